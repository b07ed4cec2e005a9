"""SGLang `/metrics` for a simulated server, as SGLang 0.5.23 exposes it.

SGLang always renders in prometheus_client multiprocess mode: no `_created` series, and gauges declared
without a multiprocess mode carry a `pid` label. Two sides feed it, and the simulator keeps their timing:
- **scheduler** gauges (per DP rank) are set once per `--decode-log-interval` decode steps (default 40);
  the speculative gauges are batch-weighted averages over that interval and keep their last value when idle;
- **tokenizer** counters and histograms move when a request finishes (`spec_verify_calls_total` grows by the
  request's verify steps then), so they lag a running request.

A custom collector renders the families from plain numbers (prometheus_client's own metric objects would
add `_created`). The family table is data, checked against the captured SGLang fixture by
`tests/test_simulator_formats.py`.
"""

from __future__ import annotations

import bisect
import os
import threading
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from specwatch.simulator.engine import SimRequest, StepRecord

ENGINE_VERSION = "0.5.23"
DECODE_LOG_INTERVAL = 40
SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "dp_rank", "moe_ep_rank")
TOKENIZER_LABELS = ("model_name", "engine_type")
_TTFT = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
_E2E = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0,
        600.0, 1200.0, 1800.0, 2400.0)
_ITL = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100, 0.200,
        0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)


@dataclass(frozen=True)
class Family:
    name: str  # exposed name (counters with their _total)
    kind: str  # counter | gauge | histogram
    help: str
    side: str  # scheduler | tokenizer
    extra_labels: tuple[str, ...] = ()
    pid_label: bool = False  # a gauge without multiprocess_mode: prometheus_client adds `pid`
    buckets: tuple[float, ...] = ()


FAMILIES: tuple[Family, ...] = (
    # scheduler side, set at each decode log tick
    Family("sglang:num_running_reqs", "gauge", "The number of running requests.", "scheduler"),
    Family("sglang:num_used_tokens", "gauge", "The number of used tokens.", "scheduler"),
    Family("sglang:token_usage", "gauge", "The token usage.", "scheduler"),
    Family("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", "scheduler"),
    Family("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", "scheduler"),
    Family("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", "scheduler"),
    Family("sglang:max_total_num_tokens", "gauge", "Maximum total number of tokens in the KV cache pool.",
           "scheduler"),
    Family("sglang:spec_accept_length", "gauge",
           "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
           "scheduler"),
    Family("sglang:spec_accept_rate", "gauge",
           "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).", "scheduler"),
    Family("sglang:spec_num_steps", "gauge", "Currently active speculative_num_steps.", "scheduler"),
    Family("sglang:spec_num_draft_tokens", "gauge",
           "Currently active speculative_num_draft_tokens (decouples from steps under topk>1).", "scheduler"),
    Family("sglang:num_retracted_reqs", "gauge", "The number of retracted requests.", "scheduler", pid_label=True),
    Family("sglang:num_paused_reqs", "gauge", "The number of paused requests by async weight sync.", "scheduler",
           pid_label=True),
    Family("sglang:realtime_tokens_total", "counter",
           "Total number of tokens processed (updated on each log interval). "
           "mode: prefill_compute, prefill_cache, decode.", "scheduler", ("mode",)),
    # tokenizer side, at request completion
    Family("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", "tokenizer",
           ("is_streaming",)),
    Family("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.", "tokenizer",
           ("is_streaming",)),
    Family("sglang:num_requests_total", "counter", "Number of requests processed.", "tokenizer", ("is_streaming",)),
    Family("sglang:num_aborted_requests_total", "counter", "Number of requests aborted.", "tokenizer"),
    Family("sglang:spec_verify_calls_total", "counter", "Number of speculative decoding verification calls.",
           "tokenizer"),
    Family("sglang:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.",
           "tokenizer", ("is_streaming",), buckets=_TTFT),
    Family("sglang:e2e_request_latency_seconds", "histogram", "Histogram of End-to-end request latency in seconds",
           "tokenizer", ("is_streaming",), buckets=_E2E),
    Family("sglang:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.",
           "tokenizer", buckets=_ITL),
)


class _Hist:
    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), float(running)))
        return out


@dataclass
class _Interval:
    """Accumulates one DP rank's decode steps until the next log tick."""

    steps: int = 0
    seconds: float = 0.0
    emitted: int = 0
    prompt: int = 0
    drafts: int = 0  # request-verify pairs
    accepted: int = 0


@dataclass
class _RankState:
    gauges: dict[str, float] = field(default_factory=dict)
    realtime: dict[str, float] = field(default_factory=lambda: {"prefill_compute": 0.0, "prefill_cache": 0.0,
                                                                "decode": 0.0})
    interval: _Interval = field(default_factory=_Interval)


class SglangMetrics:
    """The `Recorder` of a simulated SGLang server with `dp` ranks. Thread-safe."""

    def __init__(self, model_name: str, dp: int, k: int, *, kv_capacity_tokens: int = 400_000,
                 log_interval: int = DECODE_LOG_INTERVAL) -> None:
        self.dp = dp
        self.log_interval = log_interval
        self._kv_capacity = kv_capacity_tokens
        self._lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self.reset(model_name, k)

    def reset(self, model_name: str | None = None, k: int | None = None) -> None:
        with self._lock:
            if model_name is not None:
                self.model_name = model_name
            if k is not None:
                self.k = k
            self._ranks = [self._fresh_rank() for _ in range(self.dp)]
            self._counters: dict[tuple[str, tuple[str, ...]], float] = {}
            self._hists: dict[tuple[str, tuple[str, ...]], _Hist] = {}

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ------------------------------------------------------------------ Recorder
    def on_step(self, engine: int, step: StepRecord) -> None:
        with self._lock:
            rank = self._ranks[engine]
            iv = rank.interval
            iv.steps += 1
            iv.seconds += step.duration
            iv.emitted += step.emitted_tokens
            iv.prompt += step.prompt_tokens
            iv.drafts += step.drafts
            iv.accepted += step.accepted_tokens
            if iv.steps >= self.log_interval:
                self._log_tick(rank, step)

    def on_finish(self, engine: int, request: SimRequest, now: float) -> None:
        with self._lock:
            if request.finish_reason == "abort":
                self._inc("sglang:num_aborted_requests_total", ())
                return
            streaming = "false" if request.internal else "true"
            self._inc("sglang:prompt_tokens_total", (streaming,), request.prompt_tokens)
            self._inc("sglang:generation_tokens_total", (streaming,), request.generated)
            self._inc("sglang:num_requests_total", (streaming,))
            if self.k:
                self._inc("sglang:spec_verify_calls_total", (), request.verify_steps)
            first = request.first_token_at if request.first_token_at is not None else now
            self._observe("sglang:time_to_first_token_seconds", (streaming,), first - request.arrival)
            self._observe("sglang:e2e_request_latency_seconds", (streaming,), now - request.arrival)
            if request.generated > 1:
                self._observe("sglang:inter_token_latency_seconds", (), (now - first) / (request.generated - 1))

    # ------------------------------------------------------------------ Collector
    def collect(self):
        with self._lock:
            ranks = [(r.gauges.copy(), r.realtime.copy()) for r in self._ranks]
            counters = dict(self._counters)
            hists = {key: (h.cumulative(), h.total) for key, h in self._hists.items()}
            model = self.model_name
        pid = str(os.getpid())
        for fam in FAMILIES:
            if fam.side == "scheduler":
                labels = [*SCHEDULER_LABELS, *fam.extra_labels] + (["pid"] if fam.pid_label else [])
                metric = _family(fam, labels)
                for dp_rank, (gauges, realtime) in enumerate(ranks):
                    base = [model, "unified", "0", "0", str(dp_rank), "0"]
                    if fam.name == "sglang:realtime_tokens_total":
                        for mode, value in realtime.items():
                            metric.add_metric(base + [mode], value)
                    elif fam.name in gauges:
                        metric.add_metric(base + ([pid] if fam.pid_label else []), gauges[fam.name])
            else:
                metric = _family(fam, [*TOKENIZER_LABELS, *fam.extra_labels])
                for (name, extra), value in sorted(counters.items()):
                    if name == fam.name:
                        metric.add_metric([model, "unified", *extra], value)
                for (name, extra), (buckets, total) in sorted(hists.items()):
                    if name == fam.name:
                        metric.add_metric([model, "unified", *extra], buckets, total)
            if metric.samples:
                yield metric

    # ------------------------------------------------------------------ helpers (lock held)
    def _fresh_rank(self) -> _RankState:
        rank = _RankState()
        rank.gauges.update({"sglang:num_running_reqs": 0.0, "sglang:num_used_tokens": 0.0,
                            "sglang:token_usage": 0.0, "sglang:gen_throughput": 0.0,
                            "sglang:num_queue_reqs": 0.0, "sglang:cache_hit_rate": 0.0,
                            "sglang:max_total_num_tokens": float(self._kv_capacity),
                            "sglang:spec_accept_length": 0.0, "sglang:spec_accept_rate": 0.0,
                            "sglang:spec_num_steps": float(self.k),
                            "sglang:spec_num_draft_tokens": float(self.k + 1 if self.k else 0),
                            "sglang:num_retracted_reqs": 0.0, "sglang:num_paused_reqs": 0.0})
        return rank

    def _log_tick(self, rank: _RankState, step: StepRecord) -> None:
        iv, g = rank.interval, rank.gauges
        g["sglang:num_running_reqs"] = float(step.running)
        g["sglang:num_queue_reqs"] = float(step.waiting)
        g["sglang:token_usage"] = step.kv_usage
        g["sglang:num_used_tokens"] = round(step.kv_usage * self._kv_capacity)
        g["sglang:gen_throughput"] = iv.emitted / iv.seconds if iv.seconds > 0 else 0.0
        if self.k and iv.drafts:
            # Batch-weighted over the interval; >= 0.5.13 the rate excludes the bonus token.
            g["sglang:spec_accept_length"] = (iv.accepted + iv.drafts) / iv.drafts
            g["sglang:spec_accept_rate"] = iv.accepted / (iv.drafts * self.k)
        rank.realtime["prefill_compute"] += iv.prompt
        rank.realtime["decode"] += iv.emitted
        rank.interval = _Interval()

    def _inc(self, name: str, extra: tuple[str, ...], amount: float = 1.0) -> None:
        self._counters[(name, extra)] = self._counters.get((name, extra), 0.0) + amount

    def _observe(self, name: str, extra: tuple[str, ...], value: float) -> None:
        key = (name, extra)
        hist = self._hists.get(key)
        if hist is None:
            bounds = next(f.buckets for f in FAMILIES if f.name == name)
            hist = self._hists[key] = _Hist(bounds)
        hist.observe(value)


def _family(fam: Family, labels: list[str]):
    if fam.kind == "counter":
        return CounterMetricFamily(fam.name, fam.help, labels=labels)
    if fam.kind == "gauge":
        return GaugeMetricFamily(fam.name, fam.help, labels=labels)
    return HistogramMetricFamily(fam.name, fam.help, labels=labels)
