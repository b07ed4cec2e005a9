"""The README stays true: its metric reference is the catalog's, and its two commands exist and are wired to CI."""

from __future__ import annotations

import re
from pathlib import Path

from specwatch.mixin.readme import embed

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_metric_reference_matches_catalog():
    assert embed(README) == README, "README metric table is stale: run tools/metrics_reference.py --write"


def test_readme_commands_exist_and_ci_runs_the_test_command():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "scripts/test.sh" in README and "scripts/test.sh" in ci
    assert "scripts/demo.sh" in README
    for script in ("scripts/test.sh", "scripts/demo.sh", "scripts/bootstrap.sh"):
        assert (ROOT / script).exists()


def test_every_documented_flag_is_a_real_cli_flag():
    from specwatch.cli import build_parser

    help_texts = []
    parser = build_parser()
    for action in parser._subparsers._group_actions:  # the subcommand table
        for sub in action.choices.values():
            help_texts.append(sub.format_help())
    known = " ".join(help_texts)
    for flag in set(re.findall(r"(--(?:config|web)\.[a-z-]+(?:\.[a-z-]+)?)", README)):
        assert flag in known, f"README mentions {flag}, which no command accepts"


def test_alert_table_lists_every_alert_with_the_severity_the_rules_give():
    from specwatch.mixin import alerts
    from specwatch.mixin.settings import DEFAULT

    table = README[README.index("<!-- alerts-reference:begin -->") : README.index("<!-- alerts-reference:end -->")]
    for group in alerts.alert_groups(DEFAULT):
        for a in group["rules"]:
            row = next(line for line in table.splitlines() if f"[`{a['alert']}`]" in line)
            assert f"| {a['labels']['severity']} |" in row, row
