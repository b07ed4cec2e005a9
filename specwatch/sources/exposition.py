"""A targeted parser for the Prometheus text exposition format (0.0.4), fast on large engine /metrics.

An engine's /metrics holds ~1,000 lines of which specwatch needs a few dozen. `parse()` therefore only
materialises the families a caller names: one regex scan visits every line start once, and in the same pass
checks that the line can start a sample or comment, stops at `# EOF`, and picks out the lines of wanted
families through a prefix tree of their names. No other line is ever split. Wanted lines of the usual
shape (plain `name="value"` labels, then the value) are read inline by one regex match and a cache of
label sets; any other wanted line goes through a strict character-by-character reader. On a full vLLM
exposition (95.6 KB, 986 lines) this and the extraction take about 1% of the time of prometheus_client's
parser (bench/bench_overhead.py, figure 1; docs/benchmarks.md).

Also accepted: OpenMetrics-style input (`# EOF`, exemplars after ` # `, `# UNIT`), and names whose `:`
was escaped to `_` by format negotiation (`vllm_spec_decode_…` is read as `vllm:spec_decode_…`).

Names are matched exactly, never by substring. A family is what a `# TYPE` line declares in text format
0.0.4, so callers ask for `vllm:spec_decode_num_drafts_total` (counter), `vllm:spec_decode_num_drafts_created`
(the gauge single-process vLLM adds beside it) or `vllm:iteration_tokens_total` (a histogram, whose
`_bucket`/`_sum`/`_count` samples are gathered into it).
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterable, Mapping, NamedTuple

_HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
# The usual shape of a sample's label pairs: no escapes, no blanks (anything else is the strict reader's).
_PLAIN_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"'
_PLAIN_LABELS_RE = re.compile("(?:" + _PLAIN_LABEL + ",)*(?:" + _PLAIN_LABEL + ")?")
_NO_LABELS: Mapping[str, str] = MappingProxyType({})
_UNLABELLED: tuple[Mapping[str, str], frozenset] = (_NO_LABELS, frozenset())
_PLAIN_PAIR_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')
# What follows a wanted name on a sample line of the usual shape: `{labels}` (checked plain by _plain_labels),
# blanks, a value without `_` (float() takes `1_0`, the format does not) and the end of the line.
_USUAL_TAIL_RE = re.compile(r"(?:\{([^}\n]*)\})?[ \t]+([^\s_]+)[ \t\r]*(?=\n|\Z)")
# The start of a sample line (after optional indentation, anything but a comment or a blank): counted against
# `max_series` at C speed before any line is read.
_SAMPLE_START_RE = re.compile(r"\n[ \t]*[^\s#]")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_TYPES = frozenset(
    ("counter", "gauge", "histogram", "summary", "untyped", "unknown", "gaugehistogram", "info", "stateset")
)


class ExpositionError(ValueError):
    """The exposition is not valid text format. `line` is 1-based (0: not tied to one line)."""

    def __init__(self, line: int, message: str) -> None:
        self.line = line
        super().__init__(f"line {line}: {message}" if line else message)


class TooManySeries(ExpositionError):
    """The exposition holds more samples than the caller's `max_series`."""


class Sample(NamedTuple):
    """One sample line. `name` is the full sample name (e.g. `…_bucket`), `:`-normalised.

    A NamedTuple rather than a frozen dataclass: as immutable, and a third of the cost to build, which
    counts at a few dozen samples per endpoint and cycle.
    """

    name: str
    labels: Mapping[str, str]
    value: float
    timestamp: float | None = None  # seconds; expositions from engines never carry one


@dataclass
class Family:
    """One requested metric family: its `# TYPE` ("unknown" if undeclared), `# HELP` and samples in order."""

    name: str
    type: str = "unknown"
    help: str = ""
    samples: list[Sample] = field(default_factory=list)

    def matching(self, match: Mapping[str, str]) -> list[Sample]:
        """The samples that agree with `match` on every label they carry.

        A label the series does not carry cannot tell routes apart, so it does not exclude it (SGLang's
        scheduler gauges have no `route` label while its tokenizer counters do).
        """
        if not match:
            return self.samples
        return [s for s in self.samples if all(s.labels.get(k, v) == v for k, v in match.items())]


def parse(
    text: str | bytes,
    wanted: Iterable[str],
    comments: bool = True,
    unique: bool = False,
    max_series: int | None = None,
    types: frozenset[str] = frozenset(),
) -> dict[str, Family]:
    """Parse the families named in `wanted` (exact names) out of `text`.

    `comments=False` leaves `# TYPE` and `# HELP` lines unread (`Family.type` stays "unknown", `help` ""):
    they are a third of the lines of a body filtered down to the wanted families. `types` names wanted families
    whose `# TYPE` lines are read all the same (HELP still is not), so that a caller can check that a family it
    sums as a counter is declared one; only families with samples are returned, as without comments. `unique=True`
    refuses an exposition in which a wanted sample name carries the same label set twice, as Prometheus refuses
    such a scrape (label order does not matter).
    `max_series` refuses (TooManySeries) an exposition with more sample lines than that, of any family, before
    reading any of them: counting stops at the cap, so a hostile body costs one scan, not a parse.

    Returns {name: Family} for the wanted families that have samples (or, with `comments`, metadata);
    absent ones are simply missing. Raises ExpositionError for invalid UTF-8, a line that cannot start a
    sample or comment (HTML, binary junk), or any malformed line of a wanted family. Lines of other families
    are not validated beyond their first character: this parser trades full validation for speed.
    """
    if isinstance(text, (bytes, bytearray, memoryview)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ExpositionError(0, f"not UTF-8 at byte {exc.start}") from None
    text = "\n" + text  # every line, the first included, now starts after a "\n": one anchor for the scan
    if max_series is not None and text.count("\n") > max_series:  # fewer lines than the cap: fewer samples
        _check_series(text, max_series)
    samples, metadata, scanner = _reader(
        wanted if isinstance(wanted, frozenset) else frozenset(wanted), comments, frozenset() if comments else types
    )
    families: dict[str, Family] = {}
    seen: set[tuple[str, frozenset]] | None = set() if unique else None
    # One C-level regex scan stops only at `# EOF`, at garbage and at lines of wanted families; Python only
    # ever touches those lines.
    usual_tail = _USUAL_TAIL_RE.match
    for m in scanner.finditer(text):
        line_start, match_end = m.start() + 1, m.end()
        head = text[line_start:match_end].lstrip(" \t")  # what the scanner matched, indentation aside
        target = samples.get(head)
        if target is not None:
            # A line of the usual shape (`{plain labels} value`) is read here, inline, by one regex match and the
            # label-set cache: calls and string operations per line were most of a small body's cost. Anything
            # else (a timestamp, an exemplar, escapes, every error) goes through _parse_sample's strict reader.
            sample = None
            tail = usual_tail(text, match_end)
            if tail is not None:
                labels_text, value_text = tail.groups()
                label_set = _UNLABELLED if labels_text is None else _plain_labels(labels_text)
                if label_set is not None:
                    try:
                        sample = Sample(target[1], label_set[0], float(value_text), None)
                    except ValueError:
                        pass
            if sample is None:
                sample = _parse_sample(head, text, line_start, match_end, samples)
                label_set = sample.labels, frozenset(sample.labels.items())
            if seen is not None:
                assert label_set is not None  # read inline above, or from the strict reader's sample
                series = (sample.name, label_set[1])
                if series in seen:
                    raise ExpositionError(
                        _lineno(text, line_start), f"duplicate series {sample.name}{dict(sample.labels)}"
                    )
                seen.add(series)
            family = families.get(target[0])
            if family is None:
                family = families[target[0]] = Family(target[0])
            family.samples.append(sample)
        elif head[:1] != "#":
            end = text.find("\n", line_start)
            line = text[line_start : end if end != -1 else len(text)]
            raise ExpositionError(_lineno(text, line_start), f"not a sample, comment or blank line: {line[:60]!r}")
        elif head[2] == "E":  # `# EOF`: nothing after it is part of the exposition
            break
        else:
            end = text.find("\n", match_end)
            _parse_comment(
                text[match_end - len(head) : end if end != -1 else len(text)].rstrip(),
                text,
                line_start,
                metadata,
                families,
            )
    if types and not comments:
        return {name: family for name, family in families.items() if family.samples}
    return families


def _check_series(text: str, max_series: int) -> None:
    counted = sum(1 for _ in itertools.islice(_SAMPLE_START_RE.finditer(text), max_series + 1))
    if counted > max_series:
        raise TooManySeries(0, f"more than {max_series} series (scrape.max_series)")


@functools.lru_cache(maxsize=64)
def _reader(
    wanted: frozenset[str], comments: bool = True, types: frozenset[str] = frozenset()
) -> tuple[dict[str, tuple[str, str]], dict[str, str], re.Pattern[str]]:
    """Everything `parse` derives from `wanted`, built once per set of names: the aliases and the line scanner
    (which stops at every comment of a wanted family with `comments`, else at the TYPE lines of `types`)."""
    samples, metadata = _aliases(wanted)
    if comments:
        scanner = _line_scanner(frozenset(samples), frozenset(metadata))
    else:
        typed = frozenset(spelled for spelled, family in metadata.items() if family in types)
        scanner = _line_scanner(frozenset(samples), typed, "TYPE")
    return samples, metadata, scanner


def _line_scanner(
    sample_names: frozenset[str], metadata_names: frozenset[str], comments: str = "TYPE|HELP"
) -> re.Pattern[str]:
    """Matches at the start of each line that the parser must look at; what it matched (indentation aside)
    says why:

    a wanted sample name: a sample of a wanted family; `# TYPE name` / `# HELP name`: a comment of one;
    `# EOF` (OpenMetrics, never indented): the end; one other character: junk, a line that cannot start a
    sample or comment (HTML, binary, a JSON error body: after optional indentation, a line starts with a
    metric name, `#` or nothing).

    The names are merged into prefix trees first: `re` does not factor alternations, and a tree fails
    after a few characters on the ~95% of lines that belong to other families. The pattern has no groups:
    saving and restoring group marks at every line cost a quarter of the scan.
    """
    comment = (
        r"|# (?:" + comments + ") " + _trie_pattern(metadata_names) + r"(?=[{ \t\r]|\n|\Z)" if metadata_names else ""
    )
    sample = r"|" + _trie_pattern(sample_names) + r"(?=[{ \t\r]|\n|\Z)" if sample_names else ""
    return re.compile(r"\n(?:# EOF[ \t\r]*(?=\n|\Z)|[ \t]*(?:[^\sa-zA-Z_:#]" + comment + sample + "))")


def _trie_pattern(words: Iterable[str]) -> str:
    trie: dict = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}  # end of a word

    def emit(node: dict) -> str:
        branches = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return emit(trie)


def _lineno(text: str, pos: int) -> int:
    """1-based line number of `pos` in the newline-prefixed text (computed only for error messages)."""
    return text.count("\n", 0, pos)


def _aliases(wanted: frozenset[str]) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """How wanted families may be spelled on sample lines and on TYPE/HELP lines.

    samples: spelled name -> (family, normalised sample name); covers `:`->`_` escaping and histogram
    suffixes. metadata: spelled name -> family; also maps OpenMetrics' counter family `foo` to `foo_total`.
    """
    samples: dict[str, tuple[str, str]] = {}
    metadata: dict[str, str] = {}
    for family in wanted:
        for spelled in {family, family.replace(":", "_")}:
            metadata.setdefault(spelled, family)
            if spelled.endswith("_total"):
                metadata.setdefault(spelled[: -len("_total")], family)
            samples.setdefault(spelled, (family, family))
            for suffix in _HISTOGRAM_SUFFIXES:
                samples.setdefault(spelled + suffix, (family, family + suffix))
    # An exact wanted name always wins over a suffix reading (e.g. `x_count` wanted as a family itself).
    for family in wanted:
        samples[family] = (family, family)
        metadata[family] = family
    return samples, metadata


def _family(families: dict[str, Family], name: str) -> Family:
    fam = families.get(name)
    if fam is None:
        fam = families[name] = Family(name)
    return fam


def _parse_comment(line: str, text: str, pos: int, metadata: Mapping[str, str], families: dict[str, Family]) -> None:
    parts = line.split(None, 3)
    family = metadata.get(parts[2])
    if family is None:
        return
    rest = parts[3] if len(parts) > 3 else ""
    fam = _family(families, family)
    if parts[1] == "TYPE":
        if rest not in _TYPES:
            raise ExpositionError(_lineno(text, pos), f"unknown metric type {rest!r} for {parts[2]}")
        fam.type = "unknown" if rest == "untyped" else rest
    else:
        fam.help = _unescape_help(rest) if "\\" in rest else rest


def _parse_sample(name: str, text: str, pos: int, name_end: int, samples: Mapping[str, tuple[str, str]]) -> Sample:
    """The sample line at `pos` whose (wanted) name ends at `name_end`, read strictly: every line that is not
    of the usual shape parse() reads inline, and every malformed one, which this reports precisely."""
    end = text.find("\n", name_end)
    if end == -1:
        end = len(text)
    sample_name = samples[name][1]
    line = text[pos:end].rstrip()
    name_at = len(line) - len(line.lstrip(" \t"))
    try:
        line_rest = line[name_at + len(name) :]
        if line_rest[:1] == "{":
            labels, after = _parse_labels(line_rest, 1)
            rest = line_rest[after:]
        else:
            labels, rest = {}, line_rest
        hash_at = rest.find("#")  # an OpenMetrics exemplar: `value [timestamp] # {labels} value [timestamp]`
        if hash_at != -1:
            rest = rest[:hash_at]
        fields = rest.split()
        if not fields or len(fields) > 2:
            raise ValueError(f"expected `value [timestamp]` after {name}, got {rest.strip()!r}")
        value = _number(fields[0])
        timestamp = _timestamp(fields[1]) if len(fields) == 2 else None
    except (ValueError, IndexError) as exc:
        raise ExpositionError(
            _lineno(text, pos),
            str(exc) if isinstance(exc, ValueError) and str(exc) else f"malformed sample: {line[:80]!r}",
        ) from None
    return Sample(sample_name, labels, value, timestamp)


@functools.lru_cache(maxsize=4096)
def _plain_labels(pairs_text: str) -> tuple[Mapping[str, str], frozenset] | None:
    """The labels of one `{…}`, read-only, and their set (what tells series apart); None when the text is not
    plain `name="value"` pairs (escapes, blanks, a brace inside a value: the strict reader's work). A series
    carries the same label text scrape after scrape, so each distinct text is read once (a cache hit costs a
    tenth of a read); the views are shared between samples, hence read-only. 4096 label sets cover 64 vLLM
    endpoints several times over."""
    if not _PLAIN_LABELS_RE.fullmatch(pairs_text):
        return None
    pairs = _PLAIN_PAIR_RE.findall(pairs_text)
    labels = dict(pairs)
    if len(labels) != len(pairs):
        return None  # a duplicate label: the strict reader names it
    return (MappingProxyType(labels), frozenset(pairs)) if labels else _UNLABELLED


def _timestamp(token: str) -> float:
    ms = _number(token)
    if not math.isfinite(ms):
        raise ValueError(f"invalid timestamp {token!r}")
    return ms / 1000.0  # text format 0.0.4 timestamps are milliseconds


def _number(token: str) -> float:
    try:
        value = float(token)
    except ValueError:
        raise ValueError(f"invalid number {token!r}") from None
    if "_" in token:  # float() accepts `1_000`; the format does not
        raise ValueError(f"invalid number {token!r}")
    return value


def _parse_labels(line: str, pos: int) -> tuple[dict[str, str], int]:
    """Parse `name="value",…}` starting at `pos`; returns the labels and the index after `}`."""
    labels: dict[str, str] = {}
    n = len(line)
    while True:
        while pos < n and line[pos] == " ":
            pos += 1
        if pos < n and line[pos] == "}":
            return labels, pos + 1
        eq = line.find("=", pos)
        if eq == -1:
            raise ValueError("unterminated label set")
        name = line[pos:eq].strip()
        if not _LABEL_NAME_RE.match(name):
            raise ValueError(f"invalid label name {name!r}")
        pos = eq + 1
        while pos < n and line[pos] == " ":
            pos += 1
        if pos >= n or line[pos] != '"':
            raise ValueError(f"label {name} value must be quoted")
        start = pos + 1
        close = line.find('"', start)
        if close == -1:
            raise ValueError(f"unterminated value of label {name}")
        raw = line[start:close]
        if "\\" in raw:
            value, close = _scan_escaped(line, start, name)
        else:
            value = raw
        if name in labels:
            raise ValueError(f"duplicate label {name}")
        labels[name] = value
        pos = close + 1
        while pos < n and line[pos] == " ":
            pos += 1
        if pos < n and line[pos] == ",":
            pos += 1
        elif pos < n and line[pos] == "}":
            return labels, pos + 1
        else:
            raise ValueError(f"expected , or }} after label {name}")


def _scan_escaped(line: str, start: int, label: str) -> tuple[str, int]:
    """Decode an escaped label value from `start`; returns it and the index of its closing quote."""
    out: list[str] = []
    i, n = start, len(line)
    while i < n:
        c = line[i]
        if c == "\\":
            if i + 1 >= n or line[i + 1] not in _ESCAPES:
                raise ValueError(f"invalid escape in value of label {label}")
            out.append(_ESCAPES[line[i + 1]])
            i += 2
        elif c == '"':
            return "".join(out), i
        else:
            out.append(c)
            i += 1
    raise ValueError(f"unterminated value of label {label}")


def _unescape_help(text: str) -> str:
    """Undo HELP escaping (only backslash-backslash and backslash-n; other backslashes stay, as in Prometheus)."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] in ("\\", "n"):
            out.append("\n" if text[i + 1] == "n" else "\\")
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)
