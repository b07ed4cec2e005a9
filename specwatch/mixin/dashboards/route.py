"""Route detail: one route on its nodes, one row of panels per question.

Acceptance per window against the baseline and the route's own page threshold, the detection horizon,
per-position acceptance and k, batch against the crossover, GPU time lost or saved, canary probes and the GPUs
the route runs on; model changes are annotations.
"""

from __future__ import annotations

from typing import Any

from specwatch.mixin.dashboards.panels import (
    DATASOURCE,
    Row,
    Selectors,
    dashboard,
    dashed,
    layout,
    right_axis,
    selectors,
    stat,
    timeseries,
)
from specwatch.mixin.settings import Settings


def mean_acceptance_length(sel: Selectors, w: str) -> str:
    """Mean acceptance length of each route on each node over `w`: 1 + accepted tokens / drafts from its
    counters, or the engine's own gauge for a route without counters (only those export it)."""
    accepted = f"rate(specwatch_route_accepted_tokens_total{{{sel.route}}}[{w}])"
    drafts = f"rate(specwatch_route_drafts_total{{{sel.route}}}[{w}])"
    gauge = f'specwatch_route_mean_acceptance_length{{{sel.route},window="{w}"}}'
    return f"(1 + {accepted}\n/ ({drafts} > 0))\nor {gauge}"


def _route_gpu(sel: Selectors, metric: str) -> str:
    """A GPU metric for the GPUs the selected routes run on, labelled with the route.

    The route mapping is the "many" side: several routes may share one GPU.
    """
    return f"specwatch_route_gpu_info{{{sel.route}}}\n* on(job, instance, gpu) group_left()\n{metric}{{{sel.node}}}"


def acceptance_row(s: Settings, sel: Selectors) -> Row:
    """Acceptance per window against the baseline band, and the detector's evidence."""
    return [
        (
            timeseries(
                "Acceptance per window and baseline band",
                "Draft-token acceptance per window (solid) inside the baseline band (dashed): the pinned "
                "baseline and the threshold the detector alarms below, baseline x (1 - the route's own "
                f"drop; {s.default_drop:g} by default).",
                [
                    (f"specwatch_route_acceptance_ratio{{{sel.route}}}", "{{instance}} {{route}} {{window}}"),
                    (f"specwatch_route_acceptance_baseline_ratio{{{sel.route}}}", "{{instance}} {{route}} baseline"),
                    (
                        f"specwatch_route_acceptance_threshold_ratio{{{sel.route}}}",
                        "{{instance}} {{route}} alarm threshold",
                    ),
                ],
                "percentunit",
                minimum=0,
                overrides=[dashed(".* baseline"), dashed(".* alarm threshold", color="red")],
            ),
            16,
            9,
        ),
        (
            timeseries(
                "Drop and detector evidence",
                "Relative drop 1 - current / baseline, and the CUSUM evidence statistic (alarms at its "
                f"threshold, {s.default_cusum_threshold:g} by default on a busy route).",
                [
                    (f"specwatch_route_acceptance_drop_ratio{{{sel.route}}}", "{{instance}} {{route}} drop"),
                    (f"specwatch_route_acceptance_cusum{{{sel.route}}}", "{{instance}} {{route}} CUSUM"),
                ],
                "percentunit",
                overrides=[right_axis(".* CUSUM", "none")],
            ),
            8,
            9,
        ),
    ]


def horizon_row(s: Settings, sel: Selectors) -> Row:
    """How soon a drop would page, against the route's budget."""
    return [
        (
            timeseries(
                "Detection horizon",
                "Expected time to page a 20% acceptance drop: by the traffic detector at the last hour's "
                "evidence rate (traffic), by canary probes where configured (probe: 2 rounds), against the "
                "route's detection.horizon_budget (dashed). Above the budget with no faster probe, the route "
                "is under-watched (docs/detection.md, detection horizon).",
                [
                    (
                        f"specwatch_route_detection_horizon_seconds{{{sel.route}}}",
                        "{{instance}} {{route}} {{path}}",
                    ),
                    (
                        f"specwatch_route_detection_horizon_budget_seconds{{{sel.route}}}",
                        "{{instance}} {{route}} budget",
                    ),
                ],
                "s",
                minimum=0,
                overrides=[dashed(".* budget", color="red")],
            ),
            24,
            6,
        ),
    ]


def drafting_row(s: Settings, sel: Selectors) -> Row:
    """Per-position acceptance, mean acceptance length, draft length."""
    return [
        (
            timeseries(
                "Per-position acceptance (5m)",
                "Share of drafts whose token at each position was "
                "accepted. Position 0 does not depend on k: compare it when k changed. Right axis, comparable: "
                "1 when every draft proposed all k positions (or the engine counts drafted tokens per position); "
                "at 0, drafts shorter than k (a batch-size band, grammar, a verify cap, a drafter with nothing to "
                "propose) count as rejections at positions they never drafted, so later positions read low.",
                [
                    (
                        f"specwatch_route_position_acceptance_ratio{{{sel.route}}}",
                        "{{instance}} {{route}} position {{position}}",
                    ),
                    (
                        f"specwatch_route_position_acceptance_comparable{{{sel.route}}}",
                        "{{instance}} {{route}} comparable",
                    ),
                ],
                "percentunit",
                overrides=[right_axis(".* comparable", "none"), dashed(".* comparable")],
                minimum=0,
            ),
            12,
            8,
        ),
        (
            timeseries(
                "Mean acceptance length",
                "Tokens per verify step including the bonus token over 5m: 1 + accepted tokens / drafts from "
                "the route's counters, or the engine's own gauge where it has no counters.",
                [(mean_acceptance_length(sel, "5m"), "{{instance}} {{route}}")],
                "none",
                minimum=1,
            ),
            6,
            8,
        ),
        (
            timeseries(
                "Draft length k",
                "Effective draft tokens per draft step over 5m, whatever the engine "
                "(a batch-size schedule or adaptive speculation moves it); speculating is 0 when the route "
                "generates without drafting.",
                [
                    (f"specwatch_route_draft_length{{{sel.route}}}", "{{instance}} {{route}}"),
                    (f"specwatch_route_speculation_active{{{sel.route}}}", "{{instance}} {{route}} speculating"),
                ],
                "none",
                minimum=0,
            ),
            6,
            8,
        ),
    ]


def crossover_row(s: Settings, sel: Selectors) -> Row:
    """Batch against the crossover and what the flag judges against."""
    return [
        (
            timeseries(
                "Batch vs crossover",
                "Time-weighted running requests per engine, against the batch size above which speculation "
                "lowers throughput (each source's B*), the batch the flag judges against now (flag, with "
                "its source: sweep, estimate, batch_size or live) and that source's band (dashed), named with "
                "the verify attention kernel its step model prices (packed, unpacked, or unknown: the band "
                "spans both), the largest batch whose KV cache fits at the live context (KV fits; an "
                "estimated crossover above it is none), and the batch bins live calibration has (right "
                "axis). No flag line: the flag cannot fire (no crossover, or an estimate whose band has no "
                "upper side).",
                [
                    (f"specwatch_route_batch_size{{{sel.route}}}", "{{instance}} {{route}} batch"),
                    (
                        f"specwatch_route_crossover_batch_size{{{sel.route}}}",
                        "{{instance}} {{route}} crossover ({{source}})",
                    ),
                    (
                        f"specwatch_route_crossover_flag_batch_size{{{sel.route}}}",
                        "{{instance}} {{route}} flag ({{source}})",
                    ),
                    (
                        f"specwatch_route_crossover_band_batch_size{{{sel.route}}} and on (instance, route, source) "
                        f"specwatch_route_crossover_flag_batch_size{{{sel.route}}}",
                        "{{instance}} {{route}} flag band {{bound}} ({{source}}, {{kernel}} kernel)",
                    ),
                    (f"specwatch_route_kv_capacity_batch_size{{{sel.route}}}", "{{instance}} {{route}} KV fits"),
                    (
                        f"specwatch_route_running_requests{{{sel.route}}}",
                        "{{instance}} {{route}} running (all engines)",
                    ),
                    (f"specwatch_route_waiting_requests{{{sel.route}}}", "{{instance}} {{route}} waiting"),
                    (f"specwatch_route_crossover_live_bins{{{sel.route}}}", "{{instance}} {{route}} live bins"),
                ],
                "none",
                minimum=0,
                overrides=[dashed(".* flag band .*"), dashed(".* KV fits"), right_axis(".* live bins", "none")],
            ),
            12,
            8,
        ),
        (
            timeseries(
                "Predicted speedup",
                "Predicted speculative / plain throughput at the current batch; below 1 speculation costs throughput.",
                [(f"specwatch_route_predicted_speedup_ratio{{{sel.route}}}", "{{instance}} {{route}}")],
                "none",
                thresholds=[{"color": "red", "value": None}, {"color": "green", "value": 1}],
            ),
            8,
            8,
        ),
        (
            stat(
                "Flag judges against",
                "The batch the above-crossover flag compares with now, and its source (sweep, estimate, "
                "batch_size, or live once live calibration settled). The band and live calibration's "
                "batch bins are in Batch vs crossover.",
                f"specwatch_route_crossover_flag_batch_size{{{sel.route}}}",
                legend="{{route}} {{source}}",
                text_mode="value_and_name",
            ),
            4,
            8,
        ),
    ]


def gpu_hours_row(s: Settings, sel: Selectors) -> Row:
    """GPU time speculation cost or saved."""
    return [
        (
            stat(
                "GPU-hours lost this week",
                "GPU time speculative decoding cost the route over the last 7 days: "
                "GPUs x time x (1 - predicted speedup) while above the crossover (docs/crossover.md).",
                f"sum(increase(specwatch_route_speculation_gpu_seconds_lost_total{{{sel.route}}}[7d])) / 3600",
            ),
            6,
            5,
        ),
        (
            stat(
                "GPU-hours saved this week",
                "GPU time speculative decoding saved the route over the last 7 days: "
                "GPUs x time x (predicted speedup - 1) while below the crossover.",
                f"sum(increase(specwatch_route_speculation_gpu_seconds_saved_total{{{sel.route}}}[7d])) / 3600",
            ),
            6,
            5,
        ),
        (
            timeseries(
                "GPU-hours lost and saved by speculation",
                "Hourly GPU-hours speculation cost (above the "
                "crossover) or saved (below it), from the predicted speedup and the route's GPUs.",
                [
                    (
                        f"increase(specwatch_route_speculation_gpu_seconds_lost_total{{{sel.route}}}[1h]) / 3600",
                        "{{instance}} {{route}} lost",
                    ),
                    (
                        f"increase(specwatch_route_speculation_gpu_seconds_saved_total{{{sel.route}}}[1h]) / 3600",
                        "{{instance}} {{route}} saved",
                    ),
                ],
                "none",
                minimum=0,
            ),
            12,
            5,
        ),
    ]


def canary_row(s: Settings, sel: Selectors) -> Row:
    """Canary probe rounds (routes with `probe:`)."""
    return [
        (
            timeseries(
                "Canary probes",
                "Acceptance of each canary probe round against the fingerprint it is "
                "judged by (dashed), the verdict (1: two rounds in a row dropped prompt by prompt), and "
                "rounds that failed or found the engine busy. Only routes with `probe:` configured.",
                [
                    (f"specwatch_route_probe_acceptance_ratio{{{sel.route}}}", "{{instance}} {{route}} probe"),
                    (f"specwatch_route_probe_baseline_ratio{{{sel.route}}}", "{{instance}} {{route}} fingerprint"),
                    (f"specwatch_route_probe_degraded{{{sel.route}}}", "{{instance}} {{route}} degraded"),
                    (
                        f"sum by (instance, route, result) (increase(specwatch_route_probe_rounds_total"
                        f'{{{sel.route},result!="ok"}}[$__rate_interval]))',
                        "{{instance}} {{route}} {{result}} rounds",
                    ),
                ],
                "percentunit",
                minimum=0,
                overrides=[
                    dashed(".* fingerprint"),
                    right_axis(".* (degraded|rounds)", "none"),
                ],
            ),
            16,
            8,
        ),
        (
            timeseries(
                "Canary round duration",
                "Wall-clock seconds of the last canary probe round, whether it read the engine's acceptance (1) "
                "or failed or found it busy (0), and how acceptance is read (method).",
                [
                    (f"specwatch_route_probe_duration_seconds{{{sel.route}}}", "{{instance}} {{route}}"),
                    (f"specwatch_route_probe_success{{{sel.route}}}", "{{instance}} {{route}} read acceptance"),
                    (f"specwatch_route_probe_method_info{{{sel.route}}}", "{{instance}} {{route}} {{method}}"),
                ],
                "s",
                minimum=0,
            ),
            8,
            8,
        ),
    ]


def gpu_row(s: Settings, sel: Selectors) -> Row:
    """The route's GPUs."""
    return [
        (
            timeseries(
                "GPU tensor and DRAM activity",
                "GPM activity of the route's GPUs: decode is memory-bound "
                "while DRAM bandwidth leads and tensor activity stays low.",
                [
                    (_route_gpu(sel, "specwatch_gpu_tensor_active_ratio"), "{{instance}} {{route}} gpu {{gpu}} tensor"),
                    (
                        _route_gpu(sel, "specwatch_gpu_dram_bandwidth_utilization_ratio"),
                        "{{instance}} {{route}} gpu {{gpu}} DRAM",
                    ),
                ],
                "percentunit",
                minimum=0,
            ),
            24,
            8,
        )
    ]


def route_detail(s: Settings) -> dict[str, Any]:
    sel = selectors(s)
    rows = [
        row(s, sel)
        for row in (acceptance_row, horizon_row, drafting_row, crossover_row, gpu_hours_row, canary_row, gpu_row)
    ]

    changes = {
        "name": "Model changes",
        "datasource": DATASOURCE,
        "enable": True,
        "iconColor": "orange",
        "expr": f"changes(specwatch_route_model_changes_total{{{sel.route}}}[$__interval]) > 0",
        "step": "1m",
        "titleFormat": "Model change on {{route}}",
        "textFormat": "{{instance}}: model, engine version or draft length changed",
    }
    return dashboard(
        s,
        "route",
        "specwatch / Route detail",
        "One route on its nodes: acceptance, per-position acceptance, draft length, batch vs "
        "crossover, canary probes and the GPUs it runs on. Model changes are annotations.",
        layout(rows),
        annotations=[changes],
    )
