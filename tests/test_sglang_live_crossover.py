"""Live calibration of an SGLang route from `sglang:inter_token_latency_seconds`, as SGLang 0.5.23's own metric
code records it.

`tests/fixtures/sglang/0.5.23_itl_levels/` holds fifteen scrapes of SGLang 0.5.23's own collectors
(`TokenizerMetricsCollector.observe_inter_token_latency`, `observe_one_finished_request`,
`SchedulerMetricsCollector.log_stats`, rendered by `MultiProcessCollector` as the server does) fed by a
closed-loop engine stepping at batch 8, 16, 32, 64 and 128, three 20 s cycles each, with known true step times
(`tools/fixtures/capture/sglang_itl.py`; each scrape's `.truth.json` beside it). The fast path of
`observe_inter_token_latency` (srt/observability/metrics_collector.py:2161-2182) puts the interval into `_sum`
once and `num_new_tokens` into one bucket, so `_count` counts tokens; the interval is the time since the
request's previous output (`TokenizerManager.collect_metrics`, srt/managers/tokenizer_manager.py:3248-3258).
Each scrape goes through the SGLang source, the route tracker and the crossover evaluator of an `estimate:`
route, as in the daemon.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from specwatch.config import parse_config
from specwatch.crossover import gpus
from specwatch.crossover.inputs import Efficiency
from specwatch.crossover.speedup import LLAMA3_8B, Draft, StepModel, positions_from_alpha
from specwatch.evaluators.above_crossover import build_evaluator
from specwatch.evaluators.base import EvaluatorContext
from specwatch.sources.engines import parse_engine_sample
from specwatch.tracking.routes import RouteTracker

FIXTURE = Path(__file__).parent / "fixtures" / "sglang" / "0.5.23_itl_levels"
SCRAPES = sorted(FIXTURE.glob("*.prom"))
TRUTH = json.loads(SCRAPES[0].with_suffix(".truth.json").read_text(encoding="utf-8"))
ESTIMATE = {
    "gpu": "H200",
    "layers": 32,
    "hidden_size": 4096,
    "kv_heads": 8,
    "head_dim": 128,
    "params": 8.03,
    "draft": "eagle3",
    "context": 1024,
}


def scrapes() -> list[tuple[dict, str]]:
    """(what was fed up to it, exposition) of each captured scrape, in order."""
    return [
        (json.loads(p.with_suffix(".truth.json").read_text(encoding="utf-8"))["scrape"], p.read_text(encoding="utf-8"))
        for p in SCRAPES
    ]


def truth_model() -> StepModel:
    """The captured engine's true step times: the H200 row with the efficiency recorded at capture."""
    hardware, _ = gpus.lookup(TRUTH["truth_model"]["gpu"])
    known = {f.name for f in fields(Efficiency)}
    eff = Efficiency(**{k: v for k, v in TRUTH["truth_model"]["efficiency"].items() if k in known})
    return StepModel(LLAMA3_8B, hardware, eff, draft=Draft.parse("eagle3", LLAMA3_8B))


def test_fixture_is_sglangs_own_recording_with_the_true_step_times():
    """The header names the engine and its code; the recorded step times are the truth model's; each scrape's
    `_sum` and `_count` are the intervals and tokens fed in (`_count` counts tokens, not outputs)."""
    truth = truth_model()
    for level, seconds in TRUTH["spec_step_s"].items():
        assert seconds == pytest.approx(truth.spec_step_s(int(level), TRUTH["k"], TRUTH["context"]), rel=1e-9)
    captured = scrapes()
    assert len(captured) == TRUTH["scrapes"] == 15
    assert [fed["batch"] for fed, _ in captured] == [b for b in (8, 16, 32, 64, 128) for _ in range(3)]
    for fed, text in captured:
        assert "engine: sglang 0.5.23 (the engine's own metric code" in text
        assert "TokenizerMetricsCollector.observe_inter_token_latency" in text
        count = next(line for line in text.splitlines() if line.startswith("sglang:inter_token_latency_seconds_count"))
        total = next(line for line in text.splitlines() if line.startswith("sglang:inter_token_latency_seconds_sum"))
        assert float(count.split()[-1]) == pytest.approx(fed["itl_tokens"])
        assert float(total.split()[-1]) == pytest.approx(fed["itl_sum_s"], rel=1e-6)


def test_sglang_source_reads_the_per_token_latency_totals():
    """The source passes the histogram's `_sum` and `_count` (summed over label sets) on, marked per token,
    and a filtered /metrics asks for those sample names."""
    from specwatch.sources import sglang
    from specwatch.sources.engines import FILTER_NAMES

    fed, text = scrapes()[0]
    cfg = parse_config({"routes": [{"name": "chat", "url": "http://127.0.0.1:30000/metrics", "engine": "sglang"}]})
    sample = parse_engine_sample("sglang", text, cfg.routes[0], fed["t"])
    ((engine_id, totals),) = sample.step_time_totals.items()
    assert engine_id == "0" and totals.per_token and totals.steps is None
    assert totals.seconds == pytest.approx(fed["itl_sum_s"], rel=1e-6)
    assert totals.observations == pytest.approx(fed["itl_tokens"])
    assert sglang.STEP_TIME + "_sum" in FILTER_NAMES and sglang.STEP_TIME + "_count" in FILTER_NAMES


@pytest.mark.slow
def test_sglang_route_gets_a_live_crossover():
    """Fed SGLang's own recording at five batch sizes, the route's live calibration bins each level's steps at
    the engine's true step time (not per token) and finds the true B*, which the prior misses by over 20%."""
    truth = truth_model()
    positions = positions_from_alpha(TRUTH["alpha"], TRUTH["k"])
    true_b_star = truth.crossover(positions, TRUTH["context"])
    cfg = parse_config(
        {
            "routes": [
                {
                    "name": "chat",
                    "url": "http://127.0.0.1:30000/metrics",
                    "engine": "sglang",
                    # The simulated engine's step times are the H200 table's, whose verify is unpacked.
                    "crossover": {"estimate": ESTIMATE, "hold": "1m", "attention_kernel": "unpacked"},
                }
            ]
        }
    )
    route = cfg.routes[0]
    evaluator = build_evaluator(EvaluatorContext(config=cfg, clock=lambda: 0.0), route)
    prior = evaluator.source.model.crossover(positions, TRUTH["context"])
    assert true_b_star is not None and prior is not None and abs(prior / true_b_star - 1) > 0.2
    tracker = RouteTracker("chat")
    update: dict = {}
    for fed, text in scrapes():
        sample = parse_engine_sample("sglang", text, route, fed["t"])
        update = evaluator.evaluate(tracker.observe(sample), [])
    assert evaluator.live is not None
    observed = evaluator.live.observed()
    for level, seconds in TRUTH["spec_step_s"].items():
        batch, measured, _ = min(observed, key=lambda o: abs(o[0] - int(level)))
        assert batch == pytest.approx(int(level), rel=0.1)
        assert measured == pytest.approx(seconds, rel=0.1)
    live = update["live_crossover_batch_size"]
    assert live is not None and live == pytest.approx(true_b_star, rel=0.2)
    assert update["live_crossover_lower"] <= live <= update["live_crossover_upper"]
    assert update["crossover_flag_source"] == "live" and update["live_crossover_bins"] >= len(TRUTH["spec_step_s"])
