"""`specwatch check-config`: validate a config (and optionally a web config) and list every problem.

Exit status 0 with a summary when valid, 1 with every problem (each with its path) when not, like
`promtool check config`.
"""

from __future__ import annotations

import argparse
import sys

from specwatch.commands import add_config_file_argument
from specwatch.config import ConfigError, load_config, summarize, unreadable_files
from specwatch.export.http import load_web_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_file_argument(parser)
    parser.add_argument(
        "--web.config.file",
        dest="web_config_file",
        default="",
        metavar="FILE",
        help="also check this TLS / basic auth file",
    )


def main(args: argparse.Namespace) -> int:
    failed = False
    try:
        config = load_config(args.config_file)
    except ConfigError as exc:
        _print_problems(args.config_file, exc)
        failed = True
    else:
        print(f"SUCCESS: {args.config_file} is valid")
        print(summarize(config))
        for problem in unreadable_files(config):  # read at scrape time, so not an error: the scrapes fail
            print(f"WARNING: {problem}", file=sys.stderr)
    if args.web_config_file:
        try:
            load_web_config(args.web_config_file)
        except ConfigError as exc:
            _print_problems(args.web_config_file, exc)
            failed = True
        else:
            print(f"SUCCESS: {args.web_config_file} is valid")
    return 1 if failed else 0


def _print_problems(path: str, exc: ConfigError) -> None:
    print(f"FAILED: {path}: {len(exc.problems)} problem(s)", file=sys.stderr)
    for problem in exc.problems:
        print(f"  - {problem}", file=sys.stderr)
