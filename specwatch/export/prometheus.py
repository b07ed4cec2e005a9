"""The Prometheus collector: fresh metric families rendered from the current Snapshot on every scrape.

Names, HELP and types come from `catalog.py`, nothing is cached between scrapes (a vanished route or GPU
simply disappears), absent values are omitted rather than exported as NaN, and no sample carries a
timestamp. `collect()` never raises: prometheus_client fails the whole scrape when a collector raises, so
each section is rendered on its own and a bug in one is logged and costs only that section.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Generic, Iterator, Mapping, Protocol, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from specwatch import __version__
from specwatch.catalog import BY_NAME, PREFIX, MetricSpec
from specwatch.export.text_format import TextFamily, text_body
from specwatch.snapshot import Snapshot

log = logging.getLogger(__name__)
_reported_unknown: set[str] = set()  # names outside the catalog already logged (once per process)


class Samples(Protocol):
    """Where the sections below write one scrape's samples."""

    def add(self, name: str, value: float | bool | None, /, **labels: str) -> None: ...


class _Family(Protocol):
    def add(self, labels: Mapping[str, str], value: float) -> None: ...


F = TypeVar("F", bound=_Family)


class _CatalogFamilies(Generic[F]):
    """One scrape's samples, grouped into families created on first use from their catalog entry, in first-use
    order, as prometheus_client families (`_ClientFamily`) or text-format lines (`TextFamily`)."""

    def __init__(self, new_family: Callable[[MetricSpec], F]) -> None:
        self._new_family = new_family
        self.families: dict[str, F] = {}

    def add(self, name: str, value: float | bool | None, /, **labels: str) -> None:
        """Add one sample; None, NaN and infinities are omitted, booleans are 1/0. (Positional-only
        parameters, so `name` is free as a label: gpu_info has one.)"""
        if value is None:
            return
        value = float(value)
        if not math.isfinite(value):
            return
        family = self.families.get(name)
        if family is None:
            spec = BY_NAME.get(name)
            if spec is None:
                if name not in _reported_unknown:  # a metric outside the catalog is a bug: say so, render the rest
                    log.error("metric %s is not in the catalog; not exported", name)
                    _reported_unknown.add(name)
                return
            family = self.families[name] = self._new_family(spec)
        family.add(labels, value)


class _ClientFamily:
    """A prometheus_client family, for the collector (OpenMetrics, OTel, generate_latest)."""

    def __init__(self, spec: MetricSpec) -> None:
        cls = CounterMetricFamily if spec.type == "counter" else GaugeMetricFamily
        self.metric: Metric = cls(spec.name, spec.help, labels=spec.labels)
        self._label_names = spec.labels

    def add(self, labels: Mapping[str, str], value: float) -> None:
        self.metric.add_metric([labels[label] for label in self._label_names], value)


def _self_metrics(s: Snapshot, f: Samples) -> None:
    f.add(PREFIX + "build_info", 1, version=__version__)
    if s.timestamp > 0:  # before the first evaluation there is no "last evaluation"
        f.add(PREFIX + "last_evaluation_timestamp_seconds", s.timestamp)
        f.add(PREFIX + "evaluation_duration_seconds", s.evaluation_duration_seconds)
    f.add(PREFIX + "evaluation_overruns_total", s.evaluation_overruns_total)
    f.add(PREFIX + "config_last_reload_successful", s.config_last_reload_successful)
    f.add(PREFIX + "config_last_reload_success_timestamp_seconds", s.config_last_reload_success_timestamp)
    f.add(PREFIX + "state_errors_total", s.state_errors_total)


def _route_metrics(s: Snapshot, f: Samples) -> None:
    for r in s.routes:
        route = r.name
        f.add(PREFIX + "route_up", r.up, route=route)
        f.add(PREFIX + "route_info", 1, route=route, engine_kind=r.engine_kind, model_name=r.model_name,
              engine_version=r.engine_version, acceptance_source=r.acceptance_source)
        f.add(PREFIX + "source_scrape_duration_seconds", r.scrape_duration_seconds, route=route)
        for reason, count in sorted(r.errors_total.items()):
            f.add(PREFIX + "source_errors_total", count, route=route, reason=reason)
        if r.acceptance_source == "counter":  # gauge-only engines have no counters to export
            f.add(PREFIX + "route_drafts_total", r.drafts_total, route=route)
            f.add(PREFIX + "route_draft_tokens_total", r.draft_tokens_total, route=route)
            f.add(PREFIX + "route_accepted_tokens_total", r.accepted_tokens_total, route=route)
        for window, ratio in r.acceptance_ratio.items():
            f.add(PREFIX + "route_acceptance_ratio", ratio, route=route, window=window)
        for window, length in r.mean_acceptance_length.items():
            f.add(PREFIX + "route_mean_acceptance_length", length, route=route, window=window)
        for position, ratio in enumerate(r.position_acceptance_ratio):
            f.add(PREFIX + "route_position_acceptance_ratio", ratio, route=route, position=str(position), window="5m")
        f.add(PREFIX + "route_draft_length", r.draft_length, route=route)
        f.add(PREFIX + "route_running_requests", r.running_requests, route=route)
        f.add(PREFIX + "route_waiting_requests", r.waiting_requests, route=route)
        f.add(PREFIX + "route_kv_cache_usage_ratio", r.kv_usage_ratio, route=route)


def _detection_metrics(s: Snapshot, f: Samples) -> None:
    for r in s.routes:
        route = r.name
        f.add(PREFIX + "route_acceptance_baseline_ratio", r.baseline_ratio, route=route)
        f.add(PREFIX + "route_acceptance_drop_ratio", r.drop_ratio, route=route)
        f.add(PREFIX + "route_acceptance_degraded", r.degraded, route=route)
        f.add(PREFIX + "route_acceptance_cusum", r.cusum_statistic, route=route)
        f.add(PREFIX + "route_model_changes_total", r.model_changes_total, route=route)
        f.add(PREFIX + "route_last_model_change_timestamp_seconds", r.last_model_change_timestamp, route=route)


def _crossover_metrics(s: Snapshot, f: Samples) -> None:
    for r in s.routes:
        route = r.name
        f.add(PREFIX + "route_crossover_batch_size", r.crossover_batch_size, route=route, source=r.crossover_source)
        f.add(PREFIX + "route_batch_size", r.batch_size, route=route)
        f.add(PREFIX + "route_above_crossover", r.above_crossover, route=route)
        f.add(PREFIX + "route_predicted_speedup_ratio", r.predicted_speedup_ratio, route=route)
        f.add(PREFIX + "route_compute_bound", r.compute_bound, route=route)


def _gpu_metrics(s: Snapshot, f: Samples) -> None:
    if s.nvml_up is None:  # GPU collection disabled
        return
    f.add(PREFIX + "nvml_up", s.nvml_up)
    for g in s.gpus:
        gpu = str(g.index)
        f.add(PREFIX + "gpu_up", g.up, gpu=gpu)
        if g.uuid or g.name:
            f.add(PREFIX + "gpu_info", 1, gpu=gpu, uuid=g.uuid, name=g.name, driver=g.driver)
        for key, value in sorted(g.fields.items()):
            f.add(PREFIX + key, value, gpu=gpu)
    for r in s.routes:
        for gpu_index in r.gpus:
            f.add(PREFIX + "route_gpu_info", 1, route=r.name, gpu=str(gpu_index))


_SECTIONS: tuple[Callable[[Snapshot, Samples], None], ...] = (
    _self_metrics, _route_metrics, _detection_metrics, _crossover_metrics, _gpu_metrics)


def render_families(snapshot: Snapshot) -> list[Metric]:
    """All metric families for one snapshot. Never raises; a failing section is logged and left out."""
    samples = _CatalogFamilies(_ClientFamily)
    _render(snapshot, samples)
    return [family.metric for family in samples.families.values()]


def render_text(snapshot: Snapshot) -> bytes:
    """The snapshot in the Prometheus text format, exactly the bytes `generate_latest` writes for
    `render_families(snapshot)`, written straight from the Snapshot. Never raises, like render_families."""
    samples = _CatalogFamilies(TextFamily)
    _render(snapshot, samples)
    return text_body(samples.families.values())


def _render(snapshot: Snapshot, samples: Samples) -> None:
    for section in _SECTIONS:
        try:
            section(snapshot, samples)
        except Exception:  # noqa: BLE001 - a rendering bug must not turn /metrics into a 500
            log.exception("rendering %s failed; the rest of /metrics is still served", section.__name__)


class SnapshotCollector(Collector):
    """A prometheus_client collector over whatever Snapshot `get_snapshot()` returns at scrape time."""

    def __init__(self, get_snapshot: Callable[[], Snapshot]) -> None:
        self._get_snapshot = get_snapshot

    def collect(self) -> Iterator[Metric]:
        try:
            snapshot = self._get_snapshot()
        except Exception:  # noqa: BLE001
            log.exception("reading the snapshot failed; serving an empty /metrics")
            return iter(())
        return iter(render_families(snapshot))

    def describe(self) -> Iterator[Metric]:
        # Unchecked collector: families vary with the snapshot, so registration must not call collect().
        return iter(())
