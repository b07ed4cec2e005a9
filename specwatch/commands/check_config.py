"""`specwatch check-config`: validate a config (and optionally a web config) and list every problem.

Exit status 0 with a summary when valid, 1 with every problem (each with its path) when not, like
`promtool check config`. A valid config may still get warnings (specwatch/config_warnings.py): files it cannot
read, inline secrets, routes whose GPUs the auto-mapping cannot find under the service's user.
"""

from __future__ import annotations

import argparse
import sys

from specwatch.commands import add_config_file_argument
from specwatch import config_warnings
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
    parser.add_argument(
        "--service.user",
        dest="service_user",
        default=None,
        metavar="USER",
        help="the account the daemon runs as, for the GPU auto-mapping warning (default: "
        f"{config_warnings.SERVICE_USER} where that account exists, as the shipped unit runs as it; '' for none)",
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
        for warning in config_warnings.warnings(config, args.service_user):
            print(f"WARNING: {warning}", file=sys.stderr)
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
