"""OTLP push of the same Snapshot the Prometheus collector renders, through the OpenTelemetry SDK.

One observable instrument per catalog metric, with the Prometheus name, a unit derived from the name's unit
suffix and the catalog's labels as attributes; catalog counters become observable counters (cumulative
monotonic sums), everything else observable gauges. A `PeriodicExportingMetricReader` collects every
`otlp.interval`; the callbacks read the current Snapshot, rendered once per Snapshot (by the Prometheus
collector's `render_families`, so the two exports cannot drift apart) however many instruments ask.

    otlp:
      endpoint: https://otel-collector:4318     # a bare host gets /v1/metrics appended
      protocol: http/protobuf                    # grpc needs opentelemetry-exporter-otlp-proto-grpc
      interval: 60s
      headers: {authorization: "Bearer ..."}
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections import defaultdict
from typing import Any, Callable, Iterable, Mapping
from urllib.parse import urlparse

from specwatch import __version__, catalog
from specwatch.config import ConfigError, OtlpConfig
from specwatch.export.prometheus import AdminRequests, ExportErrors, render_families
from specwatch.snapshot import Snapshot

log = logging.getLogger(__name__)

GRPC_EXPORTER_MODULE = "opentelemetry.exporter.otlp.proto.grpc.metric_exporter"
_UNIT_SUFFIXES = (
    ("_seconds", "s"),
    ("_bytes", "By"),
    ("_watts", "W"),
    ("_joules", "J"),
    ("_hertz", "Hz"),
    ("_celsius", "Cel"),
    ("_ratio", "1"),
)

Sample = tuple[float, Mapping[str, str]]  # value, attributes


def unit_for(name: str) -> str:
    """UCUM unit for a Prometheus metric name's base-unit suffix ('1' when dimensionless)."""
    base = name.removesuffix("_total")
    return next((unit for suffix, unit in _UNIT_SUFFIXES if base.endswith(suffix)), "1")


def otlp_config_problems(cfg: OtlpConfig) -> list[str]:
    """What would stop `start_otlp` for this config; for config validation before a (re)load is accepted."""
    if cfg.protocol == "grpc" and not _module_available(GRPC_EXPORTER_MODULE):
        return [
            "otlp.protocol: grpc needs the opentelemetry-exporter-otlp-proto-grpc package, which is not "
            "installed; install it or use protocol: http/protobuf"
        ]
    return []


def _module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def metrics_endpoint(endpoint: str, protocol: str) -> str:
    """OTLP/HTTP posts to <base>/v1/metrics: append it to a bare base URL, keep an explicit path as given."""
    if protocol == "http/protobuf" and urlparse(endpoint).path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/metrics"
    return endpoint


# --------------------------------------------------------------------------- Snapshot -> samples
def render(
    snap: Snapshot, errors: ExportErrors | None = None, admin: AdminRequests | None = None
) -> dict[str, list[Sample]]:
    """Every sample of `snap` keyed by catalog name, taken from the Prometheus collector's own rendering, so
    both exports carry the same names, labels and values by construction (absent values stay absent)."""
    out: dict[str, list[Sample]] = defaultdict(list)
    for family in render_families(snap, errors, admin):
        for sample in family.samples:
            if sample.name in catalog.BY_NAME:  # counters' `_created` companions have no OTLP equivalent
                out[sample.name].append((sample.value, sample.labels))
    return out


# --------------------------------------------------------------------------- the exporter
class OtlpExport:
    """A running OTLP export. `force_flush()` exports now; `shutdown()` exports once more and stops."""

    def __init__(
        self,
        cfg: OtlpConfig,
        get_snapshot: Callable[[], Snapshot],
        exporter: Any = None,
        errors: ExportErrors | None = None,
        admin: AdminRequests | None = None,
    ) -> None:
        """`exporter` replaces the OTLP exporter the config describes (tests); `errors` counts failed
        exports and sections that fail to render; `admin`: the HTTP server's admin request counts."""
        from opentelemetry.metrics import Observation
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        self._Observation = Observation
        self._get_snapshot = get_snapshot
        self._lock = threading.Lock()
        self._rendered_for: Snapshot | None = None
        self._rendered: dict[str, list[Sample]] = {}
        self.errors = errors or ExportErrors()
        self.admin = admin

        self._reader = PeriodicExportingMetricReader(
            _counting(exporter if exporter is not None else _build_exporter(cfg), self.errors),
            export_interval_millis=cfg.interval_seconds * 1000,
            export_timeout_millis=min(cfg.interval_seconds, 30.0) * 1000,
        )
        # Resource.create also merges OTEL_RESOURCE_ATTRIBUTES, the usual place for host and cluster attributes.
        resource = Resource.create({"service.name": "specwatch", "service.version": __version__})
        # Not registered globally: a reload builds a new provider and shuts this one down.
        self._provider = MeterProvider(metric_readers=[self._reader], resource=resource, shutdown_on_exit=False)
        meter = self._provider.get_meter("specwatch", __version__)
        for spec in catalog.METRICS:
            create = meter.create_observable_counter if spec.type == "counter" else meter.create_observable_gauge
            create(
                spec.name, callbacks=[self._callback_for(spec.name)], unit=unit_for(spec.name), description=spec.help
            )

    def _samples(self, name: str) -> list[Sample]:
        with self._lock:
            try:
                snap = self._get_snapshot()
                if snap is not self._rendered_for:
                    self._rendered_for, self._rendered = snap, {}
                    self._rendered = render(snap, self.errors, self.admin)
            except Exception:  # a bad Snapshot must not stop the export of later ones
                log.exception("otlp: cannot render the snapshot; exporting nothing for it")
            return self._rendered.get(name, [])

    def _callback_for(self, name: str) -> Callable[[Any], Iterable[Any]]:
        def callback(_options: Any) -> Iterable[Any]:
            return [self._Observation(value, dict(attrs)) for value, attrs in self._samples(name)]

        return callback

    def force_flush(self, timeout_seconds: float = 10.0) -> bool:
        return self._provider.force_flush(timeout_millis=timeout_seconds * 1000)

    def shutdown(self, timeout_seconds: float = 5.0) -> None:
        try:
            self._provider.shutdown(timeout_millis=timeout_seconds * 1000)
        except Exception:  # shutting down must never fail the daemon's own shutdown
            log.exception("otlp: shutdown failed")


def _counting_exporter_class() -> type:
    # Imported here, like the SDK in OtlpExport: a daemon without `otlp:` never loads it.
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

    class CountingExporter(MetricExporter):
        """Another exporter, with each failed or raising export counted in specwatch_otlp_export_errors_total."""

        def __init__(self, inner: Any, errors: ExportErrors) -> None:
            super().__init__(
                preferred_temporality=inner._preferred_temporality, preferred_aggregation=inner._preferred_aggregation
            )
            self._inner, self._errors = inner, errors

        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
            try:
                result = self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
            except Exception:
                self._errors.count_otlp()
                raise  # the SDK's reader logs it
            if result is not MetricExportResult.SUCCESS:
                self._errors.count_otlp()
            return result

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return bool(self._inner.force_flush(timeout_millis=timeout_millis))

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)

    return CountingExporter


def _counting(inner: Any, errors: ExportErrors) -> Any:
    return _counting_exporter_class()(inner, errors)


def _build_exporter(cfg: OtlpConfig) -> Any:
    problems = otlp_config_problems(cfg)
    if problems:
        raise ConfigError(problems)
    endpoint = metrics_endpoint(cfg.endpoint, cfg.protocol)
    timeout = min(cfg.interval_seconds, 10.0)
    headers = dict(cfg.headers)
    if cfg.protocol == "grpc":
        grpc = importlib.import_module(GRPC_EXPORTER_MODULE)
        return grpc.OTLPMetricExporter(
            endpoint=endpoint, headers=headers, timeout=timeout, insecure=urlparse(endpoint).scheme == "http"
        )
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter(endpoint=endpoint, headers=headers, timeout=timeout)


def start_otlp(
    otlp_cfg: OtlpConfig,
    get_snapshot: Callable[[], Snapshot],
    errors: ExportErrors | None = None,
    admin: AdminRequests | None = None,
) -> OtlpExport:
    """Start exporting `get_snapshot()` every `otlp_cfg.interval_seconds`. Raises ConfigError for an unusable
    protocol; network failures are the SDK's to retry and log, never the daemon's to crash on."""
    export = OtlpExport(otlp_cfg, get_snapshot, errors=errors, admin=admin)
    log.info(
        "otlp: exporting to %s (%s) every %gs",
        metrics_endpoint(otlp_cfg.endpoint, otlp_cfg.protocol),
        otlp_cfg.protocol,
        otlp_cfg.interval_seconds,
    )
    return export
