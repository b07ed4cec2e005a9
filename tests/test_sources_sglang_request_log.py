"""SGLang per-route acceptance on one shared server: its per-request files and its custom-labelled counters.

Fixtures: tests/fixtures/sglang/request_log (SGLang 0.5.23's file format, PROVENANCE.md there) and the 0.5.23
/metrics captures of tests/fixtures/sglang (routes chat and code told apart by a custom label).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from specwatch.config import ConfigError, parse_config
from specwatch.snapshot import EngineSample
from specwatch.sources.base import NoData, SourceError
from specwatch.sources.engines import make_source, parse_engine_sample
from specwatch.sources.sglang_request_log import DirectoryTail, SGLangRequestLogSource, custom_labels, parse_record
from specwatch.tracking.routes import RouteTracker

FIXTURES = Path(__file__).parent / "fixtures" / "sglang"
LOG = FIXTURES / "request_log"
FILES = ("sglang-request-metrics-20261202_05.log", "sglang-request-metrics-20261202_06.log")


def _config(directory: Path, *routes: str):
    return parse_config(
        {
            "gpu": {"enabled": "false"},
            "routes": [
                {"name": r, "engine": "sglang_request_log", "url": directory.as_uri(), "match": {"route": r}}
                for r in routes
            ],
        }
    )


def _truth() -> dict:
    return json.loads((LOG / "truth.json").read_text())


def _lines(name: str) -> list[str]:
    return (LOG / name).read_text(encoding="utf-8").splitlines(keepends=True)


def test_records_give_counts_and_labels_and_never_the_prompt() -> None:
    records = [parse_record(line) for name in FILES for line in _lines(name)]
    spec = [r for r in records if r is not None]
    assert len(records) - len(spec) == 1  # the request that never verified
    chat = [r for r in spec if r.labels.get("route") == "chat"]
    assert len(chat) == _truth()["chat"]["requests"]  # request 3's prompt names "code": not taken for a label
    for r in spec:
        assert sum(r.histogram) == r.verify_steps
        assert sum(i * n for i, n in enumerate(r.histogram)) == r.accepted
    # the key is found only where json.dumps wrote it, never inside a string value
    assert custom_labels(json.dumps({"text": '"custom_labels": {"route": "x"}'})) == {}
    assert custom_labels(json.dumps({"text": "t", "custom_labels": {"route": "y"}})) == {"route": "y"}
    with pytest.raises(ValueError):
        parse_record('{"spec_verify_ct": -1}')
    with pytest.raises(ValueError):
        parse_record("[1, 2]")


def test_tail_follows_partial_lines_and_the_hourly_rotation(tmp_path: Path) -> None:
    (tmp_path / FILES[0]).write_bytes(b"")  # the server just opened its first file
    tail = DirectoryTail(str(tmp_path))
    assert tail.read_lines() == []
    first = "".join(_lines(FILES[0])).encode()
    cut = first.index(b"\n", len(first) // 2) + 40  # in the middle of a line
    with open(tmp_path / FILES[0], "ab") as f:
        f.write(first[:cut])
    got = tail.read_lines()
    assert len(got) == first[:cut].count(b"\n")  # the partial line waits
    with open(tmp_path / FILES[0], "ab") as f:
        f.write(first[cut:])
    got += tail.read_lines()
    shutil.copy(LOG / FILES[1], tmp_path / FILES[1])  # the next hour
    got += tail.read_lines()
    assert got == [line.rstrip("\n") for name in FILES for line in _lines(name)]
    assert tail.read_lines() == [] and tail.dropped_partials == 0


def test_tail_rereads_a_replaced_or_truncated_file_and_starts_at_the_end_on_first_sight(tmp_path: Path) -> None:
    shutil.copy(LOG / FILES[0], tmp_path / FILES[0])
    tail = DirectoryTail(str(tmp_path))
    assert tail.read_lines() == []  # history before the daemon started is not counted
    (tmp_path / FILES[0]).write_text(_lines(FILES[0])[0], encoding="utf-8")  # truncated and rewritten
    assert len(tail.read_lines()) == 1
    os.replace(_copy(tmp_path, FILES[1], "new"), tmp_path / FILES[0])  # replaced by another file
    assert len(tail.read_lines()) == len(_lines(FILES[1]))


def _copy(tmp_path: Path, name: str, new_name: str) -> Path:
    target = tmp_path / new_name
    shutil.copy(LOG / name, target)
    return target


def test_missing_directory_is_a_clear_source_error(tmp_path: Path) -> None:
    source = SGLangRequestLogSource(_config(tmp_path / "absent", "chat").routes[0])
    with pytest.raises(SourceError, match="cannot list"):
        source.sample(1.0)
    empty = SGLangRequestLogSource(_config(tmp_path, "chat").routes[0])
    with pytest.raises(NoData):
        empty.sample(1.0)


def _feed_live(tmp_path: Path, routes: tuple[str, ...]) -> dict[str, tuple[RouteTracker, EngineSample]]:
    """Two routes read one directory while SGLang writes it (in chunks, across the hour's rotation)."""
    config = _config(tmp_path, *routes)
    (tmp_path / FILES[0]).write_bytes(b"")
    sources = {r.name: make_source(r, config) for r in config.routes}
    trackers = {name: RouteTracker(name) for name in sources}
    last: dict[str, EngineSample] = {}
    ts = 1796173200.0

    def cycle() -> None:
        nonlocal ts
        ts += 15.0
        for name, source in sources.items():
            last[name] = source.sample(ts)
            trackers[name].observe(last[name])

    cycle()
    for name in FILES:
        data = "".join(_lines(name)).encode()
        path = tmp_path / name
        for i in range(0, len(data), 1500):  # writes that end in the middle of lines
            with open(path, "ab") as f:
                f.write(data[i : i + 1500])
            cycle()
    return {name: (trackers[name], last[name]) for name in sources}


def test_shared_server_two_routes_by_custom_label_from_the_request_files(tmp_path: Path) -> None:
    truth = _truth()
    got = _feed_live(tmp_path, ("chat", "code"))
    for route, (tracker, sample) in got.items():
        fed = truth[route]
        (engine,) = sample.engines
        assert (engine.drafts, engine.draft_tokens, engine.accepted_tokens) == (
            fed["verify_steps"],
            fed["proposed"],
            fed["accepted"],
        )
        assert sample.num_speculative_tokens == 3
        state = tracker.state()
        assert state.accepted_tokens_total == fed["accepted"] and state.draft_tokens_total == fed["proposed"]
        assert state.acceptance_ratio["1h"] == pytest.approx(fed["accepted"] / fed["proposed"])
    chat, code = (got[r][0].state().acceptance_ratio["1h"] for r in ("chat", "code"))
    assert chat > 0.5 and code < 0.3  # the routes' own requests, not the server's mix


def test_shared_server_two_routes_by_custom_label_from_the_counters() -> None:
    """The same server's /metrics: `sglang:spec_verify_calls_total` and `generation_tokens_total` carry the custom
    label, so each route's acceptance is (Δgeneration - Δverify) / (Δverify x k) of its own requests."""
    text = (FIXTURES / "0.5.23_dp2.prom").read_text()
    truth = json.loads((FIXTURES / "0.5.23_dp2.truth.json").read_text())
    config = parse_config(
        {
            "gpu": {"enabled": "false"},
            "routes": [
                {"name": r, "engine": "sglang", "url": "http://127.0.0.1:9/metrics", "match": {"route": r}}
                for r in ("chat", "code")
            ],
        }
    )
    k = truth["spec_num_draft_tokens"] - 1
    ratios = {}
    for route in config.routes:
        tracker = RouteTracker(route.name)
        # two scrapes: zero counters, then the capture (the tracker's windows need an increase)
        zero = parse_engine_sample("sglang", _zeroed(text), route, 1.0)
        tracker.observe(zero)
        tracker.observe(parse_engine_sample("sglang", text, route, 16.0))
        fed = truth["tokenizer"][route.name]
        expected = (fed["generation_tokens"] - fed["spec_verify_calls"]) / (fed["spec_verify_calls"] * k)
        ratios[route.name] = tracker.state().acceptance_ratio["1m"]
        assert ratios[route.name] == pytest.approx(expected)
    assert ratios["chat"] != pytest.approx(ratios["code"])


def _zeroed(text: str) -> str:
    """The capture with its tokenizer counters at 0 (the server just started)."""
    out = []
    for line in text.splitlines():
        if line.startswith(("sglang:spec_verify_calls_total", "sglang:generation_tokens_total")):
            line = line.rsplit(" ", 1)[0] + " 0.0"
        out.append(line)
    return "\n".join(out) + "\n"


def test_config_takes_a_file_url_for_the_request_files_only(tmp_path: Path) -> None:
    route = _config(tmp_path, "chat").routes[0]
    assert route.engine == "sglang_request_log" and route.url == tmp_path.as_uri()
    with pytest.raises(ConfigError, match="file://"):
        parse_config(
            {
                "gpu": {"enabled": "false"},
                "routes": [{"name": "chat", "engine": "sglang_request_log", "url": "http://127.0.0.1:9/metrics"}],
            }
        )
    with pytest.raises(ConfigError, match="http"):
        parse_config(
            {"gpu": {"enabled": "false"}, "routes": [{"name": "chat", "engine": "sglang", "url": tmp_path.as_uri()}]}
        )
