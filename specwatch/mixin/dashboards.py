"""Grafana dashboards as code (grafanalib; the only module that imports it).

Three dashboards: Fleet overview (every route, judged across the selected nodes), Route detail (one route on
its nodes: acceptance per window against the baseline and the route's own page threshold, per-position
acceptance, k, batch against the crossover, the route's GPUs) and GPUs. All share the datasource, job,
instance and route variables, and every panel honours them: the fleet panels compute the fleet rules' formulas
(ratios of summed rates, never averages of ratios) from the selected nodes' raw series, since the recorded
series are summed over every node. A route in the fleet view links to its Route detail with the same
selection. `all_dashboards()` returns plain JSON-ready dicts; `render.py` serialises them.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

from grafanalib import core as g

from specwatch.mixin.settings import Settings

DATASOURCE = "${datasource}"
NODE = 'job=~"$job",instance=~"$instance"'
ROUTE = NODE + ',route=~"$route"'
FULL_WIDTH = 24


def _route_link(s: Settings, route: str) -> list[dict[str, Any]]:
    """A data link to the Route detail dashboard for `route` (a Grafana field or value macro), keeping the
    data source, job and instance selection and the time range."""
    url = (
        f"/d/{s.dashboard_uid_prefix}-route?var-route={route}"
        "&${datasource:queryparam}&${job:queryparam}&${instance:queryparam}&${__url_time_range}"
    )
    return [{"title": "Route detail for " + route, "url": url}]


def _sum_rate(metric: str, w: str) -> str:
    return f"sum by (route) (rate({metric}{{{ROUTE}}}[{w}]))"


def fleet_acceptance(w: str) -> str:
    """Accepted over drafted tokens of each route, summed over the selected nodes (rules.ACCEPTANCE's formula)."""
    accepted = _sum_rate("specwatch_route_accepted_tokens_total", w)
    drafted = _sum_rate("specwatch_route_draft_tokens_total", w)
    return f"{accepted}\n/ ({drafted} > 0)"


FLEET_BASELINE = f"avg by (route) (specwatch_route_acceptance_baseline_ratio{{{ROUTE}}})"


def fleet_drop(w: str) -> str:
    return f"1 - (\n{fleet_acceptance(w)}\n) / {FLEET_BASELINE}"


def _fleet(aggregation: str, metric: str) -> str:
    return f"{aggregation} by (route) ({metric}{{{ROUTE}}})"


def _target(expr: str, legend: str = "", ref: str = "A", instant: bool = False) -> g.Target:
    return g.Target(
        expr=expr, legendFormat=legend, refId=ref, instant=instant, format="table" if instant else "time_series"
    )


def _targets(*queries: tuple[str, str]) -> list[g.Target]:
    return [_target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(queries)]


def _timeseries(
    title: str,
    description: str,
    queries: list[tuple[str, str]],
    unit: str = "",
    overrides: list[dict[str, Any]] | None = None,
    thresholds: list[dict[str, Any]] | None = None,
    minimum: float | None = None,
    links: list[dict[str, Any]] | None = None,
) -> g.TimeSeries:
    defaults: dict[str, Any] = {}
    if thresholds:
        defaults["thresholds"] = {"mode": "absolute", "steps": thresholds}
    if links:
        defaults["links"] = links
    extra = {"fieldConfig": {"defaults": defaults}} if defaults else {}
    return g.TimeSeries(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=_targets(*queries),
        unit=unit,
        overrides=overrides or [],
        valueMin=minimum,
        legendDisplayMode="table",
        legendCalcs=["lastNotNull"],
        tooltipMode="multi",
        spanNulls=False,
        thresholdsStyleMode="line" if thresholds else "off",
        extraJson=extra or None,
    )


def _stat(
    title: str,
    description: str,
    expr: str,
    unit: str = "none",
    thresholds: list[dict[str, Any]] | None = None,
    legend: str = "",
    text_mode: str = "auto",
) -> g.Stat:
    return g.Stat(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=_targets((expr, legend)),
        format=unit,
        reduceCalc="lastNotNull",
        graphMode="none",
        colorMode="background",
        textMode=text_mode,
        thresholds=thresholds or [{"color": "green", "value": None}],
    )


def _table(
    title: str,
    description: str,
    columns: list[tuple[str, str]],
    rename: dict[str, str],
    column_links: dict[str, list[dict[str, Any]]] | None = None,
) -> g.Table:
    """One row per route: instant queries merged on their labels, each value column renamed; `column_links`
    puts data links on columns, by their displayed name."""
    targets = [_target(expr, "", chr(ord("A") + i), instant=True) for i, (expr, _) in enumerate(columns)]
    renames = {f"Value #{chr(ord('A') + i)}": name for i, (_, name) in enumerate(columns)}
    renames.update(rename)
    return g.Table(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=targets,
        overrides=[
            {"matcher": {"id": "byName", "options": name}, "properties": [{"id": "links", "value": links}]}
            for name, links in (column_links or {}).items()
        ],
        transformations=[
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True}, "renameByName": renames}},
        ],
    )


def _dashed(name_regex: str, color: str = "") -> dict[str, Any]:
    """Draw the series whose display name matches as a dashed reference line."""
    properties: list[dict[str, Any]] = [{"id": "custom.lineStyle", "value": {"dash": [10, 10], "fill": "dash"}}]
    if color:
        properties.append({"id": "color", "value": {"mode": "fixed", "fixedColor": color}})
    return {"matcher": {"id": "byRegexp", "options": name_regex}, "properties": properties}


def _right_axis(name_regex: str, unit: str) -> dict[str, Any]:
    """Plot the series whose display name matches on a right-hand axis of its own unit."""
    properties = [{"id": "custom.axisPlacement", "value": "right"}, {"id": "unit", "value": unit}]
    return {"matcher": {"id": "byRegexp", "options": name_regex}, "properties": properties}


def _layout(rows: list[list[tuple[Any, int, int]]]) -> list[Any]:
    """Place panels left to right: each row is [(panel, width, height)], rows stack top to bottom."""
    panels, y = [], 0
    for row in rows:
        x = 0
        for panel, width, height in row:
            panel.gridPos = g.GridPos(h=height, w=width, x=x, y=y)
            panels.append(panel)
            x += width
        y += max(h for _, _, h in row)
    return panels


def _templating() -> g.Templating:
    def var(name: str, label: str, query: str) -> g.Template:
        return g.Template(
            name=name,
            label=label,
            dataSource=DATASOURCE,
            query=query,
            includeAll=True,
            multi=True,
            allValue=".+",
            refresh=2,
            sort=1,
            default="$__all",
        )

    return g.Templating(
        list=[
            g.Template(
                name="datasource", label="Data source", query="prometheus", type="datasource", default="default"
            ),
            var("job", "Job", "label_values(specwatch_build_info, job)"),
            var("instance", "Instance", 'label_values(specwatch_build_info{job=~"$job"}, instance)'),
            var("route", "Route", f"label_values(specwatch_route_info{{{NODE}}}, route)"),
        ]
    )


def _dashboard(
    s: Settings,
    slug: str,
    title: str,
    description: str,
    panels: list[Any],
    annotations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    dashboard = g.Dashboard(
        title=title,
        description=description,
        uid=f"{s.dashboard_uid_prefix}-{slug}",
        tags=list(s.dashboard_tags),
        timezone="utc",
        refresh=s.dashboard_refresh,
        time=g.Time("now-6h", "now"),
        graphTooltip=1,
        editable=False,
        templating=_templating(),
        panels=panels,
        annotations=g.Annotations(list=annotations or []),
    ).auto_panel_ids()
    # Through JSON once so the result is plain data: comparable, serialisable, free of grafanalib objects.
    return json.loads(json.dumps(dashboard.to_json_data(), default=_json_data))


def _json_data(obj: Any) -> Any:
    """grafanalib objects nested in a dashboard, as their JSON data (what grafanalib's own encoder does)."""
    to_json_data = getattr(obj, "to_json_data", None)
    if to_json_data is None:
        raise TypeError(f"{type(obj).__name__} is not JSON serialisable")
    return to_json_data()


# --------------------------------------------------------------------------- Fleet overview
def fleet_overview(s: Settings) -> dict[str, Any]:
    short, long_ = s.fleet_windows[0], s.fleet_windows[-1]
    acceptance = fleet_acceptance(short)
    acceptance_long = fleet_acceptance(long_)
    baseline = FLEET_BASELINE
    drop_long = fleet_drop(long_)
    link = _route_link(s, "${__field.labels.route}")
    red_at: list[dict[str, Any]] = [{"color": "green", "value": None}, {"color": "red", "value": 1}]
    rows = [
        [
            (
                _stat(
                    "Routes",
                    "Routes served by at least one node.",
                    f"count(count by (route) (specwatch_route_info{{{ROUTE}}})) or vector(0)",
                ),
                6,
                4,
            ),
            (
                _stat(
                    "Routes degraded",
                    "Routes where at least one node's detector says acceptance dropped.",
                    f"count(max by (route) (specwatch_route_acceptance_degraded{{{ROUTE}}}) == 1) or vector(0)",
                    thresholds=red_at,
                ),
                6,
                4,
            ),
            (
                _stat(
                    "Routes above crossover",
                    "Routes where at least one node batches above its crossover.",
                    f"count(max by (route) (specwatch_route_above_crossover{{{ROUTE}}}) == 1) or vector(0)",
                    thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 1}],
                ),
                6,
                4,
            ),
            (
                _stat(
                    "Engine endpoints down",
                    "Route endpoints specwatch cannot scrape, over the selected nodes.",
                    f"count(specwatch_route_up{{{ROUTE}}} == 0) or vector(0)",
                    thresholds=red_at,
                ),
                6,
                4,
            ),
        ],
        [
            (
                _table(
                    "Routes",
                    "Fleet view of every route (click a route for its detail): acceptance over "
                    f"{long_} summed over the selected nodes, its pinned baseline and drop, and how many nodes "
                    "are up, degraded or above the crossover.",
                    [
                        (acceptance_long, f"Acceptance {long_}"),
                        (baseline, "Baseline"),
                        (drop_long, f"Drop {long_}"),
                        (_fleet("sum", "specwatch_route_up"), "Nodes up"),
                        (_fleet("sum", "specwatch_route_acceptance_degraded"), "Nodes degraded"),
                        (_fleet("sum", "specwatch_route_above_crossover"), "Nodes above crossover"),
                        (_fleet("max", "specwatch_route_batch_size"), "Max batch"),
                        (_fleet("min", "specwatch_route_crossover_batch_size"), "Crossover"),
                    ],
                    {"route": "Route"},
                    column_links={"Route": _route_link(s, "${__value.raw}")},
                ),
                FULL_WIDTH,
                8,
            )
        ],
        [
            (
                _timeseries(
                    "Acceptance vs baseline",
                    f"Draft-token acceptance over {short}, summed over the route's "
                    "nodes (solid), and its pinned baseline (dashed).",
                    [(acceptance, "{{route}}"), (baseline, "{{route}} baseline")],
                    "percentunit",
                    overrides=[_dashed(".* baseline")],
                    minimum=0,
                    links=link,
                ),
                12,
                9,
            ),
            (
                _timeseries(
                    "Acceptance drop",
                    f"1 - acceptance / baseline over {long_} and {short}; the detector "
                    f"alarms near the red line (the default drop, {s.default_drop:.0%}; a route may set its own).",
                    [
                        (drop_long, "{{route}} " + long_),
                        (fleet_drop(short), "{{route}} " + short),
                    ],
                    "percentunit",
                    thresholds=[{"color": "green", "value": None}, {"color": "red", "value": s.default_drop}],
                    links=link,
                ),
                12,
                9,
            ),
        ],
        [
            (
                _timeseries(
                    "Batch vs crossover",
                    "Largest per-engine batch of the route over its nodes, and the "
                    "lowest crossover: above it speculation costs throughput.",
                    [
                        (_fleet("max", "specwatch_route_batch_size"), "{{route}} batch"),
                        (_fleet("min", "specwatch_route_crossover_batch_size"), "{{route}} crossover"),
                    ],
                    "none",
                    minimum=0,
                    links=link,
                ),
                12,
                9,
            ),
            (
                _timeseries(
                    "Nodes above crossover",
                    "Nodes of each route whose batch runs above the crossover (with hysteresis).",
                    [(_fleet("sum", "specwatch_route_above_crossover"), "{{route}}")],
                    "none",
                    minimum=0,
                    links=link,
                ),
                12,
                9,
            ),
        ],
    ]
    return _dashboard(
        s,
        "fleet",
        "specwatch / Fleet overview",
        "Speculative decoding on every route, judged across all nodes that serve it.",
        _layout(rows),
    )


# --------------------------------------------------------------------------- Route detail
def mean_acceptance_length(w: str) -> str:
    """1 + accepted tokens / drafts of each route on each node over `w`, from its counters."""
    accepted = f"rate(specwatch_route_accepted_tokens_total{{{ROUTE}}}[{w}])"
    drafts = f"rate(specwatch_route_drafts_total{{{ROUTE}}}[{w}])"
    return f"1 + {accepted}\n/ ({drafts} > 0)"


def _route_gpu(metric: str) -> str:
    """A GPU metric for the GPUs the selected routes run on, labelled with the route.

    The route mapping is the "many" side: several routes may share one GPU.
    """
    return f"specwatch_route_gpu_info{{{ROUTE}}}\n* on(job, instance, gpu) group_left()\n{metric}{{{NODE}}}"


def route_detail(s: Settings) -> dict[str, Any]:
    rows = [
        [
            (
                _timeseries(
                    "Acceptance per window and baseline band",
                    "Draft-token acceptance per window (solid) inside the baseline band (dashed): the pinned "
                    "baseline and the threshold the detector alarms below, baseline x (1 - the route's own "
                    f"drop; {s.default_drop:g} by default).",
                    [
                        (f"specwatch_route_acceptance_ratio{{{ROUTE}}}", "{{instance}} {{route}} {{window}}"),
                        (f"specwatch_route_acceptance_baseline_ratio{{{ROUTE}}}", "{{instance}} {{route}} baseline"),
                        (
                            f"specwatch_route_acceptance_threshold_ratio{{{ROUTE}}}",
                            "{{instance}} {{route}} alarm threshold",
                        ),
                    ],
                    "percentunit",
                    minimum=0,
                    overrides=[_dashed(".* baseline"), _dashed(".* alarm threshold", color="red")],
                ),
                16,
                9,
            ),
            (
                _timeseries(
                    "Drop and detector evidence",
                    "Relative drop 1 - current / baseline, and the CUSUM evidence statistic (alarms at its "
                    f"threshold, {s.default_cusum_threshold:g} by default on a busy route).",
                    [
                        (f"specwatch_route_acceptance_drop_ratio{{{ROUTE}}}", "{{instance}} {{route}} drop"),
                        (f"specwatch_route_acceptance_cusum{{{ROUTE}}}", "{{instance}} {{route}} CUSUM"),
                    ],
                    "percentunit",
                    overrides=[_right_axis(".* CUSUM", "none")],
                ),
                8,
                9,
            ),
        ],
        [
            (
                _timeseries(
                    "Detection horizon",
                    "Expected time to page a 20% acceptance drop: by the traffic detector at the last hour's "
                    "evidence rate (traffic), by canary probes where configured (probe: 2 rounds), against the "
                    "route's detection.horizon_budget (dashed). Above the budget with no faster probe, the route "
                    "is under-watched (docs/detection.md, detection horizon).",
                    [
                        (
                            f"specwatch_route_detection_horizon_seconds{{{ROUTE}}}",
                            "{{instance}} {{route}} {{path}}",
                        ),
                        (
                            f"specwatch_route_detection_horizon_budget_seconds{{{ROUTE}}}",
                            "{{instance}} {{route}} budget",
                        ),
                    ],
                    "s",
                    minimum=0,
                    overrides=[_dashed(".* budget", color="red")],
                ),
                24,
                6,
            ),
        ],
        [
            (
                _timeseries(
                    "Per-position acceptance (5m)",
                    "Share of drafts whose token at each position was "
                    "accepted. Position 0 does not depend on k: compare it when k changed.",
                    [
                        (
                            f"specwatch_route_position_acceptance_ratio{{{ROUTE}}}",
                            "{{instance}} {{route}} position {{position}}",
                        )
                    ],
                    "percentunit",
                    minimum=0,
                ),
                12,
                8,
            ),
            (
                _timeseries(
                    "Mean acceptance length",
                    "Tokens per verify step including the bonus token over 5m: 1 + accepted tokens / drafts from "
                    "the route's counters, or the engine's own gauge where it has no counters (window label).",
                    [
                        (mean_acceptance_length("5m"), "{{instance}} {{route}} 5m"),
                        (f"specwatch_route_mean_acceptance_length{{{ROUTE}}}", "{{instance}} {{route}} {{window}}"),
                    ],
                    "none",
                    minimum=1,
                ),
                6,
                8,
            ),
            (
                _timeseries(
                    "Draft length k",
                    "Effective draft tokens per draft step over 5m, whatever the engine "
                    "(a batch-size schedule or adaptive speculation moves it); speculating is 0 when the route "
                    "generates without drafting.",
                    [
                        (f"specwatch_route_draft_length{{{ROUTE}}}", "{{instance}} {{route}}"),
                        (f"specwatch_route_speculation_active{{{ROUTE}}}", "{{instance}} {{route}} speculating"),
                    ],
                    "none",
                    minimum=0,
                ),
                6,
                8,
            ),
        ],
        [
            (
                _timeseries(
                    "Batch vs crossover",
                    "Time-weighted running requests per engine, against the batch size above which speculation "
                    "lowers throughput (each source's B*), the batch the flag judges against now (flag, with "
                    "its source: sweep, estimate, batch_size or live) and that source's band (dashed), and the "
                    "batch bins live calibration has (right axis). No flag line: the flag cannot fire (no "
                    "crossover, or an estimate whose band has no upper side).",
                    [
                        (f"specwatch_route_batch_size{{{ROUTE}}}", "{{instance}} {{route}} batch"),
                        (
                            f"specwatch_route_crossover_batch_size{{{ROUTE}}}",
                            "{{instance}} {{route}} crossover ({{source}})",
                        ),
                        (
                            f"specwatch_route_crossover_flag_batch_size{{{ROUTE}}}",
                            "{{instance}} {{route}} flag ({{source}})",
                        ),
                        (
                            f"specwatch_route_crossover_band_batch_size{{{ROUTE}}} and on (instance, route, source) "
                            f"specwatch_route_crossover_flag_batch_size{{{ROUTE}}}",
                            "{{instance}} {{route}} flag band {{bound}} ({{source}})",
                        ),
                        (
                            f"specwatch_route_running_requests{{{ROUTE}}}",
                            "{{instance}} {{route}} running (all engines)",
                        ),
                        (f"specwatch_route_waiting_requests{{{ROUTE}}}", "{{instance}} {{route}} waiting"),
                        (f"specwatch_route_crossover_live_bins{{{ROUTE}}}", "{{instance}} {{route}} live bins"),
                    ],
                    "none",
                    minimum=0,
                    overrides=[_dashed(".* flag band .*"), _right_axis(".* live bins", "none")],
                ),
                12,
                8,
            ),
            (
                _timeseries(
                    "Predicted speedup",
                    "Predicted speculative / plain throughput at the current batch; "
                    "below 1 speculation costs throughput.",
                    [(f"specwatch_route_predicted_speedup_ratio{{{ROUTE}}}", "{{instance}} {{route}}")],
                    "none",
                    thresholds=[{"color": "red", "value": None}, {"color": "green", "value": 1}],
                ),
                8,
                8,
            ),
            (
                _stat(
                    "Flag judges against",
                    "The batch the above-crossover flag compares with now, and its source (sweep, estimate, "
                    "batch_size, or live once live calibration settled). The band and live calibration's "
                    "batch bins are in Batch vs crossover.",
                    f"specwatch_route_crossover_flag_batch_size{{{ROUTE}}}",
                    legend="{{route}} {{source}}",
                    text_mode="value_and_name",
                ),
                4,
                8,
            ),
        ],
        [
            (
                _stat(
                    "GPU-hours lost this week",
                    "GPU time speculative decoding cost the route over the last 7 days: "
                    "GPUs x time x (1 - predicted speedup) while above the crossover (docs/crossover.md).",
                    f"sum(increase(specwatch_route_speculation_gpu_seconds_lost_total{{{ROUTE}}}[7d])) / 3600",
                ),
                6,
                5,
            ),
            (
                _stat(
                    "GPU-hours saved this week",
                    "GPU time speculative decoding saved the route over the last 7 days: "
                    "GPUs x time x (predicted speedup - 1) while below the crossover.",
                    f"sum(increase(specwatch_route_speculation_gpu_seconds_saved_total{{{ROUTE}}}[7d])) / 3600",
                ),
                6,
                5,
            ),
            (
                _timeseries(
                    "GPU-hours lost and saved by speculation",
                    "Hourly GPU-hours speculation cost (above the "
                    "crossover) or saved (below it), from the predicted speedup and the route's GPUs.",
                    [
                        (
                            f"increase(specwatch_route_speculation_gpu_seconds_lost_total{{{ROUTE}}}[1h]) / 3600",
                            "{{instance}} {{route}} lost",
                        ),
                        (
                            f"increase(specwatch_route_speculation_gpu_seconds_saved_total{{{ROUTE}}}[1h]) / 3600",
                            "{{instance}} {{route}} saved",
                        ),
                    ],
                    "none",
                    minimum=0,
                ),
                12,
                5,
            ),
        ],
        [
            (
                _timeseries(
                    "Canary probes",
                    "Acceptance of each canary probe round against the fingerprint it is "
                    "judged by (dashed), the verdict (1: two rounds in a row dropped prompt by prompt), and "
                    "rounds that failed or found the engine busy. Only routes with `probe:` configured.",
                    [
                        (f"specwatch_route_probe_acceptance_ratio{{{ROUTE}}}", "{{instance}} {{route}} probe"),
                        (f"specwatch_route_probe_baseline_ratio{{{ROUTE}}}", "{{instance}} {{route}} fingerprint"),
                        (f"specwatch_route_probe_degraded{{{ROUTE}}}", "{{instance}} {{route}} degraded"),
                        (
                            f"sum by (instance, route, result) (increase(specwatch_route_probe_rounds_total"
                            f'{{{ROUTE},result!="ok"}}[$__rate_interval]))',
                            "{{instance}} {{route}} {{result}} rounds",
                        ),
                    ],
                    "percentunit",
                    minimum=0,
                    overrides=[
                        _dashed(".* fingerprint"),
                        _right_axis(".* (degraded|rounds)", "none"),
                    ],
                ),
                16,
                8,
            ),
            (
                _timeseries(
                    "Canary round duration",
                    "Wall-clock seconds of the last canary probe round, whether it read the engine's acceptance (1) "
                    "or failed or found it busy (0), and how acceptance is read (method).",
                    [
                        (f"specwatch_route_probe_duration_seconds{{{ROUTE}}}", "{{instance}} {{route}}"),
                        (f"specwatch_route_probe_success{{{ROUTE}}}", "{{instance}} {{route}} read acceptance"),
                        (f"specwatch_route_probe_method_info{{{ROUTE}}}", "{{instance}} {{route}} {{method}}"),
                    ],
                    "s",
                    minimum=0,
                ),
                8,
                8,
            ),
        ],
        [
            (
                _timeseries(
                    "GPU tensor and DRAM activity",
                    "GPM activity of the route's GPUs: decode is memory-bound "
                    "while DRAM bandwidth leads and tensor activity stays low.",
                    [
                        (_route_gpu("specwatch_gpu_tensor_active_ratio"), "{{instance}} {{route}} gpu {{gpu}} tensor"),
                        (
                            _route_gpu("specwatch_gpu_dram_bandwidth_utilization_ratio"),
                            "{{instance}} {{route}} gpu {{gpu}} DRAM",
                        ),
                    ],
                    "percentunit",
                    minimum=0,
                ),
                24,
                8,
            )
        ],
    ]
    changes = {
        "name": "Model changes",
        "datasource": DATASOURCE,
        "enable": True,
        "iconColor": "orange",
        "expr": f"changes(specwatch_route_model_changes_total{{{ROUTE}}}[$__interval]) > 0",
        "step": "1m",
        "titleFormat": "Model change on {{route}}",
        "textFormat": "{{instance}}: model, engine version or draft length changed",
    }
    return _dashboard(
        s,
        "route",
        "specwatch / Route detail",
        "One route on its nodes: acceptance, per-position acceptance, draft length, batch vs "
        "crossover, canary probes and the GPUs it runs on. Model changes are annotations.",
        _layout(rows),
        annotations=[changes],
    )


# --------------------------------------------------------------------------- GPUs
def gpus(s: Settings) -> dict[str, Any]:
    def per_gpu(metric: str) -> list[tuple[str, str]]:
        return [(f"{metric}{{{NODE}}}", "{{instance}} gpu {{gpu}}")]

    rows = [
        [
            (
                _stat(
                    "GPUs answering NVML",
                    "GPUs whose last NVML query succeeded.",
                    f"sum(specwatch_gpu_up{{{NODE}}}) or vector(0)",
                ),
                8,
                4,
            ),
            (
                _stat(
                    "GPUs lost",
                    "GPUs that stopped answering NVML.",
                    f"count(specwatch_gpu_up{{{NODE}}} == 0) or vector(0)",
                    thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}],
                ),
                8,
                4,
            ),
            (
                _stat(
                    "Nodes without NVML",
                    "specwatch instances where NVML did not load or answer.",
                    f"count(specwatch_nvml_up{{{NODE}}} == 0) or vector(0)",
                ),
                8,
                4,
            ),
        ],
        [
            (
                _timeseries(
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
                _timeseries(
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
                _timeseries(
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
                _timeseries(
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
                _timeseries(
                    "Memory used",
                    "GPU memory in use against installed memory.",
                    [
                        (f"specwatch_gpu_memory_used_bytes{{{NODE}}}", "{{instance}} gpu {{gpu}} used"),
                        (f"specwatch_gpu_memory_total_bytes{{{NODE}}}", "{{instance}} gpu {{gpu}} total"),
                    ],
                    "bytes",
                    minimum=0,
                ),
                8,
                8,
            ),
            (
                _timeseries(
                    "Power",
                    "Power draw against the enforced limit.",
                    [
                        (f"specwatch_gpu_power_watts{{{NODE}}}", "{{instance}} gpu {{gpu}} draw"),
                        (f"specwatch_gpu_power_limit_watts{{{NODE}}}", "{{instance}} gpu {{gpu}} limit"),
                    ],
                    "watt",
                    minimum=0,
                ),
                8,
                8,
            ),
            (
                _timeseries(
                    "Temperature and SM clock",
                    "Die temperature and SM clock: a falling clock at steady load means throttling.",
                    [
                        (f"specwatch_gpu_temperature_celsius{{{NODE}}}", "{{instance}} gpu {{gpu}} temperature"),
                        (f"specwatch_gpu_sm_clock_hertz{{{NODE}}}", "{{instance}} gpu {{gpu}} SM clock"),
                    ],
                    "celsius",
                    overrides=[_right_axis(".* SM clock", "hertz")],
                ),
                8,
                8,
            ),
        ],
        [
            (
                _timeseries(
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
                _timeseries(
                    "ECC errors",
                    "Corrected and uncorrected ECC errors per second.",
                    [
                        (
                            f"rate(specwatch_gpu_ecc_corrected_errors_total{{{NODE}}}[$__rate_interval])",
                            "{{instance}} gpu {{gpu}} corrected",
                        ),
                        (
                            f"rate(specwatch_gpu_ecc_uncorrected_errors_total{{{NODE}}}[$__rate_interval])",
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
                _table(
                    "GPUs and routes",
                    "Every GPU and the routes that run on it.",
                    [(f"specwatch_gpu_info{{{NODE}}}", "info"), (f"specwatch_route_gpu_info{{{ROUTE}}}", "route")],
                    {},
                ),
                FULL_WIDTH,
                8,
            )
        ],
    ]
    return _dashboard(
        s, "gpus", "specwatch / GPUs", "NVML and Hopper GPM readings of every GPU specwatch watches.", _layout(rows)
    )


def all_dashboards(s: Settings) -> dict[str, dict[str, Any]]:
    """File stem -> dashboard JSON."""
    return {"specwatch-fleet": fleet_overview(s), "specwatch-route": route_detail(s), "specwatch-gpus": gpus(s)}


def iter_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) for every panel target and annotation of a rendered dashboard."""
    for panel in dashboard.get("panels", []):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if annotation.get("expr"):
            yield f"annotation {annotation['name']}", annotation["expr"]
