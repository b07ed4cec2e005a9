"""Fleet overview: every route, judged across the selected nodes.

The panels compute the fleet rules' formulas (rules.py: ratios of summed rates, never averages of ratios) from
the selected nodes' raw series, since the recorded series are summed over every node. A route links to its
Route detail with the same selection.
"""

from __future__ import annotations

from typing import Any

from specwatch.mixin.dashboards.panels import (
    FULL_WIDTH,
    Selectors,
    dashboard,
    dashed,
    layout,
    route_link,
    selectors,
    stat,
    table,
    timeseries,
)
from specwatch.mixin.settings import Settings


def _sum_rate(sel: Selectors, metric: str, w: str) -> str:
    return f"sum by (route) (rate({metric}{{{sel.route}}}[{w}]))"


def fleet_acceptance(sel: Selectors, w: str) -> str:
    """Accepted over drafted tokens of each route, summed over the selected nodes (rules.ACCEPTANCE's formula)."""
    accepted = _sum_rate(sel, "specwatch_route_accepted_tokens_total", w)
    drafted = _sum_rate(sel, "specwatch_route_draft_tokens_total", w)
    return f"{accepted}\n/ ({drafted} > 0)"


def fleet_baseline(sel: Selectors) -> str:
    return f"avg by (route) (specwatch_route_acceptance_baseline_ratio{{{sel.route}}})"


def fleet_drop(sel: Selectors, w: str) -> str:
    return f"1 - (\n{fleet_acceptance(sel, w)}\n) / {fleet_baseline(sel)}"


def _fleet(sel: Selectors, aggregation: str, metric: str) -> str:
    return f"{aggregation} by (route) ({metric}{{{sel.route}}})"


def fleet_overview(s: Settings) -> dict[str, Any]:
    short, long_ = s.fleet_windows[0], s.fleet_windows[-1]
    sel = selectors(s)
    acceptance = fleet_acceptance(sel, short)
    acceptance_long = fleet_acceptance(sel, long_)
    baseline = fleet_baseline(sel)
    drop_long = fleet_drop(sel, long_)
    link = route_link(s, "${__field.labels.route}")
    red_at: list[dict[str, Any]] = [{"color": "green", "value": None}, {"color": "red", "value": 1}]
    rows = [
        [
            (
                stat(
                    "Routes",
                    "Routes served by at least one node.",
                    f"count(count by (route) (specwatch_route_info{{{sel.route}}})) or vector(0)",
                ),
                6,
                4,
            ),
            (
                stat(
                    "Routes degraded",
                    "Routes where at least one node's detector says acceptance dropped.",
                    f"count(max by (route) (specwatch_route_acceptance_degraded{{{sel.route}}}) == 1) or vector(0)",
                    thresholds=red_at,
                ),
                6,
                4,
            ),
            (
                stat(
                    "Routes above crossover",
                    "Routes where at least one node batches above its crossover.",
                    f"count(max by (route) (specwatch_route_above_crossover{{{sel.route}}}) == 1) or vector(0)",
                    thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 1}],
                ),
                6,
                4,
            ),
            (
                stat(
                    "Engine endpoints down",
                    "Route endpoints specwatch cannot scrape, over the selected nodes.",
                    f"count(specwatch_route_up{{{sel.route}}} == 0) or vector(0)",
                    thresholds=red_at,
                ),
                6,
                4,
            ),
        ],
        [
            (
                table(
                    "Routes",
                    "Fleet view of every route (click a route for its detail): acceptance over "
                    f"{long_} summed over the selected nodes, its pinned baseline and drop, and how many nodes "
                    "are up, degraded or above the crossover.",
                    [
                        (acceptance_long, f"Acceptance {long_}"),
                        (baseline, "Baseline"),
                        (drop_long, f"Drop {long_}"),
                        (_fleet(sel, "sum", "specwatch_route_up"), "Nodes up"),
                        (_fleet(sel, "sum", "specwatch_route_acceptance_degraded"), "Nodes degraded"),
                        (_fleet(sel, "sum", "specwatch_route_above_crossover"), "Nodes above crossover"),
                        (_fleet(sel, "max", "specwatch_route_batch_size"), "Max batch"),
                        (_fleet(sel, "min", "specwatch_route_crossover_batch_size"), "Crossover"),
                    ],
                    {"route": "Route"},
                    column_links={"Route": route_link(s, "${__value.raw}")},
                ),
                FULL_WIDTH,
                8,
            )
        ],
        [
            (
                timeseries(
                    "Acceptance vs baseline",
                    f"Draft-token acceptance over {short}, summed over the route's "
                    "nodes (solid), and its pinned baseline (dashed).",
                    [(acceptance, "{{route}}"), (baseline, "{{route}} baseline")],
                    "percentunit",
                    overrides=[dashed(".* baseline")],
                    minimum=0,
                    links=link,
                ),
                12,
                9,
            ),
            (
                timeseries(
                    "Acceptance drop",
                    f"1 - acceptance / baseline over {long_} and {short}; the detector "
                    f"alarms near the red line (the default drop, {s.default_drop:.0%}; a route may set its own).",
                    [
                        (drop_long, "{{route}} " + long_),
                        (fleet_drop(sel, short), "{{route}} " + short),
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
                timeseries(
                    "Batch vs crossover",
                    "Largest per-engine batch of the route over its nodes, and the "
                    "lowest crossover: above it speculation costs throughput.",
                    [
                        (_fleet(sel, "max", "specwatch_route_batch_size"), "{{route}} batch"),
                        (_fleet(sel, "min", "specwatch_route_crossover_batch_size"), "{{route}} crossover"),
                    ],
                    "none",
                    minimum=0,
                    links=link,
                ),
                12,
                9,
            ),
            (
                timeseries(
                    "Nodes above crossover",
                    "Nodes of each route whose batch runs above the crossover (with hysteresis).",
                    [(_fleet(sel, "sum", "specwatch_route_above_crossover"), "{{route}}")],
                    "none",
                    minimum=0,
                    links=link,
                ),
                12,
                9,
            ),
        ],
    ]
    return dashboard(
        s,
        "fleet",
        "specwatch / Fleet overview",
        "Speculative decoding on every route, judged across all nodes that serve it.",
        layout(rows),
    )
