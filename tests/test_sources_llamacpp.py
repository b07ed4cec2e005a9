"""llama.cpp (llama-server --metrics) fixtures -> EngineSample and tracked ratios, against the counters fed in.

The fixtures are transcribed from llama-server's to_metrics() (see their headers and
tools/fixtures/capture/transcribed.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwatch.config import parse_config
from specwatch.sources.base import NoData, SourceError
from specwatch.sources.engines import parse_engine_sample
from specwatch.sources.llamacpp import extract
from specwatch.sources.exposition import parse
from specwatch.tracking.routes import RouteTracker

FIXTURES = Path(__file__).parent / "fixtures" / "llamacpp"


def route(**extra):
    raw = {"name": "r", "url": "http://127.0.0.1:9/metrics", "engine": "llamacpp", **extra}
    return parse_config({"gpu": {"enabled": "false"}, "routes": [raw]}).routes[0]


def fixture(name):
    return (FIXTURES / f"{name}.prom").read_text(), json.loads((FIXTURES / f"{name}.truth.json").read_text())


@pytest.mark.parametrize("name", ["server_k3", "server_k3_scrape2"])
def test_counters_equal_what_the_server_counted(name):
    text, truth = fixture(name)
    sample = parse_engine_sample("auto", text, route(engine="auto"), 1.0)
    assert (sample.engine_kind, sample.acceptance_source, sample.speculation_enabled) == ("llamacpp", "counter", True)
    assert sample.num_speculative_tokens == truth["k"] == 3
    (engine,) = sample.engines
    assert (engine.drafts, engine.draft_tokens, engine.accepted_tokens, engine.generation_tokens) == (
        truth["drafts"],
        truth["draft_tokens"],
        truth["accepted_tokens"],
        truth["generation_tokens"],
    )
    assert engine.accepted_per_pos == tuple(truth["accepted_per_pos"])
    assert engine.running is not None and engine.drafted_per_pos == ()


def test_tracked_ratios_equal_the_server_counter_ratios():
    (t1, a), (t2, b) = fixture("server_k3"), fixture("server_k3_scrape2")
    tracker = RouteTracker("r")
    tracker.observe(parse_engine_sample("llamacpp", t1, route(), 0.0))
    tracker.observe(parse_engine_sample("llamacpp", t2, route(), 30.0))
    state = tracker.state()
    d = {key: b[key] - a[key] for key in ("drafts", "draft_tokens", "accepted_tokens")}
    assert state.acceptance_ratio["1m"] == pytest.approx(d["accepted_tokens"] / d["draft_tokens"])
    assert state.mean_acceptance_length["1m"] == pytest.approx(1 + d["accepted_tokens"] / d["drafts"])
    per_pos = [y - x for x, y in zip(a["accepted_per_pos"], b["accepted_per_pos"])]
    assert state.position_acceptance_ratio == pytest.approx([p / d["drafts"] for p in per_pos])
    assert state.draft_length == pytest.approx(3.0)
    assert state.speculation_active is True


def test_counts_of_the_first_finished_request_are_not_lost():
    """The per-position family appears only when the first request that drafted finishes: a route that
    saw the server before that counts those tokens as new, not as history."""
    (t0, _), (t1, truth) = fixture("server_nodraft"), fixture("server_k3")
    tracker = RouteTracker("r")
    assert parse_engine_sample("llamacpp", t0, route(), 0.0).speculation_enabled is False
    tracker.observe(parse_engine_sample("llamacpp", t0, route(), 0.0))
    obs = tracker.observe(parse_engine_sample("llamacpp", t1, route(), 30.0))
    assert obs.d_accepted_per_pos == tuple(truth["accepted_per_pos"])
    assert (obs.d_drafts, obs.d_accepted) == (truth["drafts"], truth["accepted_tokens"])


def test_rounded_large_counters_parse_and_stay_monotonic():
    """llama-server writes doubles with 6 significant digits: 1234567 becomes 1.23457e+06."""
    text = (
        "# TYPE llamacpp:spec_decode_num_drafts_total counter\nllamacpp:spec_decode_num_drafts_total 1.23457e+06\n"
        "# TYPE llamacpp:spec_decode_num_draft_tokens_total counter\n"
        "llamacpp:spec_decode_num_draft_tokens_total 3.7037e+06\n"
    )
    (engine,) = extract(
        parse(text, {"llamacpp:spec_decode_num_drafts_total", "llamacpp:spec_decode_num_draft_tokens_total"}),
        {},
        (),
        1.0,
    ).engines
    assert (engine.drafts, engine.draft_tokens) == (1234570.0, 3703700.0)


def test_filters():
    text, _ = fixture("server_k3")
    with pytest.raises(NoData):
        parse_engine_sample("llamacpp", text, route(engines=["1"]), 1.0)
    with pytest.raises(NoData):
        parse_engine_sample("llamacpp", text, route(match={"route": "chat"}), 1.0)  # no labels at all
    with pytest.raises(SourceError):
        parse_engine_sample("llamacpp", "# nothing here\n", route(), 1.0)


def test_the_crossover_batch_is_the_mean_busy_slots_of_the_cycles_decodes():
    """n_busy_slots_per_decode is a since-start ratio (b11434 server-task.cpp); times n_decode_total it gives the
    busy-slot count back, and the increases over a cycle the mean slots per llama_decode() of that cycle, not the
    requests_processing gauge of its last instant."""
    (t1, a), (t2, b) = fixture("server_k3"), fixture("server_k3_scrape2")
    (first,) = parse_engine_sample("llamacpp", t1, route(), 0.0).engines
    assert first.decode_steps == a["n_decode"]
    assert first.decode_step_requests == pytest.approx(a["n_busy_slots"], rel=1e-5)  # the gauge's 6 digits
    tracker = RouteTracker("r")
    assert tracker.observe(parse_engine_sample("llamacpp", t1, route(), 0.0)).running_per_engine == {"0": 2.0}
    obs = tracker.observe(parse_engine_sample("llamacpp", t2, route(), 30.0))
    assert obs.running_per_engine["0"] == pytest.approx(b["busy_slots_per_decode_since_previous_scrape"], rel=1e-4)
    assert tracker.state().running_requests == 1.0, "running requests stay the requests_processing gauge"
