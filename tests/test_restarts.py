"""Engine restarts are seen whatever the counters read afterwards: lower, zero, or already higher than before.

Each engine's captured fixture is served by a fake endpoint (no HTTP); a restart is the endpoint refusing
connections (as the real `http.py` reports it) and coming back with counters that are all higher than the
old server's, or at 0.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from specwatch.config import parse_config
from specwatch.snapshot import EngineCounters, EngineSample
from specwatch.sources.base import SourceError
from specwatch.sources.engines import HttpEngineSource, parse_families
from specwatch.sources.http import _failure
from specwatch.tracking.routes import RouteTracker

FIXTURES = Path(__file__).parent / "fixtures"
SLOTS = FIXTURES / "llamacpp" / "responses" / "slots_draft_simple.json"
CASES = {
    # engine: (fixture, strip `_created` lines: vLLM in multiprocess mode has none)
    "vllm": ("vllm/v1_k1_1engine.prom", False),
    "vllm-multiprocess": ("vllm/v1_k1_1engine.prom", True),
    "sglang": ("sglang/0.5.23_dp2.prom", False),
    "trtllm": ("trtllm/serve_k3.prom", False),
    "llamacpp": ("llamacpp/server_k3.prom", False),
}
_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?) (\S+)$", re.M)


def scaled(text: str, factor: float, created_shift: float = 0.0) -> str:
    """Every counter sample times `factor` (gauges kept), every `_created` moved by `created_shift`."""

    def one(m: re.Match) -> str:
        name, value = m.group(1), m.group(2)
        base = name.split("{")[0]
        if base.endswith("_created"):
            return f"{name} {float(value) + created_shift!r}"
        if base.endswith("_total") or base.endswith("_count") or base.endswith("_sum"):
            return f"{name} {float(value) * factor!r}"
        return m.group(0)

    return _SAMPLE.sub(one, text)


class FakeEndpoint:
    """Stands in for SharedEndpoint: this cycle's body, or the error of a refused connection."""

    def __init__(self, body: str) -> None:
        self.body: str | None = body

    def families(self, reader: object, kind: str, now: float):
        if self.body is None:
            raise _failure("http://127.0.0.1:9/metrics", ConnectionRefusedError(111, "Connection refused"), 1.0)
        return parse_families(kind, self.body)


class FakeFetcher:
    def __init__(self) -> None:
        self.asked: list[str] = []

    def get_json_field(self, url: str, key: str) -> str:
        return {"build_info": "b11434-0000000", "model_alias": "tiny.gguf"}.get(key, "1.0")

    def get_json(self, url: str) -> object:
        self.asked.append(url)
        return json.loads(SLOTS.read_text())["after_one_request"]  # llama-server's /slots after a request

    def close(self) -> None:
        pass


def make_source(engine: str, body: str) -> tuple[HttpEngineSource, FakeEndpoint]:
    kind = engine.split("-")[0]
    route = parse_config(
        {"gpu": {"enabled": "false"}, "routes": [{"name": "r", "url": "http://127.0.0.1:9/metrics", "engine": kind}]}
    ).routes[0]
    endpoint = FakeEndpoint(body)
    return HttpEngineSource(route, FakeFetcher(), endpoint), endpoint  # type: ignore[arg-type]


def load(engine: str) -> str:
    name, strip = CASES[engine]
    text = (FIXTURES / name).read_text()
    if strip:
        text = "\n".join(line for line in text.splitlines() if "_created" not in line) + "\n"
    return text


def totals(obs_state) -> tuple[float, float, float]:
    return obs_state.drafts_total, obs_state.draft_tokens_total, obs_state.accepted_tokens_total


@pytest.mark.parametrize("engine", sorted(CASES))
def test_a_restart_whose_counters_all_come_back_higher_is_a_restart(engine):
    old = load(engine)
    source, endpoint = make_source(engine, old)
    tracker = RouteTracker("r")
    first = tracker.observe(source.sample(0.0))
    assert first.acceptance_source == "counter"
    before = totals(tracker.state())
    endpoint.body = None  # the server is gone: connections refused
    with pytest.raises(SourceError):
        source.sample(10.0)
    tracker.observe_down(10.0)
    # The new server has already done more than the old one did in its whole life (its `_created` is later).
    endpoint.body = scaled(old, 2.0, created_shift=60.0)
    obs = tracker.observe(source.sample(20.0))
    assert obs.reset, "the counters came back higher, but it is a new server"
    after = totals(tracker.state())
    assert after == pytest.approx(tuple(2 * b + b for b in before)), "totals are old + new, exactly"
    assert obs.d_draft_tokens == pytest.approx(2 * before[1]), "the increase is all of the new server's count"


@pytest.mark.parametrize("engine", ["vllm", "trtllm"])
def test_a_new_created_time_alone_is_a_restart(engine):
    old = load(engine)
    source, endpoint = make_source(engine, old)
    tracker = RouteTracker("r")
    tracker.observe(source.sample(0.0))
    endpoint.body = scaled(old, 2.0, created_shift=60.0)  # restarted between two scrapes: never refused
    assert tracker.observe(source.sample(20.0)).reset


def test_a_failure_that_is_not_a_missing_engine_is_not_a_restart():
    old = load("llamacpp")
    source, endpoint = make_source("llamacpp", old)
    tracker = RouteTracker("r")
    tracker.observe(source.sample(0.0))
    source.endpoint = TimeoutEndpoint()  # type: ignore[assignment]
    with pytest.raises(SourceError):
        source.sample(10.0)
    source.endpoint = endpoint  # type: ignore[assignment]
    endpoint.body = scaled(old, 2.0)
    obs = tracker.observe(source.sample(20.0))
    assert not obs.reset
    assert obs.d_draft_tokens > 0


class TimeoutEndpoint:
    def families(self, reader: object, kind: str, now: float):
        raise _failure("http://127.0.0.1:9/metrics", TimeoutError(), 1.0)


def llamacpp_sample(ts: float, drafts: float, draft_tokens: float, accepted: float, per_pos=()) -> EngineSample:
    engine = EngineCounters(
        engine="0",
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted_tokens=accepted,
        generation_tokens=draft_tokens,
        accepted_per_pos=tuple(per_pos),
    )
    return EngineSample(
        ts=ts,
        engine_kind="llamacpp",
        acceptance_source="counter",
        model_name="m",
        engine_version="b1",
        speculation_enabled=bool(drafts),
        num_speculative_tokens=len(per_pos) or None,
        engines=(engine,),
    )


def test_one_counter_going_back_restarts_every_counter_of_the_engine():
    tracker = RouteTracker("r")
    tracker.observe(llamacpp_sample(0.0, 100, 400, 300, (90, 80, 70, 60)))
    # After a restart the per-position vector is not written until a request finishes; the totals are at 0.
    obs = tracker.observe(llamacpp_sample(10.0, 0, 0, 0))
    assert obs.reset
    # The first request of the new server: positions come back, all above the old ones, yet all new.
    obs = tracker.observe(llamacpp_sample(20.0, 120, 480, 460, (115, 115, 115, 115)))
    assert not obs.reset
    assert obs.d_accepted_per_pos == (115, 115, 115, 115)
    assert tracker.state().drafts_total == 220


def test_an_all_zero_llamacpp_exposition_is_a_counter_sample():
    text = (FIXTURES / "llamacpp/server_nodraft.prom").read_text()
    kind, families = parse_families("llamacpp", text)
    from specwatch.sources.llamacpp import extract

    sample = extract(families, {}, (), 0.0)
    assert sample.acceptance_source == "counter" and not sample.speculation_enabled


def test_llamacpp_model_name_comes_from_props_once_per_start():
    source, endpoint = make_source("llamacpp", load("llamacpp"))
    sample = source.sample(0.0)
    assert (sample.model_name, sample.engine_version) == ("tiny.gguf", "b11434-0000000")


def test_llamacpp_method_comes_from_slots_once_it_has_drafted_and_again_after_a_restart():
    source, endpoint = make_source("llamacpp", load("llamacpp"))
    fetcher = source.fetcher
    assert source.sample(0.0).drafter == "draft-simple"  # the fixture has drafted: k is known
    assert source.sample(10.0).drafter == "draft-simple"
    assert fetcher.asked == ["http://127.0.0.1:9/slots"]  # once per start
    source.version = None  # what a restart does
    source.sample(20.0)
    assert len(fetcher.asked) == 2


def test_a_sample_without_counters_shows_no_windowed_series_at_all():
    tracker = RouteTracker("r")
    tracker.observe(llamacpp_sample(0.0, 100, 400, 300, (90, 80, 70, 60)))
    tracker.observe(llamacpp_sample(10.0, 110, 440, 330, (99, 88, 77, 66)))
    state = tracker.state()
    assert state.acceptance_ratio and state.position_acceptance_ratio and state.draft_length
    off = replace(llamacpp_sample(20.0, 0, 0, 0), acceptance_source="none")
    tracker.observe(off)
    state = tracker.state()
    assert (state.acceptance_ratio, state.position_acceptance_ratio, state.draft_length) == ({}, (), None)


class Http503Endpoint:
    def families(self, reader: object, kind: str, now: float):
        raise SourceError("http_status", "GET http://127.0.0.1:9/metrics: HTTP 503 Service Unavailable")


@pytest.mark.parametrize(("engine", "restart"), [("llamacpp", True), ("sglang", False)])
def test_a_503_marks_a_new_server_only_where_the_engine_itself_answers_it_while_loading(engine, restart):
    old = load(engine)
    source, endpoint = make_source(engine, old)
    tracker = RouteTracker("r")
    tracker.observe(source.sample(0.0))
    source.endpoint = Http503Endpoint()  # type: ignore[assignment]
    with pytest.raises(SourceError):
        source.sample(10.0)
    source.endpoint = endpoint  # type: ignore[assignment]
    endpoint.body = scaled(old, 2.0)
    assert tracker.observe(source.sample(20.0)).reset is restart
