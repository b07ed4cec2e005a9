"""specwatch's own writer (render_text) serves exactly the bytes prometheus_client's encoders write.

Its speed is measured side by side by bench/bench_overhead.py (figure 4), not asserted here: timed assertions
in unit tests are noise on shared CI boxes."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.utils import floatToGoString

from specwatch import catalog
from specwatch.catalog import MetricSpec
from specwatch.export import prometheus as prom_export
from specwatch.export.http import RenderCache, own_writer_format
from specwatch.export.prometheus import SnapshotCollector, render_text
from specwatch.export.text_format import TextFamily, go_float, text_body
from specwatch.snapshot import EMPTY_SNAPSHOT, GpuSample, RouteState


def rich_snapshot():
    odd = 'mo"del\\with\nnewline, ünïcode'
    routes = tuple(
        RouteState(
            name=f"r{i}" if i else odd,
            up=bool(i % 3),
            acceptance_source="counter",
            model_name=odd,
            engine_kind="vllm",
            engine_version="0.33.0",
            drafts_total=1e6 * i + 0.5,
            draft_tokens_total=float(2**60),
            accepted_tokens_total=123456789.0,
            acceptance_ratio={"1m": 0.71, "5m": 1 / 3, "1h": 0.0},
            position_acceptance_ratio=(0.9, 0.7, 1e-9),
            mean_acceptance_length={"1m": 2.5},
            errors_total={"timeout": 3.0, "parse": 0.0},
            gpus=(i % 8,),
            batch_size=float("nan"),
            crossover_batch_size=float("inf"),
            crossover_source="sweep",
            above_crossover=bool(i % 2),
            degraded=None,
            drop_ratio=-0.05,
            cusum_statistic=-0.0,
            last_model_change_timestamp=1.7e9 + i,
        )
        for i in range(20)
    )
    gpus = tuple(
        GpuSample(
            index=i,
            up=i != 3,
            uuid=f"GPU-{i}",
            name="NVIDIA H200",
            driver="560.35",
            fields={"gpu_utilization_ratio": 0.25 * i, "gpu_memory_used_bytes": 1.4e11},
        )
        for i in range(8)
    )
    return dataclasses.replace(
        EMPTY_SNAPSHOT,
        timestamp=1.7e9,
        routes=routes,
        gpus=gpus,
        nvml_up=True,
        evaluation_duration_seconds=0.0123,
        evaluation_overruns_total=2.0,
    )


# What Prometheus 2.42 (the Debian package here) sends, captured from its scrape: OpenMetrics first.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def registry_of(snapshot) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snapshot))
    return registry


def reference(snapshot) -> bytes:
    return generate_latest(registry_of(snapshot))


def test_the_bytes_equal_generate_latest_for_a_snapshot_with_awkward_values():
    snapshot = rich_snapshot()
    body = render_text(snapshot)
    assert body == reference(snapshot)
    assert b'\\"del\\\\with\\nnewline' in body  # label values escaped as Prometheus expects
    assert b'specwatch_route_drafts_total{route="r2"} 2.0000005e+06\n' in body  # Go's exponent form
    assert b"NaN" not in body and b"Inf" not in body  # non-finite values are omitted, never exported


def test_the_empty_snapshot_too():
    assert render_text(EMPTY_SNAPSHOT) == reference(EMPTY_SNAPSHOT)
    assert render_text(EMPTY_SNAPSHOT, openmetrics=True) == choose_encoder(PROMETHEUS_ACCEPT)[0](
        registry_of(EMPTY_SNAPSHOT)
    )


@pytest.mark.parametrize(
    "accept",
    [
        PROMETHEUS_ACCEPT,
        "",
        "text/plain;version=0.0.4",
        "application/openmetrics-text",
        "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8",
        "text/plain;version=1.0.0;escaping=allow-utf-8",
        "text/plain;version=1.0.0;escaping=underscores",
        # not specwatch's writer's (they go through client_python), served all the same
        "application/openmetrics-text;version=1.0.0;escaping=dots",
        "application/openmetrics-text;version=2.0.0",
    ],
)
def test_what_is_served_for_each_accept_header_is_what_client_pythons_encoder_writes(accept):
    snapshot = rich_snapshot()
    encoder, content_type = choose_encoder(accept)
    body, served_type, gzipped = RenderCache(lambda: snapshot).body(accept, "")
    assert (served_type, gzipped) == (content_type, False)
    assert body == encoder(registry_of(snapshot))


def test_prometheus_gets_openmetrics_from_specwatchs_own_writer_and_curl_the_text_format():
    assert own_writer_format(choose_encoder(PROMETHEUS_ACCEPT)[0]) is True
    assert own_writer_format(choose_encoder("*/*")[0]) is False
    assert own_writer_format(choose_encoder("application/openmetrics-text;version=1.0.0;escaping=dots")[0]) is None
    body = render_text(rich_snapshot(), openmetrics=True)
    assert b"# TYPE specwatch_route_drafts counter\nspecwatch_route_drafts_total{" in body and body.endswith(b"# EOF\n")


def test_a_failing_section_costs_only_that_section_in_both_renderers(monkeypatch):
    def broken(snapshot, families):
        families("route_up").add(True, "half-written")
        raise RuntimeError("a rendering bug")

    sections = list(prom_export._SECTIONS)
    sections.insert(2, broken)
    monkeypatch.setattr(prom_export, "_SECTIONS", tuple(sections))
    snapshot = rich_snapshot()
    body = render_text(snapshot)
    assert body == reference(snapshot)
    assert b'specwatch_route_up{route="half-written"} 1.0' in body  # what it wrote before failing stays
    assert b"specwatch_gpu_up" in body  # the sections after the broken one still render


def test_a_name_outside_the_catalog_is_dropped_in_both_renderers(monkeypatch):
    def stray(snapshot, families):
        families("not_in_the_catalog").add(1.0)

    monkeypatch.setattr(prom_export, "_SECTIONS", (stray, *prom_export._SECTIONS))
    snapshot = rich_snapshot()
    body = render_text(snapshot)
    assert body == reference(snapshot) and b"not_in_the_catalog" not in body


def test_every_catalog_name_is_one_the_text_writer_need_not_escape():
    # render_text writes names as they are; client_python would rewrite a non-legacy one (a dot; and a colon
    # in OpenMetrics with underscore escaping).
    for spec in catalog.METRICS:
        assert re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", spec.name), spec.name
        assert spec.type in ("gauge", "counter", "info"), spec.name
        for label in spec.labels:
            assert re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", label), (spec.name, label)


@given(
    st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([0.0, -0.0, 1e6, 999999.0, 1234567.0, 1e16, 1e22, 2.0**60, 5e-324, -1e7])
)
def test_go_float_matches_client_python_for_every_finite_float(value):
    assert go_float(value) == floatToGoString(value)


@pytest.mark.parametrize("kind", ["gauge", "counter"])
@pytest.mark.parametrize("accept", ["", PROMETHEUS_ACCEPT])
def test_a_family_with_awkward_help_and_unsorted_labels(kind, accept):
    spec = MetricSpec(
        "specwatch_x_total" if kind == "counter" else "specwatch_x",
        kind,
        'a "quoted" \\ help\nover two lines',
        ("zone", "app", "mid"),
    )
    samples = [(("z1", "a1", 'm"1'), 1.0), (("z2", "a\\2", "m\n2"), 2.5e6)]
    cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
    family = cls(spec.name, spec.help, labels=spec.labels)
    mine = TextFamily(spec, openmetrics=bool(accept))
    for labels, value in samples:
        family.add_metric(labels, value)
        mine.append(value, labels)

    class One:
        def collect(self):
            yield family

    registry = CollectorRegistry(auto_describe=False)
    registry.register(One())
    assert text_body([mine], openmetrics=bool(accept)) == choose_encoder(accept)[0](registry)
