"""The generated alerts, rules and dashboards: committed output is current, names exist, conventions hold, and
promtool / amtool accept and test them (skipped, with the reason, only where those binaries are missing)."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from specwatch import catalog
from specwatch.cli import main as cli_main
from specwatch.mixin import alerts, dashboards, render, rules, sitetests
from specwatch.mixin.dashboards import fleet as fleet_dashboard
from specwatch.mixin.dashboards.panels import selectors
from specwatch.mixin.settings import ALERT_CLASSES, DEFAULT

REPO = Path(__file__).resolve().parents[1]
RUNBOOK = REPO / "docs" / "runbook.md"
PROMTOOL = shutil.which("promtool")
AMTOOL = shutil.which("amtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (scripts/ensure_prometheus.sh)")
needs_amtool = pytest.mark.skipif(AMTOOL is None, reason="amtool not installed (scripts/ensure_prometheus.sh)")


@pytest.fixture(scope="module")
def files() -> dict[str, str]:
    return render.render_all(DEFAULT)


@pytest.fixture(scope="module")
def rule_groups(files) -> list[dict]:
    return yaml.safe_load(files[render.RULES_PATH])["groups"]


def all_alerts(groups: list[dict]) -> list[dict]:
    return [r for g in groups for r in g["rules"] if "alert" in r]


# --------------------------------------------------------------------------- generation
def test_committed_files_are_current():
    assert cli_main(["generate", "--out-dir", str(REPO), "--check"]) == 0


def test_render_is_deterministic(files):
    assert render.render_all(DEFAULT) == files


def test_generate_writes_then_check_catches_edits_and_leftovers(tmp_path, capsys):
    assert cli_main(["generate", "--out-dir", str(tmp_path)]) == 0
    assert cli_main(["generate", "--out-dir", str(tmp_path), "--check"]) == 0
    rules_file = tmp_path / render.RULES_PATH
    rules_file.write_text(rules_file.read_text() + "# hand edit\n")
    (tmp_path / "dashboards" / "old.json").write_text("{}")
    (tmp_path / render.ALERTMANAGER_PATH).unlink()
    capsys.readouterr()
    assert cli_main(["generate", "--out-dir", str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert f"{render.RULES_PATH}: differs" in err
    assert "dashboards/old.json: not generated" in err
    assert f"{render.ALERTMANAGER_PATH}: missing" in err
    # A second plain run rewrites only what changed.
    assert render.write(tmp_path, render.render_all(DEFAULT)) == [render.ALERTMANAGER_PATH, render.RULES_PATH]


# --------------------------------------------------------------------------- names
def test_every_referenced_metric_is_in_the_catalog(files):
    assert render.unknown_names(files) == []
    used: set[str] = set()
    for text in files.values():
        used |= render.referenced_names(text)[1]
    # Not vacuous: the checks below would catch a typo such as specwatch_route_acceptance_ratios.
    assert {"specwatch_route_acceptance_degraded", "specwatch_gpu_tensor_active_ratio"} <= used
    assert render.unknown_names({"x": "rate(specwatch_route_acceptance_ratios[5m])"}) == [
        "x: specwatch_route_acceptance_ratios is not in specwatch/catalog.py"
    ]
    assert render.unknown_names({"x": "route:specwatch_nope:rate5m"}) == [
        "x: route:specwatch_nope:rate5m is not a recording rule"
    ]


def test_render_refuses_a_metric_missing_from_the_catalog(monkeypatch):
    monkeypatch.delitem(catalog.BY_NAME, "specwatch_route_above_crossover")
    with pytest.raises(ValueError, match="specwatch_route_above_crossover is not in specwatch/catalog.py"):
        render.render_all(DEFAULT)


def test_recording_rules_follow_level_metric_operations(rule_groups):
    records = [r["record"] for g in rule_groups for r in g["rules"] if "record" in r]
    assert len(records) == len(set(records))
    for name in records:
        assert re.fullmatch(r"route:specwatch_[a-z_]+:[a-z0-9_]+", name), name
        assert not name.split(":")[1].endswith("_total"), f"{name}: drop _total after rate()"
    for template in (rules.ACCEPTANCE, rules.ACCEPTANCE_DROP, rules.MEAN_ACCEPTANCE_LENGTH):
        assert {template.format(w=w) for w in DEFAULT.fleet_windows} <= set(records)


# --------------------------------------------------------------------------- alerts
def test_alerts_follow_the_conventions(rule_groups):
    found = all_alerts(rule_groups)
    assert len(found) >= 10
    runbook_headings = set(re.findall(r"^## (\w+)$", RUNBOOK.read_text(), flags=re.M))
    for a in found:
        name = a["alert"]
        assert re.fullmatch(r"Specwatch[A-Z][A-Za-z]+", name), name
        assert a["labels"]["severity"] in ("critical", "warning"), name
        assert re.fullmatch(r"\d+[smh]", a["for"]), f"{name}: explicit for"
        annotations = a["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, name  # no dashboard_url by default
        assert "{{" not in annotations["summary"], f"{name}: summary is static"
        assert "{{ $labels.instance }}" in annotations["description"], f"{name}: description is templated"
        assert annotations["runbook_url"] == f"{DEFAULT.runbook_url}#{name.lower()}"
        assert name in runbook_headings, f"docs/runbook.md lacks '## {name}'"


def test_nothing_pages_by_default_and_each_kind_of_drop_pages_on_its_own_setting(rule_groups):
    assert {a["labels"]["severity"] for a in all_alerts(rule_groups)} == {"warning"}
    for setting, alert in (
        ("severity_drop", "SpecwatchAcceptanceDegraded"),
        ("severity_model_change", "SpecwatchAcceptanceDegradedAfterModelChange"),
        ("severity_canary", "SpecwatchCanaryAcceptanceDropped"),
        ("severity_crossover", "SpecwatchRouteAboveCrossover"),
    ):
        paging = dataclasses.replace(DEFAULT, **{setting: "critical"})
        pages = {a["alert"] for a in all_alerts(alerts.alert_groups(paging)) if a["labels"]["severity"] == "critical"}
        assert alert in pages and not pages & {
            "SpecwatchAcceptanceDegraded",
            "SpecwatchCanaryAcceptanceDropped",
            "SpecwatchAcceptanceDegradedAfterModelChange",
        } - {alert}, setting
    names = {a["alert"] for a in all_alerts(rule_groups)}
    assert {
        "SpecwatchRouteAboveCrossover",
        "SpecwatchSourceDown",
        "SpecwatchTargetDown",
        "SpecwatchStale",
        "SpecwatchGpuLost",
        "SpecwatchGpuThrottling",
        "SpecwatchStateStoreErrors",
    } <= names


def test_every_alert_class_has_its_own_severity_setting():
    for cls in ALERT_CLASSES:
        shaped = dataclasses.replace(DEFAULT, **{f"severity_{cls}": "critical"})
        critical = [a for a in all_alerts(alerts.alert_groups(shaped)) if a["labels"]["severity"] == "critical"]
        assert critical, cls
    with pytest.raises(ValueError, match="severity_drop: 'page' is not one of critical, warning, info"):
        dataclasses.replace(DEFAULT, severity_drop="page")


def test_generate_flags_shape_selector_runbook_severity_interval_and_dashboard_links(tmp_path):
    argv = [
        "generate",
        "--out-dir",
        str(tmp_path),
        "--selector",
        'job="gpu-nodes"',
        "--runbook-url",
        "https://wiki.example/specwatch",
        "--severity.drop=critical",
        "--interval",
        "15s",
        "--dashboard-url",
        "https://grafana.example/",
    ]
    assert cli_main(argv) == 0
    text = (tmp_path / render.RULES_PATH).read_text()
    assert 'job="specwatch"' not in text and 'up{job="gpu-nodes"} == 0' in text
    by_name = {a["alert"]: a for a in all_alerts(yaml.safe_load(text)["groups"])}
    degraded = by_name["SpecwatchAcceptanceDegraded"]
    assert degraded["labels"]["severity"] == "critical"
    assert degraded["annotations"]["runbook_url"] == "https://wiki.example/specwatch#specwatchacceptancedegraded"
    assert degraded["annotations"]["dashboard_url"] == (
        "https://grafana.example/d/specwatch-route?var-job={{ $labels.job | urlquery }}"
        "&var-instance={{ $labels.instance | urlquery }}&var-route={{ $labels.route | urlquery }}"
    )
    assert by_name["SpecwatchGpuLost"]["annotations"]["dashboard_url"].startswith(
        "https://grafana.example/d/specwatch-gpus?"
    )
    assert "var-route" not in by_name["SpecwatchStale"]["annotations"]["dashboard_url"]
    # Three 15 s intervals, not three of the default 5 s.
    assert by_name["SpecwatchStale"]["expr"].endswith("\n> 45\n")
    assert "intervals of 15s" in by_name["SpecwatchStale"]["annotations"]["description"]
    assert by_name["SpecwatchRouteAboveCrossover"]["labels"]["severity"] == "warning"


def test_generate_reads_a_settings_file_and_flags_override_it(tmp_path, capsys):
    settings = tmp_path / "mixin.yml"
    settings.write_text('selector: job="llm"\nseverity_drop: critical\nevaluation_interval_seconds: 10s\n')
    out = tmp_path / "out"
    assert cli_main(["generate", "--out-dir", str(out), "--settings", str(settings), "--severity.drop", "info"]) == 0
    by_name = {a["alert"]: a for a in all_alerts(yaml.safe_load((out / render.RULES_PATH).read_text())["groups"])}
    assert by_name["SpecwatchTargetDown"]["expr"].startswith('up{job="llm"} == 0\n')
    assert by_name["SpecwatchAcceptanceDegraded"]["labels"]["severity"] == "info"
    assert by_name["SpecwatchStale"]["expr"].endswith("\n> 30\n")
    settings.write_text("selectr: x\nstale_intervals: many\n")
    assert cli_main(["generate", "--out-dir", str(out), "--settings", str(settings)]) == 2
    err = capsys.readouterr().err
    assert "selectr: unknown setting" in err and "stale_intervals: expected an integer" in err


def test_self_monitoring_expressions(rule_groups):
    by_name = {a["alert"]: a for a in all_alerts(rule_groups)}
    target_down = by_name["SpecwatchTargetDown"]["expr"]
    assert target_down.startswith('up{job="specwatch"} == 0\nand on(job, instance)\n')
    assert 'max_over_time(specwatch_build_info{job="specwatch"}[1d])' in target_down
    stale = by_name["SpecwatchStale"]["expr"]
    assert "specwatch_last_evaluation_timestamp_seconds" in stale
    assert f"> {DEFAULT.stale_intervals * DEFAULT.evaluation_interval_seconds:g}" in stale
    after_change = by_name["SpecwatchAcceptanceDegradedAfterModelChange"]["expr"]
    assert "specwatch_route_last_model_change_timestamp_seconds" in after_change
    assert "group_left(model_name, engine_version)" in after_change


def test_with_all_for_shortens_every_alert():
    groups = alerts.alert_groups(DEFAULT.with_all_for("2s"))
    assert {r["for"] for g in groups for r in g["rules"]} == {"2s"}
    assert {r.get("keep_firing_for") for g in groups for r in g["rules"]} == {"2s", None}


def test_every_alert_a_failed_scrape_would_resolve_keeps_firing(rule_groups):
    """Alerts on specwatch's gauges keep firing through a stale scrape; `up` and the increase() alerts need not."""
    keeps = {a["alert"]: a.get("keep_firing_for") for a in all_alerts(rule_groups)}
    assert {name for name, keep in keeps.items() if keep is None} == alerts.SURVIVES_A_FAILED_SCRAPE
    assert {keep for keep in keeps.values() if keep is not None} == {DEFAULT.keep_firing_for}
    # Long enough that a blind spell too short for TargetDown never resolves a page.
    assert DEFAULT.keep_firing_for == DEFAULT.target_down_for


def test_keep_firing_for_is_a_setting_and_0s_leaves_it_out(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli_main(["generate", "--out-dir", str(out), "--keep-firing-for", "0s"]) == 0
    text = (out / render.RULES_PATH).read_text()
    assert "keep_firing_for" not in text
    assert cli_main(["generate", "--out-dir", str(out), "--keep-firing-for", "10m"]) == 0
    by_name = {a["alert"]: a for a in all_alerts(yaml.safe_load((out / render.RULES_PATH).read_text())["groups"])}
    assert by_name["SpecwatchAcceptanceDegraded"]["keep_firing_for"] == "10m"
    assert cli_main(["generate", "--out-dir", str(out), "--keep-firing-for", "5 min"]) == 2
    assert "keep_firing_for: '5 min' is not a duration like 5m" in capsys.readouterr().err


def test_runbook_has_no_orphan_sections(rule_groups):
    headings = set(re.findall(r"^## (\w+)$", RUNBOOK.read_text(), flags=re.M))
    assert headings == {a["alert"] for a in all_alerts(rule_groups)}


# --------------------------------------------------------------------------- Alertmanager example
def test_alertmanager_example_routes_and_inhibits(files):
    am = yaml.safe_load(files[render.ALERTMANAGER_PATH])
    assert am["route"]["group_by"] == ["route"]
    self_route = next(r for r in am["route"]["routes"] if 'route=""' in r["matchers"])
    assert self_route["group_by"] == ["alertname", "job", "instance"]
    receivers = {r["name"] for r in am["receivers"]}
    assert {DEFAULT.page_receiver, DEFAULT.ticket_receiver} == receivers
    blind = am["inhibit_rules"][0]
    assert "SpecwatchTargetDown" in blind["source_matchers"][0] and "SpecwatchStale" in blind["source_matchers"][0]
    assert "SpecwatchAcceptanceDegraded" in blind["target_matchers"][0]
    assert blind["equal"] == ["job", "instance"]


@pytest.mark.slow
@needs_amtool
def test_amtool_accepts_the_example_and_routes_pages_and_tickets_apart():
    config = str(REPO / render.ALERTMANAGER_PATH)
    subprocess.run([AMTOOL, "check-config", config], check=True, capture_output=True)

    def receiver(*labels: str) -> str:
        out = subprocess.run(
            [AMTOOL, "config", "routes", "test", f"--config.file={config}", *labels],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return out.strip()

    assert receiver("alertname=SpecwatchAcceptanceDegraded", "severity=critical", "route=chat") == DEFAULT.page_receiver
    assert (
        receiver("alertname=SpecwatchRouteAboveCrossover", "severity=warning", "route=chat") == DEFAULT.ticket_receiver
    )
    assert (
        receiver("alertname=SpecwatchGpuLost", "severity=warning", "instance=node-1:9448", "gpu=1")
        == DEFAULT.ticket_receiver
    )


# --------------------------------------------------------------------------- dashboards
@pytest.fixture(scope="module")
def boards() -> dict[str, dict]:
    return dashboards.all_dashboards(DEFAULT)


def test_dashboards_have_variables_and_use_them(boards):
    assert set(boards) == {"specwatch-fleet", "specwatch-route", "specwatch-gpus"}
    assert len({b["uid"] for b in boards.values()}) == 3
    for name, board in boards.items():
        variables = [v["name"] for v in board["templating"]["list"]]
        assert variables == ["datasource", "job", "instance", "route"], name
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), name
        for panel in board["panels"]:
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, (name, panel["title"])
            assert panel.get("description"), (name, panel["title"])
            assert panel["targets"], (name, panel["title"])
        for title, expr in dashboards.iter_queries(board):
            # Raw specwatch series are filtered by job and instance; recorded fleet series by route.
            for selector in re.findall(r"\bspecwatch_\w+\{([^}]*)\}", expr):
                assert 'job=~"$job"' in selector and 'instance=~"$instance"' in selector, (name, title, expr)
            for selector in re.findall(r"\broute:specwatch_\w+:\w+(\{[^}]*\})?", expr):
                assert selector == '{route=~"$route"}', (name, title, expr)


def test_dashboards_cover_the_required_views(boards):
    def exprs(name: str) -> str:
        return "\n".join(e for _, e in dashboards.iter_queries(boards[name]))

    fleet, route, gpu = exprs("specwatch-fleet"), exprs("specwatch-route"), exprs("specwatch-gpus")
    sel = selectors(DEFAULT)
    for needed in (
        fleet_dashboard.fleet_acceptance(sel, "5m"),
        fleet_dashboard.fleet_baseline(sel),
        fleet_dashboard.fleet_drop(sel, "1h"),
        "sum by (route) (specwatch_route_above_crossover{",
        "max by (route) (specwatch_route_batch_size{",
        "min by (route) (specwatch_route_crossover_batch_size{",
    ):
        assert needed in fleet
    for needed in (
        "specwatch_route_acceptance_ratio",
        "specwatch_route_acceptance_baseline_ratio",
        "specwatch_route_position_acceptance_ratio",
        "specwatch_route_mean_acceptance_length",
        "rate(specwatch_route_drafts_total{",
        "specwatch_route_draft_length",
        "specwatch_route_batch_size",
        "specwatch_route_crossover_batch_size",
        "specwatch_route_predicted_speedup_ratio",
        "specwatch_gpu_tensor_active_ratio",
        "specwatch_gpu_dram_bandwidth_utilization_ratio",
        "specwatch_route_model_changes_total",
    ):
        assert needed in route
    assert "specwatch_gpu_up" in gpu and "specwatch_gpu_clock_throttle_reasons" in gpu


def test_the_route_dashboard_shows_the_flags_source_its_band_and_live_bins(boards):
    """What the flag judges against is on the route dashboard: the flag's batch labelled with its source (sweep,
    estimate, batch_size, live), the band of that same source (joined on the source label), and the batch bins
    live calibration has; the flag and band families both carry `source`, so the join can match."""
    panels = {p["title"]: p for p in boards["specwatch-route"]["panels"]}
    targets = {t["expr"]: t["legendFormat"] for t in panels["Batch vs crossover"]["targets"]}
    flag = "specwatch_route_crossover_flag_batch_size"
    assert "({{source}})" in next(legend for expr, legend in targets.items() if expr.startswith(flag))
    band = next(expr for expr in targets if expr.startswith("specwatch_route_crossover_band_batch_size"))
    assert f"and on (instance, route, source) {flag}" in band and "{{bound}}" in targets[band]
    assert "{{kernel}}" in targets[band]  # the kernel assumption is named with the band
    assert any(expr.startswith("specwatch_route_kv_capacity_batch_size") for expr in targets)
    assert any(expr.startswith("specwatch_route_crossover_live_bins") for expr in targets)
    stat = panels["Flag judges against"]
    assert stat["targets"][0]["expr"].startswith(flag) and "{{source}}" in stat["targets"][0]["legendFormat"]
    assert stat["options"]["textMode"] == "value_and_name"
    by_name = {m.name: m for m in catalog.METRICS}
    for name in (flag, "specwatch_route_crossover_band_batch_size"):
        assert "source" in by_name[name].labels
    assert "kernel" in by_name["specwatch_route_crossover_band_batch_size"].labels


def test_every_dashboard_query_honours_the_job_and_instance_variables(boards):
    """Recorded fleet series are summed over every node, so no panel may use them: a fleet panel would ignore
    the job and instance the viewer selected."""
    for name, board in boards.items():
        for title, expr in dashboards.iter_queries(board):
            assert not re.search(r"\broute:specwatch_", expr), (name, title, expr)
            assert 'job=~"$job"' in expr and 'instance=~"$instance"' in expr, (name, title, expr)


def test_the_fleet_view_links_each_route_to_its_route_dashboard(boards):
    fleet = boards["specwatch-fleet"]
    route_uid = boards["specwatch-route"]["uid"]
    table = next(p for p in fleet["panels"] if p["type"] == "table")
    (override,) = [o for o in table["fieldConfig"]["overrides"] if o["matcher"]["options"] == "Route"]
    (link,) = override["properties"][0]["value"]
    assert link["url"].startswith(f"/d/{route_uid}?var-route=${{__value.raw}}&")
    assert "${job:queryparam}" in link["url"] and "${instance:queryparam}" in link["url"]
    for panel in (p for p in fleet["panels"] if p["type"] == "timeseries"):
        (link,) = panel["fieldConfig"]["defaults"]["links"]
        assert link["url"].startswith(f"/d/{route_uid}?var-route=${{__field.labels.route}}&"), panel["title"]


def test_the_threshold_line_is_the_exported_per_route_threshold(boards):
    panel = next(p for p in boards["specwatch-route"]["panels"] if p["title"].startswith("Acceptance per window"))
    exprs = [t["expr"] for t in panel["targets"]]
    assert any(e.startswith("specwatch_route_acceptance_threshold_ratio{") for e in exprs)
    assert not any("*" in e for e in exprs), "no fixed multiple of the baseline"


def test_dashboard_panels_do_not_overlap(boards):
    for name, board in boards.items():
        cells: set[tuple[int, int]] = set()
        for panel in board["panels"]:
            pos = panel["gridPos"]
            assert pos["x"] + pos["w"] <= 24, (name, panel["title"])
            area = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
            assert not cells & area, (name, panel["title"])
            cells |= area


# --------------------------------------------------------------------------- module boundaries
def test_mixin_imports_only_the_catalog_the_config_defaults_and_itself():
    for path in sorted((REPO / "specwatch" / "mixin").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            for module in modules:
                if module == "specwatch":  # `from specwatch import catalog`
                    assert [a.name for a in node.names] == ["catalog"], path.name
                elif module.startswith("specwatch."):
                    assert module in ("specwatch.catalog", "specwatch.config_schema") or module.startswith(
                        "specwatch.mixin"
                    ), (path.name, module)
                if module.startswith("grafanalib"):
                    assert path.name == "panels.py", f"{path.name} imports grafanalib"


def test_config_schema_is_a_leaf_the_mixin_can_import_offline():
    tree = ast.parse((REPO / "specwatch" / "config_schema.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "math", "re", "dataclasses", "typing"}, imported


def test_settings_and_dashboard_texts_follow_the_config_defaults():
    from specwatch.config import Config, DetectionConfig

    assert DEFAULT.evaluation_interval_seconds == Config().interval_seconds
    assert DEFAULT.default_drop == DetectionConfig().drop
    assert DEFAULT.default_cusum_threshold == DetectionConfig().cusum_threshold
    texts = json.dumps(dashboards.route_detail(DEFAULT))
    assert f"threshold, {DetectionConfig().cusum_threshold:g} by default" in texts
    assert f"drop; {DetectionConfig().drop:g} by default" in texts
    assert f"the default drop, {DetectionConfig().drop:.0%}" in json.dumps(dashboards.fleet_overview(DEFAULT))


# --------------------------------------------------------------------------- promtool
@pytest.mark.slow
@needs_promtool
def test_promtool_check_rules():
    result = subprocess.run([PROMTOOL, "check", "rules", str(REPO / render.RULES_PATH)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
@needs_promtool
def test_promtool_rule_unit_tests():
    tests = sorted(str(p) for p in sitetests.TESTS_DIR.glob("*_test.yaml"))
    assert len(tests) >= 3
    result = subprocess.run([PROMTOOL, "test", "rules", *tests], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
