"""Per-position acceptance is marked not comparable where drafts are shorter than k, on vLLM 0.34.0's own metric
code fed a batch-size schedule (`num_speculative_tokens_per_batch_size`) and grammar-invalidated drafts
(`Scheduler.make_spec_decoding_stats` takes those out of the draft tokens, not out of the per-position counts).
The truth sidecars hold the positions each draft really proposed (`drafted_per_pos`), which vLLM counts but does
not export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwatch.commands.status import render_status
from specwatch.config import parse_config
from specwatch.export.http import routes_document
from specwatch.snapshot import Snapshot
from specwatch.sources.engines import parse_engine_sample
from specwatch.tracking.routes import RouteTracker

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"
ROUTE = parse_config(
    {"gpu": {"enabled": "false"}, "routes": [{"name": "chat", "url": "http://127.0.0.1:9/metrics"}]}
).routes[0]


def tracked(name: str) -> tuple[RouteTracker, dict, dict]:
    """A tracker that has seen the fixture's two scrapes 60 s apart, and the fed counters of both."""
    tracker = RouteTracker("chat")
    truths = []
    for ts, suffix in ((1000.0, ""), (1060.0, "_scrape2")):
        body = (FIXTURES / f"{name}{suffix}.prom").read_bytes()
        tracker.observe(parse_engine_sample("auto", body, ROUTE, ts))
        truths.append(json.loads((FIXTURES / f"{name}{suffix}.truth.json").read_text())["0"])
    return tracker, truths[0], truths[1]


@pytest.mark.parametrize("name", ["0.34.0_v1_k4_2engines", "v1_k4_2engines", "0.34.0_v1_k1_1engine"])
def test_drafts_of_full_length_give_comparable_positions(name):
    tracker, _, _ = tracked(name)
    state = tracker.state()
    assert state.position_acceptance_ratio and state.position_acceptance_comparable is True


@pytest.mark.parametrize("name", ["0.34.0_v1_k4_dynamic_k", "0.34.0_v1_k4_grammar"])
def test_shorter_drafts_mark_the_positions_not_comparable(name):
    tracker, first, second = tracked(name)
    state = tracker.state()
    assert state.position_acceptance_comparable is False
    drafts = second["drafts"] - first["drafts"]
    accepted = [b - a for a, b in zip(first["accepted_per_pos"], second["accepted_per_pos"])]
    drafted = [b - a for a, b in zip(first["drafted_per_pos"], second["drafted_per_pos"])]
    # What specwatch (and vLLM's own formula) reports per position is per draft...
    assert state.position_acceptance_ratio == pytest.approx([x / drafts for x in accepted])
    # ...which is below the acceptance of the drafts that reached the position: the curve mixes in drafts that
    # never drafted it. That is what the flag says.
    true = [x / n for x, n in zip(accepted, drafted)]
    assert state.position_acceptance_ratio[-1] < true[-1]
    assert state.draft_length == pytest.approx((second["draft_tokens"] - first["draft_tokens"]) / drafts)
    assert state.draft_length < 4


def test_the_flag_reaches_metrics_api_and_status():
    from specwatch.export.prometheus import render_text

    tracker, _, _ = tracked("0.34.0_v1_k4_dynamic_k")
    state = tracker.state()
    snapshot = Snapshot(timestamp=1060.0, routes=(state,), nvml_up=True)
    assert 'specwatch_route_position_acceptance_comparable{route="chat"} 0.0' in render_text(snapshot).decode()
    document = routes_document(snapshot)
    assert document["routes"][0]["position_acceptance_comparable"] is False
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(render_status(document, 200))
    assert "chat: per-position acceptance not comparable" in console.export_text()


def test_no_per_position_ratios_no_flag():
    body = (FIXTURES / "0.34.0_v1_nospec_1engine.prom").read_bytes()
    fresh = RouteTracker("off")
    fresh.observe(parse_engine_sample("auto", body, ROUTE, 1000.0))
    assert fresh.state().position_acceptance_comparable is None
    assert 'position_acceptance_comparable{route="off"}' not in render_for(fresh)


def render_for(tracker: RouteTracker) -> str:
    from specwatch.export.prometheus import render_text

    return render_text(Snapshot(timestamp=1.0, routes=(tracker.state(),), nvml_up=True)).decode()


@pytest.mark.parametrize(
    "method, varies", [("ngram", True), ("ngram_gpu", True), ("suffix", True), ("dspark", True), ("eagle3", False)]
)
def test_vllm_methods_whose_misses_count_as_k_tokens(method, varies):
    from specwatch.sources.vllm import draft_length_varies

    assert draft_length_varies(method) is varies


def test_an_engine_that_says_its_drafts_vary_is_not_comparable_even_at_full_draft_tokens():
    import dataclasses

    tracker = RouteTracker("chat")
    for ts, suffix in ((1000.0, ""), (1060.0, "_scrape2")):
        body = (FIXTURES / f"0.34.0_v1_k4_2engines{suffix}.prom").read_bytes()
        sample = parse_engine_sample("auto", body, ROUTE, ts)
        tracker.observe(dataclasses.replace(sample, draft_length_varies=True))
    assert tracker.state().position_acceptance_comparable is False


@pytest.mark.parametrize("method, comparable", [("ngram", False), ("suffix", False), ("eagle3", True)])
def test_a_vllm_route_configured_with_a_variable_length_method_is_not_comparable(method, comparable):
    """vLLM counts an ngram or suffix miss as k drafted tokens: the counters look full, only the method tells."""
    route = parse_config(
        {
            "gpu": {"enabled": "false"},
            "routes": [{"name": "chat", "url": "http://127.0.0.1:9/metrics", "speculative": {"method": method}}],
        }
    ).routes[0]
    tracker = RouteTracker("chat")
    for ts, suffix in ((1000.0, ""), (1060.0, "_scrape2")):
        body = (FIXTURES / f"0.34.0_v1_k4_2engines{suffix}.prom").read_bytes()
        tracker.observe(parse_engine_sample("auto", body, route, ts))
    assert tracker.state().position_acceptance_comparable is comparable
