"""A fake `pynvml` with per-GPU answer tables and named scenarios (after gpustat's mocked NVML tests).

Only what specwatch calls exists, with pynvml's names, constants and error codes, so the real source runs
against it unchanged. Any device call can be made to fail with any NVML code (`FakeGpu.errors`) or never return
(`FakeGpu.hangs`), a GPU can be lost mid-run (`FakeGpu.lost`), the library can be missing and appear later
(`FakeNvml.library_present`).
GPM is modelled as pynvml does it: opaque sample buffers (allocations counted so leaks show), a metrics
request with one return code per metric.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

# Values from nvml.h (as in pynvml).
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_UNKNOWN = 999

NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
nvmlMemory_v2 = 0x02000028
DRIVER_RESERVED_BYTES = 644_940_000  # v1 counts it as used, v2 does not (as read on an H200)
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1

NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_SM_OCCUPANCY = 3
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRIC_DRAM_BW_UTIL = 10
NVML_GPM_METRIC_MAX = 477
NVML_GPM_METRICS_GET_VERSION = 1

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """pynvml's base error: `.value` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML error {self.value}")


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    memory_total: int = 150_754_820_096
    memory_used: int = 130_000_000_000
    utilization: int = 100
    power_mw: int = 412_000
    power_limit_mw: int = 700_000
    clocks_mhz: dict[int, int] = field(default_factory=lambda: {NVML_CLOCK_SM: 1980, NVML_CLOCK_MEM: 3201})
    temperature: int = 52
    clock_event_reasons: int = 0x4  # sw_power_cap
    ecc: dict[int, int] = field(
        default_factory=lambda: {NVML_MEMORY_ERROR_TYPE_CORRECTED: 3, NVML_MEMORY_ERROR_TYPE_UNCORRECTED: 0}
    )
    processes: tuple[int, ...] = ()
    gpm_supported: bool = True
    mig: bool = False
    # percent over the interval ending at the next GPM sample, by metric id; an int in gpm_errors fails that id
    gpm: dict[int, float] = field(
        default_factory=lambda: {
            NVML_GPM_METRIC_SM_UTIL: 65.1,
            NVML_GPM_METRIC_ANY_TENSOR_UTIL: 2.5,
            NVML_GPM_METRIC_DRAM_BW_UTIL: 64.4,
            NVML_GPM_METRIC_SM_OCCUPANCY: 12.0,
        }
    )
    gpm_errors: dict[int, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)  # pynvml function name -> NVML error code it raises
    hangs: frozenset[str] = frozenset()  # pynvml function names that never return (a GPU fallen off the bus)
    lost: bool = False


@dataclass
class _Handle:
    index: int


class _GpmSample:
    def __init__(self) -> None:
        self.freed = False
        self.device: int | None = None
        self.seq = -1
        self.values: dict[int, float] = {}


class _GpmMetric:
    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = NVML_SUCCESS
        self.value = 0.0


class c_nvmlGpmMetricsGet_t:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: _GpmSample | None = None
        self.sample2: _GpmSample | None = None
        self.metrics = [_GpmMetric() for _ in range(NVML_GPM_METRIC_MAX)]


class FakeNvml:
    """Stands in for the `pynvml` module. `calls` counts every function called, by name."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu], *, library_present: bool = True, driver: str = "580.159.04") -> None:
        self.gpus = gpus
        self.library_present = library_present
        self.driver = driver
        self.initialized = False
        self.calls: Counter[str] = Counter()
        self.gpm_allocated: list[_GpmSample] = []
        self._gpm_seq = 0

    def __getattr__(self, name: str) -> Any:
        # Constants come from this module; anything else pynvml has but the fake lacks is an AttributeError,
        # which is what an older nvidia-ml-py without that function looks like.
        if name.startswith("NVML_") or name in ("c_nvmlGpmMetricsGet_t", "nvmlMemory_v2"):
            value = globals().get(name)
            if value is not None:
                return value
        raise AttributeError(name)

    def _enter(self, fn: str) -> None:
        self.calls[fn] += 1
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _gpu(self, fn: str, handle: _Handle) -> FakeGpu:
        self._enter(fn)
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if fn in gpu.errors:
            raise NVMLError(gpu.errors[fn])
        if fn in gpu.hangs:
            threading.Event().wait()
        return gpu

    # -------------------------------------------------------------- library
    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if not self.library_present:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if self.gpus[index].lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return _Handle(index)

    # -------------------------------------------------------------- device facts and fields
    def nvmlDeviceGetUUID(self, h: _Handle) -> str:
        return self._gpu("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetName(self, h: _Handle) -> str:
        return self._gpu("nvmlDeviceGetName", h).name

    def nvmlDeviceGetMigMode(self, h: _Handle) -> list[int]:
        g = self._gpu("nvmlDeviceGetMigMode", h)
        mode = NVML_DEVICE_MIG_ENABLE if g.mig else NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetUtilizationRates(self, h: _Handle) -> SimpleNamespace:
        g = self._gpu("nvmlDeviceGetUtilizationRates", h)
        if g.mig:  # as on real MIG-enabled GPUs
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=g.utilization, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h: _Handle, version: int | None = None) -> SimpleNamespace:
        g = self._gpu("nvmlDeviceGetMemoryInfo", h)
        free = g.memory_total - g.memory_used - DRIVER_RESERVED_BYTES
        if version == nvmlMemory_v2:
            return SimpleNamespace(total=g.memory_total, reserved=DRIVER_RESERVED_BYTES, used=g.memory_used, free=free)
        return SimpleNamespace(total=g.memory_total, used=g.memory_used + DRIVER_RESERVED_BYTES, free=free)  # v1

    def nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", h).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: _Handle) -> int:
        return self._gpu("nvmlDeviceGetEnforcedPowerLimit", h).power_limit_mw

    def nvmlDeviceGetClockInfo(self, h: _Handle, clock: int) -> int:
        return self._gpu("nvmlDeviceGetClockInfo", h).clocks_mhz[clock]

    def nvmlDeviceGetTemperature(self, h: _Handle, sensor: int) -> int:
        return self._gpu("nvmlDeviceGetTemperature", h).temperature

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: _Handle) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", h).clock_event_reasons

    def nvmlDeviceGetTotalEccErrors(self, h: _Handle, error_type: int, counter_type: int) -> int:
        return self._gpu("nvmlDeviceGetTotalEccErrors", h).ecc[error_type]

    def nvmlDeviceGetComputeRunningProcesses(self, h: _Handle) -> list[SimpleNamespace]:
        g = self._gpu("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in g.processes]

    # -------------------------------------------------------------- GPM
    def nvmlGpmQueryDeviceSupport(self, h: _Handle) -> SimpleNamespace:
        gpu = self._gpu("nvmlGpmQueryDeviceSupport", h)
        return SimpleNamespace(version=1, isSupportedDevice=int(gpu.gpm_supported))

    def nvmlGpmSampleAlloc(self) -> _GpmSample:
        self._enter("nvmlGpmSampleAlloc")
        sample = _GpmSample()
        self.gpm_allocated.append(sample)
        return sample

    def nvmlGpmSampleFree(self, sample: _GpmSample) -> None:
        self._enter("nvmlGpmSampleFree")
        assert not sample.freed, "GPM sample freed twice"
        sample.freed = True

    def nvmlGpmSampleGet(self, h: _Handle, sample: _GpmSample) -> _GpmSample:
        g = self._gpu("nvmlGpmSampleGet", h)
        assert not sample.freed, "GPM sample used after free"
        if not g.gpm_supported or g.mig:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        self._gpm_seq += 1
        sample.device, sample.seq, sample.values = h.index, self._gpm_seq, dict(g.gpm)
        return sample

    def nvmlGpmMetricsGet(self, request: c_nvmlGpmMetricsGet_t) -> c_nvmlGpmMetricsGet_t:
        self._enter("nvmlGpmMetricsGet")
        s1, s2 = request.sample1, request.sample2
        assert request.version == NVML_GPM_METRICS_GET_VERSION
        assert s1 is not None and s2 is not None and not s1.freed and not s2.freed
        assert s1.device == s2.device and s1.seq < s2.seq, "samples must be of one GPU, oldest first"
        assert s2.device is not None, "GPM sample never filled by nvmlGpmSampleGet"
        gpu = self.gpus[s2.device]
        for m in request.metrics[: request.numMetrics]:
            m.nvmlReturn = gpu.gpm_errors.get(m.metricId, NVML_SUCCESS)
            m.value = s2.values.get(m.metricId, 0.0) if m.nvmlReturn == NVML_SUCCESS else 0.0
        return request

    @property
    def gpm_live(self) -> int:
        return sum(not s.freed for s in self.gpm_allocated)


# ------------------------------------------------------------------ named scenarios
def _uuid(i: int) -> str:
    return f"GPU-{i:08x}-1111-2222-3333-444444444444"


def basic_h200(count: int = 2) -> FakeNvml:
    return FakeNvml([FakeGpu(uuid=_uuid(i), processes=(1000 + i,)) for i in range(count)])


def one_field_unsupported() -> FakeNvml:
    """Power NotSupported, ECC NoPermission and the DRAM GPM id failing on GPU 0: those are absent, nothing else."""
    nvml = basic_h200(1)
    gpu = nvml.gpus[0]
    gpu.errors = {
        "nvmlDeviceGetPowerUsage": NVML_ERROR_NOT_SUPPORTED,
        "nvmlDeviceGetTotalEccErrors": NVML_ERROR_NO_PERMISSION,
    }
    gpu.gpm_errors = {NVML_GPM_METRIC_DRAM_BW_UTIL: NVML_ERROR_NOT_SUPPORTED}
    return nvml


def gpu_lost_mid_run() -> FakeNvml:
    """Two H200s; the test sets `gpus[1].lost = True` between cycles."""
    return basic_h200(2)


def library_missing() -> FakeNvml:
    """No driver: nvmlInit fails until the test sets `library_present = True`."""
    nvml = basic_h200(1)
    nvml.library_present = False
    return nvml


def pre_hopper() -> FakeNvml:
    return FakeNvml(
        [FakeGpu(name="NVIDIA A100-SXM4-80GB", uuid=_uuid(0), memory_total=85_899_345_920, gpm_supported=False)]
    )


def mig_mode() -> FakeNvml:
    return FakeNvml([FakeGpu(uuid=_uuid(0), mig=True)])


SCENARIOS: dict[str, Callable[[], FakeNvml]] = {
    "basic_h200": basic_h200,
    "one_field_unsupported": one_field_unsupported,
    "gpu_lost_mid_run": gpu_lost_mid_run,
    "library_missing": library_missing,
    "pre_hopper": pre_hopper,
    "mig_mode": mig_mode,
}
