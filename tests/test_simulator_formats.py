"""The simulator's `/metrics` is the engines' format: families, types, labels, HELP and `_created` as in
vLLM 0.33.0 (single-process) and SGLang 0.5.23 (multiprocess), checked against the fixtures captured from
the engines' own code when present, and parsed by specwatch's own engine sources like a real engine."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.config import parse_config
from specwatch.simulator.clock import SimClock
from specwatch.simulator.engine import EngineSettings, SimEngine, SimRequest
from specwatch.simulator.metrics_sglang import DECODE_LOG_INTERVAL, SglangMetrics
from specwatch.simulator.metrics_sglang import ENGINE_VERSION as SGLANG_VERSION
from specwatch.simulator.metrics_vllm import ENGINE_VERSION as VLLM_VERSION
from specwatch.simulator.metrics_vllm import VllmMetrics
from specwatch.simulator.speculation import AcceptanceProfile
from specwatch.simulator.steptime import load_table

FIXTURES = Path(__file__).parent / "fixtures"
# Declared by SGLang 0.5.23's TokenizerMetricsCollector but observed only on a streamed first token and on an
# abort, which the fixture capture does not drive; a real server exposes them.
SGLANG_NOT_CAPTURED = {"sglang:time_to_first_token_seconds", "sglang:num_aborted_requests"}


def _run(
    metrics, k: int, engines: int, until: float = 3.0, load: int = 8, routes: tuple[str, ...] = ()
) -> list[SimEngine]:
    """Built-in load on every engine, plus a few streaming requests (per route when `routes`)."""
    out = []
    labels = tuple({"route": r} for r in routes)
    for i in range(engines):
        settings = EngineSettings(
            model_name=metrics.model_name,
            step_time=load_table(),
            k=k,
            profile=AcceptanceProfile.iid(0.7, k) if k else None,
            internal_custom_labels=labels,
        )
        engine = SimEngine(i, settings, SimClock(), metrics, seed=i)
        engine.set_offered_concurrency(load)
        for j in range(max(1, len(labels))):
            engine.submit(SimRequest(64, 32, streaming=True, custom_labels=labels[j] if labels else None))
        engine.advance(until)
        out.append(engine)
    return out


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


# ----------------------------------------------------------------------------------------- vLLM
def test_vllm_exposition_shape():
    metrics = VllmMetrics("m", engines=2, k=3)
    _run(metrics, k=3, engines=2)
    text = metrics.render().decode()
    fams = _families(text)
    drafts = fams["vllm:spec_decode_num_drafts"]
    assert drafts.type == "counter"
    assert {s.labels["engine"] for s in drafts.samples if s.name.endswith("_total")} == {"0", "1"}
    assert fams["vllm:spec_decode_num_drafts_created"].type == "gauge"  # single-process: a `_created` family
    per_pos = fams["vllm:spec_decode_num_accepted_tokens_per_pos"]
    positions = sorted({s.labels["position"] for s in per_pos.samples if s.name.endswith("_total")})
    assert positions == ["0", "1", "2"]
    assert fams["vllm:iteration_tokens_total"].type == "histogram"
    assert fams["vllm:num_requests_running"].type == "gauge"
    frontend = ("vllm:admission_rejections", "vllm:admission_rejections_created")  # the API server's, no engine
    for fam in fams.values():
        for s in fam.samples:
            assert "engine" in s.labels or fam.name in frontend, s.name
            assert "model_name" in s.labels or fam.name == "vllm:cache_config_info", s.name
    # vLLM's own invariants: sum over positions = accepted; draft tokens = k x drafts
    for engine in ("0", "1"):
        v = {
            s.name: s.value
            for f in fams.values()
            for s in f.samples
            if s.labels.get("engine") == engine and "position" not in s.labels and s.name.endswith("_total")
        }
        pos = sum(s.value for s in per_pos.samples if s.name.endswith("_total") and s.labels["engine"] == engine)
        assert pos == v["vllm:spec_decode_num_accepted_tokens_total"] > 0
        assert v["vllm:spec_decode_num_draft_tokens_total"] == 3 * v["vllm:spec_decode_num_drafts_total"]


def test_vllm_spec_families_are_absent_not_zero_without_speculation():
    metrics = VllmMetrics("m", engines=1, k=0)
    _run(metrics, k=0, engines=1)
    fams = _families(metrics.render().decode())
    assert not [n for n in fams if n.startswith("vllm:spec_decode")]
    assert fams["vllm:generation_tokens"].samples[0].value > 0


def test_vllm_reset_is_a_restart():
    metrics = VllmMetrics("m", engines=1, k=2)
    _run(metrics, k=2, engines=1)
    before = _families(metrics.render().decode())
    metrics.reset(model_name="m2")
    after = _families(metrics.render().decode())
    total = [s for s in after["vllm:spec_decode_num_drafts"].samples if s.name.endswith("_total")]
    assert [(s.labels["model_name"], s.value) for s in total] == [("m2", 0.0)]
    created = "vllm:spec_decode_num_drafts_created"
    assert after[created].samples[0].value >= before[created].samples[0].value


# ----------------------------------------------------------------------------------------- SGLang
def test_sglang_exposition_is_multiprocess_style():
    metrics = SglangMetrics("m", dp=2, k=3)
    _run(metrics, k=3, engines=2)
    text = metrics.render().decode()
    assert "_created" not in text
    fams = _families(text)
    for fam in fams.values():
        for s in fam.samples:
            assert ("pid" in s.labels) == (fam.name in ("sglang:num_retracted_reqs", "sglang:num_paused_reqs"))
    ranks = {s.labels["dp_rank"] for s in fams["sglang:spec_accept_length"].samples}
    assert ranks == {"0", "1"}
    assert {s.labels["is_streaming"] for s in fams["sglang:generation_tokens"].samples} == {"false", "true"}
    assert fams["sglang:spec_verify_calls"].type == "counter"
    assert all("dp_rank" not in s.labels for s in fams["sglang:spec_verify_calls"].samples)  # tokenizer side
    single = _families(SglangMetrics("m", dp=1, k=3).render().decode())
    assert all("dp_rank" not in s.labels for s in single["sglang:num_running_reqs"].samples)  # only with DP > 1


def test_sglang_custom_labels_split_the_tokenizer_counters_per_route():
    metrics = SglangMetrics("m", dp=1, k=3, custom_labels=("route",))
    _run(metrics, k=3, engines=1, until=10.0, routes=("chat", "code"))
    fams = _families(metrics.render().decode())
    verify = {s.labels["route"]: s.value for s in fams["sglang:spec_verify_calls"].samples}
    assert set(verify) == {"chat", "code"} and all(v > 0 for v in verify.values())


def test_sglang_gauges_move_per_log_interval_and_counters_at_completion():
    metrics = SglangMetrics("m", dp=1, k=4)
    settings = EngineSettings(
        model_name="m",
        step_time=load_table(),
        k=4,
        profile=AcceptanceProfile.iid(0.7, 4),
        internal_output_tokens=(400, 400),
        prefill_seconds_per_token=0.0,
    )
    engine = SimEngine(0, settings, SimClock(), metrics, seed=2)
    engine.set_offered_concurrency(4)

    def gauge(name: str) -> float:
        return next(s.value for s in _families(metrics.render().decode())[name].samples)

    step = settings.step_time.target_seconds(4, 5) + 4 * settings.step_time.draft_seconds(4)
    engine.advance((DECODE_LOG_INTERVAL - 2) * step)
    assert gauge("sglang:spec_accept_length") == 0.0  # no log tick yet
    assert gauge("sglang:num_running_reqs") == 0.0
    engine.advance((DECODE_LOG_INTERVAL + 2) * step)
    assert gauge("sglang:num_running_reqs") == 4
    assert 1.0 < gauge("sglang:spec_accept_length") <= 5.0
    assert "sglang:spec_verify_calls" not in _families(metrics.render().decode())  # nothing finished yet
    engine.advance(10.0)
    fams = _families(metrics.render().decode())
    verify = fams["sglang:spec_verify_calls"].samples[0].value
    generated = sum(s.value for s in fams["sglang:generation_tokens"].samples)
    rate = AcceptanceProfile.iid(0.7, 4)
    assert generated / verify == pytest.approx(rate.mean_tokens_per_step(), rel=0.05)  # SGLang's accept length


# ----------------------------------------------------------------------------------------- real fixtures
def _fixture_files() -> list[Path]:
    """Fixtures of the engine versions the simulator imitates (others document older formats)."""
    simulated = {"vllm": VLLM_VERSION, "sglang": SGLANG_VERSION}
    return sorted(
        p
        for p in FIXTURES.glob("*/*.prom")
        if f"# engine: {p.parent.name} {simulated.get(p.parent.name)} " in p.read_text()[:500]
    )


def _capture_args(path: Path) -> dict[str, str]:
    """The provenance header's `# args:` line: `engines=2 tp=1 k=4 ...` (`off` = speculation off)."""
    for line in path.read_text().splitlines():
        if line.startswith("# args:"):
            return dict(w.split("=", 1) if "=" in w else (w, "") for w in line[len("# args:") :].split())
    return {}


def _shape(text: str, prefix: str) -> dict[str, tuple[str, str, frozenset, frozenset]]:
    """family -> (type, HELP, label names, label values other than model_name and pid, buckets included)."""
    out = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith(prefix):
            continue
        names = frozenset(k for s in fam.samples for k in s.labels if k != "le")
        values = frozenset((k, v) for s in fam.samples for k, v in s.labels.items() if k not in ("model_name", "pid"))
        out[fam.name] = (fam.type, fam.documentation, names, values)
    return out


@pytest.mark.parametrize("fixture", _fixture_files() or [None], ids=lambda p: p.name if p else "none")
def test_simulator_matches_the_captured_fixture(fixture):
    """Same families, types, HELP, label names and label values (histogram buckets included) as the engine's
    own metric code produced for the same setup (DP engines and k from the fixture's provenance header)."""
    if fixture is None:
        pytest.skip(f"no captured fixture under {FIXTURES}")
    engine = fixture.parent.name
    args = _capture_args(fixture)
    engines = int(args.get("engines", args.get("dp", "1")))
    k = 0 if "off" in args else int(args.get("k", "0"))
    if engine == "vllm":
        metrics = VllmMetrics("m", engines=engines, k=k)
    else:  # SGLang: k = speculative_num_steps; the capture's TP ranks, priority scheduling and custom labels
        k = int(args.get("steps", "0"))
        metrics = SglangMetrics(
            "m",
            dp=engines,
            k=k,
            tp=int(args.get("tp", "1")),
            all_tp_ranks=True,
            priority_scheduling=args.get("priority_scheduling") == "on",
            custom_labels=("route",) if args.get("routes") else (),
        )
    routes = tuple(r for r in args.get("routes", "").split(",") if r)
    _run(metrics, k=k, engines=engines, until=20.0, routes=routes)
    expected = _shape(fixture.read_text(), f"{engine}:")
    simulated = _shape(metrics.render().decode(), f"{engine}:")
    missing = sorted(set(expected) - set(simulated))
    extra = sorted(set(simulated) - set(expected) - SGLANG_NOT_CAPTURED)
    assert not missing, f"families of {fixture.name} the simulator lacks: {missing}"
    assert not extra, f"simulated families absent from {fixture.name}: {extra}"
    for name, (kind, help_, labels, values) in expected.items():
        assert simulated[name][:3] == (kind, help_, labels), name
        assert simulated[name][3] == values, (name, sorted(simulated[name][3] ^ values))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_specwatch_sources_parse_the_simulator_like_the_fixture(engine):
    from specwatch.sources import engines as sources

    if engine == "vllm":
        metrics = VllmMetrics("m", engines=2, k=3)
    else:
        metrics = SglangMetrics("m", dp=2, k=3)
    _run(metrics, k=3, engines=2, until=20.0)
    route = parse_config(
        {"gpu": {"enabled": "false"}, "routes": [{"name": "r", "engine": engine, "url": "http://127.0.0.1:9/metrics"}]}
    ).routes[0]
    sample = sources.parse_engine_sample(engine, metrics.render(), route, 1.0)
    assert sample.model_name == "m"
    assert [e.engine for e in sample.engines] == ["0", "1"]
    if engine == "vllm":
        assert sample.acceptance_source == "counter" and sample.num_speculative_tokens == 3
        assert all(e.drafts and e.accepted_tokens and len(e.accepted_per_pos) == 3 for e in sample.engines)
        assert all(e.created for e in sample.engines)
    else:
        assert sample.acceptance_source in ("counter", "gauge")
        assert all(e.interval_acceptance_length for e in sample.engines)
