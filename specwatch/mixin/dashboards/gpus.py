"""GPUs: NVML and Hopper GPM readings of every GPU specwatch watches on the selected nodes."""

from __future__ import annotations

from typing import Any

from specwatch.mixin.dashboards.panels import (
    FULL_WIDTH,
    dashboard,
    layout,
    right_axis,
    selectors,
    stat,
    table,
    timeseries,
)
from specwatch.mixin.settings import Settings


def gpus(s: Settings) -> dict[str, Any]:
    sel = selectors(s)

    def per_gpu(metric: str) -> list[tuple[str, str]]:
        return [(f"{metric}{{{sel.node}}}", "{{instance}} gpu {{gpu}}")]

    rows = [
        [
            (
                stat(
                    "GPUs answering NVML",
                    "GPUs whose last NVML query succeeded.",
                    f"sum(specwatch_gpu_up{{{sel.node}}}) or vector(0)",
                ),
                8,
                4,
            ),
            (
                stat(
                    "GPUs lost",
                    "GPUs that stopped answering NVML.",
                    f"count(specwatch_gpu_up{{{sel.node}}} == 0) or vector(0)",
                    thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}],
                ),
                8,
                4,
            ),
            (
                stat(
                    "Nodes without NVML",
                    "specwatch instances where NVML did not load or answer.",
                    f"count(specwatch_nvml_up{{{sel.node}}} == 0) or vector(0)",
                ),
                8,
                4,
            ),
        ],
        [
            (
                timeseries(
                    "Tensor activity",
                    "GPM: share of cycles any tensor pipe was active.",
                    per_gpu("specwatch_gpu_tensor_active_ratio"),
                    "percentunit",
                    minimum=0,
                ),
                12,
                8,
            ),
            (
                timeseries(
                    "DRAM bandwidth utilization",
                    "GPM: share of peak DRAM bandwidth used.",
                    per_gpu("specwatch_gpu_dram_bandwidth_utilization_ratio"),
                    "percentunit",
                    minimum=0,
                ),
                12,
                8,
            ),
        ],
        [
            (
                timeseries(
                    "SM activity",
                    "GPM: share of cycles with at least one warp on an SM.",
                    per_gpu("specwatch_gpu_sm_active_ratio"),
                    "percentunit",
                    minimum=0,
                ),
                12,
                8,
            ),
            (
                timeseries(
                    "SM occupancy",
                    "GPM: resident warps over the maximum.",
                    per_gpu("specwatch_gpu_sm_occupancy_ratio"),
                    "percentunit",
                    minimum=0,
                ),
                12,
                8,
            ),
        ],
        [
            (
                timeseries(
                    "Memory used",
                    "GPU memory in use against installed memory.",
                    [
                        (f"specwatch_gpu_memory_used_bytes{{{sel.node}}}", "{{instance}} gpu {{gpu}} used"),
                        (f"specwatch_gpu_memory_total_bytes{{{sel.node}}}", "{{instance}} gpu {{gpu}} total"),
                    ],
                    "bytes",
                    minimum=0,
                ),
                8,
                8,
            ),
            (
                timeseries(
                    "Power",
                    "Power draw against the enforced limit.",
                    [
                        (f"specwatch_gpu_power_watts{{{sel.node}}}", "{{instance}} gpu {{gpu}} draw"),
                        (f"specwatch_gpu_power_limit_watts{{{sel.node}}}", "{{instance}} gpu {{gpu}} limit"),
                    ],
                    "watt",
                    minimum=0,
                ),
                8,
                8,
            ),
            (
                timeseries(
                    "Temperature and SM clock",
                    "Die temperature and SM clock: a falling clock at steady load means throttling.",
                    [
                        (f"specwatch_gpu_temperature_celsius{{{sel.node}}}", "{{instance}} gpu {{gpu}} temperature"),
                        (f"specwatch_gpu_sm_clock_hertz{{{sel.node}}}", "{{instance}} gpu {{gpu}} SM clock"),
                    ],
                    "celsius",
                    overrides=[right_axis(".* SM clock", "hertz")],
                ),
                8,
                8,
            ),
        ],
        [
            (
                timeseries(
                    "Clock throttle reasons",
                    "NVML clock event reasons bitmask (0 = none); the runbook "
                    "decodes the bits. 0x1 (idle) and 0x4 (power cap) are normal.",
                    per_gpu("specwatch_gpu_clock_throttle_reasons"),
                    "none",
                    minimum=0,
                ),
                12,
                8,
            ),
            (
                timeseries(
                    "ECC errors",
                    "Corrected and uncorrected ECC errors per second.",
                    [
                        (
                            f"rate(specwatch_gpu_ecc_corrected_errors_total{{{sel.node}}}[$__rate_interval])",
                            "{{instance}} gpu {{gpu}} corrected",
                        ),
                        (
                            f"rate(specwatch_gpu_ecc_uncorrected_errors_total{{{sel.node}}}[$__rate_interval])",
                            "{{instance}} gpu {{gpu}} uncorrected",
                        ),
                    ],
                    "none",
                    minimum=0,
                ),
                12,
                8,
            ),
        ],
        [
            (
                table(
                    "GPUs and routes",
                    "Every GPU and the routes that run on it.",
                    [
                        (f"specwatch_gpu_info{{{sel.node}}}", "info"),
                        (f"specwatch_route_gpu_info{{{sel.route}}}", "route"),
                    ],
                    {},
                ),
                FULL_WIDTH,
                8,
            )
        ],
    ]
    return dashboard(
        s, "gpus", "specwatch / GPUs", "NVML and Hopper GPM readings of every GPU specwatch watches.", layout(rows)
    )
