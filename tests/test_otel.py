"""OTLP export: a loopback OTLP/HTTP receiver run by the test decodes the protobuf the SDK sends and checks
names, units, attributes and values against a hand-built Snapshot. force_flush() replaces waiting."""

from __future__ import annotations

import gzip
import http.server
import threading
import time

import pytest
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specwatch import catalog
from specwatch.config import OtlpConfig
from specwatch.export import otel
from specwatch.export.prometheus import AdminRequests, ExportErrors, SnapshotCollector, render_text
from specwatch.snapshot import GpuSample, RouteState, Snapshot

SNAPSHOT = Snapshot(
    timestamp=1_800_000_000.0,
    routes=(
        RouteState(
            name="chat",
            up=True,
            engine_kind="vllm",
            model_name="llama-70b",
            engine_version="0.11.0",
            acceptance_source="counter",
            drafts_total=1000,
            draft_tokens_total=3000,
            accepted_tokens_total=2100,
            acceptance_ratio={"1m": 0.7, "5m": 0.68},
            mean_acceptance_length={"5m": 3.04},
            position_acceptance_ratio=(0.9, 0.7, 0.5),
            degraded=False,
            baseline_ratio=0.72,
            errors_total={"timeout": 2},
            gpus=(0,),
            crossover_batch_size=48.0,
            crossover_source="sweep",
            above_crossover=True,
        ),
        RouteState(name="code", up=False, error_reason="connection"),
    ),
    gpus=(
        GpuSample(
            index=0, up=True, uuid="GPU-1", name="NVIDIA H200", driver="570.1", fields={"gpu_power_watts": 412.5}
        ),
    ),
    nvml_up=True,
    config_last_reload_successful=False,
)


class _Receiver(http.server.BaseHTTPRequestHandler):
    requests: list[tuple[str, dict, ExportMetricsServiceRequest]]

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportMetricsServiceRequest()
        request.ParseFromString(body)
        self.requests.append((self.path, dict(self.headers), request))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver():
    handler = type("R", (_Receiver,), {"requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler.requests
    server.shutdown()
    server.server_close()


def points(request: ExportMetricsServiceRequest) -> dict[str, list[tuple[float, dict]]]:
    """name -> [(value, attributes)] from a decoded export, asserting the data kind matches the catalog."""
    out: dict[str, list] = {}
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                spec = catalog.BY_NAME[m.name]
                if spec.type == "counter":
                    assert kind == "sum" and m.sum.is_monotonic, m.name
                    data = m.sum.data_points
                else:
                    assert kind == "gauge", m.name
                    data = m.gauge.data_points
                out[m.name] = [
                    (
                        p.as_double if p.HasField("as_double") else p.as_int,
                        {a.key: a.value.string_value for a in p.attributes},
                    )
                    for p in data
                ]
                assert m.unit == otel.unit_for(m.name)
    return out


@pytest.mark.slow
def test_export_delivers_route_metrics_to_an_otlp_http_receiver(receiver):
    base, received = receiver
    cfg = OtlpConfig(endpoint=base, headers={"x-tenant": "inference"}, interval_seconds=3600)
    export = otel.start_otlp(cfg, lambda: SNAPSHOT)
    try:
        assert export.force_flush()
    finally:
        export.shutdown()
    path, headers, request = received[0]
    assert path == "/v1/metrics"
    assert headers.get("x-tenant") == "inference"
    resource = {a.key: a.value.string_value for a in request.resource_metrics[0].resource.attributes}
    assert resource["service.name"] == "specwatch"

    got = points(request)
    assert sorted(got["specwatch_route_acceptance_ratio"], key=lambda p: p[1]["window"]) == [
        (0.7, {"route": "chat", "window": "1m"}),
        (0.68, {"route": "chat", "window": "5m"}),
    ]
    assert got["specwatch_route_accepted_tokens_total"] == [(2100.0, {"route": "chat"})]
    assert sorted(got["specwatch_route_up"], key=lambda p: p[1]["route"]) == [
        (1.0, {"route": "chat"}),
        (0.0, {"route": "code"}),
    ]
    assert (0.5, {"route": "chat", "position": "2", "window": "5m"}) in got["specwatch_route_position_acceptance_ratio"]
    assert got["specwatch_route_crossover_batch_size"] == [(48.0, {"route": "chat", "source": "sweep"})]
    assert got["specwatch_source_errors_total"] == [(2.0, {"route": "chat", "reason": "timeout"})]
    assert got["specwatch_route_acceptance_degraded"] == [(0.0, {"route": "chat"})]
    assert got["specwatch_config_last_reload_successful"] == [(0.0, {})]
    assert got["specwatch_gpu_power_watts"] == [(412.5, {"gpu": "0"})]
    assert got["specwatch_gpu_info"] == [(1.0, {"gpu": "0", "uuid": "GPU-1", "name": "NVIDIA H200", "driver": "570.1"})]
    # absent beats wrong: values the snapshot does not have are not sent as zeros
    assert "specwatch_route_acceptance_cusum" not in got


def test_attributes_follow_the_catalog_labels():
    for name, samples in otel.render(SNAPSHOT).items():
        for _, attrs in samples:
            assert sorted(attrs) == sorted(catalog.BY_NAME[name].labels), name


@pytest.mark.slow
def test_otlp_carries_exactly_the_prometheus_exposition(receiver):
    """Same snapshot, two wire formats: every /metrics sample is in the OTLP export and nothing else is."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: SNAPSHOT))
    exposition = {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
        if s.name in catalog.BY_NAME
    }
    base, received = receiver
    export = otel.start_otlp(OtlpConfig(endpoint=base, interval_seconds=3600), lambda: SNAPSHOT)
    export.force_flush()
    export.shutdown()
    otlp = {
        (name, tuple(sorted(attrs.items())), value)
        for name, pts in points(received[0][2]).items()
        for value, attrs in pts
    }
    assert otlp == exposition


class _NullExporter(MetricExporter):
    def export(self, metrics_data, timeout_millis=10_000, **kwargs):
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis=10_000):
        return True

    def shutdown(self, timeout_millis=30_000, **kwargs):
        pass


def test_each_snapshot_is_rendered_once_per_collection(monkeypatch):
    renders = []
    real = otel.render
    monkeypatch.setattr(otel, "render", lambda snap, errors, admin: renders.append(snap) or real(snap, errors, admin))
    current = [SNAPSHOT]
    export = otel.OtlpExport(
        OtlpConfig(endpoint="http://127.0.0.1:9", interval_seconds=3600), lambda: current[0], exporter=_NullExporter()
    )
    try:
        export.force_flush()
        export.force_flush()
        assert len(renders) == 1  # dozens of instruments, one render; the same snapshot is not rendered again
        current[0] = Snapshot(timestamp=2.0)
        export.force_flush()
        assert len(renders) == 2
    finally:
        export.shutdown()


def test_the_http_servers_admin_request_counts_reach_the_otlp_export():
    admin = AdminRequests()
    admin.count("accept", "performed")
    export = otel.OtlpExport(
        OtlpConfig(endpoint="http://127.0.0.1:9", interval_seconds=3600),
        lambda: SNAPSHOT,
        exporter=_NullExporter(),
        admin=admin,
    )
    try:
        samples = export._samples("specwatch_admin_requests_total")
        assert samples == [(1.0, {"action": "accept", "outcome": "performed"})]
    finally:
        export.shutdown()


@pytest.mark.slow
def test_unreachable_collector_neither_raises_nor_hangs_shutdown_and_is_counted_on_metrics():
    """The exporter's timeout follows the interval, so a dead collector cannot stall SIGTERM handling; the
    failure reaches /metrics through the ExportErrors the two exports share."""
    errors = ExportErrors()
    started = time.monotonic()
    export = otel.start_otlp(OtlpConfig(endpoint="http://127.0.0.1:9", interval_seconds=3600), lambda: SNAPSHOT, errors)
    export.force_flush(timeout_seconds=20)  # the SDK logs the failure; its return value does not report it
    export.shutdown(timeout_seconds=1)
    # Loose enough for a loaded box, tight enough to catch the SDK's retry backoff (about a minute in all).
    assert time.monotonic() - started < 40
    failures = errors.counts()[1]
    assert failures >= 1
    assert f"specwatch_otlp_export_errors_total {failures}" in render_text(SNAPSHOT, errors=errors).decode()


def test_an_exporter_that_raises_is_counted_and_a_successful_one_is_not():
    class Raising(_NullExporter):
        def export(self, metrics_data, timeout_millis=10_000, **kwargs):
            raise ConnectionError("collector gone")

    for exporter, expected in ((_NullExporter(), 0.0), (Raising(), 1.0)):
        errors = ExportErrors()
        export = otel.OtlpExport(
            OtlpConfig(endpoint="http://127.0.0.1:9", interval_seconds=3600),
            lambda: SNAPSHOT,
            exporter=exporter,
            errors=errors,
        )
        try:
            export.force_flush()
            assert errors.counts()[1] == expected
        finally:
            export.shutdown()
