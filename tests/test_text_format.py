"""specwatch's text encoder writes exactly what prometheus_client's generate_latest writes.

Its speed is measured side by side by scripts/bench_overhead.py (figure 4), not asserted here: timed assertions
in unit tests are noise on shared CI boxes."""

from __future__ import annotations

import dataclasses

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from specwatch.export.prometheus import SnapshotCollector, render_families
from specwatch.export.text_format import encode_text
from specwatch.snapshot import EMPTY_SNAPSHOT, GpuSample, RouteState


def rich_snapshot():
    odd = 'mo"del\\with\nnewline, ünïcode'
    routes = tuple(
        RouteState(name=f"r{i}" if i else odd, up=bool(i % 3), acceptance_source="counter", model_name=odd,
                   engine_kind="vllm", engine_version="0.33.0", drafts_total=1e6 * i + 0.5,
                   draft_tokens_total=float(2 ** 60), accepted_tokens_total=123456789.0,
                   acceptance_ratio={"1m": 0.71, "5m": 1 / 3, "1h": 0.0}, position_acceptance_ratio=(0.9, 0.7, 1e-9),
                   errors_total={"timeout": 3.0, "parse": 0.0}, gpus=(i % 8,), batch_size=float("nan"),
                   crossover_batch_size=float("inf"))
        for i in range(20))
    gpus = tuple(GpuSample(index=i, up=True, uuid=f"GPU-{i}", name="NVIDIA H200", driver="560.35",
                           fields={"gpu_utilization_ratio": 0.25 * i, "gpu_memory_used_bytes": 1.4e11})
                 for i in range(8))
    return dataclasses.replace(EMPTY_SNAPSHOT, timestamp=1.7e9, routes=routes, gpus=gpus, nvml_up=True)


def reference(snapshot) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snapshot))
    return generate_latest(registry)


def test_the_bytes_equal_generate_latest_for_a_snapshot_with_awkward_values():
    snapshot = rich_snapshot()
    body = encode_text(render_families(snapshot))
    assert body == reference(snapshot)
    assert b'\\"del\\\\with\\nnewline' in body  # label values escaped as Prometheus expects


def test_the_empty_snapshot_too():
    assert encode_text(render_families(EMPTY_SNAPSHOT)) == reference(EMPTY_SNAPSHOT)


def test_families_of_other_shapes_fall_back_to_generate_latest():
    created = CounterMetricFamily("x", "help", labels=["a"])
    created.add_metric(["1"], 1.0, created=5.0)
    histogram = HistogramMetricFamily("h", "help", buckets=[("+Inf", 1.0)], sum_value=1.0)
    odd_label = GaugeMetricFamily("g", "help", labels=["bad-label"])
    odd_label.add_metric(["v"], 1.0)
    for family in (created, histogram, odd_label):
        assert encode_text([family]) is None
