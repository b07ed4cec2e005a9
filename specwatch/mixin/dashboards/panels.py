"""What every dashboard is built from: selectors, panels, layout, variables, and the dashboard itself (grafanalib;
the only module that imports it).

1. `Selectors` puts the site's selector (`Settings.selector`) and the job, instance and route variables into
   every raw-series query and every template variable query.
2. `timeseries`, `stat` and `table` build panels; `dashed` and `right_axis` are their series overrides;
   `layout` places them.
3. `dashboard` assembles one and hands back plain JSON in the form Grafana's own schema (npm `@grafana/schema`,
   `tests/schemas/grafana-dashboard.schema.json`) accepts: grafanalib writes a 2017-era dashboard (schema
   version 12, `null` for every unset field, legacy row and style keys, data sources by name), which `modern`
   turns into today's (data source references, no nulls where a value is expected, schema version 42).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from grafanalib import core as g

from specwatch.mixin.settings import Settings

DATASOURCE_VARIABLE = "${datasource}"
DATASOURCE = {"type": "prometheus", "uid": DATASOURCE_VARIABLE}
FULL_WIDTH = 24
# The dashboard JSON version of the pinned @grafana/schema (its defaultDashboard.schemaVersion).
SCHEMA_VERSION = 42


@dataclass(frozen=True)
class Selectors:
    """Label matchers (no braces) of a site's specwatch series, with the dashboard's variables applied."""

    site: str  # Settings.selector, e.g. job="specwatch",env="prod"

    @property
    def node(self) -> str:
        """The selected nodes: the site's selector and the job and instance variables."""
        return f'{self.site},job=~"$job",instance=~"$instance"'

    @property
    def route(self) -> str:
        """The selected routes on the selected nodes."""
        return self.node + ',route=~"$route"'


def selectors(s: Settings) -> Selectors:
    return Selectors(s.selector)


def route_link(s: Settings, route: str) -> list[dict[str, Any]]:
    """A data link to the Route detail dashboard for `route` (a Grafana field or value macro), keeping the
    data source, job and instance selection and the time range."""
    url = (
        f"/d/{s.dashboard_uid_prefix}-route?var-route={route}"
        "&${datasource:queryparam}&${job:queryparam}&${instance:queryparam}&${__url_time_range}"
    )
    return [{"title": "Route detail for " + route, "url": url}]


def _target(expr: str, legend: str = "", ref: str = "A", instant: bool = False) -> g.Target:
    return g.Target(
        expr=expr, legendFormat=legend, refId=ref, instant=instant, format="table" if instant else "time_series"
    )


def _targets(*queries: tuple[str, str]) -> list[g.Target]:
    return [_target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(queries)]


def timeseries(
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
        dataSource=DATASOURCE_VARIABLE,
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


def stat(
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
        dataSource=DATASOURCE_VARIABLE,
        targets=_targets((expr, legend)),
        format=unit,
        reduceCalc="lastNotNull",
        graphMode="none",
        colorMode="background",
        textMode=text_mode,
        thresholds=thresholds or [{"color": "green", "value": None}],
    )


def table(
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
        dataSource=DATASOURCE_VARIABLE,
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


def dashed(name_regex: str, color: str = "") -> dict[str, Any]:
    """Draw the series whose display name matches as a dashed reference line."""
    properties: list[dict[str, Any]] = [{"id": "custom.lineStyle", "value": {"dash": [10, 10], "fill": "dash"}}]
    if color:
        properties.append({"id": "color", "value": {"mode": "fixed", "fixedColor": color}})
    return {"matcher": {"id": "byRegexp", "options": name_regex}, "properties": properties}


def right_axis(name_regex: str, unit: str) -> dict[str, Any]:
    """Plot the series whose display name matches on a right-hand axis of its own unit."""
    properties = [{"id": "custom.axisPlacement", "value": "right"}, {"id": "unit", "value": unit}]
    return {"matcher": {"id": "byRegexp", "options": name_regex}, "properties": properties}


Row = list[tuple[Any, int, int]]  # (panel, width, height), left to right


def layout(rows: list[Row]) -> list[Any]:
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


def _templating(sel: Selectors) -> g.Templating:
    def var(name: str, label: str, query: str) -> g.Template:
        return g.Template(
            name=name,
            label=label,
            dataSource=DATASOURCE_VARIABLE,
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
            var("job", "Job", f"label_values(specwatch_build_info{{{sel.site}}}, job)"),
            var("instance", "Instance", f'label_values(specwatch_build_info{{{sel.site},job=~"$job"}}, instance)'),
            var("route", "Route", f"label_values(specwatch_route_info{{{sel.node}}}, route)"),
        ]
    )


def dashboard(
    s: Settings,
    slug: str,
    title: str,
    description: str,
    panels: list[Any],
    annotations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    built = g.Dashboard(
        title=title,
        description=description,
        uid=f"{s.dashboard_uid_prefix}-{slug}",
        tags=list(s.dashboard_tags),
        timezone="utc",
        refresh=s.dashboard_refresh,
        time=g.Time("now-6h", "now"),
        graphTooltip=1,
        editable=False,
        templating=_templating(selectors(s)),
        panels=panels,
        annotations=g.Annotations(list=annotations or []),
    ).auto_panel_ids()
    # Through JSON once so the result is plain data: comparable, serialisable, free of grafanalib objects.
    return modern(json.loads(json.dumps(built.to_json_data(), default=_json_data)))


def _json_data(obj: Any) -> Any:
    """grafanalib objects nested in a dashboard, as their JSON data (what grafanalib's own encoder does)."""
    to_json_data = getattr(obj, "to_json_data", None)
    if to_json_data is None:
        raise TypeError(f"{type(obj).__name__} is not JSON serialisable")
    return to_json_data()


# Keys grafanalib writes that today's dashboard model does not have (rows before Grafana 5, the old dark/light
# style, export placeholders, per-panel spans and heights of the row layout, the old table panel's columns and
# font size, time picker presets).
_LEGACY = {
    "dashboard": ("__inputs", "hideControls", "rows", "sharedCrosshair", "style"),
    "panel": ("editable", "error", "height", "minSpan", "span", "columns", "fontSize"),
    "variable": ("auto", "auto_count", "auto_min", "tagValuesQuery", "tagsQuery", "useTags"),
    "timepicker": ("time_options",),
}


def modern(board: dict[str, Any]) -> dict[str, Any]:
    """grafanalib's dashboard JSON in today's model (see the module docstring)."""
    board = _without_nulls(board)
    for key in _LEGACY["dashboard"]:
        board.pop(key, None)
    board["schemaVersion"] = SCHEMA_VERSION
    for key in _LEGACY["timepicker"]:
        board.get("timepicker", {}).pop(key, None)
    for panel in board.get("panels", []):
        for key in _LEGACY["panel"]:
            panel.pop(key, None)
        for key in ("color", "mappings"):  # the old table panel's; field options now
            if key in panel:
                panel.setdefault("fieldConfig", {}).setdefault("defaults", {}).setdefault(key, panel.pop(key))
        panel["datasource"] = dict(DATASOURCE)
        for target in panel.get("targets", []):
            target["datasource"] = dict(DATASOURCE)
    for variable in board.get("templating", {}).get("list", []):
        for key in _LEGACY["variable"]:
            variable.pop(key, None)
        variable.get("current", {}).pop("tags", None)
        if variable.get("type") != "datasource":
            variable["datasource"] = dict(DATASOURCE)
    for annotation in board.get("annotations", {}).get("list", []):
        annotation["datasource"] = dict(DATASOURCE)
    return board


def _without_nulls(value: Any) -> Any:
    """`value` with every null dropped from objects, except a threshold step's (null there is -Infinity)."""
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    if isinstance(value, dict):
        is_step = set(value) == {"color", "value"}
        return {k: _without_nulls(v) for k, v in value.items() if v is not None or is_step}
    return value
