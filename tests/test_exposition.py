"""The targeted parser against prometheus_client's on every fixture, and on the format's corner cases."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.sources.exposition import ExpositionError, TooManySeries, parse

FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("*/*.prom"))


def _key(name, labels, value):
    return name, tuple(sorted(labels.items())), "nan" if math.isnan(value) else value


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_fixture_parses_like_prometheus_client(path):
    text = path.read_text()
    declared = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    ours = parse(text, declared)
    reference = list(text_string_to_metric_families(text))
    # prometheus_client's parser renames a counter sample that lacks `_total` (llama-server declares
    # `llamacpp:n_tokens_max` a counter): compare with the name as written.
    written = set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", text, re.M))

    def as_written(name: str) -> str:
        return name[: -len("_total")] if name not in written and name.endswith("_total") else name

    ref_samples = {_key(as_written(s.name), s.labels, s.value) for fam in reference for s in fam.samples}
    our_samples = {_key(s.name, s.labels, s.value) for fam in ours.values() for s in fam.samples}
    assert our_samples == ref_samples
    ref_types = {}
    for fam in reference:
        ref_types[fam.name] = fam.type
        ref_types[fam.name + "_total"] = fam.type  # prometheus_client strips `_total` from counter families
    for name, fam in ours.items():
        assert fam.type == ref_types[name], name
    assert sum(len(f.samples) for f in ours.values()) == len(ref_samples), "no sample read twice"


def test_only_wanted_families_and_exact_names():
    text = (
        '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine="0"} 3\n'
        "# TYPE vllm:num_requests_waiting_by_reason gauge\n"
        'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 2\n'
    )
    fams = parse(text, {"vllm:num_requests_waiting"})
    assert list(fams) == ["vllm:num_requests_waiting"]
    assert [s.value for s in fams["vllm:num_requests_waiting"].samples] == [3.0]
    assert parse(text, {"vllm:num_requests"}) == {}, "a prefix of a name is not that name"


def test_label_sets_read_again_next_scrape_are_equal_and_read_only():
    # Label sets are cached across scrapes (a series keeps its labels), so they must not be writable.
    first = parse('vllm:num_requests_running{engine="0",model_name="m"} 1\n', {"vllm:num_requests_running"})
    again = parse('vllm:num_requests_running{engine="0",model_name="m"} 2\n', {"vllm:num_requests_running"})
    labels = first["vllm:num_requests_running"].samples[0].labels
    assert labels == again["vllm:num_requests_running"].samples[0].labels == {"engine": "0", "model_name": "m"}
    with pytest.raises(TypeError):
        labels["engine"] = "1"  # type: ignore[index]
    with pytest.raises(ExpositionError, match="duplicate label"):
        parse('vllm:num_requests_running{engine="0",engine="1"} 1\n', {"vllm:num_requests_running"})


def test_histogram_samples_gather_into_their_family():
    text = (
        '# HELP h Tokens.\n# TYPE h histogram\nh_bucket{le="1.0"} 1\nh_bucket{le="+Inf"} 2\n'
        "h_count 2\nh_sum 3.5\nh_created 1.7e9\n"
    )
    fam = parse(text, {"h"})["h"]
    assert fam.type == "histogram" and fam.help == "Tokens."
    assert [(s.name, s.value) for s in fam.samples] == [
        ("h_bucket", 1.0),
        ("h_bucket", 2.0),
        ("h_count", 2.0),
        ("h_sum", 3.5),
    ]
    assert fam.samples[1].labels == {"le": "+Inf"}


def test_label_escapes_special_values_and_timestamps():
    text = (
        "# HELP m A \\\\ path\\nnext line\n"
        'm{a="q\\"uote",b="back\\\\slash",c="new\\nline",d=""} NaN 1700000000000\n'
        'm{a="x"} +Inf\nm{a="y"} -Inf\nm{a="z",} 1.5e-3\n'
    )
    fam = parse(text, {"m"})["m"]
    assert fam.help == "A \\ path\nnext line"
    first = fam.samples[0]
    assert first.labels == {"a": 'q"uote', "b": "back\\slash", "c": "new\nline", "d": ""}
    assert math.isnan(first.value) and first.timestamp == 1_700_000_000.0
    assert [s.value for s in fam.samples[1:]] == [math.inf, -math.inf, 0.0015]


def test_openmetrics_tolerance_eof_exemplars_and_escaped_names():
    text = (
        "# TYPE vllm:spec_decode_num_drafts counter\n# UNIT vllm:spec_decode_num_drafts drafts\n"
        'vllm_spec_decode_num_drafts_total{engine="0"} 7.0 # {trace_id="abc"} 1.0 1700000000.5\n'
        '# EOF\nvllm_spec_decode_num_drafts_total{engine="1"} 99\n'
    )
    fam = parse(text, {"vllm:spec_decode_num_drafts_total"})["vllm:spec_decode_num_drafts_total"]
    assert fam.type == "counter"
    assert [(s.name, s.labels, s.value) for s in fam.samples] == [
        ("vllm:spec_decode_num_drafts_total", {"engine": "0"}, 7.0)
    ], "normalised name; nothing after # EOF"


@pytest.mark.parametrize(
    "unusual",
    [
        'm{ a = "1" , b="x y" } 2 1700000000000',  # spaces inside the label set
        'm{a="1",b="x y",} 2 1700000000000',  # trailing comma
        'm{a="1",b="x y"}\t2\t1700000000000\r',  # tabs and a CR line end
        '  m{a="1",b="x y"} 2 1700000000000 # {trace_id="t"} 1.0',  # indented, with an exemplar
        'm{b="x y",a="1"}2 1700000000000',  # no space before the value
    ],
)
def test_plain_and_unusual_spellings_of_a_line_read_the_same(unusual):
    """The regex reader for the usual shape and the strict reader for the rest agree on every value."""
    plain = parse('m{a="1",b="x y"} 2 1700000000000\n', {"m"})["m"].samples
    other = parse(unusual + "\n", {"m"})["m"].samples
    assert (
        [(s.name, dict(s.labels), s.value, s.timestamp) for s in other]
        == [(s.name, dict(s.labels), s.value, s.timestamp) for s in plain]
        == [("m", {"a": "1", "b": "x y"}, 2.0, 1.7e9)]
    )


def test_a_wanted_line_of_the_usual_shape_with_a_bad_value_is_still_refused():
    for line, message in (
        ('m{a="1",a="2"} 1', "duplicate label a"),
        ('m{a="1"} 1_0', "invalid number"),
        ('m{a="1"} 1 NaN', "invalid timestamp"),
    ):
        with pytest.raises(ExpositionError, match=message):
            parse(f"# TYPE m gauge\n{line}\n", {"m"})


def test_bytes_input_and_crlf_line_ends():
    fam = parse(b'# TYPE g gauge\r\ng{a="1"} 2\r\n', {"g"})["g"]
    assert fam.type == "gauge" and fam.samples[0].value == 2.0


@pytest.mark.parametrize(
    "text, line",
    [
        ("ok 1\n<html><body>502</body></html>\n", 2),
        ('m{a="1" 2\n', 1),
        ("m{a=1} 2\n", 1),
        ('m{1a="x"} 2\n', 1),
        ('m{a="x",a="y"} 2\n', 1),
        ('# TYPE m gauge\nm{a="\\q"} 2\n', 2),
        ("x 1\nm not_a_number\n", 2),
        ("m 1_000\n", 1),
        ("m 1 2 3\n", 1),
        ("m\n", 1),
        ("m 1 NaN\n", 1),
        ("# TYPE m strange\n", 1),
        ("\x00\x01binary", 1),
        ('{"error": "not found"}', 1),
    ],
)
def test_malformed_input_raises_one_error_type_with_the_line(text, line):
    with pytest.raises(ExpositionError) as info:
        parse(text, {"m"})
    assert isinstance(info.value, ValueError) and info.value.line == line


def test_invalid_utf8_is_an_exposition_error():
    with pytest.raises(ExpositionError, match="UTF-8"):
        parse(b'm{a="\xff\xfe"} 1\n', {"m"})


@given(
    st.lists(
        st.tuples(st.text(max_size=12), st.floats(allow_nan=False, width=32)),
        min_size=1,
        max_size=6,
        unique_by=lambda t: t[0],
    )
)
@settings(max_examples=60, deadline=None)
def test_round_trip_of_anything_prometheus_client_renders(series):
    """Label values with quotes, backslashes, newlines or any Unicode come back exactly as they went out."""
    registry = CollectorRegistry()
    gauge = Gauge("spec_x", "Help with \\ and\nnewline.", ["v"], registry=registry)
    for label, value in series:
        gauge.labels(v=label).set(value)
    fam = parse(generate_latest(registry), {"spec_x"})["spec_x"]
    assert fam.help == "Help with \\ and\nnewline."
    assert {s.labels["v"]: s.value for s in fam.samples} == dict(series)


def test_unique_refuses_a_series_twice_in_any_label_order_and_names_it():
    text = (
        'vllm:num_requests_running{engine="0",model_name="m"} 1\n'
        'vllm:num_requests_running{model_name="m",engine="1"} 2\n'
        'vllm:num_requests_running{model_name="m",engine="0"} 3\n'
    )
    assert len(parse(text, {"vllm:num_requests_running"})["vllm:num_requests_running"].samples) == 3
    with pytest.raises(ExpositionError, match=r"line 3: duplicate series vllm:num_requests_running") as info:
        parse(text, {"vllm:num_requests_running"}, unique=True)
    assert "'engine': '0'" in str(info.value)
    # Read strictly (an escape in a label value) or inline, a series is the same series.
    strict = 'vllm:num_requests_running{engine="0",model_name="m",x="a\\\\b"} 1\n'
    with pytest.raises(ExpositionError, match="duplicate series"):
        parse(
            strict + strict.replace('"0",model_name="m"', '"0", model_name="m"'),
            {"vllm:num_requests_running"},
            unique=True,
        )
    histogram = 'h_bucket{le="1"} 1\nh_bucket{le="2"} 2\nh_count 2\nh_sum 3\n'
    assert len(parse(histogram, {"h"}, unique=True)["h"].samples) == 4, "one label set under several names is fine"


def test_max_series_counts_samples_of_every_family_but_not_comments_or_blanks():
    body = '# HELP a a\n# TYPE a counter\n\na_total 1\n  unrelated{x="1"} 2\n# EOF\n'
    assert parse(body, {"a_total"}, max_series=2)["a_total"].samples[0].value == 1.0
    with pytest.raises(TooManySeries, match="more than 1 series"):
        parse(body, {"a_total"}, max_series=1)


def test_max_series_refuses_a_label_explosion_before_reading_it():
    body = "".join(f'vllm:spec_decode_num_drafts_total{{engine="{i}"}} 1\n' for i in range(200_000))
    with pytest.raises(TooManySeries):
        parse(body, {"vllm:spec_decode_num_drafts_total"}, unique=True, max_series=100_000)


def test_types_without_comments_reads_the_type_lines_of_the_named_families_with_samples():
    text = (
        "# HELP a_total A.\n# TYPE a_total gauge\na_total 3\n"
        "# HELP b_total B.\n# TYPE b_total counter\n"  # declared, no samples
        "# TYPE c_total counter\nc_total 1\n"  # declared, but not named in types
    )
    families = parse(text, ["a_total", "b_total", "c_total"], comments=False, types=frozenset({"a_total", "b_total"}))
    assert sorted(families) == ["a_total", "c_total"]
    assert (families["a_total"].type, families["a_total"].help, families["c_total"].type) == ("gauge", "", "unknown")
    assert parse(text, ["a_total"], comments=False)["a_total"].type == "unknown"
