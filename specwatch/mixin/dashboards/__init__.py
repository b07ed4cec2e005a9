"""Grafana dashboards as code, one module per dashboard, built from `panels.py`.

Fleet overview (`fleet.py`), Route detail (`route.py`) and GPUs (`gpus.py`) share the datasource, job,
instance and route variables and the site's selector (`Settings.selector`), and every query honours them.
`all_dashboards()` returns plain JSON-ready dicts; `render.py` serialises them.
"""

from __future__ import annotations

from typing import Any, Iterator

from specwatch.mixin.dashboards.fleet import fleet_overview
from specwatch.mixin.dashboards.gpus import gpus
from specwatch.mixin.dashboards.route import route_detail
from specwatch.mixin.settings import Settings


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


def iter_variable_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(variable name, query) for every query-type template variable."""
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            yield variable["name"], str(variable["query"])
