"""Live calibration of an SGLang route from `sglang:inter_token_latency_seconds`, recorded the way SGLang 0.5.23
records it.

`SGLangITL` below is derived verbatim from SGLang 0.5.23: `TokenizerMetricsCollector.observe_inter_token_latency`
(srt/observability/metrics_collector.py:2161-2182, its prometheus_client fast path: the interval goes into
`_sum` once, `num_new_tokens` into one bucket, so `_count` counts tokens) and the ITL branch of
`TokenizerManager.collect_metrics` (srt/managers/tokenizer_manager.py:3248-3258: interval since the request's
previous output, tokens since then, then the new baseline; the first output sets the baseline, :2740). The
buckets are 0.5.23's defaults (metrics_collector.py:2014). A simulated engine steps a closed-loop batch with a
"true" step-time model; every `STREAM_INTERVAL` steps a request's output reaches the tokenizer (SGLang's
--stream-interval). Its /metrics text goes through the real SGLang source, the route tracker and the crossover
evaluator of an `estimate:` route, as in the daemon.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specwatch.config import parse_config
from specwatch.crossover import gpus
from specwatch.crossover.speedup import LLAMA3_8B, Draft, StepModel, positions_from_alpha
from specwatch.evaluators.above_crossover import build_evaluator
from specwatch.evaluators.base import EvaluatorContext
from specwatch.sources.engines import parse_engine_sample
from specwatch.tracking.routes import RouteTracker

K, ALPHA = 3, 0.7
LEVELS = (8, 16, 32, 64, 128)
CYCLE = 20.0
CYCLES_PER_LEVEL = 3
STREAM_INTERVAL = 8
REQUEST_STEPS = 64  # verify steps per request before it finishes and a new one takes its place
BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100]
BUCKETS += [0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000]
LABELS = {"model_name": "llama", "engine_type": "unified", "priority": ""}
SCHEDULER = {**LABELS, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}


class SGLangITL:
    """SGLang 0.5.23's inter-token latency recording (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.histogram_inter_token_latency = Histogram(
            name="sglang:inter_token_latency_seconds",
            documentation="Histogram of inter-token latency in seconds.",
            labelnames=LABELS.keys(),
            buckets=BUCKETS,
            registry=registry,
        )

    def observe_inter_token_latency(self, labels: dict, internval: float, num_new_tokens: int) -> None:
        if num_new_tokens <= 0:
            return
        adjusted_interval = internval / num_new_tokens
        his = self.histogram_inter_token_latency.labels(**labels)
        his._sum.inc(internval)
        for i, bound in enumerate(his._upper_bounds):
            if adjusted_interval <= bound:
                his._buckets[i].inc(num_new_tokens)
                break


class SimSGLang:
    """A closed-loop SGLang engine (DP 1) whose speculative steps last `truth.spec_step_s(batch, K)`."""

    def __init__(self, truth: StepModel, seed: int = 1) -> None:
        self.truth = truth
        self.rng = random.Random(seed)
        self.registry = CollectorRegistry()
        self.itl = SGLangITL(self.registry)
        self.running = self._gauge("sglang:num_running_reqs")
        self.accept_length = self._gauge("sglang:spec_accept_length")
        self.num_steps = self._gauge("sglang:spec_num_steps")
        self.draft_tokens = self._gauge("sglang:spec_num_draft_tokens")
        self.verify_calls = Counter("sglang:spec_verify_calls", "", LABELS.keys(), registry=self.registry)
        self.generation = Counter("sglang:generation_tokens", "", LABELS.keys(), registry=self.registry)
        self.now = 0.0
        self.requests: list[dict] = []
        self._step_s: dict[int, float] = {}

    def _gauge(self, name: str) -> Gauge:
        return Gauge(name, name, SCHEDULER.keys(), registry=self.registry)

    def _new_request(self) -> dict:
        return {"last_time": self.now, "last_tokens": 0, "tokens": 0, "steps": 0}

    def advance(self, until: float, batch: int) -> None:
        while len(self.requests) < batch:
            self.requests.append(self._new_request())
        del self.requests[batch:]
        accepted_total = steps_total = 0
        while self.now < until:
            if batch not in self._step_s:
                self._step_s[batch] = self.truth.spec_step_s(batch, K, 1024.0)
            self.now += self._step_s[batch]
            for i, req in enumerate(self.requests):
                accepted = 0
                while accepted < K and self.rng.random() < ALPHA:
                    accepted += 1
                req["tokens"] += accepted + 1
                req["steps"] += 1
                accepted_total, steps_total = accepted_total + accepted, steps_total + 1
                if req["steps"] % STREAM_INTERVAL == 0 or req["steps"] == REQUEST_STEPS:
                    # TokenizerManager.collect_metrics: the interval since this request's previous output
                    self.itl.observe_inter_token_latency(
                        LABELS, self.now - req["last_time"], req["tokens"] - req["last_tokens"]
                    )
                    req["last_time"], req["last_tokens"] = self.now, req["tokens"]
                if req["steps"] == REQUEST_STEPS:
                    self.verify_calls.labels(**LABELS).inc(req["steps"])
                    self.generation.labels(**LABELS).inc(req["tokens"])
                    self.requests[i] = self._new_request()
        self.running.labels(**SCHEDULER).set(batch)
        self.accept_length.labels(**SCHEDULER).set(1 + accepted_total / max(1, steps_total))
        self.num_steps.labels(**SCHEDULER).set(K)
        self.draft_tokens.labels(**SCHEDULER).set(K + 1)

    def render(self) -> str:
        return generate_latest(self.registry).decode()


def truth_model() -> StepModel:
    """An engine whose weights stream at 0.6 of the shipped H200 calibration's rate (its B* is about 50% later):
    what live calibration is for."""
    hardware, eff = gpus.lookup("H200")
    slower = replace(eff, memory=0.6 * eff.memory)
    return StepModel(LLAMA3_8B, hardware, slower, draft=Draft.parse("eagle3", LLAMA3_8B))


def test_sglang_histogram_counts_tokens_and_sums_intervals():
    """The recording this source relies on: `_count` grows by tokens, `_sum` by the wall time between outputs."""
    registry = CollectorRegistry()
    itl = SGLangITL(registry)
    itl.observe_inter_token_latency(LABELS, 0.09, 3)  # one step of 30 ms yielding 3 tokens
    itl.observe_inter_token_latency(LABELS, 0.05, 2)
    text = generate_latest(registry).decode()
    assert 'sglang:inter_token_latency_seconds_count{engine_type="unified",model_name="llama",priority=""} 5.0' in text
    assert 'sglang:inter_token_latency_seconds_sum{engine_type="unified",model_name="llama",priority=""} 0.14' in text


@pytest.mark.slow
def test_sglang_route_gets_a_live_crossover():
    truth = truth_model()
    positions = positions_from_alpha(ALPHA, K)
    true_b_star = truth.crossover(positions, 1024.0)
    cfg = parse_config(
        {
            "routes": [
                {
                    "name": "chat",
                    "url": "http://127.0.0.1:30000/metrics",
                    "engine": "sglang",
                    "crossover": {
                        "estimate": {
                            "gpu": "H200",
                            "layers": 32,
                            "hidden_size": 4096,
                            "kv_heads": 8,
                            "head_dim": 128,
                            "params": 8.03,
                            "draft": "eagle3",
                            "context": 1024,
                        },
                        "hold": "1m",
                    },
                }
            ]
        }
    )
    route = cfg.routes[0]
    evaluator = build_evaluator(EvaluatorContext(config=cfg, clock=lambda: 0.0), route)
    prior = evaluator.source.model.crossover(positions, 1024.0)
    assert true_b_star is not None and prior is not None and abs(prior / true_b_star - 1) > 0.2
    engine = SimSGLang(truth)
    tracker = RouteTracker("chat")
    t, update = 0.0, {}
    for level in LEVELS:
        for _ in range(CYCLES_PER_LEVEL):
            t += CYCLE
            engine.advance(t, level)
            sample = parse_engine_sample("sglang", engine.render(), route, t)
            update = evaluator.evaluate(tracker.observe(sample), [])
    assert evaluator.live is not None
    observed = evaluator.live.observed()
    # Every level's steps landed in the bin of its own batch, at the engine's step time (not per token).
    for level in LEVELS:
        batch, seconds, _ = min(observed, key=lambda o: abs(o[0] - level))
        assert batch == pytest.approx(level, rel=0.1)
        assert seconds == pytest.approx(truth.spec_step_s(level, K, 1024.0), rel=0.1)
    live = update["live_crossover_batch_size"]
    assert live is not None and live == pytest.approx(true_b_star, rel=0.2)
    assert update["live_crossover_lower"] <= live <= update["live_crossover_upper"]


def test_sglang_source_reads_the_per_token_latency_totals():
    """The source passes the histogram's `_sum` and `_count` (summed over label sets) on, marked per token,
    and a filtered /metrics asks for those sample names."""
    from specwatch.sources import sglang
    from specwatch.sources.engines import FILTER_NAMES

    engine = SimSGLang(truth_model())
    engine.advance(5.0, 4)
    cfg = parse_config({"routes": [{"name": "chat", "url": "http://127.0.0.1:30000/metrics", "engine": "sglang"}]})
    sample = parse_engine_sample("sglang", engine.render(), cfg.routes[0], 5.0)
    ((engine_id, totals),) = sample.step_time_totals.items()
    histogram = engine.itl.histogram_inter_token_latency.labels(**LABELS)
    assert engine_id == "0" and totals.per_token and totals.steps is None
    assert totals.seconds == pytest.approx(histogram._sum.get())
    assert totals.observations == pytest.approx(sum(b.get() for b in histogram._buckets))
    assert sglang.STEP_TIME + "_sum" in FILTER_NAMES and sglang.STEP_TIME + "_count" in FILTER_NAMES
