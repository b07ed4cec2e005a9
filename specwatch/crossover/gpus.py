"""GPU peak figures and achieved efficiencies: the hardware half of the crossover model.

Peaks are dense (no 2:4 sparsity) vendor figures (`docs/crossover.md` §9 lists sources). An efficiency row is
either measured (fitted by `calibrate.py` on step times, the provenance in `source`) or the documented default
derating. Names match NVML's `nvmlDeviceGetName` loosely ("NVIDIA H200" finds the H200 row).
"""

from __future__ import annotations

import re

from specwatch.crossover.inputs import Efficiency, Hardware

GB = 1e9
T = 1e12

HARDWARE: dict[str, Hardware] = {
    h.name: h
    for h in (
        Hardware("A100-40GB", 1555 * GB, 312 * T, None, 40 * GB, sms=108),
        Hardware("A100-80GB", 2039 * GB, 312 * T, None, 80 * GB, sms=108),
        Hardware("H100-SXM", 3350 * GB, 989 * T, 1979 * T, 80 * GB),
        Hardware("H100-PCIE", 2000 * GB, 756 * T, 1513 * T, 80 * GB, sms=114),
        Hardware("H200", 4800 * GB, 989 * T, 1979 * T, 141 * GB),
        Hardware("B200", 8000 * GB, 2250 * T, 4500 * T, 180 * GB, sms=148),
        Hardware("L40S", 864 * GB, 362 * T, 733 * T, 48 * GB, sms=142),
        Hardware("L4", 300 * GB, 121 * T, 242 * T, 24 * GB, sms=58),
        Hardware("MI300X", 5300 * GB, 1307 * T, 2615 * T, 192 * GB, sms=304),
    )
}

# Fitted by `specwatch.crossover.shapes.fit()` on the 28 H200 step-time tables in specwatch/data (Llama-3.2-1B
# ... CodeLlama-34B at context 1024, three of them MHA and two MoE, Qwen3-30B-A3B and OLMoE-1B-7B; four dense shapes
# also at 2048-16384 and both MoE at 2048: plain, verify q = 3/5/8 and draft steps)
# together with the attention kernels timed alone (`h200-attention-probe-ctx1024.json`) and the elementwise kernels
# of a profiled forward (`h200-forward-profile-ctx1024.json`: their rate and fixed cost per layer).
# `bench/crossover_shapes.py` refits them and scores leave-one-shape-out; tests fail if they drift.
CALIBRATED: dict[str, Efficiency] = {
    "H200": Efficiency(
        memory=0.791,
        compute=0.733,
        verify_attention=0.989,
        step_overhead_s=19.5e-6,
        decode_attention=0.954,
        layer_overhead_s=28.9e-6,
        verify_key_s=4.61e-11,
        decode_attention_flop_s=0.0,
        attention_slice_key_s=0.781e-9,
        expert_group_s=0.391e-6,
        verify_block_s=5.23e-6,
        verify_reads_per_query_head=True,
        elementwise=0.389,
        elementwise_layer_s=35.6e-6,
        source="fitted: attention terms on an H200 attention-kernel probe and the tables' context deltas, the "
        "elementwise rate and fixed cost on a profiled forward, the rest on 28 H200 step-time tables (ten shapes "
        "1.5-34B, GQA 1-8, two MoE, at context 1024; four of them also at 2048-16384, the MoE at 2048), torch 2.11 "
        "CUDA graphs",
    ),
}

DEFAULT_EFFICIENCY = Efficiency()

# NVML name fragments -> table row, most specific first.
_ALIASES: tuple[tuple[str, str], ...] = (
    (r"h100.*pcie", "H100-PCIE"),
    (r"h100", "H100-SXM"),
    (r"h200", "H200"),
    (r"gh200", "H200"),
    (r"a100.*80", "A100-80GB"),
    (r"a100", "A100-40GB"),
    (r"b200", "B200"),
    (r"l40s", "L40S"),
    (r"\bl4\b", "L4"),
    (r"mi300x", "MI300X"),
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
