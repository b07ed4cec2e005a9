"""Fuzzing the exposition parser and the engine parse path with hypothesis.

Whatever an engine's /metrics returns (random bytes, exposition-like noise, a real capture with bytes deleted,
inserted, flipped, lines duplicated or cut), `exposition.parse` returns families or raises `ExpositionError`,
and `parse_engine_sample` returns an `EngineSample` or raises `SourceError`: nothing else escapes, nothing hangs
(a SIGALRM watchdog fails any single call that runs past WATCHDOG_SECONDS). Well-formed expositions parse to the
same values as `prometheus_client`'s parser. Bounded for CI: fixed example counts and per-example deadlines.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from specwatch.config import parse_config
from specwatch.sources.base import SourceError

from specwatch.sources import engines, exposition
from specwatch.sources import sglang as sglang_source
from specwatch.sources import vllm as vllm_source

FIXTURES = Path(__file__).parent / "fixtures"
WATCHDOG_SECONDS = 5.0
FUZZ = settings(max_examples=150, deadline=1000, suppress_health_check=[HealthCheck.too_slow])  # seed: conftest.py
# What the engine sources ask the parser for: the fuzz exercises the lines that are really parsed.
WANTED = sorted(vllm_source.WANTED | sglang_source.WANTED)
ROUTE_CONFIG = parse_config(
    {"gpu": {"enabled": "false"}, "routes": [{"name": "r", "url": "http://127.0.0.1:9/metrics"}]}
)


class Hang(Exception):
    pass


@contextmanager
def watchdog(seconds: float = WATCHDOG_SECONDS) -> Iterator[None]:
    """Fail a call that does not return in time (a hang), instead of hanging the test run."""

    def expire(signum: int, frame: Any) -> None:
        raise Hang(f"no answer within {seconds:g}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def seed_corpus() -> list[bytes]:
    """Real captures (engine fixtures), else the simulator's expositions, which copy the engines' names."""
    corpus = [p.read_bytes() for p in sorted(FIXTURES.glob("*/*.prom"))]
    if corpus:
        return corpus
    from specwatch.simulator.metrics_sglang import SglangMetrics
    from specwatch.simulator.metrics_vllm import VllmMetrics

    return [VllmMetrics("m", engines=2, k=4).render(), SglangMetrics("m", 2, 4).render()]


CORPUS = seed_corpus()


def parse_or_clear_error(data: bytes | str) -> Any:
    with watchdog():
        try:
            return exposition.parse(data, WANTED)
        except exposition.ExpositionError as exc:
            assert str(exc), "the error says what is wrong"
            return exc


def engine_sample_or_source_error(kind: str, data: bytes) -> Any:
    with watchdog():
        try:
            return engines.parse_engine_sample(kind, data, ROUTE_CONFIG.routes[0], 0.0)
        except SourceError as exc:
            return exc


# --------------------------------------------------------------------------------------------- strategies
NAMES = st.sampled_from(WANTED + ["vllm:other", "sglang:other", "go_gc", "a", "vllm_spec_decode_num_drafts"])
LABEL_VALUE = st.lists(st.sampled_from(list('ab0"\\\n{}=,# \t') + ['\\"', "\\\\", "\\n", "é"]), max_size=12).map(
    "".join
)
VALUE = st.sampled_from(
    ["1", "0", "-1", "1.5e3", "NaN", "+Inf", "-Inf", "1e400", "0x10", "", "1 2", "12345678901234567890"]
)


@st.composite
def exposition_like_line(draw: Any) -> str:
    name = draw(NAMES) + draw(st.sampled_from(["", "", "_total", "_created", "_bucket", "_sum", "_count", "{", "}"]))
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return f"# {draw(st.sampled_from(['TYPE', 'HELP', 'EOF', 'UNIT', '']))} {name} {draw(st.text(max_size=10))}"
    labels = draw(
        st.lists(
            st.tuples(st.sampled_from(["engine", "model_name", "position", "le", "", "1x"]), LABEL_VALUE), max_size=3
        )
    )
    body = ",".join(f'{k}="{v}"' for k, v in labels)
    opener = draw(st.sampled_from(["{", "{", "", "{{"]))
    closer = draw(st.sampled_from(["}", "}", "", ",}"]))
    line = f"{name}{opener}{body}{closer} {draw(VALUE)}"
    if draw(st.booleans()):
        line += " " + draw(st.sampled_from(["1700000000000", "-1", "x", '# {a="1"} 1.0']))
    return line if kind != 5 else line[: draw(st.integers(0, len(line)))]


@st.composite
def mutated_capture(draw: Any) -> bytes:
    data = bytearray(draw(st.sampled_from(CORPUS)))
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["delete", "insert", "flip", "truncate", "dup_line", "swap_lines"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "delete":
            del data[at : at + draw(st.integers(1, 64))]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=32))
        elif op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del data[at:]
        else:
            lines = bytes(data).split(b"\n")
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            if op == "dup_line":
                lines.insert(j, lines[i])
            else:
                lines[i], lines[j] = lines[j], lines[i]
            data = bytearray(b"\n".join(lines))
    return bytes(data)


# --------------------------------------------------------------------------------------------- properties
@FUZZ
@given(st.binary(max_size=4096))
def test_random_bytes_parse_or_raise_the_one_error(data):
    parse_or_clear_error(data)


@pytest.mark.slow
@FUZZ
@given(st.lists(exposition_like_line(), max_size=40).map("\n".join))
def test_exposition_like_noise_parses_or_raises_the_one_error(text):
    parse_or_clear_error(text)
    parse_or_clear_error(text.encode())


@pytest.mark.slow
@FUZZ
@given(mutated_capture())
def test_mutated_real_captures_parse_or_raise_the_one_error(data):
    parse_or_clear_error(data)


@FUZZ
@given(mutated_capture(), st.sampled_from(["vllm", "sglang"]))
def test_the_engine_parse_path_raises_only_source_errors(data, kind):
    result = engine_sample_or_source_error(kind, data)
    if isinstance(result, SourceError):
        assert result.reason in ("parse", "no_spec_metrics", "no_match", "too_large"), result.reason
        return
    for engine in result.engines:  # whatever got through is a usable value, never a crash later on
        for value in (engine.drafts, engine.draft_tokens, engine.accepted_tokens):
            assert value is None or isinstance(value, float)


def test_unmutated_corpus_parses():
    for data in CORPUS:
        families = parse_or_clear_error(data)
        assert not isinstance(families, Exception), families


def test_pathological_sizes_finish_quickly():
    long_line = b'vllm:spec_decode_num_drafts_total{engine="' + b"x" * 1_000_000 + b'"} 1\n'
    many_labels = b"vllm:num_requests_running{" + b",".join(b'l%d="v"' % i for i in range(10_000)) + b"} 1\n"
    deep_escapes = b'vllm:num_requests_running{engine="' + b"\\\\" * 200_000 + b'"} 1\n'
    for data in (long_line, many_labels, deep_escapes, b"\n" * 1_000_000, b"#" * 1_000_000):
        parse_or_clear_error(data)


# --------------------------------------------------------------------------------------------- differential
LABEL_NAMES = st.sampled_from(["engine", "model_name", "position", "dp_rank", "le", "a_b", "_x", "Z9"])
ANY_LABEL_VALUE = st.text(st.characters(blacklist_categories=("Cs",)), max_size=16)
ANY_VALUE = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**53), 2**53).map(float)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@st.composite
def well_formed_exposition(draw: Any) -> tuple[str, set[str]]:
    """A valid text-format exposition mixing wanted families with others; returns it and the wanted names."""
    from prometheus_client.utils import floatToGoString

    lines: list[str] = []
    names = draw(
        st.lists(
            st.sampled_from(WANTED + ["vllm:other_total", "go_gc_duration_seconds"]),
            unique=True,
            min_size=1,
            max_size=6,
        )
    )
    for name in names:
        lines += [
            f"# HELP {name} {_escape(draw(st.text(max_size=20)))}",
            f"# TYPE {name} {'counter' if name.endswith('_total') else 'gauge'}",
        ]
        label_sets = draw(
            st.lists(
                st.dictionaries(LABEL_NAMES, ANY_LABEL_VALUE, max_size=3),
                max_size=4,
                unique_by=lambda d: tuple(sorted(d.items())),
            )
        )
        for labels in label_sets:
            body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(
                f"{name}{{{body}}} {floatToGoString(draw(ANY_VALUE))}"
                if body
                else f"{name} {floatToGoString(draw(ANY_VALUE))}"
            )
    return "\n".join(lines) + "\n", {n for n in names if n in WANTED}


def _comparable(samples: Any) -> list[tuple[str, tuple, str]]:
    return sorted((s.name, tuple(sorted(s.labels.items())), repr(s.value)) for s in samples)


@pytest.mark.slow
@FUZZ
@given(well_formed_exposition())
def test_well_formed_expositions_parse_like_prometheus_client(case):
    text, wanted = case
    ours = parse_or_clear_error(text)
    assert not isinstance(ours, Exception), ours
    reference: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            reference.setdefault(sample.name, []).append(sample)
    for name in wanted:
        theirs = reference.get(name, [])
        mine = ours[name].samples if name in ours else []
        assert _comparable(mine) == _comparable(theirs), name


# -------------------------------------------- the inline reading of usual lines against the strict reader
_LABEL_PAIRS = ['a="x"', 'b="y z"', 'c="}"', 'a="1"', 'd="\\"q"', ' e="1"', 'f=""', 'g="x\\\\n"', 'h="{"', "i=1"]


@st.composite
def sample_line(draw: Any) -> str:
    """One sample line of a wanted family, usual or not: odd label text, blanks, values, timestamps, exemplars."""
    line = draw(st.sampled_from(["vllm:num_requests_running", "  vllm:num_requests_running"]))
    if draw(st.booleans()):
        pairs = draw(st.lists(st.sampled_from(_LABEL_PAIRS), max_size=3))
        separator = draw(st.sampled_from([",", ", "]))
        line += "{" + separator.join(pairs) + draw(st.sampled_from(["", ","])) + draw(st.sampled_from(["}", ""]))
    line += draw(st.sampled_from([" ", "\t", "", "  "]))
    line += draw(st.sampled_from(["1", "1.5", "-2e3", "NaN", "+Inf", "1_0", "0x1", "abc", "", "1 2"]))
    line += draw(st.sampled_from(["", " 1700000000000", ' # {a="b"} 1', "\r", " ", "#"]))
    return line


def _outcome(text: str, **options: Any) -> Any:
    try:
        families = exposition.parse(text, {"vllm:num_requests_running"}, **options)
    except exposition.ExpositionError as exc:
        return "error", str(exc)
    return [(s.name, dict(s.labels), repr(s.value), s.timestamp) for f in families.values() for s in f.samples]


def _strictly(patch: pytest.MonkeyPatch) -> None:
    """No line read inline: every sample line goes through the strict reader."""
    patch.setattr(exposition, "_plain_labels", lambda text: None)
    patch.setattr(exposition, "_USUAL_TAIL_RE", exposition.re.compile("(?!)"))


@pytest.mark.slow
@FUZZ
@given(st.lists(sample_line(), min_size=1, max_size=6).map("\n".join), st.booleans())
def test_usual_lines_read_inline_agree_with_the_strict_reader(text, comments):
    inline = _outcome(text, comments=comments, unique=True)
    with pytest.MonkeyPatch.context() as patch:
        _strictly(patch)
        strict = _outcome(text, comments=comments, unique=True)
    assert inline == strict
