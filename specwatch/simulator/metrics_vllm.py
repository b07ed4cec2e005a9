"""vLLM V1 `/metrics` for a simulated server: the families, labels, HELP and `_created` series of vLLM 0.33.0.

Like vLLM's own `PrometheusStatLogger`, one registry serves all DP engines of an API server, every series
labelled `model_name` and `engine`; it is rendered single-process style (counters and histograms followed
by `_created` gauges). Real `prometheus_client` metric objects do the rendering, so the text format is the
library's, exactly as vLLM's. The registry is private (never the global one), and a restart or model bump
builds a fresh one, so counters restart at 0 with new `_created` timestamps, as after a process restart.

The family table is data, in vLLM's registration order: name, type, HELP, the extra label and its values,
buckets. It was aligned with `tests/fixtures/vllm/v1_k4_2engines.prom` (captured from vLLM 0.33.0's own
`PrometheusStatLogger`), and `tests/test_simulator_formats.py` keeps it that way. Features the simulator
has no model for (prefix-cache hits, KV transfer, multi-modal cache, preemption, admission limits) are
exported at 0, as a real engine with them idle does.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specwatch.simulator.engine import SimRequest, StepRecord

ENGINE_VERSION = "0.33.0"
LABELS = ("model_name", "engine")
_LATENCY = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
_TTFT = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_ITERATION = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
_SIZES = "1-2-5"  # vLLM's build_1_2_5_buckets(max_model_len)
_MFU = " (for Model Flops Utilization calculations)."

# A Llama-3-8B-shaped target for the MFU counters: 2 flops per parameter per token; weights read per forward.
_PARAMS = 8.0e9
_WEIGHT_BYTES = 2 * _PARAMS
_KV_BYTES_PER_TOKEN = 131_072  # 32 layers x 8 KV heads x 128 x (K, V) x bf16


@dataclass(frozen=True)
class Family:
    name: str  # as declared (prometheus_client appends _total to counters)
    kind: str  # counter | gauge | histogram
    help: str
    extra_label: str = ""
    values: tuple[str, ...] = ()  # the extra label's values, each series created up front
    buckets: tuple[float, ...] | str = ()
    per_engine: bool = True  # False: counted by the API server, labelled model_name only


SPEC_FAMILIES: tuple[Family, ...] = (  # registered first, only with speculation on (absent, not zero, when off)
    Family("vllm:spec_decode_num_drafts", "counter", "Number of spec decoding drafts."),
    Family("vllm:spec_decode_num_draft_tokens", "counter", "Number of draft tokens."),
    Family("vllm:spec_decode_num_accepted_tokens", "counter", "Number of accepted tokens."),
    Family(
        "vllm:spec_decode_num_accepted_tokens_per_pos", "counter", "Accepted tokens per draft position.", "position"
    ),  # values "0".."k-1"
)

FAMILIES: tuple[Family, ...] = (
    Family("vllm:estimated_flops_per_gpu", "counter", "Estimated number of floating point operations per GPU" + _MFU),
    Family("vllm:estimated_read_bytes_per_gpu", "counter", "Estimated number of bytes read from memory per GPU" + _MFU),
    Family(
        "vllm:estimated_write_bytes_per_gpu", "counter", "Estimated number of bytes written to memory per GPU" + _MFU
    ),
    Family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches."),
    Family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
    Family(
        "vllm:num_requests_waiting_by_reason",
        "gauge",
        "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
        "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
        "Sum of all reasons equals vllm:num_requests_waiting.",
        "reason",
        ("capacity", "deferred"),
    ),
    Family(
        "vllm:engine_sleep_state",
        "gauge",
        "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
        "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
        "sleep_state",
        ("awake", "weights_offloaded", "discard_all"),
    ),
    Family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
    Family("vllm:prefix_cache_queries", "counter", "Prefix cache queries, in terms of number of queried tokens."),
    Family("vllm:prefix_cache_hits", "counter", "Prefix cache hits, in terms of number of cached tokens."),
    Family(
        "vllm:external_prefix_cache_queries",
        "counter",
        "External prefix cache queries from KV connector cross-instance cache sharing, "
        "in terms of number of queried tokens.",
    ),
    Family(
        "vllm:external_prefix_cache_hits",
        "counter",
        "External prefix cache hits from KV connector cross-instance cache sharing, "
        "in terms of number of cached tokens.",
    ),
    Family("vllm:mm_cache_queries", "counter", "Multi-modal cache queries, in terms of number of queried items."),
    Family("vllm:mm_cache_hits", "counter", "Multi-modal cache hits, in terms of number of cached items."),
    Family("vllm:num_preemptions", "counter", "Cumulative number of preemption from the engine."),
    Family("vllm:prompt_tokens", "counter", "Number of prefill tokens processed."),
    Family(
        "vllm:prompt_tokens_by_source",
        "counter",
        "Number of prompt tokens by source.",
        "source",
        ("local_compute", "local_cache_hit", "external_kv_transfer"),
    ),
    Family("vllm:prompt_tokens_cached", "counter", "Number of cached prompt tokens (local + external)."),
    Family(
        "vllm:prompt_tokens_cached_by_source",
        "counter",
        "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to "
        "DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at "
        "admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
        "source",
        ("device", "host", "disk", "p2p", "external_unspecified"),
    ),
    Family("vllm:generation_tokens", "counter", "Number of generation tokens processed."),
    Family(
        "vllm:request_success",
        "counter",
        "Count of successfully processed requests.",
        "finished_reason",
        ("stop", "length", "abort", "error", "repetition"),
    ),
    Family(
        "vllm:admission_rejections",
        "counter",
        "Number of admission attempts rejected by a queue limit, by reason.",
        "reason",
        ("max_num_queued_reqs", "max_num_queued_tokens"),
        per_engine=False,
    ),
    Family("vllm:request_prompt_tokens", "histogram", "Number of prefill tokens processed.", buckets=_SIZES),
    Family("vllm:request_generation_tokens", "histogram", "Number of generation tokens processed.", buckets=_SIZES),
    Family(
        "vllm:iteration_tokens_total", "histogram", "Histogram of number of tokens per engine_step.", buckets=_ITERATION
    ),
    Family(
        "vllm:request_max_num_generation_tokens",
        "histogram",
        "Histogram of maximum number of requested generation tokens.",
        buckets=_SIZES,
    ),
    Family("vllm:request_params_n", "histogram", "Histogram of the n request parameter.", buckets=(1, 2, 5, 10, 20)),
    Family(
        "vllm:request_params_max_tokens", "histogram", "Histogram of the max_tokens request parameter.", buckets=_SIZES
    ),
    Family(
        "vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.", buckets=_TTFT
    ),
    Family(
        "vllm:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.", buckets=_ITL
    ),
    Family(
        "vllm:request_time_per_output_token_seconds",
        "histogram",
        "Histogram of time_per_output_token_seconds per request.",
        buckets=_ITL,
    ),
    Family(
        "vllm:e2e_request_latency_seconds",
        "histogram",
        "Histogram of e2e request latency in seconds.",
        buckets=_LATENCY,
    ),
    Family(
        "vllm:request_queue_time_seconds",
        "histogram",
        "Histogram of time spent in WAITING phase for request.",
        buckets=_LATENCY,
    ),
    Family(
        "vllm:request_inference_time_seconds",
        "histogram",
        "Histogram of time spent in RUNNING phase for request.",
        buckets=_LATENCY,
    ),
    Family(
        "vllm:request_prefill_time_seconds",
        "histogram",
        "Histogram of time spent in PREFILL phase for request.",
        buckets=_LATENCY,
    ),
    Family(
        "vllm:request_decode_time_seconds",
        "histogram",
        "Histogram of time spent in DECODE phase for request.",
        buckets=_LATENCY,
    ),
    Family(
        "vllm:request_num_preemptions",
        "histogram",
        "Histogram of the number of times a request was preempted.",
        buckets=(1, 2, 3, 4, 5, 10, 20),
    ),
    Family(
        "vllm:request_prefill_kv_computed_tokens",
        "histogram",
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
        buckets=_SIZES,
    ),
)

CACHE_CONFIG_INFO = Family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
SLEEP_STATE_VALUES = {"awake": 1, "weights_offloaded": 0, "discard_all": 0}  # never asleep


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """vLLM's request-size buckets: 1, 2, 5, 10, 20, 50, ... up to max_value."""
    out: list[int] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > max_value:
                return out
            out.append(value)
        exponent += 1


class VllmMetrics:
    """The `Recorder` of a simulated vLLM API server with `engines` DP engines. Thread-safe."""

    def __init__(
        self,
        model_name: str,
        engines: int,
        k: int,
        *,
        max_model_len: int = 8192,
        block_size: int = 16,
        num_gpu_blocks: int = 27_000,
    ) -> None:
        self.model_name = model_name
        self.engines = engines
        self.k = k
        self._max_model_len = max_model_len
        self._cache_info = {
            "block_size": str(block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": "True",
            "gpu_memory_utilization": "0.9",
            "num_gpu_blocks": str(num_gpu_blocks),
            "num_cpu_blocks": "None",
        }
        self._lock = threading.Lock()
        self.registry = self._build()

    def reset(self, model_name: str | None = None, k: int | None = None) -> None:
        """A restart: fresh registry, counters at 0, new `_created` timestamps."""
        with self._lock:
            if model_name is not None:
                self.model_name = model_name
            if k is not None:
                self.k = k
            self.registry = self._build()

    def render(self, names: Sequence[str] | None = None) -> bytes:
        """The exposition; with `names`, only those samples, as vLLM's /metrics?name[]=... serves them (its
        prometheus_client app restricts the registry; in single-process mode every metric's names are known)."""
        with self._lock:
            registry = self.registry
        return generate_latest(registry.restricted_registry(names) if names else registry)

    # ------------------------------------------------------------------ Recorder
    def on_step(self, engine: int, step: StepRecord) -> None:
        m = self._series(engine)
        m["vllm:num_requests_running"].set(step.running)
        m["vllm:num_requests_waiting"].set(step.waiting)
        m["vllm:num_requests_waiting_by_reason/capacity"].set(step.waiting)
        m["vllm:kv_cache_usage_perc"].set(step.kv_usage)
        if step.prompt_tokens:
            m["vllm:prefix_cache_queries"].inc(step.prompt_tokens)
            m["vllm:prompt_tokens"].inc(step.prompt_tokens)
            m["vllm:prompt_tokens_by_source/local_compute"].inc(step.prompt_tokens)
        m["vllm:generation_tokens"].inc(step.emitted_tokens)
        m["vllm:iteration_tokens_total"].observe(step.prompt_tokens + step.emitted_tokens)
        itl = m["vllm:inter_token_latency_seconds"]
        for _ in range(step.decoding):  # one observation per decoding request, as IterationStats records it
            itl.observe(step.duration)
        processed = step.prompt_tokens + step.running * (self.k + 1)  # verify passes score k + 1 per request
        m["vllm:estimated_flops_per_gpu"].inc(2 * _PARAMS * processed)
        m["vllm:estimated_read_bytes_per_gpu"].inc(_WEIGHT_BYTES + _KV_BYTES_PER_TOKEN * step.kv_tokens)
        m["vllm:estimated_write_bytes_per_gpu"].inc(_KV_BYTES_PER_TOKEN * processed)
        if self.k and step.drafts:
            m["vllm:spec_decode_num_drafts"].inc(step.drafts)
            m["vllm:spec_decode_num_draft_tokens"].inc(step.draft_tokens)
            m["vllm:spec_decode_num_accepted_tokens"].inc(step.accepted_tokens)
            for pos, count in enumerate(step.accepted_per_pos):
                if count:
                    m[self._per_pos_keys[pos]].inc(count)

    def on_finish(self, engine: int, request: SimRequest, now: float) -> None:
        m = self._series(engine)
        m[f"vllm:request_success/{request.finish_reason}"].inc()
        if request.finish_reason == "abort":
            return
        # vLLM reports the scheduler's counts after the step's finished requests left the batch
        # (Scheduler.update_from_output calls make_stats last), so an idle engine reads 0 running.
        m["vllm:num_requests_running"].dec()
        first = request.first_token_at if request.first_token_at is not None else now
        scheduled = request.scheduled_at if request.scheduled_at is not None else request.arrival
        m["vllm:time_to_first_token_seconds"].observe(first - request.arrival)
        m["vllm:e2e_request_latency_seconds"].observe(now - request.arrival)
        m["vllm:request_queue_time_seconds"].observe(scheduled - request.arrival)
        m["vllm:request_inference_time_seconds"].observe(now - scheduled)
        m["vllm:request_prefill_time_seconds"].observe(first - scheduled)
        m["vllm:request_decode_time_seconds"].observe(now - first)
        if request.generated > 1:
            m["vllm:request_time_per_output_token_seconds"].observe((now - first) / (request.generated - 1))
        m["vllm:request_prompt_tokens"].observe(request.prompt_tokens)
        m["vllm:request_prefill_kv_computed_tokens"].observe(request.prompt_tokens)
        m["vllm:request_generation_tokens"].observe(request.generated)
        m["vllm:request_max_num_generation_tokens"].observe(request.max_tokens)
        m["vllm:request_params_n"].observe(1)
        m["vllm:request_params_max_tokens"].observe(request.max_tokens)
        m["vllm:request_num_preemptions"].observe(0)

    # ------------------------------------------------------------------ building
    def _series(self, engine: int) -> dict:
        with self._lock:
            return self._per_engine[engine]

    def _build(self) -> CollectorRegistry:
        registry = CollectorRegistry(auto_describe=True)
        per_engine: dict[int, dict] = {e: {} for e in range(self.engines)}
        for fam in (SPEC_FAMILIES if self.k else ()) + FAMILIES:
            metric = self._declare(fam, registry)
            values = tuple(str(p) for p in range(self.k)) if fam.extra_label == "position" else fam.values
            if not fam.per_engine:  # nothing the simulator models increments these: create them at 0
                for value in values:
                    metric.labels(self.model_name, value)
                continue
            for e in range(self.engines):
                base = (self.model_name, str(e))
                if not fam.extra_label:
                    per_engine[e][fam.name] = metric.labels(*base)
                    continue
                for value in values:  # every series exists from the start at 0, as vLLM creates them
                    per_engine[e][f"{fam.name}/{value}"] = child = metric.labels(*base, value)
                    if fam.name == "vllm:engine_sleep_state":
                        child.set(SLEEP_STATE_VALUES[value])
        info = Gauge(
            CACHE_CONFIG_INFO.name, CACHE_CONFIG_INFO.help, labelnames=[*self._cache_info, "engine"], registry=registry
        )
        for e in range(self.engines):
            info.labels(**self._cache_info, engine=str(e)).set(1)
        self._per_engine = per_engine
        self._per_pos_keys = [f"vllm:spec_decode_num_accepted_tokens_per_pos/{pos}" for pos in range(self.k)]
        return registry

    def _declare(self, fam: Family, registry: CollectorRegistry):
        labels = list(LABELS if fam.per_engine else LABELS[:1]) + ([fam.extra_label] if fam.extra_label else [])
        if fam.kind == "counter":
            return Counter(fam.name, fam.help, labelnames=labels, registry=registry)
        if fam.kind == "gauge":
            return Gauge(fam.name, fam.help, labelnames=labels, registry=registry)
        buckets: list[Any] = build_1_2_5_buckets(self._max_model_len) if fam.buckets == _SIZES else list(fam.buckets)
        return Histogram(fam.name, fam.help, labelnames=labels, buckets=buckets, registry=registry)
