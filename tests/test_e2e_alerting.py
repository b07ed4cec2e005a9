"""End to end: simulated engines -> `specwatch run` -> real Prometheus (our generated rules) -> real Alertmanager
(our example config) -> a webhook receiver run by this test.

Three SIMULATED vLLM routes run side by side, all with a pinned baseline:
- `chat` gets an injected acceptance drop (x0.7, well past the 15% threshold): it must page as
  SpecwatchAcceptanceDegraded, grouped by route, and not before the drop;
- `rag` gets a model bump whose new model drafts worse: it must page as
  SpecwatchAcceptanceDegradedAfterModelChange, naming the new model;
- `code` stays undisturbed apart from a model bump that keeps its acceptance (a confounder): it must never page.
Then every query of every generated dashboard (panels, annotations, template variables) runs against the live
Prometheus and must parse and return data.

What is not the production path, and why:
- Alert `for:` durations are shortened to seconds (`Settings.with_all_for`) and Prometheus scrapes and evaluates
  every second; otherwise the rules are the generated ones.
- Alertmanager runs `alerts/alertmanager.example.yml` with the receivers' URLs pointed at this test and
  group_wait/group_interval of 1s.
- The daemon runs with the fake NVML of testbed/fake_nvml.py (one H200) in place of the `pynvml` module, so the
  GPU panels have data on a machine without a GPU; everything else in the daemon is the real `specwatch run`.
- The daemon evaluates every second, with baselines pinned in its config (no warm-up) and short guards
  (`min_duration`, `confirm_window`); the detector itself is the production one.
- The simulators run 3x faster than real time.

Everything listens on free loopback ports. A run takes about 1.5-2.5 minutes (the detector weighs evidence in
1-minute blocks); every wait is bounded, so a failure ends within about 3 minutes.
"""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from alerting_stack import (
    DAEMON_WITH_FAKE_NVML,
    Processes,
    Webhook,
    answers,
    free_ports,
    query,
    query_or_error,
    start_alerting,
    wait_until,
)
from specwatch.mixin import dashboards
from specwatch.mixin.settings import DEFAULT

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
# The simulators run TIME_SCALE x faster than real time, so an injected change works through the requests in
# flight within seconds; fault times below are wall seconds after the simulators started.
TIME_SCALE = 3
DROP_AT_SECONDS = 15.0  # chat: acceptance x0.7
BUMP_AT_SECONDS = 10.0  # rag: model bump to BUMPED_MODEL, acceptance x0.7
BENIGN_BUMP_AT_SECONDS = 8.0  # code: model bump that keeps acceptance
BUMPED_MODEL = "llama-3.1-8b-draft-v3"
# After a fault: the detector weighs evidence in 1-minute blocks (the unit its overdispersion is fitted on), so
# up to two blocks, then its guards, `for:` and Alertmanager's grouping, with slack for a loaded CI machine.
PAGE_DEADLINE_SECONDS = 140.0
EVALUATION_INTERVAL_SECONDS = 1.0
# Every simulated route drafts k=4 tokens with a conditional acceptance of 0.7 per position, an acceptance rate
# of (0.7 + 0.7^2 + 0.7^3 + 0.7^4) / 4 = 0.443, pinned in the config (a learned baseline needs minutes of
# warm-up for its overdispersion estimate); 2.45 is the overdispersion of that profile
# (docs/design/detection-research.md §3).
PINNED_BASELINE = {"acceptance_ratio": 0.443, "overdispersion": 2.45}


def _scenarios(workdir: Path) -> tuple[Path, Path, Path]:
    drop = workdir / "chat-drop.yaml"
    drop.write_text(
        yaml.safe_dump(
            {
                "speculation": {"k": 4, "acceptance": 0.7},
                "load": 16,
                "events": [{"at": f"{DROP_AT_SECONDS * TIME_SCALE:g}s", "type": "acceptance", "factor": 0.7}],
            }
        )
    )
    steady = workdir / "code-steady.yaml"
    steady.write_text(
        yaml.safe_dump(
            {
                "speculation": {"k": 4, "acceptance": 0.7},
                "load": 16,
                # A model bump that keeps acceptance: a model change annotation, and no page.
                "events": [
                    {
                        "at": f"{BENIGN_BUMP_AT_SECONDS * TIME_SCALE:g}s",
                        "type": "model_bump",
                        "model_name": "llama-3.1-8b-v2",
                        "acceptance_factor": 1.0,
                    }
                ],
            }
        )
    )
    bump = workdir / "rag-bump.yaml"
    bump.write_text(
        yaml.safe_dump(
            {
                "speculation": {"k": 4, "acceptance": 0.7},
                "load": 16,
                # A model bump that makes drafting worse: pages as "after a model change", naming the new model.
                "events": [
                    {
                        "at": f"{BUMP_AT_SECONDS * TIME_SCALE:g}s",
                        "type": "model_bump",
                        "model_name": BUMPED_MODEL,
                        "acceptance_factor": 0.7,
                    }
                ],
            }
        )
    )
    return drop, steady, bump


def _specwatch_config(workdir: Path, ports: dict[str, int]) -> Path:
    config = {
        "interval": f"{EVALUATION_INTERVAL_SECONDS:g}s",
        "state_dir": str(workdir / "state"),
        "scrape": {"timeout": "0.8s"},
        "gpu": {"enabled": "true"},
        # Short guards so the test runs in about a minute; the logic is the production detector's.
        "detection": {"min_drafted_tokens": 1000, "min_duration": "5s", "confirm_window": "10s"},
        "routes": [
            {
                "name": "chat",
                "url": f"http://127.0.0.1:{ports['chat']}/metrics",
                "gpus": [0],
                "baseline": PINNED_BASELINE,
                "crossover": {"batch_size": 64},
            },
            {
                "name": "rag",
                "url": f"http://127.0.0.1:{ports['rag']}/metrics",
                "gpus": [0],
                "baseline": PINNED_BASELINE,
            },
            {
                "name": "code",
                "url": f"http://127.0.0.1:{ports['code']}/metrics",
                "gpus": [0],
                "baseline": PINNED_BASELINE,
                # The simulator's step times are the H200 tables, measured with the unpacked verify kernel.
                "crossover": {
                    "attention_kernel": "unpacked",
                    "estimate": {
                        "gpu": "H200",
                        "params": 8,
                        "layers": 32,
                        "hidden_size": 4096,
                        "kv_heads": 8,
                        "head_dim": 128,
                    },
                },
            },
        ],
    }
    path = workdir / "specwatch.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("e2e")
    ports = free_ports("chat", "rag", "code", "daemon", "prometheus", "alertmanager")
    webhook = Webhook()
    procs = Processes(workdir)
    try:
        drop, steady, bump = _scenarios(workdir)
        simulate = [sys.executable, "-m", "specwatch", "simulate", "--engine", "vllm", "--time-scale", str(TIME_SCALE)]
        procs.start(
            "sim-chat", [*simulate, "--dp", "2", "--seed", "1", "--port", str(ports["chat"]), "--scenario", str(drop)]
        )
        procs.start("sim-code", [*simulate, "--seed", "2", "--port", str(ports["code"]), "--scenario", str(steady)])
        procs.start("sim-rag", [*simulate, "--seed", "3", "--port", str(ports["rag"]), "--scenario", str(bump)])
        for route in ("chat", "code", "rag"):
            wait_until(
                f"the {route} simulator", lambda url=f"http://127.0.0.1:{ports[route]}/metrics": answers(url), 60, procs
            )
        # No earlier than simulated time 0 of every simulator, so "not paged before the fault" is checked strictly.
        started = time.monotonic()
        procs.start(
            "specwatch",
            [
                sys.executable,
                "-c",
                DAEMON_WITH_FAKE_NVML,
                str(REPO),
                "run",
                "--config.file",
                str(_specwatch_config(workdir, ports)),
                "--web.listen-address",
                f"127.0.0.1:{ports['daemon']}",
            ],
        )
        prometheus, alertmanager = start_alerting(procs, workdir, webhook, ports, EVALUATION_INTERVAL_SECONDS)
        yield {
            "prometheus": prometheus,
            "alertmanager": alertmanager,
            "webhook": webhook,
            "procs": procs,
            "drop_at": started + DROP_AT_SECONDS,
            "bump_at": started + BUMP_AT_SECONDS,
        }
    finally:
        procs.stop_all()
        webhook.close()


def _pages_for(webhook: Webhook, route: str) -> list[tuple[float, dict, dict]]:
    return [(t, a, n) for t, a, n in webhook.alerts("/page") if a["labels"].get("route") == route]


def _wait_for_chat_page(stack) -> tuple[float, dict, dict]:
    timeout = stack["drop_at"] + PAGE_DEADLINE_SECONDS - time.monotonic()
    pages = wait_until(
        "the acceptance drop on route chat to be paged",
        lambda: [p for p in _pages_for(stack["webhook"], "chat") if p[1]["status"] == "firing"],
        timeout,
        stack["procs"],
    )
    return pages[0]


def test_injected_drop_pages_through_alertmanager(stack):
    arrival, alert, notification = _wait_for_chat_page(stack)
    assert alert["labels"]["alertname"] == "SpecwatchAcceptanceDegraded"
    assert alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["runbook_url"].endswith("#specwatchacceptancedegraded")
    assert "Draft acceptance on route chat" in alert["annotations"]["description"]
    assert notification["receiver"] == DEFAULT.page_receiver
    assert notification["groupLabels"] == {"route": "chat"}  # one notification per route
    assert arrival > stack["drop_at"], "paged before the drop was injected"


def test_drop_after_a_model_bump_pages_naming_the_new_model(stack):
    timeout = stack["bump_at"] + PAGE_DEADLINE_SECONDS - time.monotonic()
    pages = wait_until(
        "the drop after the model bump on route rag to be paged",
        lambda: [p for p in _pages_for(stack["webhook"], "rag") if p[1]["status"] == "firing"],
        timeout,
        stack["procs"],
    )
    arrival, alert, notification = pages[0]
    assert alert["labels"]["alertname"] == "SpecwatchAcceptanceDegradedAfterModelChange"
    assert alert["labels"]["model_name"] == BUMPED_MODEL
    assert f"now serves model {BUMPED_MODEL}" in alert["annotations"]["description"]
    assert notification["receiver"] == DEFAULT.page_receiver
    assert arrival > stack["bump_at"]
    # One page per route and cause: never also the plain "degraded" page for the same drop.
    assert {a["labels"]["alertname"] for _, a, _ in _pages_for(stack["webhook"], "rag")} == {
        "SpecwatchAcceptanceDegradedAfterModelChange"
    }


def test_undisturbed_route_never_pages(stack):
    webhook, procs = stack["webhook"], stack["procs"]
    # Run until both injected faults have paged (or their deadline passed), so the undisturbed route has been
    # watched through the same window, its own benign model bump included.
    deadline = max(stack["drop_at"], stack["bump_at"]) + PAGE_DEADLINE_SECONDS
    while time.monotonic() < deadline and not (_pages_for(webhook, "chat") and _pages_for(webhook, "rag")):
        procs.check_alive()
        time.sleep(0.5)
    assert _pages_for(webhook, "code") == []
    # (Routes the Alertmanager inhibition test posts directly are not from Prometheus.)
    from_prometheus = {a["labels"].get("route") for _, a, _ in webhook.alerts("/page")} - {"inhibited", "not-inhibited"}
    assert from_prometheus <= {"chat", "rag"}
    # The undisturbed route was really evaluated: a baseline, and a verdict of "not degraded".
    verdict = query(stack["prometheus"], 'specwatch_route_acceptance_degraded{route="code"}')
    assert verdict and verdict[0]["value"][1] == "0"
    assert query(stack["prometheus"], 'specwatch_route_model_changes_total{route="code"} > 0'), (
        "the undisturbed route's model bump was not seen"
    )


def test_alertmanager_inhibits_route_alerts_while_specwatch_is_down(stack):
    """The example config's inhibition, on the real Alertmanager: alerts posted straight to its API."""
    webhook, procs = stack["webhook"], stack["procs"]

    def post(*alerts: dict) -> None:
        request = urllib.request.Request(
            f"{stack['alertmanager']}/api/v2/alerts",
            method="POST",
            data=json.dumps(list(alerts)).encode(),
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=5).close()

    def alert(name: str, severity: str, **labels: str) -> dict:
        return {
            "labels": {"alertname": name, "severity": severity, "job": "specwatch", **labels},
            "annotations": {"summary": "posted by the end-to-end test"},
        }

    post(alert("SpecwatchTargetDown", "warning", instance="blind-node:9448"))
    time.sleep(1.5)  # the source alert must be known before the target is flushed
    post(
        alert("SpecwatchAcceptanceDegraded", "critical", instance="blind-node:9448", route="inhibited"),
        alert("SpecwatchAcceptanceDegraded", "critical", instance="seeing-node:9448", route="not-inhibited"),
    )
    wait_until("the control page from the node that is up", lambda: _pages_for(webhook, "not-inhibited"), 60, procs)
    time.sleep(3)  # several group intervals: an inhibition failure would have been delivered by now
    assert _pages_for(webhook, "inhibited") == []
    assert any(a["labels"]["alertname"] == "SpecwatchTargetDown" for _, a, _ in webhook.alerts("/ticket"))


def _concrete(expr: str) -> str:
    """Grafana's variables as a dashboard with every job, instance and route selected would send them."""
    return (
        expr.replace("$job", "specwatch")
        .replace("$instance", ".+")
        .replace("$route", ".+")
        .replace("$__rate_interval", "1m")
        .replace("$__interval", "5m")
    )


def test_every_dashboard_query_returns_data(stack):
    # By the time of the page, baseline, drop, CUSUM, crossover and model-change series all exist.
    _wait_for_chat_page(stack)
    failures = []
    for name, board in sorted(dashboards.all_dashboards(DEFAULT).items()):
        for title, expr in dashboards.iter_queries(board):
            if "specwatch_route_probe_" in expr:
                continue  # canary panels: no route probes here; tests/test_real_probe.py runs probes for real
            result, error = query_or_error(stack["prometheus"], _concrete(expr))
            if error:
                failures.append(f"{name} / {title}: {error}: {expr}")
            elif not result:
                failures.append(f"{name} / {title}: no data: {expr}")
        for variable in board["templating"]["list"]:
            if variable["type"] != "query":
                continue
            # Grafana turns label_values(selector, label) into a label values call with a series match.
            selector, label = re.fullmatch(r"label_values\((.*), (\w+)\)", variable["query"]).groups()
            values = _label_values(stack["prometheus"], label, _concrete(selector))
            if not values:
                failures.append(f"{name} / variable {variable['name']}: no values: {variable['query']}")
    assert not failures, "\n".join(failures)


def _label_values(prometheus: str, label: str, selector: str) -> list[str]:
    url = f"{prometheus}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": selector})
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)["data"]
