"""The shipped promtool unit tests (`promtool_tests/*_test.yaml`, written for the default settings), moved to a
site's settings so `specwatch generate --test` runs them against the rules generated for that site.

1. `site_labels` reads the labels a site's test series must carry from its selector: equality matchers only
   (`job="gpu-nodes",env="prod"`); a regex or negative matcher has no single value to put on a series.
2. `adapt` moves one test file: every input series gets those labels; every expected alert gets them too (the
   alerts keep their series' labels, except those that aggregate to `node_labels`), the site's alert labels,
   its severity for the alert's class, and its runbook and dashboard addresses.
3. `run` writes the site's rules and the moved tests to a directory and runs `promtool test rules` on them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import yaml

from specwatch.mixin import alerts, render
from specwatch.mixin.settings import DEFAULT, Settings

TESTS_DIR = Path(__file__).parent / "promtool_tests"
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!=|!~|=)\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}$")


class SiteTestError(ValueError):
    pass


def site_labels(selector: str) -> dict[str, str]:
    """Label values of the selector's equality matchers; SiteTestError for anything else."""
    labels: dict[str, str] = {}
    rest = selector.strip()
    while rest:
        m = _MATCHER.match(rest)
        if m is None:
            raise SiteTestError(f"selector {selector!r}: cannot read the matcher at {rest!r}")
        name, op, value = m.group(1), m.group(2), m.group(3)
        if op != "=":
            raise SiteTestError(
                f'selector {selector!r}: {name}{op}"{value}" matches no single value to give the test series; '
                "run the tests with an equality selector of the same labels"
            )
        labels[name] = value
        rest = rest[m.end() :]
    return labels


def _series(text: str, default: dict[str, str], labels: dict[str, str]) -> str:
    """A test series moved to the site: one the default selector selects gets the site's labels; one it leaves
    out (another job, on purpose) stays as it is."""
    m = _SERIES.match(text.strip())
    if m is None:
        raise SiteTestError(f"cannot read the test series {text!r}")
    name, body = m.group(1), m.group(2)
    own = {k: v for k, _, v, _ in (mt.groups() for mt in _MATCHER.finditer(body))}
    if any(own.get(k) != v for k, v in default.items()):
        return text
    own.update(labels)
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in own.items()) + "}"


# Alerts whose result keeps only the labels they aggregate or join on (`sum by (job, instance)`, a one-to-one
# comparison `on(job, instance, route)`), not their series' other labels.
_JOIN_LABELS_ONLY = {"SpecwatchInternalErrors": False, "SpecwatchRouteUnderWatched": True}  # alert -> with route


def _expected_labels(s: Settings, alertname: str, given: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    kept = dict(labels)
    if alertname in _JOIN_LABELS_ONLY:
        keep = {*s.node_labels, *(["route"] if _JOIN_LABELS_ONLY[alertname] else [])}
        kept = {k: v for k, v in labels.items() if k in keep}
    return {**given, **kept, **dict(s.alert_labels), "severity": s.severity(alerts.CLASS_OF[alertname])}


def _dashboard_url(s: Settings, alertname: str, exp_labels: dict[str, Any]) -> str:
    route_alert = alertname in {a["alert"] for a in alerts.route_alerts(s)}
    slug = "route" if route_alert else ("gpus" if alertname.startswith("SpecwatchGpu") else "fleet")
    template = alerts.dashboard_link(s, slug, route_alert)
    return re.sub(
        r"\{\{ \$labels\.(\w+) \| urlquery \}\}", lambda m: quote_plus(str(exp_labels.get(m.group(1), ""))), template
    )


def adapt(doc: dict[str, Any], s: Settings, rules_path: Path) -> dict[str, Any]:
    """One shipped test file, moved to settings `s` and pointed at `rules_path`."""
    labels, default = site_labels(s.selector), site_labels(DEFAULT.selector)
    doc = {**doc, "rule_files": [str(rules_path)]}
    for test in doc.get("tests", []):
        for series in test.get("input_series", []):
            series["series"] = _series(series["series"], default, labels)
        for case in test.get("alert_rule_test", []):
            name = case["alertname"]
            for alert in case.get("exp_alerts", []) or []:
                alert["exp_labels"] = _expected_labels(s, name, alert.get("exp_labels", {}), labels)
                annotations = alert.get("exp_annotations")
                if annotations is None:
                    continue
                if "runbook_url" in annotations:
                    annotations["runbook_url"] = f"{s.runbook_url}#{alerts.runbook_anchor(name)}"
                if s.dashboard_url:
                    annotations["dashboard_url"] = _dashboard_url(s, name, alert["exp_labels"])
    return doc


def run(s: Settings, work_dir: Path, promtool: str | None = None) -> subprocess.CompletedProcess[str]:
    """Write the site's rules and the moved tests under `work_dir`, then run `promtool test rules` on them."""
    binary = promtool or shutil.which("promtool")
    if binary is None:
        raise SiteTestError("promtool is not on PATH (it ships with Prometheus)")
    rules_path = work_dir / "specwatch-rules.yaml"
    rules_path.write_text(render.to_yaml(render.rules_document(s)), encoding="utf-8")
    tests = []
    for path in sorted(TESTS_DIR.glob("*_test.yaml")):
        moved = work_dir / path.name
        moved.write_text(yaml.safe_dump(adapt(yaml.safe_load(path.read_text()), s, rules_path), sort_keys=False))
        tests.append(str(moved))
    return subprocess.run([binary, "test", "rules", *tests], capture_output=True, text=True, timeout=300)
