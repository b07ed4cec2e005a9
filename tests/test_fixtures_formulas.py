"""Acceptance figures computed from two fixture scrapes equal vLLM's own formulas on the counters fed in.

vLLM's formulas (docs/engines.md §1.2, SpecDecodingLogging.log()): over a window, summed across engines
before dividing, r = Δaccepted / Δdraft_tokens, τ = 1 + Δaccepted / Δdrafts, p_j = Δper_pos[j] / Δdrafts,
K = Δdraft_tokens / Δdrafts. The truth sidecars hold the exact counters the capture fed vLLM's stat logger.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwatch.config import parse_config
from specwatch.sources.engines import parse_engine_sample

FIXTURES = Path(__file__).parent / "fixtures"
ROUTE = parse_config(
    {"gpu": {"enabled": "false"}, "routes": [{"name": "r", "url": "http://127.0.0.1:9/metrics"}]}
).routes[0]


def scrape(name):
    body = (FIXTURES / f"{name}.prom").read_bytes()
    return parse_engine_sample("auto", body, ROUTE, 0.0), json.loads((FIXTURES / f"{name}.truth.json").read_text())


def vllm_formulas(first: dict, second: dict) -> dict:
    """vLLM's formulas over the fed counters of all engines (the reference side)."""

    def delta(key):
        return sum(second[e][key] - first[e][key] for e in second)

    drafts, draft_tokens, accepted = delta("drafts"), delta("draft_tokens"), delta("accepted_tokens")
    k = next(iter(second.values()))["k"]
    per_pos = [
        sum(second[e]["accepted_per_pos"][j] - first[e]["accepted_per_pos"][j] for e in second) for j in range(k)
    ]
    return {
        "r": accepted / draft_tokens,
        "tau": 1 + accepted / drafts,
        "p": [x / drafts for x in per_pos],
        "K": draft_tokens / drafts,
    }


def from_samples(first, second) -> dict:
    """The same figures from what the source extracted (the side under test)."""

    def delta(field):
        return sum(getattr(b, field) - getattr(a, field) for a, b in zip(first.engines, second.engines))

    drafts, draft_tokens, accepted = delta("drafts"), delta("draft_tokens"), delta("accepted_tokens")
    k = second.num_speculative_tokens
    per_pos = [
        sum(b.accepted_per_pos[j] - a.accepted_per_pos[j] for a, b in zip(first.engines, second.engines))
        for j in range(k)
    ]
    return {
        "r": accepted / draft_tokens,
        "tau": 1 + accepted / drafts,
        "p": [x / drafts for x in per_pos],
        "K": draft_tokens / drafts,
    }


@pytest.mark.parametrize(
    "name", ["vllm/v1_k4_2engines", "vllm/v1_k1_1engine", "vllm/0.34.0_v1_k4_2engines", "vllm/0.34.0_v1_k1_1engine"]
)
def test_window_figures_match_vllm_formulas_on_the_fed_counters(name):
    (a, truth_a), (b, truth_b) = scrape(name), scrape(f"{name}_scrape2")
    expected = vllm_formulas(truth_a, truth_b)
    got = from_samples(a, b)
    assert got["r"] == pytest.approx(expected["r"], rel=1e-12)
    assert got["tau"] == pytest.approx(expected["tau"], rel=1e-12)
    assert got["p"] == pytest.approx(expected["p"], rel=1e-12)
    assert got["K"] == pytest.approx(b.num_speculative_tokens)
    # sanity of the synthetic traffic itself: positions non-increasing, Σ p_j = τ - 1, 1 <= τ <= k + 1
    assert all(x >= y for x, y in zip(got["p"], got["p"][1:]))
    assert sum(got["p"]) == pytest.approx(got["tau"] - 1)
    assert 1 <= got["tau"] <= b.num_speculative_tokens + 1


def test_engines_are_summed_before_dividing_not_averaged():
    (a, truth_a), (b, truth_b) = scrape("vllm/v1_k4_2engines"), scrape("vllm/v1_k4_2engines_scrape2")
    pooled = from_samples(a, b)["r"]
    per_engine = [
        (y.accepted_tokens - x.accepted_tokens) / (y.draft_tokens - x.draft_tokens)
        for x, y in zip(a.engines, b.engines)
    ]
    assert min(per_engine) <= pooled <= max(per_engine)
    assert pooled == pytest.approx(vllm_formulas(truth_a, truth_b)["r"])


def test_sglang_counter_accept_length_matches_the_fed_requests():
    (a, truth_a), (b, truth_b) = scrape("sglang/0.5.23_dp2"), scrape("sglang/0.5.23_dp2_scrape2")
    d_verify = b.engines[0].drafts - a.engines[0].drafts
    d_generated = b.engines[0].generation_tokens - a.engines[0].generation_tokens
    fed = {
        key: sum(truth_b["tokenizer"][r][key] - truth_a["tokenizer"][r][key] for r in truth_b["tokenizer"])
        for key in ("spec_verify_calls", "generation_tokens")
    }
    assert (d_verify, d_generated) == (fed["spec_verify_calls"], fed["generation_tokens"])
    # SGLang's own accept length (completion_tokens / spec_verify_ct): per request it includes one prefill
    # token, so over many requests it sits just above the per-verify mean of the gauges.
    length = d_generated / d_verify
    gauge = sum(e.interval_acceptance_length for e in b.engines) / len(b.engines)
    assert 1 <= length <= b.num_speculative_tokens + 1 + 0.05
    assert length == pytest.approx(gauge, abs=0.15)
