"""The CLI's subcommands, a module each; `specwatch.cli` wires them up."""

from __future__ import annotations

import argparse
import sys
from typing import Any

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


class _DeprecatedAlias(argparse.Action):
    """An old flag name: stores into the new flag's dest and says, once per use, which name to use instead."""

    def __init__(self, *args: Any, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(*args, **kwargs)

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None
    ) -> None:
        print(f"{parser.prog}: {option} is deprecated, use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_deprecated_alias(parser: Any, old: str, new: str, dest: str, type: Any = None) -> None:
    """Accept `old` for the flag now spelled `new` (same `dest`), hidden from --help, warning when used."""
    parser.add_argument(old, dest=dest, type=type, action=_DeprecatedAlias, new=new, help=argparse.SUPPRESS)


def add_state_dir_argument(parser: argparse.ArgumentParser, help: str) -> None:
    """`--state.dir` (`--state-dir` still accepted, with a warning)."""
    parser.add_argument("--state.dir", dest="state_dir", default=None, metavar="DIR", help=help)
    add_deprecated_alias(parser, "--state-dir", "--state.dir", "state_dir")
