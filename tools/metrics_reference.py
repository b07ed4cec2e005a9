#!/usr/bin/env python3
"""Print the README's metric reference and alert table (specwatch/mixin/readme.py), or write them.

.venv/bin/python tools/metrics_reference.py --write     # after changing specwatch/catalog.py or the mixin
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specwatch.mixin.readme import embed, render, render_alerts

README = Path(__file__).resolve().parent.parent / "README.md"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the tables inside README.md")
    args = parser.parse_args()
    if not args.write:
        sys.stdout.write(render() + "\n\n" + render_alerts() + "\n")
        return 0
    try:
        README.write_text(embed(README.read_text(encoding="utf-8")), encoding="utf-8")
    except ValueError as exc:
        raise SystemExit(f"{README}: {exc}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
