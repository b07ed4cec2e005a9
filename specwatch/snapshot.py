"""Immutable value types that flow one way: sources -> tracking -> evaluators/crossover -> Snapshot -> exporters.

This is a leaf module: it imports nothing from specwatch. The daemon builds one `Snapshot` per cycle and
publishes it by swapping a single reference; exporters only ever read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping, NamedTuple

AcceptanceSource = Literal["counter", "gauge", "lifetime_gauge", "none"]
WINDOWS: tuple[str, ...] = ("1m", "5m", "1h")
WINDOW_SECONDS: Mapping[str, float] = {"1m": 60.0, "5m": 300.0, "1h": 3600.0}


# --------------------------------------------------------------------------- what a source returns
class StepTimes(NamedTuple):
    """An engine's step-time totals (vLLM), or their increases over a cycle.

    seconds, observations: `vllm:inter_token_latency_seconds`' sum and count, one observation per decoding
    request per engine step (the time since that request's previous step), so seconds / observations is the
    mean step time, weighted by the batch. steps: `vllm:iteration_tokens_total`'s count, one per engine step
    that emitted output, so observations / steps is the mean decoding batch of those very steps (None where
    the engine does not export it).

    per_token (SGLang): `sglang:inter_token_latency_seconds`' sum and count, where the count counts output
    tokens, not request-steps: the consumer divides by the tokens per step (tau) of the same cycle."""

    seconds: float
    observations: float
    steps: float | None = None
    per_token: bool = False


@dataclass(frozen=True)
class EngineCounters:
    """One DP engine (vLLM `engine`, SGLang `dp_rank`) of one route at one scrape, in one meaning whatever the
    engine: each source module turns its engine's names, versions and definitions into these fields
    (docs/engines.md), so tracking holds no engine rule.

    Counter fields are the engine's own cumulative values (None when the engine does not expose them).
    Gauge fields are instantaneous. `created` is the counter's `_created` timestamp when exposed; a change of
    it marks a restart even when values did not decrease.
    """

    engine: str
    drafts: float | None = None  # verify steps that drafted (or, with `verify_counts`, every verify step)
    draft_tokens: float | None = None
    accepted_tokens: float | None = None  # bonus token excluded
    accepted_per_pos: tuple[float, ...] = ()
    # Draft tokens proposed at each position (TensorRT-LLM): the denominators that keep per-position rates
    # true when the draft length varies. Empty where the engine exports none (p_j is then per draft).
    drafted_per_pos: tuple[float, ...] = ()
    generation_tokens: float | None = None
    created: float | None = None
    running: float | None = None  # requests in the engine's batch, prefills included
    waiting: float | None = None
    kv_usage: float | None = None
    # The decode batch, where the engine tells it apart from `running`: requests decoding in its last step
    # (TensorRT-LLM), or cumulative decode steps and the requests summed over them (llama.cpp), whose increases
    # give the mean batch of the cycle's steps. Tracking hands the crossover this batch where present.
    decode_batch: float | None = None
    decode_steps: float | None = None
    decode_step_requests: float | None = None
    # Engines that count verify steps (`drafts`) and generated tokens but neither draft nor accepted tokens:
    # every verify step emits its accepted tokens and one more, so tracking takes accepted = Δgeneration -
    # Δdrafts and draft tokens = Δdrafts x `draft_length`, the draft tokens per verify step now (0: not
    # drafting; None: unknown, so no draft tokens).
    verify_counts: bool = False
    draft_length: float | None = None
    # Interval averages the engine computes itself (acceptance source "gauge"): the acceptance ratio without the
    # bonus token and the mean acceptance length with it, each None while it says nothing about acceptance
    # (an idle tier, a step that verified without drafting). Tracking weights them by `running`.
    interval_acceptance_ratio: float | None = None
    interval_acceptance_length: float | None = None
    # The acceptance ratio since the engine started (acceptance source "lifetime_gauge").
    lifetime_acceptance_ratio: float | None = None


@dataclass(frozen=True)
class EngineSample:
    """Everything one scrape of one route's endpoint yields, filtered by the route's `match`/`engines`."""

    ts: float
    engine_kind: str  # "vllm" | "vllm-v0" | "sglang" | "trtllm" | "llamacpp"
    acceptance_source: AcceptanceSource
    model_name: str = ""
    engine_version: str = ""
    speculation_enabled: bool = True
    num_speculative_tokens: int | None = None  # k, e.g. the number of vLLM `position` values
    # The speculative method and the draft model, as far as the engine or the route's config tells them; ""
    # where neither does. Together (`drafter`) they are part of the baseline key.
    spec_method: str = ""
    spec_drafter: str = ""
    engines: tuple[EngineCounters, ...] = ()
    # engine -> its step-time totals (vLLM). Kept apart from EngineCounters, which is built per engine on the
    # hot path.
    step_time_totals: Mapping[str, StepTimes] = field(default_factory=dict)
    # What the engines' `draft_length` counts where the engine counts no draft tokens itself (SGLang: chain, tree,
    # block, dspark_cap, adaptive; sources/sglang.py `DRAFT_LENGTH_BASES`); "" where it counts them.
    draft_length_basis: str = ""
    # The engine says its drafts differ in length from draft to draft (a verify cap, an adaptive tier), so a
    # per-position count per draft mixes positions never drafted with rejected ones.
    draft_length_varies: bool = False

    @property
    def drafter(self) -> str:
        """The method and drafter as one text, the baseline key's `drafter`: "method:drafter", or whichever is
        known; "" when neither is."""
        method, drafter = self.spec_method.strip(), self.spec_drafter.strip()
        return f"{method}:{drafter}" if method and drafter else method or drafter


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one cycle. Any field NVML does not support is None and never exported."""

    index: int
    up: bool
    uuid: str = ""
    name: str = ""
    driver: str = ""
    fields: Mapping[str, float] = field(default_factory=dict)  # metric name (without prefix) -> value
    pids: tuple[int, ...] = ()  # compute processes on this GPU (route -> GPU auto-mapping)


# --------------------------------------------------------------------------- what the daemon publishes
@dataclass(frozen=True)
class RouteState:
    """Everything exported for one route, as of the last evaluation."""

    name: str
    up: bool
    engine_kind: str = ""
    model_name: str = ""
    engine_version: str = ""
    drafter: str = ""  # the speculative method and drafter, "method:drafter" (EngineSample.drafter)
    acceptance_source: AcceptanceSource = "none"
    error_reason: str = ""  # last error reason when down
    error_message: str = ""  # what that error said (for no_match: the label values the endpoint has)
    # reset-corrected cumulative counters summed over the route's engines
    drafts_total: float = 0.0
    draft_tokens_total: float = 0.0
    accepted_tokens_total: float = 0.0
    # counter samples rejected as impossible, by reason (tracking/counters.py REJECT_REASONS)
    rejected_samples_total: Mapping[str, float] = field(default_factory=dict)
    acceptance_ratio: Mapping[str, float] = field(default_factory=dict)  # window -> ratio (absent: no drafts)
    mean_acceptance_length: Mapping[str, float] = field(default_factory=dict)  # window -> tau
    position_acceptance_ratio: tuple[float, ...] = ()  # 5m window, p_j per position
    draft_length: float | None = None  # effective k
    draft_length_basis: str = ""  # EngineSample.draft_length_basis of the last sample
    # Whether position_acceptance_ratio reads as the acceptance at each position: True where every draft of the
    # 5m window proposed all k positions (or the engine counts drafted tokens per position); False where shorter
    # drafts count as rejections at positions they never drafted; None without per-position ratios.
    position_acceptance_comparable: bool | None = None
    # 1: drafts were proposed over 5m; 0: the route generated tokens with none, speculation configured;
    # None: no generation (idle) or speculation not configured
    speculation_active: bool | None = None
    running_requests: float | None = None
    waiting_requests: float | None = None
    kv_usage_ratio: float | None = None
    scrape_duration_seconds: float | None = None
    engines: int | None = None  # DP engines seen at the last successful scrape; None while down
    last_scrape_timestamp: float | None = None  # the last successful scrape's time; None: never scraped
    errors_total: Mapping[str, float] = field(default_factory=dict)  # reason -> count
    evaluator_errors_total: Mapping[str, float] = field(default_factory=dict)  # evaluator -> failures
    gpus: tuple[int, ...] = ()
    # detection
    baseline_ratio: float | None = None
    # the reference baseline's key and origin (Baseline.source), and its φ̄; "" / None without one
    baseline_model: str = ""
    baseline_engine_version: str = ""
    baseline_draft_length: int | None = None
    baseline_drafter: str = ""
    baseline_source: str = ""
    baseline_overdispersion: float | None = None
    # baseline x (1 - the route's `drop`): the acceptance the detector pages below
    acceptance_threshold_ratio: float | None = None
    drop_ratio: float | None = None
    degraded: bool | None = None
    cusum_statistic: float | None = None
    # expected seconds to page a 20% drop (stats/horizon.py): by the traffic detector at the last hour's evidence
    # rate (inf: no traffic), and by canary probes (None: no probes); the route's `detection.horizon_budget`
    traffic_horizon_seconds: float | None = None
    probe_horizon_seconds: float | None = None
    horizon_budget_seconds: float | None = None
    model_changes_total: float = 0.0
    seed_errors_total: Mapping[str, float] = field(default_factory=dict)  # reason -> fleet seeds not used
    last_model_change_timestamp: float | None = None
    # crossover
    crossover_batch_size: float | None = None
    crossover_source: str = ""
    crossover_lower: float | None = None  # the estimate's validated error band (estimate sources)
    crossover_upper: float | None = None
    # The verify attention kernel an estimate assumes (packed, unpacked, or unknown: its band covers both), the
    # largest batch whose KV cache fits the route's GPUs, and whether the model's B* lies beyond it (then
    # crossover_batch_size is None: no crossover below the largest batch that fits). Estimate sources only.
    crossover_attention_kernel: str = ""
    crossover_kv_capacity_batch: float | None = None
    crossover_beyond_capacity: bool | None = None
    batch_size: float | None = None
    above_crossover: bool | None = None
    predicted_speedup_ratio: float | None = None
    compute_bound: bool | None = None
    speculation_gpu_seconds_lost_total: float | None = None  # None: no speedup-predicting crossover source
    speculation_gpu_seconds_saved_total: float | None = None
    # live calibration from the route's own step times (estimate sources)
    live_crossover_batch_size: float | None = None
    live_crossover_lower: float | None = None
    live_crossover_upper: float | None = None
    live_crossover_bins: int | None = None  # batch bins the live calibration has seen
    live_crossover_attention_kernel: str = ""  # the verify kernel the live refit's step model prices
    # What the flag compares the batch with now: its source (sweep, estimate, batch_size, or live once settled)
    # and that batch size (an estimate's band's upper side; None: no crossover)
    crossover_flag_source: str = ""
    crossover_flag_batch_size: float | None = None
    # True: the flag judges against the live B* (its band pinned it down); False: the source's B*
    live_crossover_settled: bool | None = None
    # canary probes (evaluators/canary.py)
    probe_acceptance_ratio: float | None = None
    probe_baseline_ratio: float | None = None
    probe_degraded: bool | None = None
    probe_success: bool | None = None
    probe_duration_seconds: float | None = None
    probe_rounds_total: Mapping[str, float] = field(default_factory=dict)  # result -> count
    probe_method: str = ""


@dataclass(frozen=True)
class Snapshot:
    """One evaluation's complete, immutable view. Exporters read this and nothing else."""

    timestamp: float  # wall-clock time of the evaluation
    routes: tuple[RouteState, ...] = ()
    gpus: tuple[GpuSample, ...] = ()
    nvml_up: bool | None = None  # None: GPU collection disabled
    evaluation_duration_seconds: float = 0.0
    evaluation_overruns_total: float = 0.0
    state_errors_total: float = 0.0
    config_last_reload_successful: bool = True
    config_last_reload_success_timestamp: float = 0.0

    def route(self, name: str) -> RouteState | None:
        for r in self.routes:
            if r.name == name:
                return r
        return None


EMPTY_SNAPSHOT = Snapshot(timestamp=0.0)


# --------------------------------------------------------------------------- tracking -> evaluators/crossover
@dataclass(frozen=True)
class RouteObservation:
    """Tracking's output for one route at one cycle; the only input of detectors and the crossover flag.

    Deltas are since the previous cycle, summed over the route's engines and reset-safe (never negative).
    For SGLang >= 0.5.13 they are derived from counters (drafts = verify calls, accepted = generation
    tokens - verify calls, draft tokens = verify calls x (num_draft_tokens - 1)); for gauge-only sources
    they are 0 and `gauge_acceptance_ratio` carries the batch-weighted interval gauge instead.
    """

    route: str
    ts: float
    up: bool
    model_name: str = ""
    engine_version: str = ""
    engine_kind: str = ""
    acceptance_source: AcceptanceSource = "none"
    k: int | None = None
    drafter: str = ""  # the speculative method and drafter (EngineSample.drafter)
    reset: bool = False  # an engine restarted (counter decrease or new _created) since the last cycle
    d_drafts: float = 0.0
    d_draft_tokens: float = 0.0
    d_accepted: float = 0.0
    d_accepted_per_pos: tuple[float, ...] = ()
    d_generation_tokens: float = 0.0
    gauge_acceptance_ratio: float | None = None
    # engine -> the batch the crossover judges: its decode batch where the engine tells it, else its running
    # requests
    running_per_engine: Mapping[str, float] = field(default_factory=dict)
    waiting_requests: float | None = None  # summed over the route's engines
    kv_usage: float | None = None
    window_acceptance: Mapping[str, float] = field(default_factory=dict)  # window -> ratio
    gpus: tuple[int, ...] = ()
    # engine -> its step-time totals' increases since the last cycle (vLLM)
    step_time_per_engine: Mapping[str, StepTimes] = field(default_factory=dict)
