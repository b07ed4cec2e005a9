"""`specwatch replay TRACE.jsonl [--config.file F]`: run the acceptance-drop pipeline offline at full speed.

Prints one JSON object per alert transition to stdout, with the detector's predicted horizon then
(`predicted_horizon_seconds`: the daemon's `specwatch_route_detection_horizon_seconds`), and at the end one
per route (`"state": "end"`) with its last state and predicted horizon. Exit status: 0 done, 1 bad trace line,
2 bad config.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext

from specwatch.config import Config, ConfigError, load_config
from specwatch.offline.replay import Replayer, TraceError, read_trace


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "trace", metavar="TRACE.jsonl", help="trace of cumulative counters, one scrape per line ('-' for stdin)"
    )
    parser.add_argument(
        "--config.file",
        dest="config_file",
        default=None,
        help="config whose routes' detection settings and pinned baselines apply "
        "(default: built-in defaults for every route)",
    )


def load_optional_config(path: str | None) -> Config:
    return load_config(path) if path else Config()


def main(args: argparse.Namespace) -> int:
    try:
        config = load_optional_config(args.config_file)
    except ConfigError as exc:
        print(f"specwatch replay: {exc}", file=sys.stderr)
        return 2
    try:
        source = nullcontext(sys.stdin) if args.trace == "-" else open(args.trace, encoding="utf-8")
    except OSError as exc:
        print(f"specwatch replay: cannot read {args.trace}: {exc}", file=sys.stderr)
        return 1
    out = sys.stdout
    replayer = Replayer(config)
    try:
        with source as lines:
            for sample in read_trace(lines):
                transition = replayer.feed(sample)
                if transition is not None:
                    out.write(transition.to_json() + "\n")
        for summary in replayer.summaries():
            out.write(summary.to_json() + "\n")
    except TraceError as exc:
        print(f"specwatch replay: {args.trace}: {exc}", file=sys.stderr)
        return 1
    finally:
        replayer.close()
    return 0
