"""What the GPU source collects: the field table, as data (after dcgm-exporter's default-counters.csv).

To collect another NVML value, add one row here and its metric to the gpu section of `catalog.py` (help and
type live there; a test checks that table and catalog agree). Each row is read on its own: a field NVML
answers NotSupported or NoPermission for is simply absent on that GPU (never 0, never NaN).

`call` and `args` are pynvml names, resolved once against the loaded bindings, so a function an older
nvidia-ml-py lacks disables only its rows. The call is `call(handle, *args)`; `attribute` picks a member of
the result ("" = the result itself); `scale` converts NVML's unit to the metric's base unit. Rows sharing a
call and args cost one NVML call per cycle.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NvmlField:
    metric: str  # catalog name without the specwatch_ prefix
    call: str
    args: tuple[str, ...] = ()
    attribute: str = ""
    scale: float = 1.0


@dataclass(frozen=True)
class GpmField:
    """A GPM metric (Hopper and later), computed by NVML between two samples one evaluation interval apart."""

    metric: str  # catalog name without the specwatch_ prefix; NVML's percent is exported as a 0-1 ratio
    metric_id: str  # pynvml NVML_GPM_METRIC_* constant name


NVML_FIELDS: tuple[NvmlField, ...] = (
    NvmlField("gpu_utilization_ratio", "nvmlDeviceGetUtilizationRates", attribute="gpu", scale=0.01),
    # v2: `used` excludes the driver's reservation (~615 MiB on an H200), as nvidia-smi reports it.
    NvmlField("gpu_memory_used_bytes", "nvmlDeviceGetMemoryInfo", ("nvmlMemory_v2",), attribute="used"),
    NvmlField("gpu_memory_total_bytes", "nvmlDeviceGetMemoryInfo", ("nvmlMemory_v2",), attribute="total"),
    NvmlField("gpu_power_watts", "nvmlDeviceGetPowerUsage", scale=0.001),  # mW
    NvmlField("gpu_power_limit_watts", "nvmlDeviceGetEnforcedPowerLimit", scale=0.001),  # mW
    # Off: nvmlDeviceGetTotalEnergyConsumption cost 3.9 ms of CPU per call on an H200 (docs/benchmarks.md),
    # 65x the rest of this table; power x time gives energy closely enough for dashboards.
    # NvmlField("gpu_energy_joules_total", "nvmlDeviceGetTotalEnergyConsumption", scale=0.001),  # mJ
    NvmlField("gpu_sm_clock_hertz", "nvmlDeviceGetClockInfo", ("NVML_CLOCK_SM",), scale=1e6),  # MHz
    NvmlField("gpu_memory_clock_hertz", "nvmlDeviceGetClockInfo", ("NVML_CLOCK_MEM",), scale=1e6),  # MHz
    NvmlField("gpu_temperature_celsius", "nvmlDeviceGetTemperature", ("NVML_TEMPERATURE_GPU",)),
    NvmlField("gpu_clock_throttle_reasons", "nvmlDeviceGetCurrentClocksEventReasons"),
    # Volatile counts reset when the driver reloads, which a Prometheus counter tolerates; NotSupported with ECC off.
    NvmlField(
        "gpu_ecc_corrected_errors_total",
        "nvmlDeviceGetTotalEccErrors",
        ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC"),
    ),
    NvmlField(
        "gpu_ecc_uncorrected_errors_total",
        "nvmlDeviceGetTotalEccErrors",
        ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"),
    ),
)

GPM_FIELDS: tuple[GpmField, ...] = (
    GpmField("gpu_sm_active_ratio", "NVML_GPM_METRIC_SM_UTIL"),
    GpmField("gpu_tensor_active_ratio", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    GpmField("gpu_dram_bandwidth_utilization_ratio", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
    GpmField("gpu_sm_occupancy_ratio", "NVML_GPM_METRIC_SM_OCCUPANCY"),
)
