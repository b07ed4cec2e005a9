"""Rules and dashboards shaped by the site: `specwatch generate --selector 'env="prod"' --label team=infer`
reaches every dashboard query, template variable and alert, and the shipped promtool tests pass on it
(`specwatch generate --test`)."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from specwatch.cli import main as cli_main
from specwatch.mixin import render, sitetests
from specwatch.mixin.dashboards import iter_queries, iter_variable_queries
from specwatch.mixin.settings import DEFAULT

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (scripts/ensure_prometheus.sh)")
SITE = ["--selector", 'env="prod"', "--label", "team=infer"]


@pytest.fixture(scope="module")
def site_out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    assert cli_main(["generate", "--out-dir", str(out), *SITE]) == 0
    return out


def test_every_dashboard_query_and_variable_carries_the_site_selector(site_out):
    boards = sorted((site_out / render.DASHBOARD_DIR).glob("*.json"))
    assert len(boards) == 3
    for path in boards:
        board = json.loads(path.read_text())
        queries = [*iter_queries(board), *iter_variable_queries(board)]
        assert len(queries) > 5, path.name
        for where, expr in queries:
            selectors = re.findall(r"\bspecwatch_\w+\{([^}]*)\}", expr)
            assert selectors, (path.name, where, expr)
            for selector in selectors:
                assert 'env="prod"' in selector, (path.name, where, expr)


def test_every_alert_carries_the_site_label_and_every_rule_the_selector(site_out):
    groups = yaml.safe_load((site_out / render.RULES_PATH).read_text())["groups"]
    rules = [r for g in groups for r in g["rules"]]
    alerts = [r for r in rules if "alert" in r]
    assert len(alerts) == 14
    for alert in alerts:
        assert alert["labels"]["team"] == "infer", alert["alert"]
    for rule in rules:
        for selector in re.findall(r"\b(?:specwatch_\w+|up)\{([^}]*)\}", rule["expr"]):
            assert 'env="prod"' in selector, (rule.get("alert") or rule["record"], rule["expr"])


def test_labels_must_be_label_names_and_not_the_alerts_own(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        cli_main(["generate", "--out-dir", str(tmp_path), "--label", "team"])
    assert exit_.value.code == 2
    assert "not a label like team=infer" in capsys.readouterr().err
    assert cli_main(["generate", "--out-dir", str(tmp_path), "--label", "severity=page"]) == 2
    assert "'severity' is set by the alerts themselves" in capsys.readouterr().err


def test_a_settings_file_takes_labels_as_a_mapping(tmp_path):
    settings = tmp_path / "site.yml"
    settings.write_text("alert_labels: {team: infer, env: prod}\nseverity_canary: critical\n")
    assert cli_main(["generate", "--out-dir", str(tmp_path), "--settings", str(settings)]) == 0
    groups = yaml.safe_load((tmp_path / render.RULES_PATH).read_text())["groups"]
    by_name = {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}
    assert by_name["SpecwatchStale"]["labels"] == {"severity": "warning", "team": "infer", "env": "prod"}
    assert by_name["SpecwatchCanaryAcceptanceDropped"]["labels"]["severity"] == "critical"
    assert by_name["SpecwatchAcceptanceDegraded"]["labels"]["severity"] == "warning"


def test_a_regex_selector_cannot_be_tested_and_says_why(capsys):
    assert cli_main(["generate", "--test", "--selector", 'job=~"gpu.*"']) == 2
    assert 'job=~"gpu.*" matches no single value' in capsys.readouterr().err


def test_the_moved_tests_carry_the_site_labels_and_leave_other_jobs_alone():
    site = dataclasses.replace(DEFAULT, selector='job="gpu-nodes",env="prod"', alert_labels=(("team", "infer"),))
    doc = yaml.safe_load((sitetests.TESTS_DIR / "fleet_rules_test.yaml").read_text())
    moved = sitetests.adapt(doc, site, Path("/site/rules.yaml"))
    series = [s["series"] for t in moved["tests"] for s in t["input_series"]]
    assert any(s.startswith('specwatch_route_batch_size{job="other"') for s in series)
    assert all('env="prod"' in s and 'job="gpu-nodes"' in s for s in series if 'job="other"' not in s)
    assert moved["rule_files"] == ["/site/rules.yaml"]


@pytest.mark.slow
@needs_promtool
def test_the_shipped_promtool_tests_pass_on_the_site_rules(capsys, tmp_path):
    assert cli_main(["generate", "--test", *SITE, "--severity.drop=critical"]) == 0
    assert "promtool test rules: passed" in capsys.readouterr().out
    # Another job, runbook and Grafana address, and a severity of its own: the annotations move too.
    site = dataclasses.replace(
        DEFAULT,
        selector='job="gpu-nodes",env="prod"',
        alert_labels=(("team", "infer"), ("tier", "a")),
        dashboard_url="https://grafana.example",
        runbook_url="https://wiki.example/specwatch",
        severity_model_change="critical",
    )
    result = sitetests.run(site, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
@needs_promtool
def test_the_moved_tests_fail_on_rules_of_other_settings(tmp_path):
    """Not vacuous: tests moved to the site fail on the default rules (another selector, no team label)."""
    site = dataclasses.replace(DEFAULT, selector='job="gpu-nodes",env="prod"', alert_labels=(("team", "infer"),))
    assert sitetests.run(site, tmp_path).returncode == 0
    default_rules = tmp_path / "specwatch-rules.yaml"
    default_rules.write_text(render.to_yaml(render.rules_document(DEFAULT)))
    tests = sorted(str(p) for p in tmp_path.glob("*_test.yaml"))
    result = subprocess.run([PROMTOOL or "promtool", "test", "rules", *tests], capture_output=True, text=True)
    assert result.returncode != 0
