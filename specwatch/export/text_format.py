"""specwatch's families in the 0.0.4 text format and OpenMetrics 1.0.0, the bytes client_python's writers produce.

Kept because client_python's writer takes about 6x the CPU, which takes a 64-route daemon past 1% of a core.
The bytes match because specwatch's families are gauges and counters with legacy names, no `_created` samples
and no timestamps (tests/test_text_format.py compares the bytes and checks the catalog).
"""

from __future__ import annotations

from operator import itemgetter
from typing import Iterable

from specwatch.catalog import MetricSpec


def text_body(families: Iterable[TextFamily], openmetrics: bool = False) -> bytes:
    body = "".join(line for family in families for line in family.lines)
    return (body + "# EOF\n" if openmetrics else body).encode("utf-8")


class TextFamily:
    """One metric family as lines of the 0.0.4 text format or of OpenMetrics 1.0.0 (they differ only in the
    HELP and TYPE lines of counters, HELP escaping and the final `# EOF`): HELP and TYPE, then one line per
    `append`."""

    __slots__ = ("lines", "_sorted", "_prefix")

    def __init__(self, spec: MetricSpec, openmetrics: bool = False) -> None:
        # client_python's CounterMetricFamily names the family without "_total" and its samples with it; the
        # 0.0.4 text format names both with it. specwatch renders every non-counter (info too) as a gauge.
        kind = "counter" if spec.type == "counter" else "gauge"
        name = spec.name.removesuffix("_total") + "_total" if kind == "counter" else spec.name
        family_name = spec.name.removesuffix("_total") if openmetrics else name
        doc = spec.help.replace("\\", r"\\").replace("\n", r"\n")
        if openmetrics:  # OpenMetrics escapes double quotes in HELP too
            doc = doc.replace('"', r"\"")
        self.lines = [f"# HELP {family_name} {doc}\n# TYPE {family_name} {kind}\n"]
        # generate_latest writes labels sorted by name; `_sorted` puts the catalog-ordered values in that order
        # (None: already sorted). Names are legacy (no '%', '{', '"'), so they are safe in the %-template.
        order = sorted(range(len(spec.labels)), key=lambda i: spec.labels[i])
        self._sorted = itemgetter(*order) if order != sorted(order) else None
        labels = ",".join(f'{spec.labels[i]}="%s"' for i in order)
        self._prefix = f"{name}{{{labels}}} " if labels else f"{name} "

    def append(self, value: float, label_values: tuple[str, ...]) -> None:
        """One sample; `value` finite, `label_values` in the catalog's label order."""
        text = repr(value) if value < 1e6 else go_float(value)  # go_float's answer, without the call
        if self._sorted is not None:
            label_values = self._sorted(label_values)
        joined = "".join(label_values)  # one scan for all values: escaping is rare
        if "\\" in joined or "\n" in joined or '"' in joined:
            label_values = tuple(map(_escape, label_values))
        self.lines.append(self._prefix % label_values + text + "\n")

    def has_samples(self) -> bool:
        return len(self.lines) > 1


def go_float(value: float) -> str:
    """A finite float as prometheus_client's floatToGoString writes it: repr, except that positive numbers
    of 1e6 and more that repr writes without an exponent switch to Go's exponent form (1234567.0 ->
    1.234567e+06)."""
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
