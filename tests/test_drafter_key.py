"""The speculative method and drafter are part of a route's baseline key: where they come from (the engine, else the
route's `speculative` config), how a change of them is a model change, and how state written before keeps working.
"""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from rich.console import Console

from specwatch.commands._admin import BadRequest, parse_accept
from specwatch.commands.status import render_status_table
from specwatch.config import PinnedBaseline, RouteConfig, parse_config
from specwatch.daemon import Daemon
from specwatch.evaluators.accept import Expected
from specwatch.evaluators.fleet_seed import queries
from specwatch.export.prometheus import render_text
from specwatch.snapshot import EngineSample
from specwatch.sources import llamacpp
from specwatch.sources.engines import parse_engine_sample
from specwatch.state.baselines import Baseline, BaselineKey
from specwatch.state.store import StateStore
from specwatch.tracking.routes import RouteTracker

from fakes import FakeClock

FIXTURES = Path(__file__).parent / "fixtures"
VLLM_SCRAPES = [(FIXTURES / "vllm" / f"v1_k4_2engines{s}.prom").read_text() for s in ("", "_scrape2")]


# ------------------------------------------------------------------ where method and drafter come from
def test_llamacpp_tells_its_method_on_slots_once_a_slot_has_run_a_request():
    doc = json.loads((FIXTURES / "llamacpp" / "responses" / "slots_draft_simple.json").read_text())
    assert llamacpp.method_of_slots(doc["fresh"]) == ""  # no slot has run a request: not told
    # the server says "none,draft-simple" (--spec-type appends to the default "none")
    assert llamacpp.method_of_slots(doc["after_one_request"]) == "draft-simple"
    assert llamacpp.method_of_slots({"error": "slots disabled"}) == ""


def _trtllm_exposition(**speculative_config: str) -> str:
    """The serve_k3 fixture's exposition with the info gauge of `MetricsCollector.log_config_info(
    speculative_config=...)` (tensorrt_llm/metrics/collector.py, NVIDIA/TensorRT-LLM main after 050f80def8df),
    transcribed: a prometheus_client Gauge named trtllm_speculative_config_info with the collector's labels and
    the dict's keys as label names, set to 1."""
    registry = CollectorRegistry()
    labels = {"model_name": "llama-3.1-8b-instruct", "engine_type": "trtllm"}
    info_labels = {**labels, **speculative_config}
    gauge = Gauge(
        name="trtllm_speculative_config_info",
        documentation="Speculative decoding configuration info",
        labelnames=info_labels.keys(),
        registry=registry,
    )
    gauge.labels(**info_labels).set(1)
    return (FIXTURES / "trtllm" / "serve_k3.prom").read_text() + generate_latest(registry).decode()


def test_trtllm_tells_method_and_drafter_in_its_speculative_config_info():
    route = RouteConfig(name="r", url="http://127.0.0.1:1/prometheus/metrics", engine="trtllm")
    body = _trtllm_exposition(
        spec_enabled="true", spec_method="Eagle", spec_num_tokens="3", spec_draft_model="eagle-model"
    )
    sample = parse_engine_sample("trtllm", body, route, 1.0)
    assert (sample.spec_method, sample.spec_drafter, sample.drafter) == ("Eagle", "eagle-model", "Eagle:eagle-model")
    assert sample.num_speculative_tokens == 3


def test_the_route_config_names_what_the_engine_does_not_tell_and_the_engine_wins_where_it_does():
    configured = parse_config(
        {
            "routes": [
                {"name": "v", "url": "http://127.0.0.1:1/metrics", "speculative": {"method": "eagle3", "drafter": "a"}},
                {"name": "t", "url": "http://127.0.0.1:2/metrics", "speculative": {"method": "mtp", "drafter": "b"}},
            ]
        }
    )
    vllm_route, trt_route = configured.routes
    assert parse_engine_sample("vllm", VLLM_SCRAPES[0], vllm_route, 1.0).drafter == "eagle3:a"
    told = _trtllm_exposition(spec_enabled="true", spec_method="Eagle", spec_num_tokens="3")
    assert parse_engine_sample("trtllm", told, trt_route, 1.0).drafter == "Eagle:b"  # the drafter it left out
    plain = RouteConfig(name="p", url="http://127.0.0.1:3/metrics")
    assert parse_engine_sample("vllm", VLLM_SCRAPES[0], plain, 1.0).drafter == ""


def test_a_drafter_not_told_keeps_the_last_one_told():
    tracker = RouteTracker("r")

    def sample(ts: float, method: str) -> EngineSample:
        return EngineSample(ts=ts, engine_kind="llamacpp", acceptance_source="none", model_name="m", spec_method=method)

    assert tracker.observe(sample(1.0, "")).drafter == ""
    assert tracker.observe(sample(2.0, "draft-simple")).drafter == "draft-simple"
    assert tracker.observe(sample(3.0, "")).drafter == "draft-simple"  # a restarted server before its first request
    assert tracker.observe(sample(4.0, "ngram-simple")).drafter == "ngram-simple"
    assert tracker.state().drafter == "ngram-simple"


# ------------------------------------------------------------------ a change is a model change
class FixtureSource:
    """A vLLM route read from fixtures made by vLLM's own metric code, through the engine module and the route's
    config, as the daemon's HTTP source reads it."""

    def __init__(self, route: RouteConfig, bodies: list[str]) -> None:
        self.route, self.bodies = route, bodies

    def sample(self, now: float) -> EngineSample:
        body = self.bodies.pop(0) if len(self.bodies) > 1 else self.bodies[0]
        return parse_engine_sample("vllm", body, self.route, now)

    def close(self) -> None:
        pass


def _route(drafter: str, drop: float = 0.2) -> dict[str, Any]:
    return {
        "name": "chat",
        "url": "http://127.0.0.1:1/metrics",
        "engine": "vllm",
        "drop": drop,
        "baseline": {"acceptance_ratio": 0.6, "overdispersion": 2.0},
        "speculative": {"method": "eagle3", "drafter": drafter},
    }


def _raw(state_dir: Path, drafter: str, drop: float = 0.2) -> dict[str, Any]:
    return {"state_dir": str(state_dir), "gpu": {"enabled": "false"}, "routes": [_route(drafter, drop)]}


def _config(state_dir: Path, drafter: str, drop: float = 0.2) -> Any:
    return parse_config(_raw(state_dir, drafter, drop))


def _daemon(config: Any, clock: FakeClock, bodies: list[str]) -> Daemon:
    return Daemon(config, source_factory=lambda r, c: FixtureSource(r, bodies), clock=clock)


def test_a_configured_drafter_changed_by_a_reload_at_the_same_model_and_k_is_a_model_change(tmp_path):
    clock, bodies = FakeClock(), list(VLLM_SCRAPES)
    daemon = _daemon(_config(tmp_path, "org/eagle3-a"), clock, bodies)
    try:
        (before,) = daemon.tick().routes
        daemon.reload(_config(tmp_path, "org/eagle3-a", drop=0.25))  # another setting, the same drafter
        clock.advance(5.0)
        (same,) = daemon.tick().routes
        daemon.reload(_config(tmp_path, "org/eagle3-b"))
        clock.advance(5.0)
        (after,) = daemon.tick().routes
        text = render_text(daemon.snapshot).decode()
    finally:
        daemon.close()
    assert before.up and before.drafter == "eagle3:org/eagle3-a" and before.model_changes_total == 0
    assert same.model_changes_total == 0
    assert (after.model_name, after.drafter) == (before.model_name, "eagle3:org/eagle3-b")
    assert after.model_changes_total == 1 and after.last_model_change_timestamp == clock.now
    stored = StateStore.in_state_dir(str(tmp_path), readonly=True, repair=False).route_state("chat")
    assert stored is not None and stored["key"] == [before.model_name, "", 4, "eagle3:org/eagle3-b"]
    assert 'drafter="eagle3:org/eagle3-b"' in text  # the baseline info names the key it judges


def test_a_configured_drafter_changed_between_two_daemon_runs_is_a_model_change(tmp_path):
    clock = FakeClock()
    first = _daemon(_config(tmp_path, "org/eagle3-a"), clock, list(VLLM_SCRAPES))
    try:
        (before,) = first.tick().routes
    finally:
        first.close()
    clock.advance(60.0)
    second = _daemon(_config(tmp_path, "org/eagle3-b"), clock, list(VLLM_SCRAPES[1:]))
    try:
        (after,) = second.tick().routes
    finally:
        second.close()
    assert before.model_changes_total == 0
    assert after.drafter == "eagle3:org/eagle3-b" and after.model_changes_total == 1


def test_a_pinned_baseline_that_names_a_drafter_applies_only_to_that_drafter():
    pinned = PinnedBaseline(acceptance_ratio=0.6, model="m", drafter="eagle3:org/a")
    assert pinned.applies_to("m", "0.33.0", 4, "eagle3:org/a")
    assert not pinned.applies_to("m", "0.33.0", 4, "eagle3:org/b")
    assert not pinned.applies_to("m", "0.33.0", 4, "")
    assert PinnedBaseline(acceptance_ratio=0.6).applies_to("m", "0.33.0", 4, "eagle3:org/b")  # not named: any


def test_a_drafter_not_told_after_a_daemon_or_engine_restart_keeps_the_key(tmp_path):
    clock = FakeClock()
    first = _daemon(_config(tmp_path, "org/eagle3-a"), clock, list(VLLM_SCRAPES))
    try:
        first.tick()
    finally:
        first.close()
    untold = parse_config({**_raw(tmp_path, "org/eagle3-a"), "routes": [{**_route("x"), "speculative": None}]})
    second = _daemon(untold, clock, [VLLM_SCRAPES[1], VLLM_SCRAPES[0]])  # then counters going back: a restart
    try:
        clock.advance(60.0)
        (after,) = second.tick().routes
        clock.advance(5.0)
        (restarted,) = second.tick().routes
    finally:
        second.close()
    assert after.drafter == "" and after.model_changes_total == 0
    assert restarted.model_changes_total == 1  # the restart itself, counted as ever
    stored = StateStore.in_state_dir(str(tmp_path), readonly=True, repair=False).route_state("chat")
    assert stored is not None and stored["key"][3] == "eagle3:org/eagle3-a"  # the key it knew is kept


# ------------------------------------------------------------------ fleet and operators
def test_the_fleet_seed_matches_the_drafter_too():
    ratio, phi = queries("chat", BaselineKey("m", "0.33.0", 4, "eagle3:org/a"), 'job="specwatch"')
    assert 'drafter="eagle3:org/a"' in ratio and 'drafter="eagle3:org/a"' in phi
    # a key with no drafter asks for drafter="": nodes whose specwatch has no drafter label match it too
    assert 'drafter=""' in queries("chat", BaselineKey("m", "0.33.0", 4), "")[0]


def test_an_accept_may_name_the_drafter_and_refuses_another():
    expected, _ = parse_accept({"model": "m", "drafter": "eagle3:org/b"})
    assert expected == Expected("m", None, None, "eagle3:org/b")
    assert "drafter 'eagle3:org/a', not 'eagle3:org/b'" in expected.mismatch(BaselineKey("m", "v", 4, "eagle3:org/a"))
    assert expected.mismatch(BaselineKey("m", "v", 4, "eagle3:org/b")) == ""
    assert parse_accept({"model": "m"})[0].mismatch(BaselineKey("m", "v", 4, "x")) == ""  # not named: any
    with pytest.raises(BadRequest, match="drafter must be a JSON string"):
        parse_accept({"model": "m", "drafter": 3})


def test_status_shows_the_drafter_beside_the_model():
    table = render_status_table([{"name": "chat", "up": True, "model_name": "m", "drafter": "eagle3:org/a"}], 200)
    console = Console(width=200, file=io.StringIO(), record=True)
    console.print(table)
    assert "m eagle3:org/a" in console.export_text()


# ------------------------------------------------------------------ state written before the drafter was a key
# The tables as the release before wrote them (state/baselines.py and state/canary.py at fcba4bd).
OLD_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE baselines (
    route TEXT NOT NULL, model_name TEXT NOT NULL, engine_version TEXT NOT NULL, k INTEGER NOT NULL,
    acceptance_ratio REAL NOT NULL, position_acceptance TEXT NOT NULL, mean_acceptance_length REAL,
    overdispersion REAL NOT NULL, drafted_tokens REAL NOT NULL, source TEXT NOT NULL, pinned INTEGER NOT NULL,
    created REAL NOT NULL, updated REAL NOT NULL, dispersion_intercept REAL, dispersion_slope REAL NOT NULL DEFAULT 0,
    dispersion_block_seconds REAL, daily_profile TEXT, PRIMARY KEY (route, model_name, engine_version, k));
CREATE TABLE probe_fingerprints (
    route TEXT NOT NULL, model_name TEXT NOT NULL, engine_version TEXT NOT NULL, k INTEGER NOT NULL,
    prompt_set TEXT NOT NULL, prompt_id TEXT NOT NULL, drafted REAL NOT NULL, accepted REAL NOT NULL,
    steps REAL NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY (route, model_name, engine_version, k, prompt_set, prompt_id));
INSERT INTO meta VALUES ('schema_version', '1');
INSERT INTO baselines VALUES ('chat', 'm', '0.33.0', 4, 0.62, '[0.8, 0.6]', 2.4, 3.0, 50000.0, 'learned', 1,
    100.0, 200.0, 2.5, 0.0001, 60.0, NULL);
INSERT INTO probe_fingerprints VALUES ('chat', 'm', '0.33.0', 4, 'set', 'p1', 100.0, 60.0, 30.0, 300.0);
"""


def _old_file(tmp_path: Path) -> Path:
    path = tmp_path / "baselines.db"
    conn = sqlite3.connect(path)
    conn.executescript(OLD_SCHEMA)
    conn.commit()
    conn.close()
    return path


def test_a_file_written_before_keeps_its_baselines_under_drafter_unknown(tmp_path):
    path = _old_file(tmp_path)
    reader = StateStore(str(path), readonly=True, repair=False)  # read-only: the file is not changed
    (before,) = reader.baselines("chat")
    assert before.key == BaselineKey("m", "0.33.0", 4, "") and before.acceptance_ratio == 0.62
    assert reader.get("chat", BaselineKey("m", "0.33.0", 4, "x")) is None
    assert reader.fingerprint("chat", BaselineKey("m", "0.33.0", 4), "set") == {"p1": (100.0, 60.0, 30.0)}
    assert reader.fingerprint_keys("chat", "set") == [BaselineKey("m", "0.33.0", 4)]
    assert reader.errors == []
    reader.close()
    store = StateStore(str(path))
    try:
        assert store.get("chat", BaselineKey("m", "0.33.0", 4)) == before
        assert store.fingerprint("chat", BaselineKey("m", "0.33.0", 4), "set") == {"p1": (100.0, 60.0, 30.0)}
        told = BaselineKey("m", "0.33.0", 4, "eagle3:org/a")
        assert store.put(Baseline(route="chat", key=told, acceptance_ratio=0.5, source="accepted"))
        assert {b.key.drafter for b in store.baselines("chat")} == {"", "eagle3:org/a"}
    finally:
        store.close()
    # a key saved before (three items) reads as drafter ""
    assert BaselineKey.from_json(["m", "0.33.0", 4]) == BaselineKey("m", "0.33.0", 4, "")


CRASH = """
import os, sqlite3, sys
from specwatch.state.store import StateStore
def crash(statement):
    if statement.startswith("DROP TABLE baselines"):
        os._exit(9)  # killed half way through the migration: the new table is written, the old not yet dropped
real = sqlite3.connect
def connect(*args, **kwargs):
    conn = real(*args, **kwargs)
    conn.set_trace_callback(crash)
    return conn
sqlite3.connect = connect
StateStore(sys.argv[1])
"""


@pytest.mark.slow
def test_a_migration_killed_half_way_loses_no_baseline_and_is_done_on_the_next_open(tmp_path):
    path = _old_file(tmp_path)
    killed = subprocess.run([sys.executable, "-c", CRASH, str(path)], env={**os.environ}, timeout=120)
    assert killed.returncode == 9
    columns = {row[1] for row in sqlite3.connect(path).execute("PRAGMA table_info(baselines)")}
    assert "drafter" not in columns, "the half-done migration is rolled back"
    store = StateStore(str(path))
    try:
        (baseline,) = store.baselines("chat")
        assert baseline.key == BaselineKey("m", "0.33.0", 4, "") and baseline.acceptance_ratio == 0.62
        assert store.errors == []
    finally:
        store.close()


def test_a_baseline_stored_before_the_drafter_was_told_is_the_told_drafters_at_start(tmp_path):
    """An older specwatch (or an engine that had not yet told) stored the key with drafter "": a daemon starting
    on the same model, version and k with the drafter told judges against it at once instead of learning again."""
    route = {**_route("org/eagle3-a"), "baseline": None}
    config = parse_config({**_raw(tmp_path, "org/eagle3-a"), "routes": [route]})
    model = parse_engine_sample("vllm", VLLM_SCRAPES[0], config.routes[0], 1.0).model_name
    store = StateStore.in_state_dir(str(tmp_path))
    try:
        untold = Baseline(route="chat", key=BaselineKey(model, "", 4, ""), acceptance_ratio=0.61, source="accepted")
        assert store.put(untold)
    finally:
        store.close()
    daemon = _daemon(config, FakeClock(), list(VLLM_SCRAPES))
    try:
        (state,) = daemon.tick().routes
    finally:
        daemon.close()
    assert state.drafter == "eagle3:org/eagle3-a" and state.model_changes_total == 0
    assert state.baseline_ratio == pytest.approx(0.61)
