"""`specwatch generate [--out-dir DIR] [--check]`: write, or verify, the alert rules, the Alertmanager example
and the Grafana dashboards rendered by `specwatch.mixin`. Runs offline: no config, NVML or network."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specwatch.mixin import render
from specwatch.mixin.settings import DEFAULT


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


def main(args: argparse.Namespace) -> int:
    files = render.render_all(DEFAULT)
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
