"""The generated dashboards against Grafana's own dashboard schema: npm `@grafana/schema`'s `Dashboard` type as
JSON Schema (tests/schemas/grafana-dashboard.schema.json, made by tools/grafana_schema.sh; its `x-provenance`
names the package versions and the command). No Grafana server installs from the package indexes; this is the
closest check to a real import."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from specwatch.mixin import dashboards
from specwatch.mixin.render import dashboard_json
from specwatch.mixin.settings import DEFAULT

SCHEMA_PATH = Path(__file__).parent / "schemas" / "grafana-dashboard.schema.json"
REPO = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


def errors(schema: dict, board: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in validator.iter_errors(board)]


def test_the_schema_is_grafanas_pinned_one_with_one_named_relaxation(schema):
    provenance = schema["x-provenance"]
    assert provenance["packages"]["@grafana/schema"] == "13.2.3"
    assert provenance["relaxed_definitions"] == ["AnnotationQuery"]
    relaxed = [name for name, d in schema["definitions"].items() if d.get("additionalProperties") is True]
    assert relaxed == provenance["relaxed_definitions"]
    jsonschema.Draft7Validator.check_schema(schema)


@pytest.mark.parametrize("name", ["specwatch-fleet", "specwatch-route", "specwatch-gpus"])
def test_every_committed_dashboard_passes_grafanas_schema(schema, name):
    board = json.loads((REPO / "dashboards" / f"{name}.json").read_text())
    assert errors(schema, board) == []
    assert board["schemaVersion"] == schema["x-provenance"]["schemaVersion"], "Grafana would migrate it on import"


def test_generated_dashboards_pass_it_for_any_settings(schema):
    from dataclasses import replace

    site = replace(DEFAULT, selector='job="specwatch",env="prod"', dashboard_uid_prefix="site")
    for name, board in dashboards.all_dashboards(site).items():
        assert errors(schema, json.loads(dashboard_json(board))) == [], name


def test_the_schema_catches_what_grafanalib_writes(schema):
    """The check has teeth: grafanalib's own output (legacy keys, nulls, data sources by name) fails it."""
    from grafanalib import core as g

    legacy = g.Dashboard(title="t", panels=[g.TimeSeries(title="p", dataSource="${datasource}")]).to_json_data()
    found = errors(schema, json.loads(json.dumps(legacy, default=lambda o: o.to_json_data())))
    assert any("__inputs" in e for e in found) and any("null" in e or "None" in e for e in found)
