"""SGLang fixtures -> EngineSample, against the values the capture fed SGLang's collectors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwatch.config import parse_config
from specwatch.sources.base import NoData, SourceError
from specwatch.sources.engines import parse_engine_sample

FIXTURES = Path(__file__).parent / "fixtures" / "sglang"


def route(**extra):
    raw = {"name": "r", "url": "http://127.0.0.1:9/metrics", "engine": "sglang", **extra}
    return parse_config({"gpu": {"enabled": "false"}, "routes": [raw]}).routes[0]


def fixture(name):
    return (FIXTURES / f"{name}.prom").read_text(), json.loads((FIXTURES / f"{name}.truth.json").read_text())


@pytest.mark.parametrize("name", ["0.5.23_dp2", "0.5.23_dp2_scrape2", "0.5.23_dp1_tp2"])
def test_0_5_23_gauges_per_scheduler_and_counters_server_wide(name):
    text, truth = fixture(name)
    sample = parse_engine_sample("auto", text, route(engine="auto"), 2.0)
    assert (sample.engine_kind, sample.acceptance_source, sample.speculation_enabled) == ("sglang", "counter", True)
    assert sample.num_speculative_tokens == truth["spec_num_steps"] == 3
    assert [e.engine for e in sample.engines] == sorted(truth["schedulers"])
    for engine in sample.engines:
        fed = truth["schedulers"][engine.engine]
        # running is the priority="" total, not the sum of it and its per-priority breakdown
        assert engine.running == fed["num_running_reqs"]
        assert engine.spec_accept_length == pytest.approx(fed["spec_accept_length"])
        assert engine.spec_accept_rate == pytest.approx(fed["spec_accept_rate"])
        assert (engine.spec_num_steps, engine.spec_num_draft_tokens) == (3, 4)
    first, rest = sample.engines[0], sample.engines[1:]
    routes = truth["tokenizer"].values()
    assert first.spec_verify_calls == sum(r["spec_verify_calls"] for r in routes), "summed over is_streaming"
    assert first.generation_tokens == sum(r["generation_tokens"] for r in routes)
    assert all(e.spec_verify_calls is None and e.generation_tokens is None for e in rest), "counted once"


def test_tp_rank_copies_are_not_extra_engines():
    text, _ = fixture("0.5.23_dp1_tp2")
    assert 'tp_rank="1"' in text
    assert len(parse_engine_sample("sglang", text, route(), 1.0).engines) == 1


def test_route_label_selects_tokenizer_counters_and_keeps_server_wide_gauges():
    text, truth = fixture("0.5.23_dp2")
    sample = parse_engine_sample("sglang", text, route(match={"route": "chat"}), 1.0)
    assert sample.engines[0].spec_verify_calls == truth["tokenizer"]["chat"]["spec_verify_calls"]
    assert sample.engines[0].generation_tokens == truth["tokenizer"]["chat"]["generation_tokens"]
    assert [e.running for e in sample.engines] == [truth["schedulers"][r]["num_running_reqs"] for r in ("0", "1")]
    with pytest.raises(NoData):
        parse_engine_sample("sglang", text, route(match={"model_name": "other"}), 1.0)


def test_engines_filter_selects_dp_ranks():
    text, truth = fixture("0.5.23_dp2")
    sample = parse_engine_sample("sglang", text, route(engines=[1]), 1.0)
    assert [e.engine for e in sample.engines] == ["1"]
    assert sample.engines[0].spec_verify_calls is not None, "server-wide counters ride on the first kept engine"


@pytest.mark.parametrize("name, rate", [("0.4.3_gauges", False), ("0.5.4_accept_rate", True)])
def test_older_versions_are_gauge_sources(name, rate):
    text, truth = fixture(name)
    sample = parse_engine_sample("sglang", text, route(), 1.0, version=name.split("_")[0])
    assert (sample.acceptance_source, sample.speculation_enabled) == ("gauge", True)
    (engine,) = sample.engines
    assert engine.spec_accept_length == pytest.approx(truth["spec_accept_length"])
    assert (engine.spec_accept_rate is not None) == rate
    assert engine.running == truth["num_running_reqs"] and engine.spec_verify_calls is None


def test_adaptive_step_zero_gates_the_acceptance_gauges():
    text, _ = fixture("0.5.23_dp2")
    lines = []
    for line in text.splitlines():
        if line.startswith("sglang:spec_num_steps{") and 'dp_rank="1"' in line:
            line = line.rsplit(" ", 1)[0] + " 0.0"
        lines.append(line)
    sample = parse_engine_sample("sglang", "\n".join(lines) + "\n", route(), 1.0)
    assert sample.engines[0].spec_accept_length is not None
    assert sample.engines[1].spec_accept_length is None and sample.engines[1].spec_accept_rate is None


def test_speculation_off_and_missing_families():
    off = (
        'sglang:num_running_reqs{model_name="m"} 4\nsglang:spec_accept_length{model_name="m"} 0\n'
        'sglang:generation_tokens_total{model_name="m"} 100\n'
    )
    sample = parse_engine_sample("sglang", off, route(), 1.0)
    assert (sample.speculation_enabled, sample.acceptance_source) == (False, "none")
    assert sample.engines[0].running == 4
    with pytest.raises(SourceError) as info:
        parse_engine_sample("sglang", "# TYPE up gauge\nup 1\n", route(), 1.0)
    assert info.value.reason == "no_spec_metrics"


@pytest.mark.parametrize("value", ["chta", "Chat"])
def test_a_misspelled_match_value_is_no_match_not_a_quiet_route(value):
    """The scheduler gauges carry no `route` label, so a typo used to leave the route up on them alone."""
    text, _ = fixture("0.5.23_dp2")
    with pytest.raises(NoData) as caught:
        parse_engine_sample("sglang", text, route(match={"route": value}), 2.0)
    assert caught.value.reason == "no_match"
    assert f"route={value!r}" in str(caught.value) and "'chat'" in str(caught.value)
