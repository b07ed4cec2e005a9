"""TensorRT-LLM (trtllm-serve, Dynamo) fixtures -> EngineSample and tracked ratios, against the counters fed in.

The fixtures are transcribed from TensorRT-LLM's collector (see their headers and
tools/fixtures/capture/transcribed.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwatch.config import parse_config
from specwatch.sources.base import NoData, SourceError
from specwatch.sources.engines import SharedEndpoint, parse_engine_sample
from specwatch.sources.trtllm import IterationStatsTotals
from specwatch.tracking.routes import RouteTracker

FIXTURES = Path(__file__).parent / "fixtures"


def route(**extra):
    raw = {"name": "r", "url": "http://127.0.0.1:9/prometheus/metrics", "engine": "trtllm", **extra}
    return parse_config({"gpu": {"enabled": "false"}, "routes": [raw]}).routes[0]


def fixture(name):
    return (FIXTURES / f"{name}.prom").read_text(), json.loads((FIXTURES / f"{name}.truth.json").read_text())


@pytest.mark.parametrize(
    "name", ["trtllm/serve_k3", "trtllm/serve_dynamic_k", "dynamo/trtllm_passthrough", "dynamo/trtllm_stripped"]
)
def test_counters_equal_what_the_collector_was_fed(name):
    text, truth = fixture(name)
    sample = parse_engine_sample("auto", text, route(engine="auto"), 1.0)
    assert (sample.engine_kind, sample.acceptance_source, sample.speculation_enabled) == ("trtllm", "counter", True)
    assert sample.num_speculative_tokens == truth["k"]
    (engine,) = sample.engines
    assert engine.accepted_per_pos == tuple(truth["accepted_per_pos"])
    assert engine.drafted_per_pos == tuple(truth["drafted_per_pos"])
    assert engine.drafts == truth["drafted_per_pos"][0]
    assert engine.draft_tokens == sum(truth["drafted_per_pos"])
    assert engine.accepted_tokens == sum(truth["accepted_per_pos"])
    assert engine.generation_tokens == truth["generation_tokens"]
    if name != "dynamo/trtllm_stripped":
        assert sample.model_name == "llama-3.1-8b-instruct"


def test_iteration_counters_alone_give_the_rate():
    """Without the per-request counters (return_perf_metrics off) the iteration counters are read."""
    text, truth = fixture("trtllm/serve_k3")
    kept = "\n".join(line for line in text.splitlines() if "_tokens_total{" not in line or "token_position" not in line)
    (engine,) = parse_engine_sample("trtllm", kept, route(), 1.0).engines
    assert engine.accepted_per_pos == () and engine.drafts is None
    assert (engine.draft_tokens, engine.accepted_tokens) == (truth["draft_tokens"], truth["accepted_tokens"])


@pytest.mark.parametrize("name", ["trtllm/serve_k3", "trtllm/serve_dynamic_k", "dynamo/trtllm_passthrough"])
def test_tracked_ratios_equal_the_engine_counter_ratios(name):
    (t1, _), (t2, truth2) = fixture(name), fixture(name + "_scrape2")
    first, second = fixture(name)[1], truth2
    tracker = RouteTracker("r")
    tracker.observe(parse_engine_sample("trtllm", t1, route(), 0.0))
    tracker.observe(parse_engine_sample("trtllm", t2, route(), 30.0))
    state = tracker.state()
    d = {
        key: second[key] - first[key]
        if not isinstance(first[key], list)
        else [b - a for a, b in zip(first[key], second[key])]
        for key in ("accepted_per_pos", "drafted_per_pos")
    }
    drafts = d["drafted_per_pos"][0]
    assert state.acceptance_ratio["1m"] == pytest.approx(sum(d["accepted_per_pos"]) / sum(d["drafted_per_pos"]))
    assert state.mean_acceptance_length["1m"] == pytest.approx(1 + sum(d["accepted_per_pos"]) / drafts)
    # per position: accepted at j over drafted at j, true for every draft length in the mix
    assert state.position_acceptance_ratio == pytest.approx(
        [a / n for a, n in zip(d["accepted_per_pos"], d["drafted_per_pos"])]
    )
    assert state.draft_length == pytest.approx(sum(d["drafted_per_pos"]) / drafts)
    assert state.speculation_active is True


def test_dynamic_k_positions_use_their_own_denominators():
    """With draft lengths 1, 2 and 4 mixed, later positions are drafted less often; dividing by drafts would
    understate them (vLLM's p_j); dividing by drafted-at-j does not."""
    _, truth = fixture("trtllm/serve_dynamic_k")
    drafted = truth["drafted_per_pos"]
    assert drafted[0] > drafted[1] > drafted[3] > 0, "the fixture mixes draft lengths"


def test_iteration_stats_json_accumulates_each_iteration_once():
    body1 = (FIXTURES / "trtllm/iteration_stats.json").read_bytes()
    body2 = (FIXTURES / "trtllm/iteration_stats_scrape2.json").read_bytes()
    truth = json.loads((FIXTURES / "trtllm/iteration_stats_scrape2.truth.json").read_text())
    totals = IterationStatsTotals()
    for body in (body1, body1, body2):  # a repeated body adds nothing
        totals.add(body)
    assert totals.totals == {
        "spec_decode_num_draft_tokens_total": truth["draft_tokens"],
        "spec_decode_num_accepted_tokens_total": truth["accepted_tokens"],
        "specDecodingStats.numRequestsWithDraftTokens": truth["drafts"],
    }


def test_iteration_stats_through_the_shared_endpoint():
    bodies = [(FIXTURES / f"trtllm/iteration_stats{s}.json").read_bytes() for s in ("", "_scrape2")]
    # each fixture body holds only the iterations since the previous one (the drained queue)
    truths = [json.loads((FIXTURES / f"trtllm/iteration_stats{s}.truth.json").read_text()) for s in ("", "_scrape2")]

    class DrainingServer:
        """trtllm-serve before its snapshot buffer: a GET hands out the pending iterations and drops them."""

        timeout, max_body, client = 1.0, 1 << 20, None
        pending = b"[]"

        def get(self, url, accept=None):
            body, self.pending = self.pending, b"[]"
            return body

    server = DrainingServer()
    endpoint = SharedEndpoint("http://127.0.0.1:9/metrics", server)
    tracker = RouteTracker("r")
    from specwatch.sources import trtllm

    for ts, truth, body in zip((0.0, 30.0), truths, bodies):
        server.pending = body
        kind, families = endpoint.families(object(), "auto", ts)
        assert kind == "trtllm"
        sample = trtllm.extract(families, {}, (), ts)
        (engine,) = sample.engines
        assert (engine.drafts, engine.draft_tokens, engine.accepted_tokens) == (
            truth["drafts"],
            truth["draft_tokens"],
            truth["accepted_tokens"],
        )
        tracker.observe(sample)
    d = {key: truths[1][key] - truths[0][key] for key in ("drafts", "draft_tokens", "accepted_tokens")}
    state = tracker.state()
    assert state.acceptance_ratio["1m"] == pytest.approx(d["accepted_tokens"] / d["draft_tokens"])
    assert state.mean_acceptance_length["1m"] == pytest.approx(1 + d["accepted_tokens"] / d["drafts"])


def test_bad_iteration_stats_is_a_parse_error():
    with pytest.raises(SourceError) as err:
        IterationStatsTotals().add(b'[{"iter": 1}, ')
    assert err.value.reason == "parse"


def test_a_server_without_speculation_is_not_speculating():
    """The spec counters are declared by every TensorRT-LLM collector; without samples they say nothing."""
    text, _ = fixture("trtllm/serve_k3")
    kept = "\n".join(line for line in text.splitlines() if "spec_decode" not in line or line.startswith("#"))
    sample = parse_engine_sample("auto", kept, route(engine="auto"), 1.0)
    assert (sample.engine_kind, sample.speculation_enabled, sample.acceptance_source) == ("trtllm", False, "none")


def test_bare_names_without_the_backend_label_are_not_trtllm():
    text, _ = fixture("dynamo/trtllm_stripped")
    with pytest.raises(SourceError):
        parse_engine_sample("trtllm", text.replace('backend="trtllm"', 'backend="other"'), route(), 1.0)


def test_match_and_engine_filters():
    text, _ = fixture("trtllm/serve_k3")
    with pytest.raises(NoData):
        parse_engine_sample("trtllm", text, route(match={"model_name": "other"}), 1.0)
    with pytest.raises(NoData):
        parse_engine_sample("trtllm", text, route(engines=["1"]), 1.0)


def test_gauge_typed_token_families_give_their_reason_and_move_no_counter():
    """TensorRT-LLM's draft and accepted token families as per-iteration gauges (the form PR #12545 changed to
    counters): each cycle's value is one iteration's count, so the route is down with reason not_a_counter and its
    exported totals never move, however the gauges go up and down."""
    from specwatch.sources.engines import HttpEngineSource, parse_families

    text, truth = fixture("trtllm/iteration_gauges")
    with pytest.raises(SourceError) as raised:
        parse_engine_sample("auto", text, route(engine="auto"), 1.0)
    assert raised.value.reason == "not_a_counter"
    assert str(raised.value).startswith(
        "trtllm_spec_decode_num_accepted_tokens_total is declared a gauge; "
        "trtllm_spec_decode_num_draft_tokens_total is declared a gauge, not a counter"
    )

    drafted = 'trtllm_spec_decode_num_draft_tokens_total{engine_type="trtllm",model_name="llama-3.1-8b-instruct"}'
    last = f"{drafted} {float(truth['last_iteration_draft_tokens'])}"
    assert last in text
    bodies = [text, text.replace(last, f"{drafted} 12.0"), text]  # up, then back down: gauges, not restarts

    class Endpoint:
        body = text

        def families(self, reader, kind, now):
            return parse_families(kind, self.body)

    class Fetcher:
        def get_json_field(self, url, key):
            return ""

        def close(self):
            pass

    endpoint = Endpoint()
    source = HttpEngineSource(route(), Fetcher(), endpoint)  # type: ignore[arg-type]
    tracker = RouteTracker("r")
    for ts, body in enumerate(bodies):
        endpoint.body = body
        with pytest.raises(SourceError) as cycle:
            source.sample(float(ts))
        assert cycle.value.reason == "not_a_counter"
        tracker.observe_down(float(ts))
    state = tracker.state(error_reason="not_a_counter")
    assert (state.drafts_total, state.draft_tokens_total, state.accepted_tokens_total) == (0.0, 0.0, 0.0)
    assert not state.up and state.error_reason == "not_a_counter"


def test_the_crossover_batch_is_the_decode_batch_not_every_running_request():
    """trtllm_num_generation_requests (inflightBatchingStats.numGenRequests) counts the requests decoding;
    num_requests_running counts context requests too. The crossover judges the decode batch."""
    text, truth = fixture("trtllm/serve_k3")
    (engine,) = parse_engine_sample("trtllm", text, route(), 1.0).engines
    assert engine.decode_batch == truth["num_generation_requests"]
    stats = IterationStatsTotals()
    stats.add((FIXTURES / "trtllm/iteration_stats.json").read_bytes())
    families = stats.families()
    assert families["trtllm_num_generation_requests"].samples[0].value == truth["num_generation_requests"]
    prefilling = text.replace(
        'trtllm_num_requests_running{engine_type="trtllm",model_name="llama-3.1-8b-instruct"} 1.0',
        'trtllm_num_requests_running{engine_type="trtllm",model_name="llama-3.1-8b-instruct"} 4.0',
    )
    obs = RouteTracker("r").observe(parse_engine_sample("trtllm", prefilling, route(), 1.0))
    assert obs.running_per_engine == {"0": truth["num_generation_requests"]}
