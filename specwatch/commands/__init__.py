"""The CLI's subcommands, a module each; `specwatch.cli` wires them up."""

from __future__ import annotations

import argparse

from specwatch.config import DEFAULT_CONFIG_PATH


def add_config_file_argument(parser: argparse.ArgumentParser) -> None:
    """`--config.file`, as Prometheus spells it, for the commands that need a config."""
    parser.add_argument(
        "--config.file",
        dest="config_file",
        default=DEFAULT_CONFIG_PATH,
        metavar="FILE",
        help=f"configuration file (default {DEFAULT_CONFIG_PATH})",
    )
