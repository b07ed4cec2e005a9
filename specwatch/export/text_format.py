"""The Prometheus text format (0.0.4) for specwatch's own metric families, without prometheus_client's
per-sample overhead.

`generate_latest` validates and escapes every label name and metric name of every sample; for ~2,500
series that is most of a /metrics render (about 24 of 31 ms measured). Here names are checked once per
family, and only label values are escaped per sample. The bytes are exactly what `generate_latest` writes
for the same families (tests/test_text_format.py compares them); a family of any other shape (histogram,
summary, info, `_created` samples, sample timestamps, names that would need escaping) makes the whole
body fall back to `generate_latest`.
"""

from __future__ import annotations

import re
from typing import Iterable

from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

_LEGACY_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LEGACY_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class _Unsupported(Exception):
    """A family this encoder does not write byte-identically to generate_latest."""


def encode_text(families: Iterable[Metric]) -> bytes | None:
    """The text exposition of `families`; None when one of them needs generate_latest."""
    out: list[str] = []
    try:
        for metric in families:
            out.extend(_family_lines(metric))
    except _Unsupported:
        return None
    return "".join(out).encode("utf-8")


def _family_lines(metric: Metric) -> list[str]:
    name, kind = metric.name, metric.type
    if kind == "counter":
        name += "_total"
    elif kind != "gauge":
        raise _Unsupported(kind)
    if not _LEGACY_NAME.match(name):
        raise _Unsupported(name)
    doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
    lines = [f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"]
    checked: set[str] = set()
    for s in metric.samples:
        if s.name != name or s.timestamp is not None:  # counters' _created, or a timestamped sample
            raise _Unsupported(s.name)
        if s.labels:
            for label in s.labels.keys() - checked:
                if not _LEGACY_LABEL.match(label):
                    raise _Unsupported(label)
                checked.add(label)
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(s.labels.items()))
            lines.append(f"{name}{{{labels}}} {floatToGoString(s.value)}\n")
        else:
            lines.append(f"{name} {floatToGoString(s.value)}\n")
    return lines


def _escape(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value
