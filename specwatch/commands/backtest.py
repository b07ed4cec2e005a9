"""`specwatch backtest --prometheus URL --route R --start T --end T`: replay a route's history from Prometheus.

Pulls the route's cumulative counters with `query_range` and runs exactly what `specwatch replay` runs,
printing the same JSON transitions. The sources (`--source specwatch | vllm`) are in `offline/backtest.py`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys

from specwatch.commands.replay import load_optional_config
from specwatch.config import ConfigError, parse_duration
from specwatch.offline.backtest import BacktestError, PrometheusClient, samples
from specwatch.offline.replay import replay


def _time(text: str) -> float:
    """Unix seconds, RFC 3339 (2026-11-20T00:00:00Z) or now-DURATION (now-7d)."""
    if text.startswith("now"):
        back = parse_duration(text[4:]) if text.startswith("now-") else 0.0 if text == "now" else None
        if back is None:
            raise argparse.ArgumentTypeError(f"not a time like now-7d: {text!r}")
        return dt.datetime.now(dt.timezone.utc).timestamp() - back
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a unix time, RFC 3339 time or now-DURATION: {text!r}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.timezone.utc)
    return parsed.timestamp()


def _step(text: str) -> float:
    seconds = parse_duration(text)
    if seconds is None or seconds <= 0:
        raise argparse.ArgumentTypeError(f"not a duration like 15s: {text!r}")
    return seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prometheus", required=True, metavar="URL", help="Prometheus base URL, e.g. http://127.0.0.1:9090"
    )
    parser.add_argument("--route", required=True, help="route name (the `route` label; also the replay route)")
    parser.add_argument("--start", required=True, type=_time, help="unix time, RFC 3339 or now-7d")
    parser.add_argument("--end", required=True, type=_time, help="unix time, RFC 3339 or now")
    parser.add_argument("--step", type=_step, default=15.0, help="query resolution (default 15s)")
    parser.add_argument(
        "--source",
        choices=("specwatch", "vllm"),
        default="specwatch",
        help="which counters to pull (default specwatch's own)",
    )
    parser.add_argument("--selector", default="", help='label matchers for --source vllm, e.g. model_name="llama"')
    parser.add_argument(
        "--config.file", dest="config_file", default=None, help="config whose detection settings for the route apply"
    )


def main(args: argparse.Namespace) -> int:
    if args.end <= args.start:
        print("specwatch backtest: --end must be after --start", file=sys.stderr)
        return 2
    try:
        config = load_optional_config(args.config_file)
    except ConfigError as exc:
        print(f"specwatch backtest: {exc}", file=sys.stderr)
        return 2
    try:
        trace = list(
            samples(
                PrometheusClient(args.prometheus),
                args.route,
                args.start,
                args.end,
                args.step,
                args.source,
                args.selector,
            )
        )
    except BacktestError as exc:
        print(f"specwatch backtest: {exc}", file=sys.stderr)
        return 1
    print(f"specwatch backtest: {len(trace)} samples of route {args.route}", file=sys.stderr)
    for transition in replay(trace, config):
        sys.stdout.write(transition.to_json() + "\n")
    return 0
