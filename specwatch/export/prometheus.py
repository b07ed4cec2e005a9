"""The Prometheus collector: fresh metric families rendered from the current Snapshot on every scrape.

Names, HELP and types come from `catalog.py`, nothing is cached between scrapes (a vanished route or GPU
simply disappears), absent values are omitted rather than exported as NaN, and no sample carries a
timestamp. `collect()` never raises: prometheus_client fails the whole scrape when a collector raises, so
each section is rendered on its own and a bug in one is logged and costs only that section.

The sections below are the one description of what is exported. They write either client_python families
(`render_families`: the collector, hence OTel and any format client_python writes) or, for the formats
Prometheus and curl ask for, text lines directly (`render_text`: the same bytes; `text_format.py` says why).

Every per-route series is in docs/metrics-budget.md with the panel, alert or rule that reads it. What PromQL
can derive from other series (a ratio of exported counters, a flag inverted, a difference) is left to PromQL,
and counters by reason show a reason once it has counted, so a healthy route pays for none of them.
"""

from __future__ import annotations

import logging
import math
import threading
from functools import partial
from typing import Callable, Generic, Iterator, Protocol, Sequence, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from specwatch import __version__
from specwatch.catalog import BY_NAME, PREFIX, MetricSpec
from specwatch.export.text_format import TextFamily, text_body
from specwatch.snapshot import RouteState, Snapshot

log = logging.getLogger(__name__)
_reported_unknown: set[str] = set()  # names outside the catalog already logged (once per process)


class Family(Protocol):
    def add(self, value: float | bool | None, /, *label_values: str) -> None:
        """Add one sample, label values in the catalog's label order; None, NaN and infinities are omitted,
        booleans are 1/0."""


class _Dropped:
    def add(self, value: float | bool | None, /, *label_values: str) -> None:
        pass


class _ClientFamily:
    """A prometheus_client family, for the collector (OpenMetrics, OTel, generate_latest)."""

    def __init__(self, spec: MetricSpec) -> None:
        cls = CounterMetricFamily if spec.type == "counter" else GaugeMetricFamily
        self.metric: CounterMetricFamily | GaugeMetricFamily = cls(spec.name, spec.help, labels=spec.labels)

    def add(self, value: float | bool | None, /, *label_values: str) -> None:
        if value is not None and math.isfinite(value := float(value)):
            self.metric.add_metric(label_values, value)

    def has_samples(self) -> bool:
        return bool(self.metric.samples)


class _TextFamily(TextFamily):
    __slots__ = ()

    def add(self, value: float | bool | None, /, *label_values: str) -> None:
        if value is not None and math.isfinite(value := float(value)):
            self.append(value, label_values)


F = TypeVar("F", _ClientFamily, _TextFamily)


class _Families(Generic[F]):
    """One scrape's families, created on first use from their catalog entry, in first-use order, as
    prometheus_client families (`_ClientFamily`) or text-format lines (`_TextFamily`)."""

    def __init__(self, new_family: Callable[[MetricSpec], F]) -> None:
        self._new_family: Callable[[MetricSpec], F] = new_family
        self.families: dict[str, F | _Dropped] = {}

    def __call__(self, name: str) -> Family:
        """The family of catalog metric PREFIX + `name`."""
        family = self.families.get(name)
        if family is None:
            spec = BY_NAME.get(PREFIX + name)
            if spec is None:
                if name not in _reported_unknown:  # a metric outside the catalog is a bug: say so, render the rest
                    log.error("metric %s%s is not in the catalog; not exported", PREFIX, name)
                    _reported_unknown.add(name)
                family = _Dropped()
            else:
                family = self._new_family(spec)
            self.families[name] = family
        return family

    def rendered(self) -> list[F]:
        """The families holding at least one sample, in first-use order."""
        return [f for f in self.families.values() if not isinstance(f, _Dropped) and f.has_samples()]


Families = Callable[[str], Family]  # what sections write to: f("route_up") is this scrape's route_up family


class ExportErrors:
    """Failures of the exporters themselves, for /metrics: sections that raised while rendering, OTLP
    exports that failed. One per process, shared by the HTTP server and the OTLP export; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._render: dict[str, float] = {}
        self._otlp = 0.0

    def count_render(self, section: str) -> None:
        with self._lock:
            self._render[section] = self._render.get(section, 0.0) + 1

    def count_otlp(self) -> None:
        with self._lock:
            self._otlp += 1

    def counts(self) -> tuple[dict[str, float], float]:
        """(render errors by section, OTLP export errors)."""
        with self._lock:
            return dict(self._render), self._otlp


class AdminRequests:
    """Admin API requests by (action, outcome), for /metrics: counted by the HTTP server as they are answered,
    read at render time, never part of the Snapshot. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], float] = {}

    def count(self, action: str, outcome: str) -> None:
        with self._lock:
            self._counts[(action, outcome)] = self._counts.get((action, outcome), 0.0) + 1

    def counts(self) -> dict[tuple[str, str], float]:
        with self._lock:
            return dict(self._counts)


def _self_metrics(s: Snapshot, f: Families) -> None:
    f("build_info").add(1, __version__)
    if s.timestamp > 0:  # before the first evaluation there is no "last evaluation"
        f("last_evaluation_timestamp_seconds").add(s.timestamp)
        f("evaluation_duration_seconds").add(s.evaluation_duration_seconds)
    f("evaluation_overruns_total").add(s.evaluation_overruns_total)
    f("config_last_reload_successful").add(s.config_last_reload_successful)
    f("config_last_reload_success_timestamp_seconds").add(s.config_last_reload_success_timestamp)
    f("state_errors_total").add(s.state_errors_total)


def _route_metrics(s: Snapshot, f: Families) -> None:
    routes = s.routes
    _per_route(f, "route_up", routes, "up")
    info = f("route_info")
    for r in routes:
        info.add(1, r.name, r.engine_kind, r.model_name, r.engine_version, r.acceptance_source)
    _per_route(f, "source_scrape_duration_seconds", routes, "scrape_duration_seconds")
    _per_route(f, "route_last_scrape_timestamp_seconds", routes, "last_scrape_timestamp")
    _per_route_and_key(f, "source_errors_total", routes, "errors_total")
    _per_route_and_key(f, "evaluator_errors_total", routes, "evaluator_errors_total")
    counting = [r for r in routes if r.acceptance_source == "counter"]  # gauge-only engines have no counters
    _per_route(f, "route_drafts_total", counting, "drafts_total")
    _per_route(f, "route_draft_tokens_total", counting, "draft_tokens_total")
    _per_route(f, "route_accepted_tokens_total", counting, "accepted_tokens_total")
    _per_route_and_key(f, "route_rejected_samples_total", routes, "rejected_samples_total")
    ratio = f("route_acceptance_ratio")
    for r in routes:
        for window, value in r.acceptance_ratio.items():
            ratio.add(value, r.name, window)
    length = f("route_mean_acceptance_length")
    for r in routes:
        if r.acceptance_source == "counter":  # 1 + rate(accepted) / rate(drafts) of the counters above
            continue
        for window, value in r.mean_acceptance_length.items():
            length.add(value, r.name, window)
    position_ratio = f("route_position_acceptance_ratio")
    for r in routes:
        for position, value in enumerate(r.position_acceptance_ratio):
            position_ratio.add(value, r.name, str(position), "5m")
    _per_route(f, "route_position_acceptance_comparable", routes, "position_acceptance_comparable")
    _per_route(f, "route_draft_length", routes, "draft_length")
    _per_route(f, "route_speculation_active", routes, "speculation_active")
    _per_route(f, "route_running_requests", routes, "running_requests")
    _per_route(f, "route_waiting_requests", routes, "waiting_requests")
    _per_route(f, "route_kv_cache_usage_ratio", routes, "kv_usage_ratio")


def _detection_metrics(s: Snapshot, f: Families) -> None:
    routes = s.routes
    _per_route(f, "route_acceptance_baseline_ratio", routes, "baseline_ratio")
    info = f("route_acceptance_baseline_info")
    for r in routes:
        if r.baseline_ratio is not None and r.baseline_source:
            k = str(r.baseline_draft_length) if r.baseline_draft_length else ""
            info.add(1, r.name, r.baseline_model, r.baseline_engine_version, k, r.baseline_drafter, r.baseline_source)
    _per_route(f, "route_acceptance_baseline_overdispersion", routes, "baseline_overdispersion")
    _per_route(f, "route_acceptance_threshold_ratio", routes, "acceptance_threshold_ratio")
    _per_route(f, "route_acceptance_drop_ratio", routes, "drop_ratio")
    _per_route(f, "route_acceptance_degraded", routes, "degraded")
    _per_route(f, "route_acceptance_cusum", routes, "cusum_statistic")
    horizon = f("route_detection_horizon_seconds")
    for r in routes:
        horizon.add(r.traffic_horizon_seconds, r.name, "traffic")
        horizon.add(r.probe_horizon_seconds, r.name, "probe")
    _per_route(f, "route_detection_horizon_budget_seconds", routes, "horizon_budget_seconds")
    _per_route(f, "route_model_changes_total", routes, "model_changes_total")
    _per_route_and_key(f, "route_seed_errors_total", routes, "seed_errors_total")  # empty without seed_from
    _per_route(f, "route_last_model_change_timestamp_seconds", routes, "last_model_change_timestamp")


def _crossover_metrics(s: Snapshot, f: Families) -> None:
    routes = s.routes
    crossover = f("route_crossover_batch_size")
    band = f("route_crossover_band_batch_size")
    for r in routes:
        crossover.add(r.crossover_batch_size, r.name, r.crossover_source)
        crossover.add(r.live_crossover_batch_size, r.name, "live")
        kernel, live_kernel = r.crossover_attention_kernel, r.live_crossover_attention_kernel
        band.add(r.crossover_lower, r.name, r.crossover_source, "lower", kernel)
        band.add(r.crossover_upper, r.name, r.crossover_source, "upper", kernel)
        band.add(r.live_crossover_lower, r.name, "live", "lower", live_kernel)
        band.add(r.live_crossover_upper, r.name, "live", "upper", live_kernel)
    flag = f("route_crossover_flag_batch_size")
    for r in routes:
        if r.crossover_flag_source:
            flag.add(r.crossover_flag_batch_size, r.name, r.crossover_flag_source)
    _per_route(f, "route_kv_capacity_batch_size", routes, "crossover_kv_capacity_batch")
    _per_route(f, "route_crossover_live_bins", routes, "live_crossover_bins")
    _per_route(f, "route_batch_size", routes, "batch_size")
    _per_route(f, "route_above_crossover", routes, "above_crossover")
    _per_route(f, "route_predicted_speedup_ratio", routes, "predicted_speedup_ratio")
    _per_route(f, "route_speculation_gpu_seconds_lost_total", routes, "speculation_gpu_seconds_lost_total")
    _per_route(f, "route_speculation_gpu_seconds_saved_total", routes, "speculation_gpu_seconds_saved_total")
    _per_route(f, "route_compute_bound", routes, "compute_bound")


def _probe_metrics(s: Snapshot, f: Families) -> None:
    routes = [r for r in s.routes if r.probe_rounds_total]  # only routes with canary probes configured
    if not routes:
        return
    _per_route(f, "route_probe_acceptance_ratio", routes, "probe_acceptance_ratio")
    _per_route(f, "route_probe_baseline_ratio", routes, "probe_baseline_ratio")
    _per_route(f, "route_probe_degraded", routes, "probe_degraded")
    _per_route(f, "route_probe_success", routes, "probe_success")
    _per_route(f, "route_probe_duration_seconds", routes, "probe_duration_seconds")
    _per_route_and_key(f, "route_probe_rounds_total", routes, "probe_rounds_total")
    method = f("route_probe_method_info")
    for r in routes:
        if r.probe_method:
            method.add(1, r.name, r.probe_method)


def _gpu_metrics(s: Snapshot, f: Families) -> None:
    if s.nvml_up is None:  # GPU collection disabled
        return
    f("nvml_up").add(s.nvml_up)
    up, info = f("gpu_up"), f("gpu_info")
    for g in s.gpus:
        gpu = str(g.index)
        up.add(g.up, gpu)
        if g.uuid or g.name:
            info.add(1, gpu, g.uuid, g.name, g.driver)
        for key, value in sorted(g.fields.items()):
            f(key).add(value, gpu)
    route_gpu = f("route_gpu_info")
    for r in s.routes:
        for gpu_index in r.gpus:
            route_gpu.add(1, r.name, str(gpu_index))


def _per_route(f: Families, name: str, routes: Sequence[RouteState], attribute: str) -> None:
    """A family with only the route label, one sample per route from RouteState.`attribute`."""
    family = f(name)
    for r in routes:
        family.add(getattr(r, attribute), r.name)


def _per_route_and_key(f: Families, name: str, routes: Sequence[RouteState], attribute: str) -> None:
    """A counter labelled by route and one more label, from the dict RouteState.`attribute` (key -> count).

    A key appears once it has counted: zeros of every reason on every route would be most of a healthy
    route's series. `increase()` misses only the first count of a reason, and no alert pages on one count."""
    family = f(name)
    for r in routes:
        for key, value in sorted(getattr(r, attribute).items()):
            if value:
                family.add(value, r.name, key)


_SECTIONS: tuple[Callable[[Snapshot, Families], None], ...] = (
    _self_metrics,
    _route_metrics,
    _detection_metrics,
    _crossover_metrics,
    _probe_metrics,
    _gpu_metrics,
)


def section_name(section: Callable[[Snapshot, Families], None]) -> str:
    """The `section` label of a section function: `_route_metrics` -> `route`."""
    return section.__name__.strip("_").removesuffix("_metrics")


def render_families(
    snapshot: Snapshot, errors: ExportErrors | None = None, admin: AdminRequests | None = None
) -> list[Metric]:
    """All metric families for one snapshot. Never raises; a failing section is logged, counted in `errors`
    (a fresh ExportErrors when not given) and left out. `admin`: the HTTP server's admin request counts."""
    families = _Families(_ClientFamily)
    _render(snapshot, families, errors or ExportErrors(), admin)
    return [family.metric for family in families.rendered()]


def render_text(
    snapshot: Snapshot,
    openmetrics: bool = False,
    errors: ExportErrors | None = None,
    admin: AdminRequests | None = None,
) -> bytes:
    """The snapshot in the Prometheus text format (or OpenMetrics): exactly the bytes client_python's
    `generate_latest` (`openmetrics.exposition.generate_latest`) writes for `render_families(snapshot)`,
    without building its Metric objects. Never raises, like render_families."""
    families = _Families(partial(_TextFamily, openmetrics=openmetrics))
    _render(snapshot, families, errors or ExportErrors(), admin)
    return text_body(families.rendered(), openmetrics)


def _render(snapshot: Snapshot, families: Families, errors: ExportErrors, admin: AdminRequests | None) -> None:
    for section in _SECTIONS:
        try:
            section(snapshot, families)
        except Exception:  # noqa: BLE001 - a rendering bug must not turn /metrics into a 500
            log.exception("rendering %s failed; the rest of /metrics is still served", section.__name__)
            errors.count_render(section_name(section))
    # Last, so this render's own failures are in it; every section from 0, so the first failure is an increase.
    render_errors, otlp_errors = errors.counts()
    family = families("render_errors_total")
    for name in sorted({section_name(s) for s in _SECTIONS} | render_errors.keys()):
        family.add(render_errors.get(name, 0.0), name)
    families("otlp_export_errors_total").add(otlp_errors)
    admin_counts = admin.counts() if admin is not None else {}
    if admin_counts:
        family = families("admin_requests_total")
        for (action, outcome), value in sorted(admin_counts.items()):
            family.add(value, action, outcome)


class SnapshotCollector(Collector):
    """A prometheus_client collector over whatever Snapshot `get_snapshot()` returns at scrape time."""

    def __init__(
        self,
        get_snapshot: Callable[[], Snapshot],
        errors: ExportErrors | None = None,
        admin: AdminRequests | None = None,
    ) -> None:
        self._get_snapshot = get_snapshot
        self._errors = errors or ExportErrors()
        self._admin = admin

    def collect(self) -> Iterator[Metric]:
        try:
            snapshot = self._get_snapshot()
        except Exception:  # noqa: BLE001
            log.exception("reading the snapshot failed; serving an empty /metrics")
            return iter(())
        return iter(render_families(snapshot, self._errors, self._admin))

    def describe(self) -> Iterator[Metric]:
        # Unchecked collector: families vary with the snapshot, so registration must not call collect().
        return iter(())
