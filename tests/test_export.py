"""The Prometheus collector and the HTTP endpoint, on hand-built snapshots.

The golden file is regenerated with `SPECWATCH_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_export.py`;
review its diff like code.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest
import requests
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from certs import self_signed_for_localhost
from specwatch import catalog
from specwatch.export import prometheus as prom_export
from specwatch.export.http import parse_listen_address, serve
from specwatch.export.prometheus import SnapshotCollector, render_families
from specwatch.snapshot import EMPTY_SNAPSHOT, GpuSample, RouteState, Snapshot

GOLDEN = Path(__file__).parent / "golden" / "metrics.prom"
CORE_GPU = {"specwatch_gpu_up", "specwatch_gpu_info", "specwatch_nvml_up", "specwatch_route_gpu_info"}


def gpu_field_keys() -> list[str]:
    """Every per-GPU field metric registered in the catalog, as a GpuSample.fields key."""
    return sorted(
        m.name[len(catalog.PREFIX) :] for m in catalog.METRICS if m.labels == ("gpu",) and m.name not in CORE_GPU
    )


def full_snapshot() -> Snapshot:
    chat = RouteState(
        name="chat",
        up=True,
        engine_kind="vllm",
        model_name="meta-llama/Llama-3.1-8B-Instruct",
        engine_version="0.33.0",
        acceptance_source="counter",
        drafts_total=120000.0,
        draft_tokens_total=360000.0,
        accepted_tokens_total=216000.0,
        acceptance_ratio={"1m": 0.58, "5m": 0.6, "1h": 0.62},
        mean_acceptance_length={"1m": 2.74, "5m": 2.8, "1h": 2.86},
        position_acceptance_ratio=(0.8, 0.6, 0.4),
        position_acceptance_comparable=False,
        draft_length=3.0,
        speculation_active=True,
        running_requests=24.0,
        waiting_requests=2.0,
        kv_usage_ratio=0.41,
        scrape_duration_seconds=0.012,
        engines=2,
        last_scrape_timestamp=1764403199.5,
        errors_total={"connection": 0.0, "timeout": 2.0},
        rejected_samples_total={"non_finite": 0.0, "too_large": 1.0},
        gpus=(0, 1),
        evaluator_errors_total={"above_crossover": 0.0, "acceptance_drop": 3.0},
        baseline_ratio=0.7,
        baseline_model="meta-llama/Llama-3.1-8B-Instruct",
        baseline_engine_version="0.11.0",
        baseline_draft_length=4,
        baseline_source="learned",
        baseline_overdispersion=35.0,
        acceptance_threshold_ratio=0.595,
        drop_ratio=0.142857,
        degraded=False,
        cusum_statistic=3.5,
        traffic_horizon_seconds=420.0,
        probe_horizon_seconds=1800.0,
        horizon_budget_seconds=3600.0,
        model_changes_total=1.0,
        seed_errors_total={"connection": 0.0, "timeout": 2.0, "not_finite": 1.0},
        last_model_change_timestamp=1764400000.0,
        crossover_batch_size=32.0,
        crossover_source="estimate",
        crossover_lower=28.0,
        crossover_upper=41.0,
        crossover_attention_kernel="packed",
        crossover_kv_capacity_batch=219.0,
        batch_size=12.0,
        above_crossover=False,
        predicted_speedup_ratio=1.35,
        compute_bound=False,
        speculation_gpu_seconds_lost_total=120.0,
        speculation_gpu_seconds_saved_total=3600.0,
        live_crossover_batch_size=40.0,
        live_crossover_lower=35.0,
        live_crossover_upper=46.0,
        live_crossover_bins=6,
        live_crossover_attention_kernel="packed",
        live_crossover_settled=True,
        crossover_flag_source="live",
        crossover_flag_batch_size=40.0,
        probe_acceptance_ratio=0.55,
        probe_baseline_ratio=0.56,
        probe_degraded=False,
        probe_success=True,
        probe_duration_seconds=9.5,
        probe_rounds_total={"ok": 12.0, "busy": 0.0, "error": 1.0, "skipped": 0.0},
        probe_method="vllm_response",
    )
    code = RouteState(
        name="code",
        up=False,
        engine_kind="sglang",
        model_name="Qwen/Qwen3-8B",
        engine_version="0.5.10",
        acceptance_source="gauge",
        error_reason="connection",
        errors_total={"connection": 7.0},
        scrape_duration_seconds=0.001,
        degraded=True,
        baseline_ratio=float("nan"),  # NaN must never be exported
    )
    # An engine with interval gauges and no counters: its mean acceptance length is exported, not derived.
    summarize = RouteState(
        name="summarize",
        up=True,
        engine_kind="sglang",
        model_name="Qwen/Qwen3-8B",
        engine_version="0.5.10",
        acceptance_source="gauge",
        acceptance_ratio={"5m": 0.7},
        mean_acceptance_length={"5m": 3.1},
    )
    fields = {key: 0.25 if key.endswith("_ratio") else float(100 * (i + 1)) for i, key in enumerate(gpu_field_keys())}
    gpus = (
        GpuSample(index=0, up=True, uuid="GPU-aaaa", name="NVIDIA H200", driver="570.86.15", fields=fields),
        GpuSample(index=1, up=False, uuid="GPU-bbbb", name="NVIDIA H200", driver="570.86.15"),
    )
    return Snapshot(
        timestamp=1764403200.0,
        routes=(chat, code, summarize),
        gpus=gpus,
        nvml_up=True,
        evaluation_duration_seconds=0.0315,
        evaluation_overruns_total=1.0,
        state_errors_total=0.0,
        config_last_reload_successful=True,
        config_last_reload_success_timestamp=1764400000.0,
    )


def render(snapshot: Snapshot, admin_requests: bool = True) -> str:
    admin = prom_export.AdminRequests()  # the HTTP server's counts, beside the snapshot
    if admin_requests:
        admin.count("accept", "performed")
        admin.count("reset", "forbidden")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snapshot, admin=admin))
    return generate_latest(registry).decode()


def test_golden_metrics():
    text = render(full_snapshot())
    if os.environ.get("SPECWATCH_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "rendering changed: review, then SPECWATCH_UPDATE_GOLDEN=1"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not on PATH")
def test_golden_passes_promtool_lint():
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=GOLDEN.read_bytes(), capture_output=True, timeout=30
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


def test_catalog_coverage_both_directions():
    families = list(text_string_to_metric_families(render(full_snapshot())))
    rendered = {f.name + ("_total" if f.type == "counter" else "") for f in families}
    assert rendered - set(catalog.BY_NAME) == set()  # every name rendered is in the catalog
    assert set(catalog.BY_NAME) - rendered == set()  # every catalog entry is rendered when its data is present
    for f in families:  # HELP and TYPE come from the catalog
        spec = catalog.BY_NAME[f.name + ("_total" if f.type == "counter" else "")]
        assert f.documentation == spec.help and f.type == spec.type
        for sample in f.samples:
            assert set(sample.labels) == set(spec.labels), sample
            assert math.isfinite(sample.value), sample


def test_absent_values_are_omitted():
    text = render(full_snapshot())
    assert 'baseline_ratio{route="code"}' not in text  # NaN in the snapshot
    assert 'specwatch_route_acceptance_ratio{route="code"' not in text
    assert 'specwatch_route_drafts_total{route="code"}' not in text  # gauge route: no counters
    assert 'specwatch_route_acceptance_degraded{route="code"} 1.0' in text
    empty = render(EMPTY_SNAPSHOT)
    assert "specwatch_build_info" in empty and "last_evaluation_timestamp" not in empty and "nvml_up" not in empty


def test_a_failing_section_costs_only_itself(monkeypatch, caplog):
    def broken(snapshot, families):
        raise RuntimeError("bug")

    monkeypatch.setattr(prom_export, "_SECTIONS", (broken, *prom_export._SECTIONS))
    errors = prom_export.ExportErrors()
    families = {f.name: f for f in render_families(full_snapshot(), errors)}
    assert "specwatch_route_up" in families and "specwatch_gpu_up" in families
    assert any("rendering broken failed" in r.getMessage() for r in caplog.records)
    counted = {
        s.labels["section"]: s.value
        for s in families["specwatch_render_errors"].samples
        if s.name == "specwatch_render_errors_total"
    }
    assert counted == {
        "broken": 1.0,
        "route": 0.0,
        "self": 0.0,
        "detection": 0.0,
        "crossover": 0.0,
        "probe": 0.0,
        "gpu": 0.0,
    }
    render_families(full_snapshot(), errors)  # the counter counts on across scrapes
    assert errors.counts()[0] == {"broken": 2.0}


def test_unknown_gpu_field_is_not_exported():
    snap = Snapshot(timestamp=1.0, nvml_up=True, gpus=(GpuSample(index=0, up=True, fields={"gpu_bogus_thing": 1.0}),))
    text = render(snap)
    assert "bogus" not in text and 'specwatch_gpu_up{gpu="0"} 1.0' in text


def test_collector_survives_a_failing_snapshot_getter():
    def boom():
        raise RuntimeError("no snapshot")

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(boom))
    assert generate_latest(registry) == b""


# ---------------------------------------------------------------------------------------------- HTTP
@pytest.fixture
def server():
    state = {"snapshot": EMPTY_SNAPSHOT}
    srv = serve("127.0.0.1:0", lambda: state["snapshot"])
    srv.state = state
    yield srv
    srv.shutdown()


@pytest.mark.slow
def test_http_endpoints(server):
    url = server.url
    assert requests.get(url + "/-/healthy", timeout=5).status_code == 200
    assert requests.get(url + "/-/ready", timeout=5).status_code == 503
    server.state["snapshot"] = full_snapshot()
    assert requests.get(url + "/-/ready", timeout=5).status_code == 200
    r = requests.get(url + "/metrics", timeout=5, headers={"Accept-Encoding": "identity"})
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert r.text == render(full_snapshot(), admin_requests=False)
    raw = requests.get(url + "/metrics", timeout=5, headers={"Accept-Encoding": "gzip"}, stream=True).raw
    assert raw.headers["Content-Encoding"] == "gzip" and gzip.decompress(raw.read()).decode() == r.text
    om = requests.get(url + "/metrics", timeout=5, headers={"Accept": "application/openmetrics-text"})
    assert om.headers["Content-Type"].startswith("application/openmetrics-text") and om.text.endswith("# EOF\n")
    doc = requests.get(url + "/api/v1/routes", timeout=5).json()
    assert doc["timestamp"] == 1764403200.0 and [r["name"] for r in doc["routes"]] == ["chat", "code", "summarize"]
    assert doc["routes"][0]["acceptance_ratio"]["5m"] == 0.6 and doc["routes"][1]["baseline_ratio"] is None
    advice = requests.get(url + "/api/v1/advice", timeout=5)
    assert advice.status_code == 200 and advice.headers["Content-Type"] == "application/json"
    doc = advice.json()
    assert doc["version"] == 1 and doc["evaluated"] == 1764403200.0
    assert [(r["route"], r["speculate"]) for r in doc["routes"]] == [
        ("chat", True),
        ("code", None),
        ("summarize", None),
    ]
    index = requests.get(url + "/", timeout=5)
    assert index.status_code == 200 and 'href="metrics"' in index.text and 'href="api/v1/advice"' in index.text
    assert requests.get(url + "/nope", timeout=5).status_code == 404


class FakeWebConfig:
    def __init__(self, context=None) -> None:
        self.context = context

    def ssl_context(self):
        return self.context

    def authorize(self, headers) -> bool:
        return headers.get("Authorization") == "Basic dTpw"  # u:p

    def authorize_cached(self, headers) -> bool:
        return self.authorize(headers)

    auth_required = admin_identity_required = True

    def is_admin(self, user, cert_subject) -> bool:
        return False

    def host_allowed(self, host) -> bool:
        return True

    def origin_allowed(self, origin) -> bool:
        return False


@pytest.mark.slow
def test_http_basic_auth_refuses_without_detail():
    srv = serve("127.0.0.1:0", lambda: full_snapshot(), FakeWebConfig())
    try:
        for path in ("/metrics", "/api/v1/routes", "/api/v1/advice", "/"):
            r = requests.get(srv.url + path, timeout=5)
            assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Basic")
            assert "specwatch_" not in r.text
        assert requests.get(srv.url + "/metrics", auth=("u", "p"), timeout=5).status_code == 200
    finally:
        srv.shutdown()


@pytest.mark.slow
def test_http_tls(tmp_path):
    cert, key = self_signed_for_localhost(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    srv = serve("127.0.0.1:0", lambda: full_snapshot(), FakeWebConfig(context))
    try:
        assert srv.url.startswith("https://")
        r = requests.get(srv.url + "/metrics", auth=("u", "p"), verify=str(cert), timeout=5)
        assert r.status_code == 200 and "specwatch_route_up" in r.text
        advice = requests.get(srv.url + "/api/v1/advice", auth=("u", "p"), verify=str(cert), timeout=5)
        assert advice.status_code == 200 and advice.json()["routes"][0]["speculate"] is True
    finally:
        srv.shutdown()


def test_parse_listen_address():
    assert parse_listen_address("127.0.0.1:9448") == ("127.0.0.1", 9448)
    assert parse_listen_address("[::1]:9448") == ("::1", 9448)
    assert parse_listen_address(":9448") == ("", 9448)
    for bad in ("9448", "host:", "host:http", "h:70000"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_listen_address(bad)


@pytest.mark.slow
def test_routes_json_is_strict_json(server):
    server.state["snapshot"] = full_snapshot()
    body = requests.get(server.url + "/api/v1/routes", timeout=5).text
    assert "NaN" not in body
    json.loads(body)
