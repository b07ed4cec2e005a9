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
    area: str = "core"  # the README metric table it is listed in: core, service, detection, crossover, gpu


def _m(name: str, type_: str, help_: str, labels: tuple[str, ...] = (), area: str = "core") -> MetricSpec:
    return MetricSpec(PREFIX + name, type_, help_, labels, area)


METRICS: tuple[MetricSpec, ...] = (
    # --- self
    _m("build_info", "gauge", "specwatch build information; always 1", ("version",)),
    _m("last_evaluation_timestamp_seconds", "gauge", "Unix time of the last completed evaluation cycle"),
    _m("evaluation_duration_seconds", "gauge", "Duration of the last evaluation cycle"),
    _m("evaluation_overruns_total", "counter", "Evaluation cycles that took longer than the interval"),
    _m(
        "config_last_reload_successful",
        "gauge",
        "Whether the last configuration reload succeeded (1) or not (0)",
        area="service",
    ),
    _m(
        "config_last_reload_success_timestamp_seconds",
        "gauge",
        "Unix time of the last successful configuration load",
        area="service",
    ),
    _m(
        "state_errors_total",
        "counter",
        "Errors of the baseline state store (corrupt, unreadable or unwritable)",
        area="detection",
    ),
    _m(
        "evaluator_errors_total",
        "counter",
        "Evaluations of the route that raised, by evaluator (build: building the route's evaluators failed); "
        "a failing evaluator's values are left out; an evaluator appears once it has failed",
        ("route", "evaluator"),
    ),
    _m(
        "render_errors_total",
        "counter",
        "Renders of a /metrics or OTLP section that raised; a failing section's metrics are left out",
        ("section",),
    ),
    _m("otlp_export_errors_total", "counter", "OTLP exports that failed or raised; the log says why"),
    _m(
        "admin_requests_total",
        "counter",
        "Admin API requests (POST /api/v1/baselines/ROUTE/ACTION) by action and outcome: performed, failed (the "
        "action refused it), unauthorized, forbidden (not an admin), cross_origin, misdirected (Host not "
        "allowed), bad_request; the log has a line for each",
        ("action", "outcome"),
        area="service",
    ),
    # --- sources
    _m("route_up", "gauge", "Whether the last scrape of the route's engine endpoint succeeded" + AS_OF, ("route",)),
    _m(
        "route_info",
        "gauge",
        "Route facts; always 1" + AS_OF,
        ("route", "engine_kind", "model_name", "engine_version", "acceptance_source"),
    ),
    _m("source_scrape_duration_seconds", "gauge", "Duration of the last scrape of the route's endpoint", ("route",)),
    _m(
        "route_last_scrape_timestamp_seconds",
        "gauge",
        "Unix time of the last successful scrape of the route's engine endpoint" + AS_OF,
        ("route",),
    ),
    _m(
        "source_errors_total",
        "counter",
        "Failed scrapes of the route's endpoint by reason; a reason appears once it has counted",
        ("route", "reason"),
    ),
    # --- tracking
    _m(
        "route_drafts_total",
        "counter",
        "Draft steps (one request in one verify step), summed over engines and corrected across engine restarts",
        ("route",),
    ),
    _m(
        "route_draft_tokens_total",
        "counter",
        "Draft tokens proposed and verified, summed over engines and corrected across engine restarts",
        ("route",),
    ),
    _m(
        "route_accepted_tokens_total",
        "counter",
        "Accepted draft tokens (bonus token excluded), summed over engines and corrected across engine restarts",
        ("route",),
    ),
    _m(
        "route_rejected_samples_total",
        "counter",
        "Engine counter samples rejected as impossible and never stored, by reason: non_finite, negative, "
        "too_large (past 2^53), too_fast (grew over 1e9/s), accepted_over_drafted; a reason appears once it has "
        "counted",
        ("route", "reason"),
    ),
    _m(
        "route_acceptance_ratio",
        "gauge",
        "Draft token acceptance rate, accepted / drafted tokens over the window" + AS_OF,
        ("route", "window"),
    ),
    _m(
        "route_mean_acceptance_length",
        "gauge",
        "Mean tokens per verify step including the bonus token over the window, for routes whose engine reports "
        "acceptance as interval gauges (SGLang before 0.5.13); for counter routes it is 1 + rate(accepted_tokens) / "
        "rate(drafts)" + AS_OF,
        ("route", "window"),
    ),
    _m(
        "route_position_acceptance_ratio",
        "gauge",
        "Share of drafts whose token at this position was accepted, over the window (where the engine counts "
        "drafted tokens per position, of the drafts that reached it)" + AS_OF,
        ("route", "position", "window"),
    ),
    _m(
        "route_position_acceptance_comparable",
        "gauge",
        "Whether the per-position acceptance over 5m reads as the acceptance at each position (1: every draft "
        "proposed all k positions, or the engine counts drafted tokens per position) or not (0: shorter drafts "
        "count as rejections at positions they never drafted); absent without per-position acceptance" + AS_OF,
        ("route",),
    ),
    _m("route_draft_length", "gauge", "Effective draft length k, draft tokens / drafts over 5m" + AS_OF, ("route",)),
    _m(
        "route_speculation_active",
        "gauge",
        "Whether drafts were proposed over 5m (1) or the route generated tokens "
        "with none, or fewer than 1 draft token per 100, although speculation is configured (0); absent while idle"
        + AS_OF,
        ("route",),
    ),
    _m("route_running_requests", "gauge", "Running requests summed over the route's engines" + AS_OF, ("route",)),
    _m("route_waiting_requests", "gauge", "Waiting requests summed over the route's engines" + AS_OF, ("route",)),
    _m("route_kv_cache_usage_ratio", "gauge", "Mean KV-cache usage over the route's engines, 0-1" + AS_OF, ("route",)),
    # --- detection
    _m(
        "route_acceptance_baseline_ratio",
        "gauge",
        "Pinned baseline acceptance rate of the route" + AS_OF,
        ("route",),
        area="detection",
    ),
    _m(
        "route_acceptance_baseline_info",
        "gauge",
        "The (model, engine version, draft length k, speculative method:drafter) the route's baseline holds for "
        "and where it came from (learned, accepted, adopted, config, fleet); always 1" + AS_OF,
        ("route", "model_name", "engine_version", "draft_length", "drafter", "source"),
        area="detection",
    ),
    _m(
        "route_acceptance_baseline_overdispersion",
        "gauge",
        "Overdispersion (design effect) of the route's baseline: how much more its acceptance varies than a "
        "binomial" + AS_OF,
        ("route",),
        area="detection",
    ),
    _m(
        "route_acceptance_threshold_ratio",
        "gauge",
        "Acceptance the detector alarms below: the baseline x (1 - the route's drop)" + AS_OF,
        ("route",),
        area="detection",
    ),
    _m(
        "route_acceptance_drop_ratio",
        "gauge",
        "Relative acceptance drop, 1 - current / baseline" + AS_OF,
        ("route",),
        area="detection",
    ),
    _m(
        "route_acceptance_degraded",
        "gauge",
        "Detector verdict: acceptance dropped below the baseline (1) or not (0)" + AS_OF,
        ("route",),
        area="detection",
    ),
    _m(
        "route_acceptance_cusum",
        "gauge",
        "CUSUM evidence statistic of an acceptance drop (alarm at the threshold)" + AS_OF,
        ("route",),
        area="detection",
    ),
    _m(
        "route_detection_horizon_seconds",
        "gauge",
        "Expected time to page a 20% acceptance drop, by the traffic detector at the last hour's evidence rate "
        '(path="traffic"; 31536000, a year, when it never would) '
        'or by canary probes (path="probe", where configured)' + AS_OF,
        ("route", "path"),
        area="detection",
    ),
    _m(
        "route_detection_horizon_budget_seconds",
        "gauge",
        "The route's detection.horizon_budget: longest acceptable detection horizon",
        ("route",),
        area="detection",
    ),
    _m(
        "route_model_changes_total",
        "counter",
        "Model, engine version or draft length changes seen on the route",
        ("route",),
        area="detection",
    ),
    _m(
        "route_seed_errors_total",
        "counter",
        "Baselines asked of the fleet (detection.seed_from) that were not used, by reason (connection, timeout, "
        "too_large, invalid_answer, too_few_nodes, not_finite, out_of_range, cannot_page, below_own_traffic, "
        "stored_invalid: a stored fleet baseline not usable, internal); only routes with seed_from",
        ("route", "reason"),
        area="detection",
    ),
    _m(
        "route_last_model_change_timestamp_seconds",
        "gauge",
        "Unix time of the last model change on the route",
        ("route",),
        area="detection",
    ),
    # --- crossover
    _m(
        "route_crossover_batch_size",
        "gauge",
        "Batch size above which speculative decoding lowers throughput" + AS_OF,
        ("route", "source"),
        area="crossover",
    ),
    _m(
        "route_crossover_band_batch_size",
        "gauge",
        "Band of the crossover batch size: the estimate's held-out validation error (source estimate) or a "
        "jackknife over observed batches (source live); kernel is the verify attention kernel the step model "
        "prices (packed, unpacked, or unknown: the estimate's band then spans both)" + AS_OF,
        ("route", "source", "bound", "kernel"),
        area="crossover",
    ),
    _m(
        "route_crossover_flag_batch_size",
        "gauge",
        "Batch size the above-crossover flag judges against now, labelled with where it comes from: live once "
        "the live calibration settled, else the configured source (an estimate's band upper side); absent "
        "when the flag cannot fire" + AS_OF,
        ("route", "source"),
        area="crossover",
    ),
    _m(
        "route_kv_capacity_batch_size",
        "gauge",
        "Largest batch whose KV cache fits the route's GPUs at the live context (estimate source); an estimated "
        "crossover above it is reported as none" + AS_OF,
        ("route",),
        area="crossover",
    ),
    _m(
        "route_crossover_live_bins",
        "gauge",
        "Batch bins with observed step times in the route's live calibration" + AS_OF,
        ("route",),
        area="crossover",
    ),
    _m(
        "route_batch_size",
        "gauge",
        "Time-weighted running requests per engine of the route" + AS_OF,
        ("route",),
        area="crossover",
    ),
    _m(
        "route_above_crossover",
        "gauge",
        "Route batch above its crossover, with hysteresis (1) or not (0)" + AS_OF,
        ("route",),
        area="crossover",
    ),
    _m(
        "route_predicted_speedup_ratio",
        "gauge",
        "Predicted spec / plain throughput at the current batch" + AS_OF,
        ("route",),
        area="crossover",
    ),
    _m(
        "route_speculation_gpu_seconds_lost_total",
        "counter",
        "GPU-seconds speculative decoding cost the route: "
        "GPUs x time x (1 - predicted speedup) while the speedup is below 1",
        ("route",),
        area="crossover",
    ),
    _m(
        "route_speculation_gpu_seconds_saved_total",
        "counter",
        "GPU-seconds speculative decoding saved the route: "
        "GPUs x time x (predicted speedup - 1) while the speedup is above 1",
        ("route",),
        area="crossover",
    ),
    _m(
        "route_compute_bound",
        "gauge",
        "The route's GPUs look compute-bound by GPM tensor and DRAM activity" + AS_OF,
        ("route",),
        area="crossover",
    ),
    # --- canary probes (only for routes with `probe:` configured)
    _m(
        "route_probe_acceptance_ratio",
        "gauge",
        "Draft acceptance of the last successful canary probe round, "
        "accepted / drafted tokens over its prompts" + AS_OF,
        ("route",),
        area="probe",
    ),
    _m(
        "route_probe_baseline_ratio",
        "gauge",
        "Acceptance of the canary fingerprint the rounds are judged "
        "against, over the prompts paired in the last round" + AS_OF,
        ("route",),
        area="probe",
    ),
    _m(
        "route_probe_degraded",
        "gauge",
        "Canary verdict: two rounds in a row dropped below the fingerprint prompt by prompt (1) or not (0)" + AS_OF,
        ("route",),
        area="probe",
    ),
    _m(
        "route_probe_success",
        "gauge",
        "Whether the last canary probe round read the engine's acceptance (1) or failed or found it busy (0)" + AS_OF,
        ("route",),
        area="probe",
    ),
    _m(
        "route_probe_duration_seconds",
        "gauge",
        "Duration of the last canary probe round" + AS_OF,
        ("route",),
        area="probe",
    ),
    _m(
        "route_probe_rounds_total",
        "counter",
        "Canary probe rounds by result (ok, busy, error, skipped: not sent because the engine queued requests); "
        "a result appears once it has counted",
        ("route", "result"),
        area="probe",
    ),
    _m(
        "route_probe_method_info",
        "gauge",
        "How canary probes read acceptance (vllm_response, sglang_generate, "
        "sglang_openai, llamacpp_timings, bracketing); always 1" + AS_OF,
        ("route", "method"),
        area="probe",
    ),
    # --- gpu
    _m("nvml_up", "gauge", "Whether NVML loaded and answered (1) or not (0)", area="gpu"),
    _m("gpu_up", "gauge", "Whether the GPU answered NVML in the last cycle", ("gpu",), area="gpu"),
    _m("gpu_info", "gauge", "GPU facts; always 1", ("gpu", "uuid", "name", "driver"), area="gpu"),
    _m("route_gpu_info", "gauge", "Route to GPU mapping; always 1", ("route", "gpu"), area="gpu"),
    # GPU fields, one per row of sources/gpu_fields.py (a test checks they agree)
    _m(
        "gpu_utilization_ratio",
        "gauge",
        "Share of the last sample period in which any kernel ran, 0-1; liveness "
        "only (it reads ~1 at any decode batch): use gpu_sm_active_ratio and gpu_tensor_active_ratio for load",
        ("gpu",),
        area="gpu",
    ),
    _m("gpu_memory_used_bytes", "gauge", "GPU memory in use", ("gpu",), area="gpu"),
    _m("gpu_memory_total_bytes", "gauge", "GPU memory installed", ("gpu",), area="gpu"),
    _m("gpu_power_watts", "gauge", "GPU power draw", ("gpu",), area="gpu"),
    _m("gpu_power_limit_watts", "gauge", "GPU enforced power limit", ("gpu",), area="gpu"),
    _m("gpu_sm_clock_hertz", "gauge", "GPU SM clock frequency", ("gpu",), area="gpu"),
    _m("gpu_memory_clock_hertz", "gauge", "GPU memory clock frequency", ("gpu",), area="gpu"),
    _m("gpu_temperature_celsius", "gauge", "GPU die temperature", ("gpu",), area="gpu"),
    _m(
        "gpu_clock_throttle_reasons",
        "gauge",
        "Bitmask of active NVML clock event (throttle) reasons, 0 if none: "
        "0x1 gpu_idle, 0x2 applications_clocks_setting, 0x4 sw_power_cap, 0x8 hw_slowdown, 0x10 sync_boost, "
        "0x20 sw_thermal_slowdown, 0x40 hw_thermal_slowdown, 0x80 hw_power_brake_slowdown, 0x100 display_clock_setting",
        ("gpu",),
        area="gpu",
    ),
    _m(
        "gpu_ecc_corrected_errors_total",
        "counter",
        "Corrected ECC memory errors since the driver was loaded",
        ("gpu",),
        area="gpu",
    ),
    _m(
        "gpu_ecc_uncorrected_errors_total",
        "counter",
        "Uncorrected ECC memory errors since the driver was loaded",
        ("gpu",),
        area="gpu",
    ),
    _m(
        "gpu_sm_active_ratio",
        "gauge",
        "Share of SMs busy over the last evaluation interval, 0-1 (GPM, Hopper+)" + AS_OF,
        ("gpu",),
        area="gpu",
    ),
    _m(
        "gpu_tensor_active_ratio",
        "gauge",
        "Share of time the SMs ran any tensor-core instruction over the last "
        "evaluation interval, 0-1 (GPM, Hopper+)" + AS_OF,
        ("gpu",),
        area="gpu",
    ),
    _m(
        "gpu_dram_bandwidth_utilization_ratio",
        "gauge",
        "DRAM bandwidth used relative to the peak over the last evaluation interval, 0-1 (GPM, Hopper+)" + AS_OF,
        ("gpu",),
        area="gpu",
    ),
    _m(
        "gpu_sm_occupancy_ratio",
        "gauge",
        "Resident warps relative to the SMs' maximum over the last evaluation interval, 0-1 (GPM, Hopper+)" + AS_OF,
        ("gpu",),
        area="gpu",
    ),
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
