#!/usr/bin/env python3
"""Print the README's metric reference (a Markdown table per area) from specwatch/catalog.py.

The README embeds this output between the `metrics-reference` markers; tests/test_readme.py fails when the two
drift apart. Regenerate with:  .venv/bin/python scripts/metrics_reference.py --write
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from specwatch import catalog

AREAS = (
    ("core", "Sources, tracking and self-monitoring"),
    ("service", "Service"),
    ("detection", "Acceptance-drop detection"),
    ("crossover", "Crossover"),
    ("probe", "Canary probes"),
    ("gpu", "GPUs (NVML, GPM)"),
)
BEGIN, END = "<!-- metrics-reference:begin -->", "<!-- metrics-reference:end -->"
README = Path(__file__).resolve().parent.parent / "README.md"


def render() -> str:
    out = [BEGIN, "_Generated from `specwatch/catalog.py` by `scripts/metrics_reference.py`._", ""]
    for area, title in AREAS:
        specs = [m for m in catalog.METRICS if m.area == area]
        if not specs:
            continue
        out += [f"**{title}**", "", "| Metric | Type | Labels | Meaning |", "|---|---|---|---|"]
        for m in specs:
            labels = ", ".join(f"`{label}`" for label in m.labels) or "—"
            out.append(f"| `{m.name}` | {m.type} | {labels} | {m.help.replace('|', '/')} |")
        out.append("")
    out.append(END)
    return "\n".join(out)


def embed(readme_text: str) -> str:
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(readme_text):
        raise SystemExit(f"{README}: markers {BEGIN} ... {END} not found")
    return pattern.sub(lambda _: render(), readme_text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the table inside README.md")
    args = parser.parse_args()
    if args.write:
        README.write_text(embed(README.read_text(encoding="utf-8")), encoding="utf-8")
    else:
        sys.stdout.write(render() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
