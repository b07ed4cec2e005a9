"""The real NVML source on whatever GPUs this machine has; skipped where NVML does not load."""

from __future__ import annotations

import math
import time

import pytest

from specwatch import catalog
from specwatch.config import GpuConfig, RouteConfig
from specwatch.sources.nvml import make_gpu_source

pytestmark = pytest.mark.gpu

pynvml = pytest.importorskip("pynvml")


@pytest.fixture(scope="module")
def source():
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        pytest.skip(f"NVML does not load here: {exc}")
    src = make_gpu_source(GpuConfig(enabled="true"))
    yield src
    src.close()


def test_real_gpus_sample_cleanly(source):
    up, first = source.sample(time.time())
    assert up is True and first, "NVML loaded but no GPU was sampled"
    time.sleep(0.5)  # one GPM interval
    up, gpus = source.sample(time.time())
    assert [g.index for g in gpus] == list(range(len(gpus)))
    for g in gpus:
        assert g.up and g.uuid.startswith(("GPU-", "MIG-")) and g.name and g.driver
        assert g.fields["gpu_memory_total_bytes"] > 0
        assert 0 <= g.fields["gpu_memory_used_bytes"] <= g.fields["gpu_memory_total_bytes"]  # 0 on an idle GPU
        for key, value in g.fields.items():
            spec = catalog.BY_NAME[catalog.PREFIX + key]
            assert spec.labels == ("gpu",)
            assert math.isfinite(value) and value >= 0, (key, value)
            if key.endswith("_ratio"):
                assert value <= 1.0, (key, value)
        if any(h in g.name for h in ("H100", "H200", "H800", "H20", "GH200", "B200", "B100")):
            assert "gpu_tensor_active_ratio" in g.fields and "gpu_dram_bandwidth_utilization_ratio" in g.fields, (
                f"{g.name} is Hopper or later but exported no GPM activity"
            )


def test_route_with_pinned_gpus_needs_no_lookup(source):
    assert source.route_gpus(RouteConfig(name="r", url="http://127.0.0.1:1/metrics", gpus=(0,))) == (0,)


def test_close_frees_and_a_later_sample_loads_again(source):
    src = make_gpu_source(GpuConfig(enabled="auto"))
    assert src.sample(time.time())[0] is True
    src.close()
    src.close()  # idempotent
    assert src.sample(time.time())[0] is True
    src.close()
