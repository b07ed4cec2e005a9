"""GPU peak figures and achieved efficiencies: the hardware half of the crossover model.

Peaks are dense (no 2:4 sparsity) vendor figures (`docs/crossover.md` §9 lists sources). An efficiency row is
either measured (fitted by `calibrate.py` on step times, the provenance in `source`) or the documented default
derating. Names match NVML's `nvmlDeviceGetName` loosely ("NVIDIA H200" finds the H200 row).
"""

from __future__ import annotations

import re

from specwatch.crossover.model import Efficiency, Hardware

GB = 1e9
T = 1e12

HARDWARE: dict[str, Hardware] = {h.name: h for h in (
    Hardware("A100-40GB", 1555 * GB, 312 * T, None, 40 * GB),
    Hardware("A100-80GB", 2039 * GB, 312 * T, None, 80 * GB),
    Hardware("H100-SXM", 3350 * GB, 989 * T, 1979 * T, 80 * GB),
    Hardware("H100-PCIE", 2000 * GB, 756 * T, 1513 * T, 80 * GB),
    Hardware("H200", 4800 * GB, 989 * T, 1979 * T, 141 * GB),
    Hardware("B200", 8000 * GB, 2250 * T, 4500 * T, 180 * GB),
    Hardware("L40S", 864 * GB, 362 * T, 733 * T, 48 * GB),
    Hardware("L4", 300 * GB, 121 * T, 242 * T, 24 * GB),
    Hardware("MI300X", 5300 * GB, 1307 * T, 2615 * T, 192 * GB),
)}

# Fitted by `specwatch.crossover.calibrate.fit_reference()` on the H200 reference table
# (context 1024, plain decode + gamma 4 verify + draft step times; gamma 2 and 7 held out).
# `scripts/bench_crossover.py` refits these and fails loudly if they drift.
CALIBRATED: dict[str, Efficiency] = {
    "H200": Efficiency(memory=0.654, compute=0.715, verify_attention=0.160, step_overhead_s=0.000193,
                       source="fitted: H200 reference table, torch 2.11 CUDA graphs, ctx 1024, gamma 4"),
}

DEFAULT_EFFICIENCY = Efficiency()

# NVML name fragments -> table row, most specific first.
_ALIASES: tuple[tuple[str, str], ...] = (
    (r"h100.*pcie", "H100-PCIE"), (r"h100", "H100-SXM"), (r"h200", "H200"), (r"gh200", "H200"),
    (r"a100.*80", "A100-80GB"), (r"a100", "A100-40GB"), (r"b200", "B200"), (r"l40s", "L40S"),
    (r"\bl4\b", "L4"), (r"mi300x", "MI300X"),
)


def lookup(name: str) -> tuple[Hardware, Efficiency]:
    """Resolve a table key or an NVML device name. Raises ValueError listing the known GPUs."""
    key = name.strip().upper()
    if key in HARDWARE:
        return HARDWARE[key], CALIBRATED.get(key, DEFAULT_EFFICIENCY)
    lowered = name.lower()
    for pattern, row in _ALIASES:
        if re.search(pattern, lowered):
            return HARDWARE[row], CALIBRATED.get(row, DEFAULT_EFFICIENCY)
    raise ValueError(f"unknown GPU {name!r}; known: {', '.join(HARDWARE)}")


def detect_gpu_name() -> str | None:
    """The first GPU's NVML name, or None without NVML or a GPU."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        return name.decode() if isinstance(name, bytes) else str(name)
    except pynvml.NVMLError:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
