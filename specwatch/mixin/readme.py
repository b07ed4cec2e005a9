"""The README's generated parts: the metric reference (one Markdown table per area, from the catalog) and the
alert table (from the generated alert rules, with their default severities).

The README embeds each between its markers; tools/metrics_reference.py writes them there and
tests/test_readme.py fails when they drift apart.
"""

from __future__ import annotations

import re

from specwatch import catalog
from specwatch.mixin import alerts
from specwatch.mixin.settings import DEFAULT

AREAS = (
    ("core", "Sources, tracking and self-monitoring"),
    ("service", "Service"),
    ("detection", "Acceptance-drop detection"),
    ("crossover", "Crossover"),
    ("probe", "Canary probes"),
    ("gpu", "GPUs (NVML, GPM)"),
)
BEGIN, END = "<!-- metrics-reference:begin -->", "<!-- metrics-reference:end -->"
ALERTS_BEGIN, ALERTS_END = "<!-- alerts-reference:begin -->", "<!-- alerts-reference:end -->"


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


def render_alerts() -> str:
    """The alert table, markers included: every alert of the default rules with its severity, `for` and
    `keep_firing_for`."""
    out = [
        ALERTS_BEGIN,
        "_Generated from `specwatch/mixin/alerts.py` by `tools/metrics_reference.py`; severities are the defaults "
        "(`specwatch generate --severity.<class>=...` changes them)._",
        "",
        "| Alert | Class | Severity | For | Keep firing for | Summary |",
        "|---|---|---|---|---|---|",
    ]
    for group in alerts.alert_groups(DEFAULT):
        for a in group["rules"]:
            name, anchor = a["alert"], alerts.runbook_anchor(a["alert"])
            summary = a["annotations"]["summary"].replace("|", "/")
            out.append(
                f"| [`{name}`](docs/runbook.md#{anchor}) | {alerts.CLASS_OF[name]} | {a['labels']['severity']} "
                f"| {a['for']} | {a.get('keep_firing_for', '—')} | {summary} |"
            )
    out.append(ALERTS_END)
    return "\n".join(out)


def _replace(text: str, begin: str, end: str, content: str) -> str:
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise ValueError(f"markers {begin} ... {end} not found")
    return pattern.sub(lambda _: content, text)


def embed(readme_text: str) -> str:
    """`readme_text` with the metric reference and the alert table between their markers replaced by
    `render()` and `render_alerts()`; ValueError when markers are missing."""
    return _replace(_replace(readme_text, BEGIN, END, render()), ALERTS_BEGIN, ALERTS_END, render_alerts())
