"""The one place for the mixin's selectors, thresholds and `for:` durations (kubernetes-mixin's `_config`).

Everything the generated rules, alerts, Alertmanager example and dashboards depend on is a field here, so a
site adapts them by `specwatch generate --selector ... --runbook-url ...`, a settings file (`--settings FILE`,
these field names as YAML keys) or `dataclasses.replace(DEFAULT, ...)`, and regenerating, never by editing the
output.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any
from dataclasses import dataclass

from specwatch.config_schema import Config, DetectionConfig, default_of, parse_duration

SEVERITIES = ("critical", "warning", "info")
# Alert classes, each with its own `severity_<class>` field: an unexplained drop, a drop after a model change
# and a canary drop are three events a site may page on differently.
ALERT_CLASSES = ("drop", "model_change", "canary", "crossover", "source", "self", "gpu", "watch")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# A duration as Prometheus's rule files write it (model.ParseDuration): 90s, 1h30m.
_PROM_DURATION = re.compile(r"(\d+(ms|s|m|h|d|w|y))+")


@dataclass(frozen=True)
class Settings:
    # PromQL label matchers selecting specwatch's own scrape targets (no braces).
    selector: str = 'job="specwatch"'
    # Labels that identify one specwatch daemon; route-level joins match on these plus `route`.
    node_labels: tuple[str, ...] = ("job", "instance")
    # Labels added to every alert (`--label team=infer`), as (name, value) pairs.
    alert_labels: tuple[tuple[str, str], ...] = ()
    # SpecwatchTargetDown judges only targets that exported specwatch_build_info within this window, so a job
    # shared with other exporters cannot page about theirs; a specwatch down for longer stops paging.
    target_down_lookback: str = "1d"

    # The daemon's evaluation interval (config `interval`); "stale" = no evaluation for N of them.
    evaluation_interval_seconds: float = default_of(Config, "interval_seconds")
    stale_intervals: int = 3

    # A degraded route whose model, engine version or k changed this recently pages as "after a model change".
    model_change_window_seconds: float = 6 * 3600.0
    # State store errors alert when the counter grew within this window.
    state_errors_window: str = "15m"
    # specwatch's own failures (evaluators, render sections, OTLP exports) count within this window; with
    # `internal_errors_for` longer than it, one isolated failure never opens a ticket, a recurring one does.
    internal_errors_window: str = "10m"
    # Bits of specwatch_gpu_clock_throttle_reasons (NVML clock event reasons) that mean the GPU is slowed by
    # hardware or heat, not by idling, sync boost or an administrator's power cap.
    gpu_throttle_bits: tuple[tuple[str, int], ...] = (
        ("hw_slowdown", 0x8),
        ("sw_thermal_slowdown", 0x20),
        ("hw_thermal_slowdown", 0x40),
        ("hw_power_brake_slowdown", 0x80),
    )

    # `for:` of each alert. Long on purpose: the detectors already require evidence and duration.
    acceptance_degraded_for: str = "5m"
    # The canary verdict already takes two rounds in a row; `for` only rides out one evaluation's blip.
    canary_dropped_for: str = "1m"
    above_crossover_for: str = "15m"
    source_down_for: str = "5m"
    speculation_inactive_for: str = "15m"
    target_down_for: str = "5m"
    stale_for: str = "5m"
    gpu_lost_for: str = "5m"
    gpu_throttling_for: str = "15m"
    state_errors_for: str = "0m"
    config_reload_failed_for: str = "10m"
    internal_errors_for: str = "15m"
    # The traffic horizon follows the last hour's traffic: a lull shorter than this opens no ticket.
    under_watched_for: str = "1h"
    # `keep_firing_for:` of every alert whose series a failed scrape of specwatch marks stale (all but
    # TargetDown, StateStoreErrors and InternalErrors). Without it one failed scrape resolves a firing alert and
    # it pages again `for:` later. As long as TargetDown's `for:`, a blind spell either keeps the alert firing or
    # hands over to TargetDown, which inhibits it; every firing alert resolves this much later. Needs Prometheus
    # >= 2.42 (older ones refuse the rule file): "0s" leaves the field out.
    keep_firing_for: str = "5m"

    # Fleet recording-rule windows: a short one for dashboards and a long one that rides out task-mix noise.
    fleet_windows: tuple[str, ...] = ("5m", "1h")

    # Base of every alert's `runbook_url`; each alert appends `#<alertname in lower case>`.
    runbook_url: str = "https://github.com/specwatch/specwatch/blob/main/docs/runbook.md"
    # Grafana's base URL (https://grafana.example): each alert gets a `dashboard_url` annotation linking to its
    # dashboard with the alert's job, instance and route selected. Empty: no such annotation.
    dashboard_url: str = ""

    # Severity per alert class: `critical` pages (the Alertmanager example routes it to `page_receiver`),
    # `warning` opens a ticket, `info` only shows. An acceptance drop is a performance regression, not an
    # outage: a ticket unless the site wants it to page.
    severity_drop: str = "warning"  # AcceptanceDegraded: a drop with no model change to explain it
    severity_model_change: str = "warning"  # AcceptanceDegradedAfterModelChange: a planned bump that regressed
    severity_canary: str = "warning"  # CanaryAcceptanceDropped
    severity_crossover: str = "warning"  # RouteAboveCrossover, SpeculationInactive
    severity_source: str = "warning"  # SourceDown
    severity_self: str = "warning"  # TargetDown, Stale, StateStoreErrors, InternalErrors, ConfigReloadFailed
    severity_gpu: str = "warning"  # GpuLost, GpuThrottling
    # How well a route is watched is a planning matter, never a page: a ticket at most.
    severity_watch: str = "warning"  # RouteUnderWatched

    # Alertmanager example: who gets pages and who gets tickets.
    page_receiver: str = "specwatch-page"
    ticket_receiver: str = "specwatch-ticket"
    page_webhook_url: str = "http://pager.example.internal/specwatch"
    ticket_webhook_url: str = "http://tickets.example.internal/specwatch"

    # Dashboards. The page threshold line is drawn at baseline x (1 - drop) for the detector's default drop
    # (config `detection.drop`); routes with their own `drop` page at their own threshold.
    default_drop: float = default_of(DetectionConfig, "drop")
    # The CUSUM alarm threshold a busy route uses by default (config `detection.cusum_threshold`).
    default_cusum_threshold: float = default_of(DetectionConfig, "cusum_threshold")
    dashboard_uid_prefix: str = "specwatch"
    dashboard_tags: tuple[str, ...] = ("specwatch", "speculative-decoding")
    dashboard_refresh: str = "30s"

    def __post_init__(self) -> None:
        problems = [
            f"severity_{cls}: {getattr(self, f'severity_{cls}')!r} is not one of {', '.join(SEVERITIES)}"
            for cls in ALERT_CLASSES
            if getattr(self, f"severity_{cls}") not in SEVERITIES
        ]
        reserved = {"severity", *self.node_labels, "route", "alertname"}
        for name, _ in self.alert_labels:
            if not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
                problems.append(f"alert_labels: {name!r} is not a Prometheus label name")
            elif name in reserved:
                problems.append(f"alert_labels: {name!r} is set by the alerts themselves")
        if not _PROM_DURATION.fullmatch(self.keep_firing_for):
            problems.append(f"keep_firing_for: {self.keep_firing_for!r} is not a duration like 5m (0s leaves it out)")
        if not self.evaluation_interval_seconds > 0:
            problems.append(f"evaluation_interval_seconds: {self.evaluation_interval_seconds!r} is not positive")
        if problems:
            raise ValueError("; ".join(problems))

    def severity(self, alert_class: str) -> str:
        return str(getattr(self, f"severity_{alert_class}"))

    def sel(self) -> str:
        """The selector in braces, `{job="specwatch"}`, to append to a metric name."""
        return "{" + self.selector + "}"

    @property
    def on_route(self) -> str:
        """Labels that identify one route on one node, for `on(...)` joins."""
        return ", ".join((*self.node_labels, "route"))

    @property
    def keeps_firing(self) -> bool:
        """Whether the alerts carry `keep_firing_for:` at all ("0s" leaves it out, for Prometheus < 2.42)."""
        return any(int(n) for n in re.findall(r"\d+", self.keep_firing_for))

    def with_all_for(self, duration: str) -> "Settings":
        """A copy with every alert's `for:` and `keep_firing_for:` set to `duration` (fast end-to-end tests)."""
        changes: dict[str, Any] = {f.name: duration for f in dataclasses.fields(self) if f.name.endswith("_for")}
        return dataclasses.replace(self, **changes)


DEFAULT = Settings()


def from_mapping(raw: Any, base: Settings = DEFAULT) -> Settings:
    """`base` with the fields a settings file gives (field names as keys); ValueError lists every problem.

    Durations such as `evaluation_interval_seconds` also take `15s`; tuple fields take YAML lists."""
    if raw is None:
        return base
    if not isinstance(raw, dict):
        raise ValueError("a settings file is a mapping of Settings field names to values")
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    changes: dict[str, Any] = {}
    problems = []
    for key, value in raw.items():
        current = getattr(base, str(key), None)
        if key not in fields:
            problems.append(f"{key}: unknown setting")
        elif key == "alert_labels" and isinstance(value, dict):
            changes[key] = tuple((str(k), str(v)) for k, v in value.items())
        elif isinstance(current, tuple):
            if not isinstance(value, list):
                problems.append(f"{key}: expected a list")
            else:
                changes[key] = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        elif isinstance(current, float):
            seconds = parse_duration(value)
            if seconds is None:
                problems.append(f"{key}: expected a number or a duration like 15s")
            else:
                changes[key] = seconds
        elif isinstance(current, int) and not isinstance(current, bool):
            if isinstance(value, bool) or not isinstance(value, int):
                problems.append(f"{key}: expected an integer")
            else:
                changes[key] = value
        elif not isinstance(value, str):
            problems.append(f"{key}: expected a string")
        else:
            changes[key] = value
    if problems:
        raise ValueError("; ".join(problems))
    return dataclasses.replace(base, **changes)


def prom_duration(seconds: float) -> str:
    """900.0 -> '15m': the largest whole unit, as Prometheus writes it."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds * 1000)}ms"
