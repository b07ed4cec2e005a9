"""Every metric specwatch exports: the single source of truth for the exporter, the README and the mixin.

Leaf module. `mixin/` generates alerts and dashboards from these names only, and tests check coverage in
both directions (every catalog entry is emitted somewhere; every emitted or referenced name is here).
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "specwatch_"
AS_OF = " (as of the last evaluation)"


@dataclass(frozen=True)
class MetricSpec:
    name: str
    type: str  # gauge | counter | info
    help: str
    labels: tuple[str, ...] = ()
    issue: str = "core"  # which part of specwatch emits it (for docs)


def _m(name: str, type_: str, help_: str, labels: tuple[str, ...] = (), issue: str = "core") -> MetricSpec:
    return MetricSpec(PREFIX + name, type_, help_, labels, issue)


METRICS: tuple[MetricSpec, ...] = (
    # --- self
    _m("build_info", "gauge", "specwatch build information; always 1", ("version",)),
    _m("last_evaluation_timestamp_seconds", "gauge", "Unix time of the last completed evaluation cycle"),
    _m("evaluation_duration_seconds", "gauge", "Duration of the last evaluation cycle"),
    _m("evaluation_overruns_total", "counter", "Evaluation cycles that took longer than the interval"),
    _m("config_last_reload_successful", "gauge", "Whether the last configuration reload succeeded (1) or not (0)",
       issue="service"),
    _m("config_last_reload_success_timestamp_seconds", "gauge", "Unix time of the last successful configuration load",
       issue="service"),
    _m("state_errors_total", "counter", "Errors of the baseline state store (corrupt, unreadable or unwritable)",
       issue="detection"),
    # --- sources
    _m("route_up", "gauge", "Whether the last scrape of the route's engine endpoint succeeded" + AS_OF, ("route",)),
    _m("route_info", "gauge", "Route facts; always 1" + AS_OF,
       ("route", "engine_kind", "model_name", "engine_version", "acceptance_source")),
    _m("source_scrape_duration_seconds", "gauge", "Duration of the last scrape of the route's endpoint", ("route",)),
    _m("source_errors_total", "counter", "Failed scrapes of the route's endpoint by reason", ("route", "reason")),
    # --- tracking
    _m("route_drafts_total", "counter",
       "Draft steps (one request in one verify step), summed over engines and corrected across engine restarts",
       ("route",)),
    _m("route_draft_tokens_total", "counter",
       "Draft tokens proposed and verified, summed over engines and corrected across engine restarts", ("route",)),
    _m("route_accepted_tokens_total", "counter",
       "Accepted draft tokens (bonus token excluded), summed over engines and corrected across engine restarts",
       ("route",)),
    _m("route_acceptance_ratio", "gauge",
       "Draft token acceptance rate, accepted / drafted tokens over the window" + AS_OF, ("route", "window")),
    _m("route_mean_acceptance_length", "gauge",
       "Mean tokens per verify step including the bonus token, 1 + accepted / drafts over the window" + AS_OF,
       ("route", "window")),
    _m("route_position_acceptance_ratio", "gauge",
       "Share of drafts whose token at this position was accepted, over the window" + AS_OF,
       ("route", "position", "window")),
    _m("route_draft_length", "gauge", "Effective draft length k, draft tokens / drafts over 5m" + AS_OF, ("route",)),
    _m("route_running_requests", "gauge", "Running requests summed over the route's engines" + AS_OF, ("route",)),
    _m("route_waiting_requests", "gauge", "Waiting requests summed over the route's engines" + AS_OF, ("route",)),
    _m("route_kv_cache_usage_ratio", "gauge", "Mean KV-cache usage over the route's engines, 0-1" + AS_OF, ("route",)),
    # --- detection
    _m("route_acceptance_baseline_ratio", "gauge", "Pinned baseline acceptance rate of the route" + AS_OF, ("route",),
       issue="detection"),
    _m("route_acceptance_drop_ratio", "gauge", "Relative acceptance drop, 1 - current / baseline" + AS_OF, ("route",),
       issue="detection"),
    _m("route_acceptance_degraded", "gauge", "Detector verdict: acceptance dropped below the baseline (1) or not (0)"
       + AS_OF, ("route",), issue="detection"),
    _m("route_acceptance_cusum", "gauge", "CUSUM evidence statistic of an acceptance drop (alarm at the threshold)"
       + AS_OF, ("route",), issue="detection"),
    _m("route_model_changes_total", "counter", "Model, engine version or draft length changes seen on the route",
       ("route",), issue="detection"),
    _m("route_last_model_change_timestamp_seconds", "gauge", "Unix time of the last model change on the route",
       ("route",), issue="detection"),
    # --- crossover
    _m("route_crossover_batch_size", "gauge", "Batch size above which speculative decoding lowers throughput" + AS_OF,
       ("route", "source"), issue="crossover"),
    _m("route_batch_size", "gauge", "Time-weighted running requests per engine of the route" + AS_OF, ("route",),
       issue="crossover"),
    _m("route_above_crossover", "gauge", "Route batch above its crossover, with hysteresis (1) or not (0)" + AS_OF,
       ("route",), issue="crossover"),
    _m("route_predicted_speedup_ratio", "gauge", "Predicted spec / plain throughput at the current batch" + AS_OF,
       ("route",), issue="crossover"),
    _m("route_compute_bound", "gauge", "The route's GPUs look compute-bound by GPM tensor and DRAM activity" + AS_OF,
       ("route",), issue="crossover"),
    # --- gpu
    _m("nvml_up", "gauge", "Whether NVML loaded and answered (1) or not (0)", issue="gpu"),
    _m("gpu_up", "gauge", "Whether the GPU answered NVML in the last cycle", ("gpu",), issue="gpu"),
    _m("gpu_info", "gauge", "GPU facts; always 1", ("gpu", "uuid", "name", "driver"), issue="gpu"),
    _m("route_gpu_info", "gauge", "Route to GPU mapping; always 1", ("route", "gpu"), issue="gpu"),
)

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}


def register(spec: MetricSpec) -> None:
    """Add a metric defined elsewhere (e.g. the GPU field table) to the catalog."""
    global METRICS
    if spec.name in BY_NAME:
        if BY_NAME[spec.name] != spec:
            raise ValueError(f"conflicting catalog entry for {spec.name}")
        return
    BY_NAME[spec.name] = spec
    METRICS = METRICS + (spec,)
