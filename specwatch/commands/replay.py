"""`specwatch replay TRACE.jsonl [--config.file F]`: run the acceptance-drop pipeline offline at full speed.

Prints one JSON object per alert transition to stdout. Exit status: 0 done, 1 bad trace line, 2 bad config.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext

from specwatch.config import Config, ConfigError, load_config
from specwatch.offline.replay import TraceError, read_trace, replay


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
    try:
        with source as lines:
            for transition in replay(read_trace(lines), config):
                out.write(transition.to_json() + "\n")
    except TraceError as exc:
        print(f"specwatch replay: {args.trace}: {exc}", file=sys.stderr)
        return 1
    return 0
