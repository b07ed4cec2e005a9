"""Seeding from the fleet can neither stall nor blind.

Stall: the question to Prometheus runs on a thread of its own under one deadline for the whole exchange and a cap
on each answer, so a trickling, huge or hanging Prometheus costs no cycle its time (the daemon's `tick()` driven
with a fake clock against a real local HTTP server). Blind: an answer whose values are not finite or out of
range, or that the route's own traffic shows could not page, is a counted seed error and nothing is stored; a
stored baseline like that, poisoned before these checks, is not used after a restart. Also: SIGTERM never waits
for a hanging question (`specwatch run`), one question per route even across a reload, and the config keys.
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
from fakes import FakeClock, vllm_sample

from specwatch import catalog
from specwatch.config import Config, ConfigError, DetectionConfig, RouteConfig, SeedFrom, parse_config, summarize
from specwatch.daemon import Daemon
from specwatch.evaluators import fleet_seed
from specwatch.evaluators.acceptance_drop import AcceptanceDropEvaluator, build_evaluator
from specwatch.evaluators.base import EvaluatorContext
from specwatch.evaluators.fleet_seed import SEED_ERROR_REASONS, SeedError, fleet_from_answers
from specwatch.snapshot import EngineCounters, EngineSample, RouteObservation
from specwatch.state.baselines import Baseline, BaselineKey
from specwatch.state.store import StateStore

KEY = BaselineKey("m", "0.9.1", 4)
GOOD = [(0.58, 30.0), (0.60, 35.0), (0.63, 40.0)]  # (r0, φ) of three nodes


def _vector(values: list[float | str]) -> bytes:
    """An instant-vector answer, one node per value, spelled as Prometheus spells them ("+Inf", "NaN")."""
    result = [
        {"metric": {"job": "specwatch", "instance": f"10.0.0.{i}:9400", "route": "chat"}, "value": [1.0, str(v)]}
        for i, v in enumerate(values)
    ]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def _answers(nodes: list[tuple[float | str, float | str]]) -> tuple[bytes, bytes]:
    return _vector([r for r, _ in nodes]), _vector([phi for _, phi in nodes])


SEED = SeedFrom(prometheus="http://prometheus.invalid:9090", min_nodes=3)


# ------------------------------------------------------------------ the answer's values
@pytest.mark.parametrize(
    "nodes, reason",
    [
        ([(0.6, "+Inf")] * 3, "not_finite"),
        ([("NaN", 35.0)] * 3, "not_finite"),
        ([(1e-6, 1e300)] * 3, "out_of_range"),
        ([(0.6, 0.5)] * 3, "out_of_range"),
        ([(0.6, 101.0)] * 3, "out_of_range"),
        ([(1.0, 35.0)] * 3, "out_of_range"),
        ([(0.05, 35.0)] * 3, "out_of_range"),
        ([(0.6, 35.0)] * 2, "too_few_nodes"),
    ],
)
def test_an_answer_with_values_not_finite_or_out_of_range_is_a_seed_error(nodes: list[Any], reason: str) -> None:
    with pytest.raises(SeedError) as raised:
        fleet_from_answers(KEY, SEED, *_answers(nodes))
    assert raised.value.reason == reason, raised.value


def test_a_poisoned_minority_is_left_out_of_the_median() -> None:
    fleet = fleet_from_answers(KEY, SEED, *_answers([*GOOD, (0.6, "+Inf"), (1e-6, 1e300)]))
    assert (fleet.acceptance_ratio, fleet.overdispersion, fleet.nodes, fleet.left_out) == (0.60, 35.0, 3, 2)


@pytest.mark.parametrize(
    "answer",
    [b"not json", b'{"status": "error", "error": "bad query"}', b'{"status": "success", "data": {"result": [1]}}'],
)
def test_an_answer_that_is_not_an_instant_vector_is_invalid(answer: bytes) -> None:
    with pytest.raises(SeedError) as raised:
        fleet_from_answers(KEY, SEED, answer, answer)
    assert raised.value.reason == "invalid_answer"


def test_every_seed_error_reason_is_named_in_the_metric_help() -> None:
    spec = next(m for m in catalog.METRICS if m.name == "specwatch_route_seed_errors_total")
    assert all(reason in spec.help for reason in SEED_ERROR_REASONS)


# ------------------------------------------------------------------ the evaluator: nothing stored, learns instead
DETECTION = DetectionConfig(block_seconds=60.0, confirm_window_seconds=300.0, seed_from=SEED)


@pytest.fixture
def answers(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The fleet's answers for the next seed attempts (no socket: the exchange itself is tested below)."""
    current: dict[str, Any] = {"nodes": GOOD}
    monkeypatch.setattr(fleet_seed, "fetch_answers", lambda *args: _answers(current["nodes"]))
    return current


def _evaluator(tmp_path: Path, detection: DetectionConfig = DETECTION) -> AcceptanceDropEvaluator:
    ctx = EvaluatorContext(config=Config(state_dir=str(tmp_path), detection=detection), clock=lambda: 0.0)
    return build_evaluator(ctx, RouteConfig(name="chat", url="http://127.0.0.1:8000/metrics", detection=detection))


def _busy(ts: float, ratio: float) -> RouteObservation:
    """One 15 s scrape of a busy route: 3000 drafted tokens in 4-token drafts, accepted at `ratio`."""
    return RouteObservation(
        route="chat",
        ts=ts,
        up=True,
        model_name=KEY.model_name,
        engine_version=KEY.engine_version,
        k=KEY.k,
        d_drafts=750.0,
        d_draft_tokens=3000.0,
        d_accepted=3000.0 * ratio,
        running_per_engine={"0": 8.0},
    )


def _run(ev: AcceptanceDropEvaluator, ratios: list[tuple[float, float]], start: float = 0.0) -> float | None:
    """Scrapes every 15 s, (seconds, ratio) a stretch, each seed answer waited for; the first page's time."""
    ts, paged = start, None
    for seconds, ratio in ratios:
        end = ts + seconds
        while ts < end:
            fields = ev.evaluate(_busy(ts, ratio), ())
            attempt = ev.selection.seed_attempt
            if attempt is not None:
                assert attempt.wait(30.0)
            if paged is None and fields.get("degraded"):
                paged = ts
            ts += 15.0
    return paged


@pytest.mark.parametrize(
    "nodes, reason",
    [
        ([(0.6, "+Inf")] * 3, "not_finite"),
        ([(1e-6, 1e300)] * 3, "out_of_range"),
        ([(0.3, 35.0)] * 3, "below_own_traffic"),  # this node accepts 0.6: a drop to 0.51 would never page
    ],
)
def test_a_refused_seed_is_counted_stores_nothing_and_the_route_learns_and_pages(
    tmp_path: Path, answers: dict[str, Any], nodes: list[Any], reason: str
) -> None:
    answers["nodes"] = nodes
    ev = _evaluator(tmp_path)
    _run(ev, [(60.0, 0.6)])
    assert ev.selection.seed_errors[reason] == 1
    assert ev.reference is None and ev.store.baselines("chat") == []
    paged = _run(ev, [(3600.0, 0.6), (1800.0, 0.3)])  # the route learns its own 0.6, then falls to half
    assert ev.reference is not None and ev.reference.source == "learned"
    assert paged is not None and paged >= 3600.0
    assert ev.fields()["seed_errors_total"][reason] >= 1
    ev.close()


def test_a_seed_at_the_edge_of_the_range_still_pages_a_fall_to_half(tmp_path: Path, answers: dict[str, Any]) -> None:
    answers["nodes"] = [(0.6, 100.0)] * 3
    ev = _evaluator(tmp_path)
    paged = _run(ev, [(300.0, 0.6), (3600.0, 0.3)])
    assert ev.reference is not None and ev.reference.source == "fleet" and ev.reference.overdispersion == 100.0
    assert paged is not None, "a seed of φ 100 left the route blind to a fall to half"
    ev.close()


def test_a_fresh_node_with_a_degraded_drafter_still_takes_the_seed_and_pages(
    tmp_path: Path, answers: dict[str, Any]
) -> None:
    """Traffic below the fleet's is what seeding is for (a drafter degraded from the start): not refused."""
    ev = _evaluator(tmp_path)
    paged = _run(ev, [(900.0, 0.36)])
    assert ev.reference is not None and ev.reference.source == "fleet" and ev.reference.acceptance_ratio == 0.60
    assert paged is not None and paged <= 60.0 + 300.0 + 15.0, paged
    ev.close()


def test_a_seed_error_is_said_once_per_change(
    tmp_path: Path, answers: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    answers["nodes"] = [(0.6, "+Inf")] * 3
    ev = _evaluator(tmp_path)
    with caplog.at_level("WARNING", logger="specwatch.evaluators.baseline_selection"):
        _run(ev, [(1200.0, 0.6)])  # asked every 5 minutes: 4 attempts
    said = [r.getMessage() for r in caplog.records if "no fleet baseline" in r.getMessage()]
    assert ev.selection.seed_errors["not_finite"] == 4
    assert len(said) == 1 and "not_finite" in said[0] and "learning from this node's traffic" in said[0], said
    ev.close()


# NaN is not among them: the store refuses it (NOT NULL), so it was never kept
@pytest.mark.parametrize("ratio, phi", [(1e-6, 1e300), (0.6, math.inf), (0.6, 250.0)])
def test_a_stored_poisoned_seed_is_not_used_after_a_restart_and_the_route_heals(
    tmp_path: Path, answers: dict[str, Any], ratio: float, phi: float
) -> None:
    """A node that stored the fleet's bad answer before these checks: after a restart the stored seed is not
    used (counted), nothing raises, and the key seeds again from a fleet that is now sound."""
    poisoned = _evaluator(tmp_path, dataclasses.replace(DETECTION, seed_from=None))
    poisoned.evaluate(_busy(0.0, 0.6), ())
    bad = Baseline(route="chat", key=KEY, acceptance_ratio=ratio, overdispersion=phi, source="fleet")
    poisoned.selection._set(bad, persist=True)  # what the unchecked seed stored
    poisoned.close()
    poisoned.store.close()

    ev = _evaluator(tmp_path)
    assert ev.reference is None  # not the poisoned one
    assert ev.selection.seed_errors["stored_invalid"] == 1
    paged = _run(ev, [(300.0, 0.6), (1800.0, 0.3)])
    assert ev.fields().get("seed_errors_total", {}).get("stored_invalid") == 1
    assert ev.reference is not None and ev.reference.source == "fleet" and ev.reference.acceptance_ratio == 0.60
    assert ev.store.get("chat", KEY) == ev.reference  # the good seed replaced the poisoned row
    assert paged is not None
    ev.close()


def test_a_stored_seed_is_said_and_counted_with_the_state_errors_when_learned(tmp_path: Path) -> None:
    """A learned baseline with a value that is not finite (no seed_from): not used, a state store error."""
    ev = _evaluator(tmp_path, dataclasses.replace(DETECTION, seed_from=None))
    ev.store.put(Baseline(route="chat", key=KEY, acceptance_ratio=0.6, overdispersion=math.inf, source="learned"))
    ev.evaluate(_busy(0.0, 0.6), ())
    assert ev.reference is None and any("not usable" in e for e in ev.store.errors)
    ev.close()


# ------------------------------------------------------------------ the exchange, against a real local server
class _Prometheus(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.mode = "good"
        self.stop = threading.Event()
        self.sent = 0  # body bytes sent in "huge" mode
        self.requests = 0


class _Handler(BaseHTTPRequestHandler):
    server: _Prometheus

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        server, mode = self.server, self.server.mode
        server.requests += 1
        query = parse_qs(urlsplit(self.path).query).get("query", [""])[0]
        dispersion = "overdispersion" in query
        if mode == "hang":
            server.stop.wait()
            return
        if mode in ("good", "inf", "tiny"):
            nodes = {"good": GOOD, "inf": [(0.6, "+Inf")] * 3, "tiny": [(1e-6, 1e300)] * 3}[mode]
            body = _answers(nodes)[1 if dispersion else 0]
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Connection", "close")  # a body that ends when the server closes: no length to refuse
        self.end_headers()
        try:
            if mode == "trickle":  # a byte every 0.2 s, for ever: no single read ever times out
                self.wfile.write(b'{"status": "success", "data": {"result": [')
                while not server.stop.wait(0.2):
                    self.wfile.write(b" ")
                    self.wfile.flush()
            elif mode == "huge":  # 400 MB
                piece = b" " * 65536
                while server.sent < 400_000_000 and not server.stop.is_set():
                    self.wfile.write(piece)
                    server.sent += len(piece)
        except OSError:  # the client hung up: what it should do
            pass


@pytest.fixture
def prometheus() -> Iterator[_Prometheus]:
    server = _Prometheus()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stop.set()
        server.shutdown()
        server.server_close()


class _Route:
    """A busy vLLM route: 750 drafts of k=4 a call, accepted at 0.6."""

    def __init__(self) -> None:
        self.drafts = 0.0

    def sample(self, now: float) -> EngineSample:
        self.drafts += 750
        d = self.drafts
        engine = EngineCounters(engine="0", drafts=d, draft_tokens=4 * d, accepted_tokens=2.4 * d, running=8.0)
        return dataclasses.replace(vllm_sample(now, (engine,), 4, model_name="m"), engine_version="0.9.1")

    def close(self) -> None:
        pass


SEED_TIMEOUT = 3.0
ROUTES = ("a", "b", "c")  # sharing one Prometheus


def _daemon(tmp_path: Path, url: str, clock: FakeClock) -> Daemon:
    config = parse_config(
        {
            "interval": "15s",
            "state_dir": str(tmp_path),
            "scrape": {"timeout": "1s"},
            "gpu": {"enabled": "false"},
            "detection": {
                "seed_from": {
                    "prometheus": url,
                    "min_nodes": 3,
                    "timeout": f"{SEED_TIMEOUT:g}s",
                    "max_body_bytes": 65536,
                }
            },
            "routes": [{"name": n, "url": f"http://127.0.0.1:9/{n}"} for n in ROUTES],
        }
    )
    return Daemon(config, source_factory=lambda route, config: _Route(), clock=clock)


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode, reason",
    [
        ("trickle", "timeout"),
        ("hang", "timeout"),
        ("huge", "too_large"),
        ("inf", "not_finite"),
        ("tiny", "out_of_range"),
    ],
)
def test_a_bad_prometheus_never_slows_a_cycle_and_stores_nothing(
    tmp_path: Path, prometheus: _Prometheus, mode: str, reason: str
) -> None:
    """Every cycle stays well inside the seed's deadline while three routes' questions to a trickling, hanging,
    huge or poisoned Prometheus run; each route's attempt ends by the deadline as a seed error of its reason,
    and no baseline is stored."""
    prometheus.mode = mode
    clock = FakeClock()
    d = _daemon(tmp_path, f"http://127.0.0.1:{prometheus.server_port}", clock)
    slowest, counted, give_up = 0.0, {}, time.monotonic() + 60.0
    first = time.monotonic()
    try:
        while time.monotonic() < give_up:
            begin = time.monotonic()
            snapshot = d.tick()
            slowest = max(slowest, time.monotonic() - begin)
            counted = {r.name: dict(r.seed_errors_total).get(reason, 0.0) for r in snapshot.routes}
            if all(counted.values()):
                break
            clock.advance(15.0)
            time.sleep(0.1)
        ended = time.monotonic() - first
        assert slowest < SEED_TIMEOUT, f"a cycle took {slowest:.2f}s"
        assert all(counted.values()), f"no {reason} seed error after {ended:.0f}s: {counted}"
        assert all(r.baseline_source != "fleet" for r in snapshot.routes)
        assert all(not any(r.evaluator_errors_total.values()) for r in snapshot.routes)
        if mode == "huge":
            assert prometheus.sent < 50_000_000, prometheus.sent  # the client stopped reading near the cap
    finally:
        d.close()
    store = StateStore.in_state_dir(str(tmp_path))
    try:
        assert store.baselines() == []
    finally:
        store.close()


@pytest.mark.slow
def test_a_sound_prometheus_seeds_every_route_through_the_same_path(tmp_path: Path, prometheus: _Prometheus) -> None:
    clock = FakeClock()
    d = _daemon(tmp_path, f"http://127.0.0.1:{prometheus.server_port}", clock)
    give_up = time.monotonic() + 60.0
    try:
        while time.monotonic() < give_up:
            snapshot = d.tick()
            if all(r.baseline_source == "fleet" for r in snapshot.routes):
                break
            clock.advance(15.0)
            time.sleep(0.1)
        assert all(r.baseline_source == "fleet" and r.baseline_ratio == 0.60 for r in snapshot.routes), snapshot
        assert all(not any(r.seed_errors_total.values()) for r in snapshot.routes)
    finally:
        d.close()


# ------------------------------------------------------------------ shutdown
FIXTURE = Path(__file__).parent / "fixtures" / "vllm" / "v1_k1_1engine.prom"


class _EngineAndHangingPrometheus(ThreadingHTTPServer):
    """A vLLM /metrics (the captured fixture, its spec-decode counters grown on every scrape) and a Prometheus
    that never answers, on one port."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _EngineHandler)
        self.stop = threading.Event()
        self.scrapes = 0
        self.seed_queries = 0
        self.text = FIXTURE.read_text()


class _EngineHandler(BaseHTTPRequestHandler):
    server: _EngineAndHangingPrometheus

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        server = self.server
        if self.path.startswith("/api/v1/query"):
            server.seed_queries += 1
            server.stop.wait()
            return
        server.scrapes += 1
        n = server.scrapes
        lines = [
            _grown(line, n) if line.startswith("vllm:spec_decode_num_") and "_total{" in line else line
            for line in server.text.splitlines()
        ]
        body = ("\n".join(lines) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _grown(line: str, n: int) -> str:
    series, value = line.rsplit(" ", 1)
    return f"{series} {float(value) * n}"


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="needs POSIX signals")
def test_sigterm_does_not_wait_for_a_hanging_prometheus(tmp_path: Path) -> None:
    """`specwatch run` with a seed question hanging for its whole 60 s deadline stops in seconds, exit 0."""
    server = _EngineAndHangingPrometheus()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    config = tmp_path / "specwatch.yml"
    config.write_text(
        "interval: 1s\nscrape: {timeout: 500ms}\ngpu: {enabled: false}\n"
        f"state_dir: {tmp_path / 'state'}\n"
        f"detection: {{seed_from: {{prometheus: '{base}', timeout: 60s}}}}\n"
        f"routes:\n  - {{name: chat, url: '{base}/metrics'}}\n"
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / "daemon.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "specwatch", "run", "--config.file", str(config)]
        + ["--web.listen-address", f"127.0.0.1:{port}"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        give_up = time.monotonic() + 60.0
        while server.seed_queries == 0 and time.monotonic() < give_up and proc.poll() is None:
            time.sleep(0.1)
        assert server.seed_queries >= 1, (tmp_path / "daemon.log").read_text()
        scrapes = server.scrapes
        time.sleep(3.0)
        assert server.scrapes > scrapes  # evaluation goes on while the question hangs
        begin = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60.0) == 0
        took = time.monotonic() - begin
        assert took < 15.0, f"took {took:.1f}s to stop"
        assert "stopped" in (tmp_path / "daemon.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
        server.stop.set()
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------ config
def _seed_config(**seed: Any) -> Any:
    return parse_config(
        {
            "detection": {"seed_from": {"prometheus": "http://prometheus:9090", **seed}},
            "routes": [{"name": "chat", "url": "http://127.0.0.1:8000/metrics"}],
        }
    )


def test_the_deadline_and_size_cap_have_defaults_and_check_config_shows_them() -> None:
    config = _seed_config()
    seed = config.routes[0].detection.seed_from
    assert seed is not None and (seed.timeout_seconds, seed.max_body_bytes) == (5.0, 4 * 1024 * 1024)
    assert "seed_from http://prometheus:9090 (min_nodes 3, timeout 5s, max_body_bytes 4194304)" in summarize(config)


@pytest.mark.parametrize(
    "key, value, problem",
    [
        ("timeout", "0s", "timeout"),
        ("timeout", "2m", "timeout"),
        ("max_body_bytes", 100, "max_body_bytes"),
        ("max_body_bytes", "lots", "max_body_bytes"),
    ],
)
def test_a_deadline_or_size_cap_out_of_range_is_refused(key: str, value: Any, problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        _seed_config(**{key: value})
    assert any(f"seed_from.{problem}" in p for p in raised.value.problems), raised.value.problems


def test_one_question_at_a_time_per_route_even_across_a_reload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A question still hanging when a reload rebuilds the route's evaluator is joined, not asked again; the
    rebuilt evaluator takes its answer."""
    release, calls = threading.Event(), []

    def slow_fetch(*args: Any) -> tuple[bytes, bytes]:
        calls.append(args)
        assert release.wait(30.0)
        return _answers(GOOD)

    monkeypatch.setattr(fleet_seed, "fetch_answers", slow_fetch)
    before = _evaluator(tmp_path)
    before.evaluate(_busy(0.0, 0.6), ())
    before.evaluate(_busy(15.0, 0.6), ())
    before.close()
    after = _evaluator(tmp_path)  # what a reload builds
    for ts in (30.0, 45.0, 60.0):
        after.evaluate(_busy(ts, 0.6), ())
    assert len(calls) == 1 and after.reference is None
    release.set()
    attempt = after.selection.seed_attempt
    assert attempt is not None and attempt.wait(30.0)
    after.evaluate(_busy(75.0, 0.6), ())
    assert len(calls) == 1 and after.reference is not None and after.reference.source == "fleet"
    after.close()
