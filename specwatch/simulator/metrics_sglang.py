"""SGLang `/metrics` for a simulated server, as SGLang 0.5.23 exposes it.

SGLang always renders in prometheus_client multiprocess mode: no `_created` series, and gauges declared
without a multiprocess mode carry a `pid` label. Two sides feed it, and the simulator keeps their timing:
- **scheduler** series, one set per scheduler (`dp_rank` when DP > 1, `tp_rank` for each TP rank that reports),
  are set once per `--decode-log-interval` decode steps (default 40); the speculative gauges are
  batch-weighted averages over that interval and keep their last value when idle;
- **tokenizer** series (no rank labels; the allowed custom labels such as `route` instead) move when a request
  finishes: `spec_verify_calls_total` grows by the request's verify steps then, so it lags running requests.

A custom collector renders the families from plain numbers (prometheus_client's own metric objects would add
`_created`). The family table is data: names, types, HELP and labels as captured from SGLang 0.5.23's own
metric code in `tests/fixtures/sglang/`, which `tests/test_simulator_formats.py` checks it against. Features
the simulator has no model for (hierarchical cache, SWA/Mamba pools, PD disaggregation queues, routing keys,
grammar) are exported at 0, as a real server with them idle does.
"""

from __future__ import annotations

import bisect
import os
import threading
from dataclasses import dataclass, field
from typing import Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from specwatch.simulator.engine import SimRequest, StepRecord

ENGINE_VERSION = "0.5.23"
DECODE_LOG_INTERVAL = 40
CUDA_GRAPH_MAX_BATCH = 160  # above this SGLang runs decode eagerly
NEW_TOKEN_RATIO = 0.7  # SGLang's initial new-token ratio; the simulator never retracts, so it never moves

_E2E = (
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
    10.0,
    20.0,
    40.0,
    60.0,
    80.0,
    100.0,
    200.0,
    400.0,
    600.0,
    1200.0,
    1800.0,
    2400.0,
)
_TTFT = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
_TPOT = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.010,
    0.015,
    0.020,
    0.025,
    0.030,
    0.035,
    0.040,
    0.060,
    0.080,
    0.100,
    0.200,
    0.400,
    0.600,
    0.800,
    1.000,
    2.000,
    4.000,
    6.000,
    8.000,
)
_TOKENS = (
    100,
    300,
    500,
    700,
    1000,
    1500,
    2000,
    3000,
    4000,
    5000,
    6000,
    7000,
    8000,
    9000,
    10000,
    12500,
    15000,
    17500,
    20000,
    22500,
    25000,
    27500,
    30000,
    35000,
    40000,
    60000,
    80000,
    100000,
    200000,
    300000,
    400000,
    600000,
    800000,
    1000000,
    1100000,
)
_IMBALANCE = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0)
_SYNC_WAIT = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_ROUTING_BUCKETS = (
    ("0", "1"),
    ("1", "2"),
    ("2", "3"),
    ("3", "5"),
    ("5", "7"),
    ("7", "10"),
    ("10", "20"),
    ("20", "50"),
    ("50", "100"),
    ("100", "200"),
    ("200", "+Inf"),
)
_STAGES = (
    "recv_requests",
    "process_input_requests",
    "get_next_batch_to_run",
    "run_batch",
    "process_batch_result",
    "process_queue",
    "sanity_check_cache",
    "idle",
    "other",
)


@dataclass(frozen=True)
class Family:
    name: str  # exposed name (counters with their _total)
    kind: str  # counter | gauge | histogram
    help: str
    side: str  # scheduler | tokenizer
    extra_labels: tuple[str, ...] = ()
    series: tuple[tuple[str, ...], ...] = ((),)  # extra-label values created up front (at 0)
    pid_label: bool = False  # a gauge declared without multiprocess_mode: prometheus_client adds `pid`
    buckets: tuple[float, ...] = ()


def _g(name: str, help_: str, **kw) -> Family:
    return Family(name, "gauge", help_, "scheduler", **kw)


FAMILIES: tuple[Family, ...] = (
    # ---- scheduler side: histograms and counters, observed at each log tick
    Family(
        "sglang:dp_attention_token_imbalance_ratio",
        "histogram",
        "Per MLP-sync step, max tokens over mean tokens across the DP ranks (1.0 = balanced, num_dp_ranks = one "
        "busy rank). Reported once per engine, by the scheduler of DP rank 0.",
        "scheduler",
        buckets=_IMBALANCE,
    ),
    Family(
        "sglang:dp_attention_sync_wait_seconds",
        "histogram",
        "Wall time of this DP rank's scheduler MLP-sync all-gather per step. On the gloo path (the default with "
        "overlap scheduling) this is waiting for the slowest rank; on the device-group paths it also includes "
        "the gather's stream sync.",
        "scheduler",
        buckets=_SYNC_WAIT,
    ),
    Family(
        "sglang:prefill_effective_tokens_total",
        "counter",
        "Effective prefill tokens with retracted-request re-counts excluded, updated on each log interval. mode: "
        "device_hit, host_hit, storage_hit, input. Windowed prefix cache hit rate = rate(sum of *_hit) / "
        "rate(sum of all modes); per-tier rate uses a single *_hit mode in the numerator.",
        "scheduler",
        ("mode",),
        (("device_hit",), ("host_hit",), ("storage_hit",), ("input",)),
    ),
    Family(
        "sglang:scheduler_idle_seconds_total",
        "counter",
        "Total wall time while the scheduler has no runnable or queued work.",
        "scheduler",
    ),
    Family(
        "sglang:scheduler_process_cpu_seconds_total",
        "counter",
        "Total CPU time consumed by the scheduler process across all threads.",
        "scheduler",
    ),
    Family(
        "sglang:scheduler_stage_seconds_total",
        "counter",
        "Total scheduler-loop wall time exclusively attributed to each stage. forward_overlap (full, partial, "
        "none): full=both endpoints active, partial=one, none=no observed overlap (including unavailable "
        "timing). Not exact overlapped/exposed seconds.",
        "scheduler",
        ("category", "forward_overlap"),
        tuple((stage, "none") for stage in _STAGES),
    ),
    Family(
        "sglang:dp_attention_tokens_total",
        "counter",
        "Tokens of MLP-sync steps on this DP rank. kind=scheduled: tokens this rank ran; kind=imbalance: tokens "
        "the busiest rank ran beyond this rank, i.e. capacity lost to DP imbalance on this rank. On "
        "speculative-decode steps the unit is batch rows (requests).",
        "scheduler",
        ("kind",),
        (("scheduled",), ("imbalance",)),
    ),
    Family(
        "sglang:dp_attention_steps_total",
        "counter",
        "MLP-sync steps on this DP rank. rank_state=idle: this rank had no tokens and only ran to keep the DP "
        "collectives in lockstep.",
        "scheduler",
        ("rank_state",),
        (("active",), ("idle",)),
    ),
    Family(
        "sglang:dp_attention_pairs_total",
        "counter",
        "Causal (query, key) pairs attended by MLP-sync steps on this DP rank, pricing every layer as full "
        "attention: a decode row reads its sequence, a prefill chunk its prefix plus the pairs within the chunk. "
        "kind=scheduled: this rank; kind=imbalance: the busiest rank's excess over this rank. The context-length "
        "counterpart of sglang:dp_attention_tokens_total; like it, speculative-decode steps count one query per "
        "row. Sliding-window layers execute fewer pairs than counted, so on hybrid-SWA models long rows are "
        "overstated.",
        "scheduler",
        ("kind",),
        (("scheduled",), ("imbalance",)),
    ),
    # ---- scheduler side: gauges, set at each log tick
    _g("sglang:num_running_reqs", "The number of running requests."),
    _g("sglang:num_queue_reqs", "The number of requests in the waiting queue."),
    _g("sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue."),
    _g("sglang:gen_throughput", "The generation throughput (token/s)."),
    _g("sglang:cache_hit_rate", "The prefix cache hit rate."),
    _g("sglang:decode_sum_seq_lens", "The sum of all sequence lengths in decode."),
    _g("sglang:token_usage", "The token usage."),
    _g("sglang:full_token_usage", "The token usage for full attention layers."),
    _g("sglang:swa_token_usage", "The token usage for SWA layers."),
    _g("sglang:mamba_usage", "The token usage for Mamba layers."),
    _g("sglang:num_used_tokens", "The number of used tokens."),
    _g("sglang:kv_available_tokens", "Number of free token slots in the KV cache pool."),
    _g("sglang:kv_evictable_tokens", "Number of evictable (radix-cached) token slots in the KV cache pool."),
    _g("sglang:kv_used_tokens", "Number of actively used token slots in the KV cache pool."),
    _g("sglang:swa_available_tokens", "Number of free token slots in the SWA pool (hybrid-SWA only)."),
    _g("sglang:swa_evictable_tokens", "Number of evictable (radix-cached) token slots in the SWA pool."),
    _g("sglang:swa_used_tokens", "Number of actively used token slots in the SWA pool."),
    _g("sglang:mamba_available_tokens", "Number of free state slots in the mamba SSM pool (hybrid-SSM only)."),
    _g("sglang:mamba_evictable_tokens", "Number of evictable (radix-cached) state slots in the mamba SSM pool."),
    _g("sglang:mamba_used_tokens", "Number of actively used state slots in the mamba SSM pool."),
    _g(
        "sglang:spec_accept_length",
        "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
    ),
    _g("sglang:spec_accept_rate", "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch)."),
    _g(
        "sglang:spec_cap_length",
        "Mean DSpark confidence-scheduled verify window per verify step, incl the bonus "
        "slot (0 when no cap is scheduled).",
    ),
    _g(
        "sglang:spec_block_accept_length",
        "Mean uncapped full-block accept length per verify step (accept + "
        "cap-trimmed drafts; exact only in DSpark cap-accept mode).",
    ),
    _g("sglang:spec_num_steps", "Currently active speculative_num_steps."),
    _g(
        "sglang:spec_num_draft_tokens",
        "Currently active speculative_num_draft_tokens (decouples from steps under topk>1).",
    ),
    _g("sglang:num_prefill_bootstrap_queue_reqs", "The number of requests in the prefill bootstrap queue."),
    _g("sglang:num_prefill_inflight_queue_reqs", "The number of requests in the prefill inflight queue."),
    _g("sglang:num_decode_prealloc_queue_reqs", "The number of requests in the decode prealloc queue."),
    _g("sglang:num_decode_transfer_queue_reqs", "The number of requests in the decode transfer queue."),
    _g(
        "sglang:num_decode_host_receive_queue_reqs",
        "Requests in the decode transfer queue receiving into host memory or waiting for device admission.",
    ),
    _g(
        "sglang:num_decode_deferred_kv_release_reqs",
        "The number of failed decode requests whose KV allocations "
        "are held pending transfer drain acknowledgement or timeout.",
    ),
    _g(
        "sglang:pending_prealloc_token_usage", "The token usage for pending preallocated tokens (not preallocated yet)."
    ),
    _g(
        "sglang:prealloc_full_token_usage",
        "Share of the full-attention KV pool held by decode requests whose KV "
        "transfer is pending (preallocated, not yet running); same capacity basis as sglang:full_token_usage.",
    ),
    _g(
        "sglang:prealloc_swa_token_usage",
        "Share of the SWA KV pool held by decode requests whose KV transfer is "
        "pending; same capacity basis as sglang:swa_token_usage.",
    ),
    _g("sglang:utilization", "The utilization."),
    _g("sglang:fwd_occupancy", "Forward pass GPU occupancy percentage."),
    _g("sglang:new_token_ratio", "The new token ratio."),
    _g("sglang:is_cuda_graph", "Whether the batch is using CUDA graph."),
    _g("sglang:num_unique_running_routing_keys", "Number of unique routing keys in running batch."),
    _g(
        "sglang:routing_key_running_req_count",
        "Distribution of routing keys by running request count (gt < count <= le).",
        extra_labels=("gt", "le"),
        series=_ROUTING_BUCKETS,
    ),
    _g(
        "sglang:routing_key_all_req_count",
        "Distribution of routing keys by running+waiting request count (gt < count <= le).",
        extra_labels=("gt", "le"),
        series=_ROUTING_BUCKETS,
    ),
    _g("sglang:num_retracted_reqs", "The number of retracted requests.", pid_label=True),
    _g("sglang:num_paused_reqs", "The number of paused requests by async weight sync.", pid_label=True),
    # ---- tokenizer side: at request completion, labelled by the allowed custom labels
    Family(
        "sglang:e2e_request_latency_seconds",
        "histogram",
        "Histogram of End-to-end request latency in seconds",
        "tokenizer",
        ("is_streaming",),
        buckets=_E2E,
    ),
    Family(
        "sglang:request_time_per_output_token_seconds",
        "histogram",
        "Per-request TPOT in seconds: (finished_time - first_token_time) / (completion_tokens - 1).",
        "tokenizer",
        ("is_streaming",),
        buckets=_TPOT,
    ),
    Family(
        "sglang:time_to_first_token_seconds",
        "histogram",
        "Histogram of time to first token in seconds.",
        "tokenizer",
        ("is_streaming",),
        buckets=_TTFT,
    ),
    Family(
        "sglang:prompt_tokens_histogram", "histogram", "Histogram of prompt token length.", "tokenizer", buckets=_TOKENS
    ),
    Family(
        "sglang:uncached_prompt_tokens_histogram",
        "histogram",
        "Histogram of uncached (compute) prompt token length.",
        "tokenizer",
        buckets=_TOKENS,
    ),
    Family(
        "sglang:generation_tokens_histogram",
        "histogram",
        "Histogram of generation token length.",
        "tokenizer",
        buckets=_TOKENS,
    ),
    Family(
        "sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", "tokenizer", ("is_streaming",)
    ),
    Family(
        "sglang:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        "tokenizer",
        ("is_streaming",),
    ),
    Family(
        "sglang:spec_verify_calls_total", "counter", "Number of speculative decoding verification calls.", "tokenizer"
    ),
    Family(
        "sglang:cached_tokens_total",
        "counter",
        "Number of cached prompt tokens by source (device/host/storage).",
        "tokenizer",
        ("cache_source",),
        (("total",),),
    ),
    Family("sglang:num_requests_total", "counter", "Number of requests processed.", "tokenizer", ("is_streaming",)),
    Family("sglang:num_aborted_requests_total", "counter", "Number of requests aborted.", "tokenizer"),
)
BY_NAME = {f.name: f for f in FAMILIES}


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
            out.append((floatToGoString(bound), float(running)))  # "+Inf", "1e+06": prometheus_client's own
        return out


@dataclass
class _Interval:
    """Accumulates one DP rank's decode steps until the next log tick."""

    steps: int = 0
    busy: float = 0.0
    emitted: int = 0
    prompt: int = 0
    rows: int = 0  # request rows over the interval's steps
    drafts: int = 0  # request-verify pairs
    accepted: int = 0


@dataclass
class _Rank:
    """One DP rank's scheduler series (every reporting TP rank shows the same values)."""

    gauges: dict[str, float] = field(default_factory=dict)
    waiting: float = 0.0
    counters: dict[tuple[str, tuple[str, ...]], float] = field(default_factory=dict)
    hists: dict[str, _Hist] = field(default_factory=dict)
    interval: _Interval = field(default_factory=_Interval)
    last_tick: float | None = None


class SglangMetrics:
    """The `Recorder` of a simulated SGLang server with `dp` DP ranks. Thread-safe.

    `tp` > 1 with `all_tp_ranks` repeats every scheduler series per TP rank, as
    `--enable-metrics-for-all-schedulers` does; `priority_scheduling` adds the per-priority queue gauges;
    `custom_labels` are the `--tokenizer-metrics-allowed-custom-labels` (requests set them through the
    `x-custom-labels` header).
    """

    def __init__(
        self,
        model_name: str,
        dp: int,
        k: int,
        *,
        tp: int = 1,
        all_tp_ranks: bool = False,
        priority_scheduling: bool = False,
        custom_labels: tuple[str, ...] = (),
        kv_capacity_tokens: int = 400_000,
        max_running_requests: int = 256,
        log_interval: int = DECODE_LOG_INTERVAL,
    ) -> None:
        self.dp = dp
        self.tp_ranks = tuple(range(tp)) if all_tp_ranks else (0,)
        self.priority_scheduling = priority_scheduling
        self.custom_labels = tuple(custom_labels)
        self.log_interval = log_interval
        self._kv_capacity = kv_capacity_tokens
        self._max_running = max_running_requests
        self._lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self.reset(model_name, k)

    def reset(self, model_name: str | None = None, k: int | None = None) -> None:
        """A restart: every series back to its starting value."""
        with self._lock:
            if model_name is not None:
                self.model_name = model_name
            if k is not None:
                self.k = k
            self._ranks = [self._fresh_rank() for _ in range(self.dp)]
            self._counters: dict[tuple[str, tuple[str, ...]], float] = {}
            self._hists: dict[tuple[str, tuple[str, ...]], _Hist] = {}

    def render(self, names: Sequence[str] | None = None) -> bytes:
        """The exposition. SGLang serves /metrics from a multiprocess registry whose collector names no
        metrics, so `?name[]=...` restricts it to nothing: an empty body. This registry behaves the same."""
        return generate_latest(self.registry.restricted_registry(names) if names else self.registry)

    # ------------------------------------------------------------------ Recorder
    def on_step(self, engine: int, step: StepRecord) -> None:
        with self._lock:
            rank = self._ranks[engine]
            iv = rank.interval
            iv.steps += 1
            iv.busy += step.duration
            iv.emitted += step.emitted_tokens
            iv.prompt += step.prompt_tokens
            iv.rows += step.running
            iv.drafts += step.drafts
            iv.accepted += step.accepted_tokens
            if iv.steps >= self.log_interval:
                self._log_tick(rank, step)

    def on_finish(self, engine: int, request: SimRequest, now: float) -> None:
        with self._lock:
            custom = self._custom(request)
            if request.finish_reason == "abort":
                self._inc("sglang:num_aborted_requests_total", custom)
                return
            streaming = ("true",) if request.streaming else ("false",)
            self._inc("sglang:prompt_tokens_total", custom + streaming, request.prompt_tokens)
            self._inc("sglang:generation_tokens_total", custom + streaming, request.generated)
            self._inc("sglang:num_requests_total", custom + streaming)
            self._inc("sglang:cached_tokens_total", custom + ("total",), 0.0)
            if self.k:
                self._inc("sglang:spec_verify_calls_total", custom, request.verify_steps)
            first = request.first_token_at if request.first_token_at is not None else now
            self._observe("sglang:e2e_request_latency_seconds", custom + streaming, now - request.arrival)
            self._observe("sglang:time_to_first_token_seconds", custom + streaming, first - request.arrival)
            if request.generated > 1:
                self._observe(
                    "sglang:request_time_per_output_token_seconds",
                    custom + streaming,
                    (now - first) / (request.generated - 1),
                )
            self._observe("sglang:prompt_tokens_histogram", custom, request.prompt_tokens)
            self._observe("sglang:uncached_prompt_tokens_histogram", custom, request.prompt_tokens)
            self._observe("sglang:generation_tokens_histogram", custom, request.generated)

    # ------------------------------------------------------------------ Collector
    def collect(self):
        with self._lock:
            ranks = [
                (
                    dict(r.gauges),
                    r.waiting,
                    dict(r.counters),
                    {n: (h.cumulative(), h.total) for n, h in r.hists.items()},
                )
                for r in self._ranks
            ]
            counters = dict(self._counters)
            hists = {key: (h.cumulative(), h.total) for key, h in self._hists.items()}
            model = self.model_name
        pid = str(os.getpid())
        for fam in FAMILIES:
            if fam.side == "scheduler":
                metric = self._scheduler_family(fam, ranks, model, pid)
            else:
                metric = _family(fam, ["model_name", "engine_type", "priority", *self.custom_labels, *fam.extra_labels])
                base = [model, "unified", ""]
                for (name, values), value in sorted(counters.items()):
                    if name == fam.name:
                        metric.add_metric(base + list(values), value)
                for (name, values), (buckets, total) in sorted(hists.items()):
                    if name == fam.name:
                        metric.add_metric(base + list(values), buckets, total)
            if metric.samples:
                yield metric

    def _scheduler_family(self, fam: Family, ranks: list, model: str, pid: str):
        names = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "priority"]
        if self.dp > 1:
            names.append("dp_rank")
        metric = _family(fam, names + list(fam.extra_labels) + (["pid"] if fam.pid_label else []))
        for dp_rank, (gauges, waiting, counters, hists) in enumerate(ranks):
            for tp_rank in self.tp_ranks:
                base = [model, "unified", str(tp_rank), "0", "0", ""] + ([str(dp_rank)] if self.dp > 1 else [])
                tail = [pid] if fam.pid_label else []
                if fam.kind == "histogram":
                    buckets, total = hists[fam.name]
                    metric.add_metric(base, buckets, total)
                    continue
                for values in fam.series:
                    value = (
                        counters.get((fam.name, values), 0.0) if fam.kind == "counter" else gauges.get(fam.name, 0.0)
                    )
                    metric.add_metric(base + list(values) + tail, value)
                if self.priority_scheduling and fam.name in ("sglang:num_running_reqs", "sglang:num_queue_reqs"):
                    # The total sits under priority=""; every request has the default priority 0.
                    total = gauges.get(fam.name, 0.0) if fam.name == "sglang:num_running_reqs" else waiting
                    metric.add_metric(base[:5] + ["0"] + base[6:], total)
                    metric.add_metric(base[:5] + ["1"] + base[6:], 0.0)
        return metric

    # ------------------------------------------------------------------ helpers (lock held)
    def _fresh_rank(self) -> _Rank:
        rank = _Rank()
        rank.gauges.update(
            {
                "sglang:kv_available_tokens": float(self._kv_capacity),
                "sglang:spec_num_steps": float(self.k),
                "sglang:spec_num_draft_tokens": float(self.k + 1 if self.k else 0),
                "sglang:new_token_ratio": NEW_TOKEN_RATIO,
                "sglang:is_cuda_graph": 1.0,
            }
        )
        rank.hists = {f.name: _Hist(f.buckets) for f in FAMILIES if f.side == "scheduler" and f.kind == "histogram"}
        return rank

    def _log_tick(self, rank: _Rank, step: StepRecord) -> None:
        iv, g, c = rank.interval, rank.gauges, rank.counters
        idle = max(0.0, step.now - rank.last_tick - iv.busy) if rank.last_tick is not None else 0.0
        rank.last_tick = step.now
        kv_tokens = float(step.kv_tokens)
        g["sglang:num_running_reqs"] = float(step.running)
        g["sglang:num_queue_reqs"] = rank.waiting = float(step.waiting)
        g["sglang:gen_throughput"] = iv.emitted / iv.busy if iv.busy > 0 else 0.0
        g["sglang:decode_sum_seq_lens"] = g["sglang:num_used_tokens"] = g["sglang:kv_used_tokens"] = kv_tokens
        g["sglang:kv_available_tokens"] = max(0.0, self._kv_capacity - kv_tokens)
        g["sglang:token_usage"] = g["sglang:full_token_usage"] = step.kv_usage
        g["sglang:fwd_occupancy"] = 100.0 * min(1.0, step.running / self._max_running)
        g["sglang:utilization"] = step.kv_usage
        g["sglang:is_cuda_graph"] = 1.0 if step.running <= CUDA_GRAPH_MAX_BATCH else 0.0
        if self.k and iv.drafts:
            # Batch-weighted over the interval; >= 0.5.13 the rate excludes the bonus token.
            g["sglang:spec_accept_length"] = (iv.accepted + iv.drafts) / iv.drafts
            g["sglang:spec_accept_rate"] = iv.accepted / (iv.drafts * self.k)
        for key, amount in (
            (("sglang:prefill_effective_tokens_total", ("input",)), iv.prompt),
            (("sglang:scheduler_idle_seconds_total", ()), idle),
            (("sglang:scheduler_process_cpu_seconds_total", ()), iv.busy),
            (("sglang:scheduler_stage_seconds_total", ("run_batch", "none")), iv.busy),
            (("sglang:scheduler_stage_seconds_total", ("idle", "none")), idle),
            (("sglang:dp_attention_tokens_total", ("scheduled",)), iv.rows),
            (("sglang:dp_attention_steps_total", ("active",)), iv.steps),
            (("sglang:dp_attention_pairs_total", ("scheduled",)), kv_tokens * iv.steps),
        ):
            c[key] = c.get(key, 0.0) + amount
        rank.hists["sglang:dp_attention_token_imbalance_ratio"].observe(1.0)  # one engine's ranks stay balanced
        rank.hists["sglang:dp_attention_sync_wait_seconds"].observe(0.0)
        rank.interval = _Interval()

    def _custom(self, request: SimRequest) -> tuple[str, ...]:
        labels = request.custom_labels or {}
        return tuple(labels.get(name, "") for name in self.custom_labels)

    def _inc(self, name: str, values: tuple[str, ...], amount: float = 1.0) -> None:
        self._counters[(name, values)] = self._counters.get((name, values), 0.0) + amount

    def _observe(self, name: str, values: tuple[str, ...], value: float) -> None:
        hist = self._hists.get((name, values))
        if hist is None:
            hist = self._hists[(name, values)] = _Hist(BY_NAME[name].buckets)
        hist.observe(value)


def _family(fam: Family, labels: list[str]):
    if fam.kind == "counter":
        return CounterMetricFamily(fam.name, fam.help, labels=labels)
    if fam.kind == "gauge":
        return GaugeMetricFamily(fam.name, fam.help, labels=labels)
    return HistogramMetricFamily(fam.name, fam.help, labels=labels)
