"""The README's metric reference: one Markdown table per area, rendered from the catalog.

The README embeds it between the `metrics-reference` markers; tools/metrics_reference.py writes it there and
tests/test_readme.py fails when the two drift apart.
"""

from __future__ import annotations

import re

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


def render() -> str:
    """The reference, markers included."""
    out = [BEGIN, "_Generated from `specwatch/catalog.py` by `tools/metrics_reference.py`._", ""]
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
    """`readme_text` with the part between the markers replaced by `render()`; ValueError without markers."""
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(readme_text):
        raise ValueError(f"markers {BEGIN} ... {END} not found")
    return pattern.sub(lambda _: render(), readme_text)
