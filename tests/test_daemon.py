"""The daemon loop with fake sources and a fake clock: isolation of failing sources, evaluators, GPUs, reload."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import requests
from prometheus_client import CollectorRegistry
from rich.console import Console

from specwatch import daemon as daemon_module
from specwatch import scrape_pool
from specwatch.commands.status import render_status
from specwatch.config import parse_config
from specwatch.daemon import Daemon, run_source
from specwatch.export.http import routes_document, serve
from specwatch.export.prometheus import SnapshotCollector
from specwatch.scheduler import run_tick, start_scheduler
from specwatch.scrape_pool import MAX_THREADS
from specwatch.snapshot import EngineCounters, EngineSample, GpuSample
from specwatch.sources.base import NoData, SourceError
from specwatch.sources.engines import parse_engine_sample

from fakes import FakeClock, vllm_sample


class CountingSource:
    """A healthy vLLM route: 100 drafts of k=2 per call, 1.5 accepted per draft."""

    def __init__(self) -> None:
        self.drafts = 0.0
        self.closed = False

    def sample(self, now: float) -> EngineSample:
        self.drafts += 100
        e = EngineCounters(
            engine="0",
            drafts=self.drafts,
            draft_tokens=2 * self.drafts,
            accepted_tokens=1.5 * self.drafts,
            accepted_per_pos=(0.8 * self.drafts, 0.7 * self.drafts),
            running=4.0,
        )
        return vllm_sample(now, (e,), 2)

    def close(self) -> None:
        self.closed = True


class RaisingSource:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def sample(self, now: float) -> EngineSample:
        raise self.exc

    def close(self) -> None:
        pass


class FlakySource(CountingSource):
    """CountingSource that answers HTTP 503 while `failing` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = False

    def sample(self, now: float) -> EngineSample:
        if self.failing:
            raise SourceError("http_status", "HTTP 503")
        return super().sample(now)


class HangingSource:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def sample(self, now: float) -> EngineSample:
        self.calls += 1
        self.release.wait(10)
        raise SourceError("timeout", "released")

    def close(self) -> None:
        self.release.set()


def make_config(*names: str, **top: Any) -> Any:
    raw = {
        "interval": "1s",
        "scrape": {"timeout": "100ms"},
        "gpu": {"enabled": "false"},
        "routes": [{"name": n, "url": f"http://127.0.0.1:9/{n}"} for n in names],
        **top,
    }
    return parse_config(raw)


@contextlib.contextmanager
def daemon_over(
    sources: dict[str, Any], before_close: Callable[[], object] = lambda: None, **top: Any
) -> Iterator[tuple[Daemon, FakeClock]]:
    """A daemon whose routes are `sources` (config `top` over make_config's) on a fake clock, closed at the end
    after `before_close` (which frees hung sources, so that none outlives the test)."""
    clock = FakeClock()
    d = Daemon(make_config(*sources, **top), source_factory=lambda r, c: sources[r.name], clock=clock)
    try:
        yield d, clock
    finally:
        before_close()
        d.close()


def release_all(hung: dict[str, HangingSource]) -> Callable[[], None]:
    """Frees every hung source (a `before_close`)."""

    def release() -> None:
        for source in hung.values():
            source.release.set()

    return release


@pytest.fixture
def no_evaluators(monkeypatch):
    monkeypatch.setattr(daemon_module, "build_route_evaluators", lambda ctx, route: [])


@pytest.mark.slow
def test_failing_sources_cost_only_their_route_and_metrics_still_answer(no_evaluators, caplog):
    hanging = HangingSource()
    sources = {
        "good": CountingSource(),
        "dead": RaisingSource(SourceError("connection", "connection refused")),
        "hang": hanging,
        "garbage": RaisingSource(SourceError("parse", "line 3: not a number")),
        "huge": RaisingSource(SourceError("too_large", "body over 16777216 bytes")),
        "buggy": RaisingSource(ZeroDivisionError("oops")),
        "nomatch": RaisingSource(NoData("no series match route=x")),
        "wrongtype": CountingSource(),
    }
    sources["wrongtype"].sample = lambda now: {"not": "a sample"}
    with daemon_over(sources, before_close=hanging.release.set) as (d, clock):
        server = serve("127.0.0.1:0", lambda: d.snapshot)
        try:
            with caplog.at_level(logging.DEBUG, logger="specwatch.daemon"):
                for _ in range(3):
                    begin = time.monotonic()
                    snap = d.tick(clock.advance(5))
                    assert time.monotonic() - begin < 1.0  # the hung source costs 1.5 x 100 ms, not 10 s
            good = snap.route("good")
            assert good.up and good.drafts_total == 300 and good.acceptance_ratio["1m"] == pytest.approx(0.75)
            expected = {
                "dead": "connection",
                "hang": "timeout",
                "garbage": "parse",
                "huge": "too_large",
                "buggy": "internal",
                "nomatch": "no_match",
                "wrongtype": "internal",
            }
            for name, reason in expected.items():
                state = snap.route(name)
                assert not state.up and state.error_reason == reason, name
                assert state.errors_total[reason] == 3, name
            assert hanging.calls == 1  # never stacked a second call on the hung one
            # logged once per state change, not once per cycle
            warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and "route dead" in r.getMessage()]
            assert len(warnings) == 1
            assert sum("route buggy" in r.getMessage() and r.exc_info is not None for r in caplog.records) == 1

            response = requests.get(server.url + "/metrics", timeout=5)
            assert response.status_code == 200
            assert 'specwatch_route_up{route="good"} 1.0' in response.text
            assert 'specwatch_route_up{route="hang"} 0.0' in response.text
            assert 'specwatch_source_errors_total{reason="too_large",route="huge"} 3.0' in response.text
            assert 'specwatch_route_drafts_total{route="good"} 300.0' in response.text
        finally:
            server.shutdown()


@pytest.mark.slow
def test_hung_sources_listed_first_do_not_hold_up_the_healthy_routes(no_evaluators):
    """Hung calls never sit in front of healthy ones, from the first cycle on: every call has a thread of its own,
    so the healthy routes answer while the hung ones (submitted first) still hang."""
    hung = {f"hang{i}": HangingSource() for i in range(3)}  # submitted first
    healthy = {f"good{i}": CountingSource() for i in range(4)}
    sources = {**hung, **healthy}
    with daemon_over(sources, before_close=release_all(hung), interval="5s", scrape={"timeout": "1s"}) as (d, clock):
        for cycle in range(2):
            snap = d.tick(clock.advance(5))
            assert all(snap.route(name).up for name in healthy), cycle
            assert all(snap.route(name).error_reason == "timeout" for name in hung), cycle
        assert all(source.calls == 1 for source in hung.values()), "a hung call is never stacked"
        assert sorted(d.calls_running()) == sorted(f"route {name}" for name in hung)


class GatedSource(CountingSource):
    """An engine that answers only once `gate` is set (or after `wait` seconds): slow, well inside the scrape
    timeout when nothing keeps the gate shut."""

    def __init__(self, gate: threading.Event, wait: float) -> None:
        super().__init__()
        self.gate, self.wait = gate, wait

    def sample(self, now: float) -> EngineSample:
        self.gate.wait(self.wait)
        return super().sample(now)


@pytest.mark.slow
def test_slow_engines_listed_first_never_queue_a_healthy_route_behind_them(no_evaluators):
    """As many slow engines as the pool's cap leaves room for, listed before the healthy routes, each answering
    only once every healthy call has started (or after 5 s, past the cycle's deadline). Were a healthy call queued
    behind slow ones, it could not start until they gave up: every route would be down. Below the cap every call
    has a thread of its own, so every route is up, in every cycle, the first included."""
    gate = threading.Event()

    class Healthy(CountingSource):
        def sample(self, now: float) -> EngineSample:
            started.append(1)  # list.append is atomic under the GIL
            if len(started) == len(healthy):
                gate.set()
            return super().sample(now)

    started: list[int] = []
    slow = {f"slow{i:03d}": GatedSource(gate, 5.0) for i in range(MAX_THREADS - 8)}
    healthy = {f"good{i}": Healthy() for i in range(4)}
    sources = {**slow, **healthy}
    with daemon_over(sources, before_close=gate.set, interval="5s", scrape={"timeout": "2s"}) as (d, clock):
        for cycle in range(3):
            started.clear()
            gate.clear()
            snap = d.tick(clock.advance(5))
            down = {name: snap.route(name).error_reason for name in sources if not snap.route(name).up}
            assert not down, f"cycle {cycle}: routes down {down}"


class SleepySource(CountingSource):
    """An engine under load: it answers, in `seconds`."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def sample(self, now: float) -> EngineSample:
        time.sleep(self.seconds)
        return super().sample(now)


@pytest.mark.slow
def test_engines_each_a_little_slow_never_add_up_to_a_route_down(no_evaluators):
    """60 engines answering in 0.1 s each, far inside the 2 s timeout. Run back to back (as the quick lane ran calls
    that were quick last cycle) they take 6 s, twice the cycle's deadline; each on its own thread, every route is
    up in every cycle."""
    sources = {f"r{i:02d}": SleepySource(0.1) for i in range(60)}
    with daemon_over(sources, interval="5s", scrape={"timeout": "2s"}) as (d, clock):
        for cycle in range(3):
            snap = d.tick(clock.advance(5))
            down = [r.name for r in snap.routes if not r.up]
            assert not down, f"cycle {cycle}: {len(down)} routes down"


def test_no_thread_to_be_had_leaves_every_route_down_overloaded_and_never_raises(no_evaluators, monkeypatch):
    """At the task limit (TasksMax, RLIMIT_NPROC) no thread can be started: the cycle still completes and
    publishes, and no route is up on the strength of an earlier cycle."""
    sources = {f"r{i}": CountingSource() for i in range(3)}

    def refuse(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    with daemon_over(sources) as (d, clock):
        for _ in range(2):
            snap = d.tick(clock.advance(5))
            assert {r.name: (r.up, r.error_reason) for r in snap.routes} == dict.fromkeys(
                sources, (False, "overloaded")
            )
            assert snap.timestamp == clock()
        assert all(r.errors_total["overloaded"] == 2 for r in snap.routes)


def test_more_routes_than_scrape_threads_is_logged_at_start_and_on_reload(no_evaluators, monkeypatch, caplog):
    monkeypatch.setattr(scrape_pool, "MAX_THREADS", 2)
    d = Daemon(make_config("a", "b"), source_factory=lambda r, c: CountingSource(), clock=FakeClock())
    try:
        assert "scrape threads" not in caplog.text
        d.reload(make_config("a", "b", "c"))
        assert "3 routes: more scrape calls a cycle (3) than the 2 scrape threads" in caplog.text
    finally:
        d.close()
    caplog.clear()
    Daemon(make_config("a", "b", "c"), source_factory=lambda r, c: CountingSource(), clock=FakeClock()).close()
    assert "3 routes: more scrape calls a cycle (3) than the 2 scrape threads" in caplog.text


def test_past_the_cap_quick_calls_queue_and_every_route_is_up(no_evaluators, monkeypatch):
    monkeypatch.setattr(scrape_pool, "MAX_THREADS", 4)
    sources = {f"r{i:02d}": SleepySource(0.01) for i in range(40)}
    with daemon_over(sources, interval="5s", scrape={"timeout": "2s"}) as (d, clock):
        for cycle in range(2):
            snap = d.tick(clock.advance(5))
            assert all(r.up for r in snap.routes), cycle
        assert d._pool.threads <= 4


def test_calls_the_cap_leaves_no_thread_for_are_overloaded_and_go_first_next_cycle(no_evaluators, monkeypatch, caplog):
    """Hung engines hold every thread the cap allows: the healthy routes' calls never start, so they are down
    with reason overloaded (never up, never `timeout`); once a thread frees, they are the first called."""
    monkeypatch.setattr(scrape_pool, "MAX_THREADS", 3)
    hung = {f"hang{i}": HangingSource() for i in range(3)}
    healthy = {f"good{i}": CountingSource() for i in range(3)}
    sources = {**hung, **healthy}
    with daemon_over(sources, before_close=release_all(hung), interval="5s", scrape={"timeout": "200ms"}) as (d, clock):
        for cycle in range(2):
            snap = d.tick(clock.advance(5))
            assert {n: snap.route(n).error_reason for n in healthy} == dict.fromkeys(healthy, "overloaded"), cycle
            assert not any(snap.route(n).up for n in sources)
        assert "all 3 scrape threads busy" in caplog.text
        # One thread frees, and hang0 will hang again when called: only if the overloaded routes are in line
        # before it do they get that thread.
        hung["hang0"].release.set()
        deadline = time.monotonic() + 30
        while "route hang0" in d.calls_running() and time.monotonic() < deadline:
            time.sleep(0.05)
        hung["hang0"].release = threading.Event()
        snap = d.tick(clock.advance(5))
        assert all(snap.route(n).up for n in healthy)


def test_a_route_that_starts_hanging_holds_up_no_other_route(no_evaluators):
    """Every route answers for two cycles, then the first one hangs: the others, submitted after it, still answer."""
    first = CountingSource()
    release = threading.Event()
    hang_now = threading.Event()

    def sample(now: float) -> EngineSample:
        if hang_now.is_set():
            release.wait(10)
            raise SourceError("timeout", "released")
        return CountingSource.sample(first, now)

    first.sample = sample  # type: ignore[method-assign]
    healthy = {f"good{i}": CountingSource() for i in range(4)}
    sources = {"first": first, **healthy}
    with daemon_over(sources, before_close=release.set, interval="5s", scrape={"timeout": "1s"}) as (d, clock):
        for _ in range(2):
            assert all(r.up for r in d.tick(clock.advance(5)).routes)
        hang_now.set()
        snap = d.tick(clock.advance(5))
        assert all(snap.route(name).up for name in healthy)
        assert snap.route("first").error_reason == "timeout"


def test_recovery_is_logged_and_counters_continue(no_evaluators, caplog):
    source = FlakySource()
    clock = FakeClock()
    d = Daemon(make_config("r"), source_factory=lambda r, c: source, clock=clock)
    d.tick(clock.advance(5))
    source.failing = True
    snap = d.tick(clock.advance(5))
    assert not snap.route("r").up and snap.route("r").drafts_total == 100
    source.failing = False
    with caplog.at_level(logging.INFO, logger="specwatch.daemon"):
        snap = d.tick(clock.advance(5))
    assert snap.route("r").up and snap.route("r").drafts_total == 200
    assert any("works again" in r.getMessage() for r in caplog.records)


def test_source_factory_failure_is_a_failed_scrape_and_is_retried(no_evaluators):
    attempts = []

    def factory(route, config):
        attempts.append(route.name)
        if len(attempts) == 1:
            raise SourceError("connection", "cannot resolve host")
        return CountingSource()

    clock = FakeClock()
    d = Daemon(make_config("r"), source_factory=factory, clock=clock)
    assert d.tick(clock.advance(5)).route("r").error_reason == "connection"
    assert d.tick(clock.advance(5)).route("r").up
    assert attempts == ["r", "r"]


class RecordingEvaluator:
    def __init__(self, updates: dict | None = None, fail: bool = False, name: str = "recording") -> None:
        self.updates, self.fail, self.name = updates or {}, fail, name
        self.seen: list[tuple[Any, Any]] = []
        self.closed = False

    def evaluate(self, obs, gpus):
        self.seen.append((obs, list(gpus)))
        if self.fail:
            raise RuntimeError("detector bug")
        return self.updates

    def close(self) -> None:
        self.closed = True


class FakeGpuSource:
    def __init__(self) -> None:
        self.closed = False

    def sample(self, now):
        return True, (
            GpuSample(index=0, up=True, uuid="GPU-0", name="H200", fields={"gpu_power_watts": 300.0}),
            GpuSample(index=1, up=False),
        )

    def route_gpus(self, route_cfg):
        return (0,)

    def close(self) -> None:
        self.closed = True


def test_evaluators_merge_their_fields_and_a_failing_one_is_skipped(monkeypatch, caplog):
    good = RecordingEvaluator({"baseline_ratio": 0.8, "degraded": False})
    bad = RecordingEvaluator(fail=True, name="bad")
    wrong_field = RecordingEvaluator({"no_such_field": 1}, name="wrong_field")
    monkeypatch.setattr(daemon_module, "build_route_evaluators", lambda ctx, route: [good, bad, wrong_field])
    gpu = FakeGpuSource()
    clock = FakeClock()
    d = Daemon(
        make_config("r"), source_factory=lambda r, c: CountingSource(), gpu_source_factory=lambda g: gpu, clock=clock
    )
    with caplog.at_level(logging.ERROR, logger="specwatch.daemon"):
        d.tick(clock.advance(5))
        snap = d.tick(clock.advance(5))
    route = snap.route("r")
    assert route.up and route.baseline_ratio == 0.8 and route.degraded is False
    assert len([r for r in caplog.records if "evaluator" in r.getMessage()]) == 2  # once each, not per cycle
    obs, gpus = good.seen[-1]
    assert obs.route == "r" and obs.up and obs.d_drafts == 100 and obs.window_acceptance["1m"] == 0.75
    assert obs.gpus == (0,) and [g.index for g in gpus] == [0]
    assert snap.nvml_up is True and [g.index for g in snap.gpus] == [0, 1] and route.gpus == (0,)
    assert route.evaluator_errors_total == {"recording": 0.0, "bad": 2.0, "wrong_field": 2.0}
    d.close()
    assert good.closed and bad.closed and gpu.closed


def test_an_evaluator_forced_to_raise_is_counted_on_metrics_and_survives_a_reload(monkeypatch, tmp_path):
    """The real evaluators, the acceptance-drop one made to raise: its failures are a counter on /metrics,
    the other evaluator's count stays 0 (in the snapshot; /metrics shows an evaluator once it has failed), and
    a reload that rebuilds the evaluators keeps the count."""
    from specwatch.evaluators.acceptance_drop import AcceptanceDropEvaluator

    def broken(self, obs, gpus):
        raise ZeroDivisionError("forced")

    monkeypatch.setattr(AcceptanceDropEvaluator, "evaluate", broken)
    raw = {
        "interval": "1s",
        "scrape": {"timeout": "900ms"},  # in-process sources; a loaded box may take a while to run them
        "gpu": {"enabled": "false"},
        "state_dir": str(tmp_path),
        "routes": [{"name": "r", "url": "http://127.0.0.1:9/r", "crossover": {"batch_size": 32}}],
    }
    config = parse_config(raw)
    clock = FakeClock()
    d = Daemon(config, source_factory=lambda r, c: CountingSource(), clock=clock)
    try:
        for _ in range(3):
            d.tick(clock.advance(5))
        registry = CollectorRegistry()
        registry.register(SnapshotCollector(lambda: d.snapshot))
        value = registry.get_sample_value
        assert value("specwatch_evaluator_errors_total", {"route": "r", "evaluator": "acceptance_drop"}) == 3
        assert d.snapshot.route("r").evaluator_errors_total["above_crossover"] == 0
        assert value("specwatch_evaluator_errors_total", {"route": "r", "evaluator": "above_crossover"}) is None
        assert value("specwatch_route_up", {"route": "r"}) == 1  # the route is still exported
        raw["routes"][0]["drop"] = 0.3  # a changed route: its evaluators are rebuilt
        d.reload(parse_config(raw))
        snap = d.tick(clock.advance(5))
        assert snap.route("r").evaluator_errors_total["acceptance_drop"] == 4
    finally:
        d.close()


def test_reload_keeps_state_of_unchanged_routes_and_closes_removed_ones(monkeypatch):
    built: dict[str, list[RecordingEvaluator]] = {}

    def build(ctx, route):
        built.setdefault(route.name, []).append(RecordingEvaluator())
        return [built[route.name][-1]]

    monkeypatch.setattr(daemon_module, "build_route_evaluators", build)
    sources: dict[str, list[CountingSource]] = {}

    def factory(route, config):
        sources.setdefault(route.name, []).append(CountingSource())
        return sources[route.name][-1]

    clock = FakeClock()
    d = Daemon(make_config("keep", "change", "drop"), source_factory=factory, clock=clock)
    d.tick(clock.advance(5))
    d.tick(clock.advance(5))
    new = parse_config(
        {
            "interval": "1s",
            "scrape": {"timeout": "100ms"},
            "gpu": {"enabled": "false"},
            "routes": [
                {"name": "keep", "url": "http://127.0.0.1:9/keep"},
                {"name": "change", "url": "http://127.0.0.1:9/change", "drop": 0.3},
                {"name": "added", "url": "http://127.0.0.1:9/added"},
            ],
        }
    )
    clock.advance(1)
    d.reload(new)
    assert d.snapshot.config_last_reload_successful and d.snapshot.config_last_reload_success_timestamp == clock.now
    assert sources["drop"][0].closed and built["drop"][0].closed
    assert sources["change"][0].closed and built["change"][0].closed and len(built["change"]) == 2
    assert not sources["keep"][0].closed and len(built["keep"]) == 1
    snap = d.tick(clock.advance(5))
    assert [r.name for r in snap.routes] == ["keep", "change", "added"]
    assert snap.route("keep").drafts_total == 300  # same source, counters continue
    # a new source, seen as an engine restart (100 < 200): the tracker keeps the corrected total going
    assert snap.route("change").drafts_total == 300
    assert snap.route("added").drafts_total == 100
    d.reload_failed()
    assert d.snapshot.config_last_reload_successful is False
    assert d.tick(clock.advance(5)).config_last_reload_successful is False
    d.close()


def test_run_source_never_raises():
    assert run_source(lambda: 1 / 0).reason == "internal"
    assert run_source(lambda: (_ for _ in ()).throw(SourceError("parse", "x"))).reason == "parse"
    outcome = run_source(lambda: "sample")
    assert outcome.ok and outcome.sample == "sample" and outcome.duration_seconds >= 0


def test_run_tick_counts_overruns_and_only_pets_after_a_completed_tick(no_evaluators):
    clock = FakeClock()
    d = Daemon(make_config("r"), source_factory=lambda r, c: CountingSource(), clock=clock)
    petted = []
    run_tick(d, interval_seconds=0.0, on_tick=petted.append)  # any tick is longer than 0 s
    assert d.snapshot.evaluation_overruns_total == 1 and len(petted) == 1
    d.tick = lambda now=None: (_ for _ in ()).throw(RuntimeError("hung loop"))
    run_tick(d, interval_seconds=60.0, on_tick=petted.append)
    assert len(petted) == 1


def test_scheduler_smoke(no_evaluators):
    d = Daemon(make_config("r"), source_factory=lambda r, c: CountingSource())
    ticked = threading.Event()
    scheduler = start_scheduler(d, 0.2, on_tick=lambda snap: ticked.set(), first_run_in=0.0)
    try:
        assert ticked.wait(5)
        job = scheduler.get_jobs()[0]
        assert job.max_instances == 1 and job.coalesce is True and job.misfire_grace_time >= 1
    finally:
        scheduler.shutdown(wait=True)
        d.close()
    assert d.snapshot.timestamp > 0 and d.snapshot.route("r").up


def test_reload_with_the_real_evaluators_keeps_their_shared_state_store_usable(tmp_path, caplog):
    """The state store closes with its last user: a reload that replaces every evaluator must start a fresh
    context instead of handing the new evaluators a closed store."""

    def config(drop: float):
        return parse_config(
            {
                "state_dir": str(tmp_path),
                "gpu": {"enabled": "false"},
                "routes": [{"name": "r", "url": "http://127.0.0.1:9/r", "drop": drop, "crossover": {"batch_size": 2}}],
            }
        )

    clock = FakeClock()
    d = Daemon(config(0.15), source_factory=lambda r, c: CountingSource(), clock=clock)
    with caplog.at_level(logging.ERROR):
        for _ in range(3):
            d.tick(clock.advance(5))
        d.reload(config(0.2))
        for _ in range(3):
            snap = d.tick(clock.advance(5))
        d.close()
    assert [r.getMessage() for r in caplog.records] == []
    assert snap.state_errors_total == 0 and snap.route("r").above_crossover is True


def test_the_page_threshold_is_the_baseline_times_one_minus_each_routes_own_drop(monkeypatch):
    evaluator = RecordingEvaluator({"baseline_ratio": 0.8})
    monkeypatch.setattr(daemon_module, "build_route_evaluators", lambda ctx, route: [evaluator])
    config = parse_config(
        {
            "interval": "1s",
            "gpu": {"enabled": "false"},
            "routes": [
                {"name": "default", "url": "http://127.0.0.1:9/a"},
                {"name": "loose", "url": "http://127.0.0.1:9/b", "drop": 0.3},
            ],
        }
    )
    clock = FakeClock()
    d = Daemon(config, source_factory=lambda r, c: CountingSource(), clock=clock)
    snap = d.tick(clock.advance(5))
    assert snap.route("default").acceptance_threshold_ratio == pytest.approx(0.8 * (1 - config.detection.drop))
    assert snap.route("loose").acceptance_threshold_ratio == pytest.approx(0.8 * 0.7)
    d.close()


class UnmappedGpuSource(FakeGpuSource):
    def route_gpus(self, route_cfg):
        return ()


def test_a_serving_route_the_gpu_auto_mapping_finds_nothing_for_is_logged_once(no_evaluators, caplog):
    config = make_config("auto", "pinned")
    config = replace(config, routes=(config.routes[0], replace(config.routes[1], gpus=(1,))))
    clock = FakeClock()
    d = Daemon(
        config,
        source_factory=lambda r, c: CountingSource(),
        gpu_source_factory=lambda g: UnmappedGpuSource(),
        clock=clock,
    )
    with caplog.at_level(logging.WARNING, logger="specwatch.daemon"):
        for _ in range(3):
            snap = d.tick(clock.advance(5))
    warnings = [r.getMessage() for r in caplog.records if "auto-mapping found no GPU" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("route auto:") and "set gpus:" in warnings[0]
    assert snap.route("auto").gpus == () and snap.route("pinned").gpus == (1,)
    d.close()


def test_each_route_records_its_engines_and_when_it_was_last_scraped_successfully(no_evaluators):
    source = FlakySource()
    clock = FakeClock()
    d = Daemon(make_config("r"), source_factory=lambda r, c: source, clock=clock)
    ok_at = clock.advance(5)
    snap = d.tick(ok_at)
    assert snap.route("r").engines == 1 and snap.route("r").last_scrape_timestamp == ok_at
    source.failing = True
    snap = d.tick(clock.advance(5))
    assert snap.route("r").engines is None and snap.route("r").last_scrape_timestamp == ok_at


class ExpositionSource:
    """A route's real vLLM parse of a captured exposition (its `match` is the route's own)."""

    def __init__(self, route_cfg: Any, text: str) -> None:
        self.route_cfg, self.text = route_cfg, text

    def sample(self, now: float) -> EngineSample:
        return parse_engine_sample("vllm", self.text, self.route_cfg, now)

    def close(self) -> None:
        pass


def test_a_match_typo_is_logged_once_at_warning_and_shown_with_the_labels_seen(no_evaluators, caplog):
    """Why a route is down reaches the operator where they look: one warning, /api/v1/routes and `status`."""
    text = (Path(__file__).parent / "fixtures" / "vllm" / "v1_k4_2engines.prom").read_text()
    config = make_config("chat")
    typo = replace(config.routes[0], match={"model_name": "llama-3.1-8b"})
    config = replace(config, routes=(typo,))
    source = ExpositionSource(typo, text)
    clock = FakeClock()
    d = Daemon(config, source_factory=lambda r, c: source, clock=clock)
    try:
        with caplog.at_level(logging.DEBUG, logger="specwatch.daemon"):
            for _ in range(3):
                snap = d.tick(clock.advance(5))
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "route chat" in warnings[0] and "'llama-3.1-8b-instruct'" in warnings[0]
        state = snap.route("chat")
        assert not state.up and state.error_reason == "no_match"
        assert "'llama-3.1-8b-instruct'" in state.error_message
        document = routes_document(snap)
        assert document["routes"][0]["error_message"] == state.error_message
        console = Console(width=200, record=True)
        console.print(render_status(document, 200))
        shown = console.export_text()
        assert "chat: down no_match: " in shown and "(it has 'llama-3.1-8b-instruct')" in shown

        source.route_cfg = replace(typo, match={})  # the typo fixed
        state = d.tick(clock.advance(5)).route("chat")
        assert state.up and state.error_message == ""
    finally:
        d.close()
