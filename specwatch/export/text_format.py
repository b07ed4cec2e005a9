"""The Prometheus text format (0.0.4) for specwatch's own metrics, written straight from the samples.

`generate_latest` builds a client_python `Metric` and a `Sample` per series, then validates and escapes
every metric and label name of every sample: for ~2,450 series that was most of a /metrics render. Here
each family's sample-line template (name and sorted label names) is built once, when the family is first
used, and only label values are escaped and floats formatted per sample. The bytes are exactly what
`generate_latest` writes for the families `prometheus.render_families` builds from the same Snapshot
(tests/test_text_format.py compares them), which holds because specwatch's families are all gauges and
counters without `_created` samples or timestamps, named in the catalog with legacy metric and label
names (tests/test_text_format.py checks the catalog for that too).
"""

from __future__ import annotations

from typing import Iterable, Mapping

from specwatch.catalog import MetricSpec


def text_body(families: Iterable[TextFamily]) -> bytes:
    return "".join(line for family in families for line in family.lines).encode("utf-8")


class TextFamily:
    """One metric family as text-format lines: its HELP and TYPE, then one line per `add`."""

    __slots__ = ("lines", "_label_names", "_template")

    def __init__(self, spec: MetricSpec) -> None:
        name, kind = spec.name, spec.type
        if kind == "counter":  # client_python's CounterMetricFamily strips "_total"; the text format adds it
            name = name.removesuffix("_total") + "_total"
        else:
            kind = "gauge"  # specwatch's collector renders every non-counter (info included) as a gauge family
        doc = spec.help.replace("\\", r"\\").replace("\n", r"\n")
        self.lines = [f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"]
        # generate_latest writes labels sorted by name. Names are legacy (no '%', '{', '"'), so they are safe
        # in a %-template; only the values are substituted, escaped, per sample.
        self._label_names = tuple(sorted(spec.labels))
        labels = ",".join(f'{label}="%s"' for label in self._label_names)
        self._template = f"{name}{{{labels}}} %s\n" if labels else f"{name} %s\n"

    def add(self, labels: Mapping[str, str], value: float) -> None:
        text = repr(value) if value < 1e6 else go_float(value)  # go_float's answer, without the call
        names = self._label_names
        if len(names) == 1:  # most families: one label (route or gpu), no list to build
            self.lines.append(self._template % (_escape(labels[names[0]]), text))
        else:
            self.lines.append(self._template % (*[_escape(labels[label]) for label in names], text))


def go_float(value: float) -> str:
    """A finite float as prometheus_client's floatToGoString writes it: repr, except that positive numbers
    of 1e6 and more that repr writes without an exponent switch to Go's exponent form (1234567.0 ->
    1.234567e+06)."""
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _escape(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value
