"""SGLang fixtures -> EngineSample, against the values the capture fed SGLang's collectors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwatch.config import parse_config
from specwatch.sources.base import NoData, SourceError
from specwatch.sources.engines import parse_engine_sample
from specwatch.sources.sglang import acceptance_ratio, parse_version

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
        # 0.5.23's rate already excludes the bonus token: tracking gets it as fed
        assert engine.interval_acceptance_length == pytest.approx(fed["spec_accept_length"])
        assert engine.interval_acceptance_ratio == pytest.approx(fed["spec_accept_rate"])
        # spec_num_steps 3, spec_num_draft_tokens 4: three draft tokens per verify step
        assert (engine.verify_counts, engine.draft_length) == (True, 3)
    first, rest = sample.engines[0], sample.engines[1:]
    routes = truth["tokenizer"].values()
    assert first.drafts == sum(r["spec_verify_calls"] for r in routes), "summed over is_streaming"
    assert first.generation_tokens == sum(r["generation_tokens"] for r in routes)
    assert all(e.drafts is None and e.generation_tokens is None for e in rest), "counted once"


def test_tp_rank_copies_are_not_extra_engines():
    text, _ = fixture("0.5.23_dp1_tp2")
    assert 'tp_rank="1"' in text
    assert len(parse_engine_sample("sglang", text, route(), 1.0).engines) == 1


def test_route_label_selects_tokenizer_counters_and_keeps_server_wide_gauges():
    text, truth = fixture("0.5.23_dp2")
    sample = parse_engine_sample("sglang", text, route(match={"route": "chat"}), 1.0)
    assert sample.engines[0].drafts == truth["tokenizer"]["chat"]["spec_verify_calls"]
    assert sample.engines[0].generation_tokens == truth["tokenizer"]["chat"]["generation_tokens"]
    assert [e.running for e in sample.engines] == [truth["schedulers"][r]["num_running_reqs"] for r in ("0", "1")]
    with pytest.raises(NoData):
        parse_engine_sample("sglang", text, route(match={"model_name": "other"}), 1.0)


def test_engines_filter_selects_dp_ranks():
    text, truth = fixture("0.5.23_dp2")
    sample = parse_engine_sample("sglang", text, route(engines=[1]), 1.0)
    assert [e.engine for e in sample.engines] == ["1"]
    assert sample.engines[0].drafts is not None, "server-wide counters ride on the first kept engine"


@pytest.mark.parametrize("name, rate", [("0.4.3_gauges", False), ("0.5.4_accept_rate", True)])
def test_older_versions_are_gauge_sources(name, rate):
    text, truth = fixture(name)
    sample = parse_engine_sample("sglang", text, route(), 1.0, version=name.split("_")[0])
    assert (sample.acceptance_source, sample.speculation_enabled) == ("gauge", True)
    (engine,) = sample.engines
    assert engine.interval_acceptance_length == pytest.approx(truth["spec_accept_length"])
    # 0.4.3 has no rate gauge and no k to turn the length into one; 0.5.4's old-definition rate is converted
    assert (engine.interval_acceptance_ratio is not None) == rate
    assert engine.running == truth["num_running_reqs"] and engine.drafts is None


def test_adaptive_step_zero_gates_the_acceptance_gauges():
    text, _ = fixture("0.5.23_dp2")
    lines = []
    for line in text.splitlines():
        if line.startswith("sglang:spec_num_steps{") and 'dp_rank="1"' in line:
            line = line.rsplit(" ", 1)[0] + " 0.0"
        lines.append(line)
    sample = parse_engine_sample("sglang", "\n".join(lines) + "\n", route(), 1.0)
    assert sample.engines[0].interval_acceptance_length is not None
    assert sample.engines[1].interval_acceptance_length is None and sample.engines[1].interval_acceptance_ratio is None
    # its verify steps proposed no draft tokens
    assert (sample.engines[0].draft_length, sample.engines[1].draft_length) == (3, 0)


def test_old_rate_definition_is_converted():
    # <= 0.5.10: rate counted the bonus token: (accepted + verify) / (verify x n). With k = 3 (n = 4) and
    # 1.8 accepted per verify: tau = 2.8, old rate = 2.8 / 4 = 0.7, new rate = 1.8 / 3 = 0.6.
    assert acceptance_ratio(0.7, 2.8, None, (0, 5, 10), k_hint=3) == pytest.approx(0.6)
    assert acceptance_ratio(0.7, 2.8, None, (0, 5, 10), k_hint=None) == pytest.approx(0.6)  # n = tau / rate
    assert acceptance_ratio(0.7, 2.8, None, None, k_hint=3) == pytest.approx(0.6)  # no version, no n gauge: old
    assert acceptance_ratio(0.6, 2.8, 4.0, (0, 5, 23), k_hint=None) == pytest.approx(0.6)
    assert acceptance_ratio(None, 2.8, None, (0, 4, 3), k_hint=3) == pytest.approx(0.6)  # < 0.5.4: length only
    assert acceptance_ratio(None, 2.8, None, (0, 4, 3), k_hint=None) is None


def test_old_rate_definition_is_converted_by_the_version_the_source_reads():
    """The same 0.5.4-style gauges (no spec_num_draft_tokens) read as the old definition under 0.5.10 and as
    today's under 0.5.13: the source applies the version, tracking never sees it."""
    text = (
        'sglang:num_running_reqs{model_name="m"} 5\nsglang:spec_accept_length{model_name="m"} 2.8\n'
        'sglang:spec_accept_rate{model_name="m"} 0.7\n'
    )
    old = parse_engine_sample("sglang", text, route(), 1.0, version="0.5.10").engines[0]
    new = parse_engine_sample("sglang", text, route(), 1.0, version="0.5.13").engines[0]
    assert old.interval_acceptance_ratio == pytest.approx(0.6) and new.interval_acceptance_ratio == pytest.approx(0.7)


def test_parse_version():
    assert parse_version("0.5.10") == (0, 5, 10)
    assert parse_version("v0.5.13.post2") == (0, 5, 13)
    assert parse_version("0.5.13rc1") == (0, 5, 13)
    assert parse_version("dev") is None


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


def test_the_first_sample_after_a_start_is_read_with_the_version_fetched_in_the_same_call():
    """The version is fetched after the first successful scrape of an engine; the sample of that very call is
    read with it, as tracking read it when tracking applied the version."""
    from specwatch.sources.engines import HttpEngineSource, parse_families

    body = (
        'sglang:num_running_reqs{model_name="m"} 5\nsglang:spec_accept_length{model_name="m"} 2.8\n'
        'sglang:spec_accept_rate{model_name="m"} 0.7\n'
    )

    class Endpoint:
        def families(self, reader, kind, now):
            return parse_families(kind, body)

    class Fetcher:
        asked: list[str] = []

        def get_json_field(self, url, key):
            self.asked.append(url)
            return "0.5.10"

        def close(self):
            pass

    fetcher = Fetcher()
    source = HttpEngineSource(route(), fetcher, Endpoint())  # type: ignore[arg-type]
    first = source.sample(1.0)
    assert fetcher.asked and first.engine_version == "0.5.10"
    assert first.engines[0].interval_acceptance_ratio == pytest.approx(0.6), "old definition, converted"
    assert source.sample(2.0).engines[0].interval_acceptance_ratio == pytest.approx(0.6)
    assert len(fetcher.asked) == 1


# ----------------------------------------------------------------------------------- behind SMG's /engine_metrics
SMG = ("smg_two_workers", "smg_two_workers_scrape2")


def _tracked(texts, **extra):
    from specwatch.tracking.routes import RouteTracker

    tracker = RouteTracker("r")
    for ts, text in enumerate(texts):
        tracker.observe(parse_engine_sample("auto", text, route(engine="auto", **extra), float(ts) * 5))
    return tracker.state()


def test_a_gateway_exposition_splits_into_one_engine_per_worker():
    """Each worker's scheduler is an engine of its own, with its own batch: keyed on dp_rank alone, both workers'
    dp_rank "0" would be one engine and one worker's gauges would stand for both."""
    text, truth = fixture(SMG[0])
    sample = parse_engine_sample("auto", text, route(engine="auto"), 1.0)
    workers = sorted(truth)
    assert [e.engine for e in sample.engines] == [f"{w}|0" for w in workers]
    for worker, engine in zip(workers, sample.engines):
        alone = parse_engine_sample("sglang", (FIXTURES.parent / truth[worker]).read_text(), route(), 1.0).engines[0]
        assert (engine.running, engine.drafts, engine.generation_tokens) == (
            alone.running,
            alone.drafts,
            alone.generation_tokens,
        )
        assert engine.interval_acceptance_ratio == alone.interval_acceptance_ratio


def test_a_gateway_gives_each_workers_acceptance_and_their_sum_exactly():
    gateway = [fixture(name)[0] for name in SMG]
    truths = [fixture(name)[1] for name in SMG]
    workers = sorted(truths[0])
    own = {w: [(FIXTURES.parent / t[w]).read_text() for t in truths] for w in workers}
    totals = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0}
    for worker in workers:
        through = _tracked(gateway, match={"worker_addr": worker})
        direct = _tracked(own[worker])
        assert through.acceptance_ratio == direct.acceptance_ratio and through.acceptance_ratio
        assert through.mean_acceptance_length == direct.mean_acceptance_length
        assert (through.drafts_total, through.accepted_tokens_total) == (
            direct.drafts_total,
            direct.accepted_tokens_total,
        )
        first, last = (parse_engine_sample("sglang", text, route(), 0.0).engines[0] for text in own[worker])
        verify, generated = last.drafts - first.drafts, last.generation_tokens - first.generation_tokens
        totals["drafts"] += verify
        totals["draft_tokens"] += verify * 3  # spec_num_draft_tokens 4
        totals["accepted"] += generated - verify
    summed = _tracked(gateway)
    assert summed.acceptance_ratio["1m"] == totals["accepted"] / totals["draft_tokens"]
    assert summed.mean_acceptance_length["1m"] == 1.0 + totals["accepted"] / totals["drafts"]


def test_a_gateway_that_names_its_workers_by_another_label_is_split_by_the_routes_worker_label():
    text, truth = fixture(SMG[0])
    renamed = text.replace('worker_addr="', 'pod="')
    merged = parse_engine_sample("sglang", renamed, route(), 1.0)
    assert len(merged.engines) == 1, "without the label named, both workers' dp_rank 0 are one engine"
    split = parse_engine_sample("sglang", renamed, route(worker_label="pod"), 1.0)
    assert [e.engine for e in split.engines] == [f"{w}|0" for w in sorted(truth)]
    with pytest.raises(Exception, match="worker_label"):
        route(worker_label="not a label")


def tracked_shape(name):
    """The fixture's two scrapes through the source and a route tracker, 60 s apart; the fed truth of both."""
    from specwatch.tracking.routes import RouteTracker

    tracker, samples, truths = RouteTracker("r"), [], []
    for ts, suffix in ((1000.0, ""), (1060.0, "_scrape2")):
        text, truth = fixture(name + suffix)
        samples.append(parse_engine_sample("auto", text, route(engine="auto"), ts, version="0.5.23"))
        tracker.observe(samples[-1])
        truths.append(truth)
    return tracker, samples, truths


def test_an_eagle_tree_verifies_its_nodes_and_is_keyed_by_its_depth():
    # topk > 1: spec_num_draft_tokens 8 counts the tree's nodes (7 drafts and the root), spec_num_steps 3 its depth
    tracker, (first, second), (fed_a, fed_b) = tracked_shape("0.5.23_eagle_tree")
    assert (second.draft_length_basis, second.num_speculative_tokens) == ("tree", 3)
    (engine,) = second.engines
    assert engine.draft_length == 7, "draft tokens per verify: the tree's nodes, SGLang's own rate denominator"
    assert engine.interval_acceptance_ratio == pytest.approx(fed_b["scheduler"]["spec_accept_rate"])
    state = tracker.state()
    d = {key: fed_b["tokenizer"][key] - fed_a["tokenizer"][key] for key in fed_b["tokenizer"]}
    # accepted = generated - verify steps (each request's prefill token included, docs/engines.md §2.4)
    accepted = d["generation_tokens"] - d["spec_verify_calls"]
    assert accepted - d["accepted_tokens"] == 40, "one prefill token per finished request"
    assert state.acceptance_ratio["1m"] == pytest.approx(accepted / d["verified_draft_tokens"])
    assert state.draft_length == pytest.approx(7) and state.draft_length_basis == "tree"


def test_a_dspark_cap_is_the_verify_window_not_the_block():
    # DSpark: steps 1, spec_num_draft_tokens 8 (gamma 7 + 1); the cap verified fewer draft tokens per step
    tracker, (first, second), (fed_a, fed_b) = tracked_shape("0.5.23_dspark_cap")
    cap = fed_b["scheduler"]["spec_cap_length"]
    assert 2 < cap < 8
    assert (second.draft_length_basis, second.num_speculative_tokens, second.draft_length_varies) == (
        "dspark_cap",
        7,
        True,
    )
    (engine,) = second.engines
    assert engine.draft_length == pytest.approx(cap - 1)
    d = {key: fed_b["tokenizer"][key] - fed_a["tokenizer"][key] for key in fed_b["tokenizer"]}
    # the window's acceptance: accepted / draft tokens the cap verified, exactly as fed (accepted = generated -
    # verify steps, each request's prefill token included, docs/engines.md §2.4)
    accepted = d["generation_tokens"] - d["spec_verify_calls"]
    assert tracker.state().acceptance_ratio["1m"] == pytest.approx(accepted / d["verified_draft_tokens"])
    # the interval gauge, divided by the whole block in SGLang, is turned into the same definition
    scrape2 = (fed_b["scheduler"]["spec_accept_length"] - 1) / (cap - 1)
    assert engine.interval_acceptance_ratio == pytest.approx(scrape2)
    assert fed_b["scheduler"]["spec_accept_rate"] < engine.interval_acceptance_ratio


@pytest.mark.parametrize(
    "steps, n, cap, expected",
    [
        (3, 4, 0, (3, 3, "chain")),  # EAGLE topk 1
        (3, 8, 0, (7, 3, "tree")),  # EAGLE topk > 1
        (1, 12, 0, (11, 11, "block")),  # NGRAM's defaults (12 // 10 = 1 step) or a DFLASH/DSpark block
        (1, 8, 5.5, (4.5, 7, "dspark_cap")),
        (0, 1, 0, (0, None, "adaptive")),  # adaptive step 0
        (None, None, None, (None, None, "")),  # before 0.5.13: no tier gauges
    ],
)
def test_draft_shape_by_algorithm(steps, n, cap, expected):
    from specwatch.sources.sglang import DRAFT_LENGTH_BASES, draft_shape

    shape = draft_shape(steps, n, cap)
    assert (shape.draft_length, shape.k, shape.basis) == expected
    assert shape.basis in DRAFT_LENGTH_BASES or shape.basis == ""


def test_a_chain_route_says_chain():
    text, _ = fixture("0.5.23_dp2")
    sample = parse_engine_sample("sglang", text, route(), 1.0)
    assert (sample.draft_length_basis, sample.draft_length_varies) == ("chain", False)


def test_the_route_says_which_draft_length_it_used_in_api_and_status():
    from rich.console import Console

    from specwatch.commands.status import render_status
    from specwatch.export.http import routes_document
    from specwatch.snapshot import Snapshot

    tracker, _, _ = tracked_shape("0.5.23_eagle_tree")
    document = routes_document(Snapshot(timestamp=1060.0, routes=(tracker.state(),), nvml_up=True))
    assert document["routes"][0]["draft_length_basis"] == "tree"
    console = Console(width=200, record=True)
    console.print(render_status(document, 200))
    assert "7.0 tree" in console.export_text()


def test_the_server_info_tells_the_speculative_algorithm_and_draft_model_or_nothing():
    from specwatch.sources.sglang import speculative_of_server_info

    info = {"version": "0.5.23", "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/m/draft"}
    assert speculative_of_server_info(info) == ("EAGLE3", "/m/draft")
    assert speculative_of_server_info({"speculative_algorithm": "NGRAM", "speculative_draft_model_path": None}) == (
        "NGRAM",
        "",
    )
    for quiet in ({"speculative_algorithm": None}, {"speculative_algorithm": "NONE"}, {}, [], "x"):
        assert speculative_of_server_info(quiet) == ("", "")
