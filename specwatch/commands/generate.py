"""`specwatch generate [--out-dir DIR] [--check | --test] [--settings FILE] [--selector ...] [--label K=V] ...`:
write, or verify, the alert rules, the Alertmanager example and the Grafana dashboards rendered by
`specwatch.mixin`, shaped by the site's settings; `--test` runs the shipped promtool unit tests against the rules
generated for those settings instead. Runs offline: no config, NVML or network.

With no settings the output is the repository's committed alerts/ and dashboards/. A settings file holds
`specwatch/mixin/settings.py` field names as YAML keys; flags given on the command line override it."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from specwatch.config import ConfigError, read_yaml_file
from specwatch.config_schema import parse_duration
from specwatch.mixin import render, sitetests
from specwatch.mixin.alerts import CLASS_OF
from specwatch.mixin.settings import ALERT_CLASSES, DEFAULT, SEVERITIES, Settings, from_mapping


def _interval(text: str) -> float:
    seconds = parse_duration(text)
    if seconds is None or seconds <= 0:
        raise argparse.ArgumentTypeError(f"not a positive duration like 5s or 1m: {text!r}")
    return seconds


def _label(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", name):
        raise argparse.ArgumentTypeError(f"not a label like team=infer: {text!r}")
    return name, value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out-dir",
        default=".",
        type=Path,
        help="repository root to write alerts/ and dashboards/ under (default: current directory)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if any generated file is missing or differs (for CI)",
    )
    parser.add_argument(
        "--test",
        action="store_true",
        help="write nothing; run the shipped promtool unit tests against the rules these settings generate "
        "(needs promtool and an equality-only --selector)",
    )
    parser.add_argument(
        "--label",
        action="append",
        type=_label,
        metavar="NAME=VALUE",
        help="a label added to every alert (repeatable: --label team=infer --label env=prod)",
    )
    parser.add_argument(
        "--settings",
        metavar="FILE",
        help="YAML mapping of specwatch/mixin/settings.py fields (selector, runbook_url, severity_drop, ...)",
    )
    parser.add_argument(
        "--selector",
        help=f"PromQL matchers selecting specwatch's scrape targets, no braces (default {DEFAULT.selector})",
    )
    parser.add_argument(
        "--runbook-url",
        metavar="URL",
        help="base of every alert's runbook_url; `#<alertname>` is appended (default: the project's runbook)",
    )
    parser.add_argument(
        "--dashboard-url",
        metavar="URL",
        help="Grafana's base URL: adds a dashboard_url annotation to every alert (default: none)",
    )
    parser.add_argument(
        "--interval",
        type=_interval,
        metavar="DURATION",
        help="the daemons' evaluation interval (config `interval`), which the staleness alert is derived "
        f"from (default {DEFAULT.evaluation_interval_seconds:g}s)",
    )
    parser.add_argument(
        "--keep-firing-for",
        metavar="DURATION",
        help="how long an alert keeps firing once its expression stops returning, so one failed scrape does not "
        f"resolve it and page again (default {DEFAULT.keep_firing_for}; 0s leaves the field out, for Prometheus "
        "older than 2.42)",
    )
    for cls in ALERT_CLASSES:
        parser.add_argument(
            f"--severity.{cls}",
            dest=f"severity_{cls}",
            choices=SEVERITIES,
            help=f"severity of {', '.join(n.removeprefix('Specwatch') for n, c in CLASS_OF.items() if c == cls)} "
            f"(default {DEFAULT.severity(cls)}; critical pages)",
        )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The settings file (if any), then the flags given, over the defaults. ValueError on a bad file or value."""
    settings = DEFAULT
    if getattr(args, "settings", None):
        settings = from_mapping(read_yaml_file(args.settings))
    flags: dict[str, Any] = {
        "selector": args.selector,
        "runbook_url": args.runbook_url,
        "dashboard_url": args.dashboard_url,
        "evaluation_interval_seconds": args.interval,
        "keep_firing_for": args.keep_firing_for,
        **{f"severity_{cls}": getattr(args, f"severity_{cls}") for cls in ALERT_CLASSES},
        "alert_labels": tuple(args.label) if getattr(args, "label", None) else None,
    }
    return dataclasses.replace(settings, **{k: v for k, v in flags.items() if v is not None})


def main(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
    except (ValueError, ConfigError) as exc:
        print(f"specwatch generate: {args.settings or 'settings'}: {exc}", file=sys.stderr)
        return 2
    if args.test:
        return _test(settings)
    files = render.render_all(settings)
    out_dir: Path = args.out_dir
    if args.check:
        problems = render.check(out_dir, files)
        for problem in problems:
            print(f"specwatch generate --check: {problem}", file=sys.stderr)
        if problems:
            print("run `specwatch generate` and commit the result", file=sys.stderr)
            return 1
        print(f"{len(files)} generated file(s) up to date under {out_dir}")
        return 0
    changed = render.write(out_dir, files)
    for rel in changed:
        print(f"wrote {out_dir / rel}")
    print(f"{len(files)} file(s), {len(changed)} changed")
    return 0


def _test(settings: Settings) -> int:
    with tempfile.TemporaryDirectory(prefix="specwatch-rules-test-") as work:
        try:
            result = sitetests.run(settings, Path(work))
        except sitetests.SiteTestError as exc:
            print(f"specwatch generate --test: {exc}", file=sys.stderr)
            return 2
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    print(f"promtool test rules: {'passed' if result.returncode == 0 else 'FAILED'}")
    return 0 if result.returncode == 0 else 1
