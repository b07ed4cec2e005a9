"""Fault injection: every fault of issue 9, and the behaviour specwatch must show under it.

Each test asserts what the operator sees (route up/down, the error reason, totals that never go backwards, no
acceptance page, a state file that survives), not merely that nothing raised. Faults already covered well
elsewhere are referenced rather than duplicated; this table is the one place that maps each fault to its test.

| Fault | Test |
|---|---|
| engine killed and restarted (counters reset) | `test_engine_restart_resets_counters_without_negative_rates_or_a_page` (daemon, real detectors); `test_tracking.py::test_two_engine_vllm_sequence_with_restart_sums_exactly_and_never_goes_backwards` |
| engine hanging (timeout) | `test_http_hanging_engine_times_out_and_the_loop_goes_on`; `test_daemon.py::test_failing_sources_cost_only_their_route_and_metrics_still_answer` (hung call never stacked) |
| slow-drip response | `test_http_slow_drip_is_cut_at_the_scrape_timeout` |
| 100 MB body | `test_http_100mb_body_is_capped_and_the_route_is_down` |
| binary garbage | `test_http_bad_bodies_are_parse_errors` (`garbage`) |
| HTML error page | `test_http_bad_bodies_are_parse_errors` (`html_200`); `test_http_html_error_status_is_http_status` |
| invalid UTF-8 | `test_http_bad_bodies_are_parse_errors` (`invalid_utf8`) |
| duplicate series | `test_http_duplicate_series_do_not_double_count` |
| NaN / Inf / negative counter values | `test_non_finite_and_negative_counters_never_poison_totals` (daemon); `test_http_nan_inf_negative_values_are_survived`; `test_tracking.py::test_nan_and_infinite_values_never_poison_the_sums` |
| label explosion (10,000 series) | `test_label_explosion_is_bounded_in_output_and_time` (daemon); `test_http_label_explosion_10000_series` |
| NVML GPU lost mid-run | `test_gpu_lost_mid_run_costs_only_that_gpu` (daemon + fake NVML); `test_nvml.py::test_lost_gpu_is_down_while_the_others_continue_and_comes_back` |
| state database corrupted | `test_state_db_corrupted_under_a_running_daemon_is_moved_aside_at_the_next_start`; `test_baselines.py::test_corrupt_file_is_moved_aside_and_counted`, `::test_truncated_database_is_recovered` |
| state directory read-only | `test_read_only_state_dir_keeps_detecting_in_memory`; `test_baselines.py::test_unwritable_state_dir_keeps_working_in_memory` |
| state on a full disk | `test_full_disk_counts_state_errors_and_recovers_without_corruption` (RLIMIT_FSIZE in a child) |
| `kill -9` during a baseline write, restart | `test_baselines.py::test_kill_minus_nine_mid_write_keeps_last_committed` |
| `SIGHUP` with a broken config | `test_service_e2e.py::test_sighup_rejects_a_broken_config_and_applies_a_good_one`; `test_cli_core.py::test_run_serves_reloads_on_sighup_and_stops_cleanly_on_sigterm` |
| wall clock jumping backwards | `test_wall_clock_jumping_backwards_never_rewinds_totals_or_pages`; `test_nvml.py::test_retries_follow_the_monotonic_clock_not_the_wall_clock_passed_in` |
| fuzzed exposition bodies | `test_fuzz_exposition.py` |

The HTTP-level tests drive the real engine source (`specwatch.sources.engines.make_source`) against loopback
servers; they are skipped, saying so, in a build without it.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Sequence

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.config import parse_config
from specwatch.daemon import Daemon
from specwatch.export.prometheus import render_families
from specwatch.snapshot import EngineCounters, EngineSample, Snapshot
from specwatch.sources import nvml as nvml_source
from specwatch.tracking.baselines import DB_NAME, BaselineStore
import fake_nvml

REPO = Path(__file__).resolve().parent.parent
START = 1_800_000_000.0
INTERVAL = 5.0
# Detection tuned so a baseline is learned in minutes of fake time (the defaults want 30 minutes of traffic).
FAST_DETECTION = {"warmup_duration": "2m", "warmup_drafted_tokens": 2000, "min_duration": "1m",
                  "min_drafted_tokens": 500}


class FakeClock:
    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


class SimulatedEngine:
    """A vLLM route with k=4 and a fixed per-position acceptance; binomial draws so the baseline has noise.

    `restart()` is the engine being killed and started again: counters from 0 and a new `_created`.
    `poison` replaces the next sample's counters with the given value (NaN, inf, negative)."""

    K = 4
    POSITIONS = (0.8, 0.65, 0.5, 0.4)

    def __init__(self, seed: int = 1, drafts_per_sample: int = 400, engines: int = 2) -> None:
        self.rng = random.Random(seed)
        self.drafts_per_sample = drafts_per_sample
        self.engines = [self._fresh(START) for _ in range(engines)]
        self.poison: float | None = None
        self.closed = False

    @staticmethod
    def _fresh(created: float) -> dict[str, Any]:
        return {"drafts": 0.0, "per_pos": [0.0] * SimulatedEngine.K, "created": created}

    def restart(self, now: float) -> None:
        self.engines = [self._fresh(now) for _ in self.engines]

    def sample(self, now: float) -> EngineSample:
        counters = []
        for index, e in enumerate(self.engines):
            e["drafts"] += self.drafts_per_sample
            reached = self.drafts_per_sample
            for j, p in enumerate(self.POSITIONS):  # position j is accepted only if all before it were
                reached = sum(1 for _ in range(int(reached)) if self.rng.random() < p / (self.POSITIONS[j - 1]
                                                                                           if j else 1.0))
                e["per_pos"][j] += reached
            drafts, accepted = e["drafts"], sum(e["per_pos"])
            if self.poison is not None:
                drafts = accepted = self.poison
            counters.append(EngineCounters(engine=str(index), drafts=drafts, draft_tokens=self.K * drafts,
                                           accepted_tokens=accepted, accepted_per_pos=tuple(e["per_pos"]),
                                           created=e["created"], running=8.0, kv_usage=0.3))
        self.poison = None
        return EngineSample(ts=now, engine_kind="vllm", acceptance_source="counter", model_name="llama",
                            engine_version="0.33.0", num_speculative_tokens=self.K, engines=tuple(counters))

    def close(self) -> None:
        self.closed = True


def make_config(state_dir: Path | str, routes: int = 1, **top: Any) -> Any:
    raw = {"interval": f"{INTERVAL:g}s", "state_dir": str(state_dir), "scrape": {"timeout": "200ms"},
           "gpu": {"enabled": "false"}, "detection": FAST_DETECTION,
           "routes": [{"name": f"r{i}", "url": f"http://127.0.0.1:9/r{i}", "crossover": {"batch_size": 16}}
                      for i in range(routes)], **top}
    return parse_config(raw)


def exported(snapshot: Snapshot) -> dict[tuple[str, tuple], float]:
    """The /metrics samples of a snapshot, keyed by (name, sorted labels)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in render_families(snapshot) for s in family.samples}


def assert_sane_route(state: Any) -> None:
    for ratio in state.acceptance_ratio.values():
        assert 0.0 <= ratio <= 1.0
    for value in (state.drafts_total, state.draft_tokens_total, state.accepted_tokens_total):
        assert math.isfinite(value) and value >= 0.0


def run_cycles(daemon: Daemon, clock: FakeClock, cycles: int) -> list[Snapshot]:
    return [daemon.tick(clock.advance(INTERVAL)) for _ in range(cycles)]


# ============================================================================ daemon-level faults
def test_engine_restart_resets_counters_without_negative_rates_or_a_page(tmp_path):
    engine = SimulatedEngine()
    clock = FakeClock()
    daemon = Daemon(make_config(tmp_path), source_factory=lambda r, c: engine, clock=clock)
    try:
        before = run_cycles(daemon, clock, 60)  # 5 minutes: baseline learned
        assert before[-1].route("r0").baseline_ratio is not None
        engine.restart(clock.now)
        after = run_cycles(daemon, clock, 60)
    finally:
        daemon.close()
    states = [s.route("r0") for s in before + after]
    for prev, cur in zip(states, states[1:]):
        for field in ("drafts_total", "draft_tokens_total", "accepted_tokens_total"):
            assert getattr(cur, field) >= getattr(prev, field), f"{field} went backwards across the restart"
    for state in states:
        assert state.up and state.degraded is not True
        assert_sane_route(state)
    # The 1m ratio right after the restart is the same acceptance, not a collapse to 0 or a jump past 1.
    ratio_after = states[len(before) + 1].acceptance_ratio["1m"]
    assert ratio_after == pytest.approx(before[-1].route("r0").acceptance_ratio["1m"], abs=0.05)
    # Exported counters are monotonic too, so Prometheus rate() sees no negative step.
    totals = [exported(s)[("specwatch_route_draft_tokens_total", (("route", "r0"),))] for s in before + after]
    assert totals == sorted(totals)


def test_wall_clock_jumping_backwards_never_rewinds_totals_or_pages(tmp_path, caplog):
    engine = SimulatedEngine(seed=2)
    clock = FakeClock()
    daemon = Daemon(make_config(tmp_path), source_factory=lambda r, c: engine, clock=clock)
    try:
        before = run_cycles(daemon, clock, 60)
        clock.advance(-3600.0)  # NTP step back one hour
        after = run_cycles(daemon, clock, 40)
        clock.advance(7200.0)  # and forward past where it was
        later = run_cycles(daemon, clock, 20)
    finally:
        daemon.close()
    snapshots = before + after + later
    states = [s.route("r0") for s in snapshots]
    for prev, cur in zip(states, states[1:]):
        assert cur.draft_tokens_total >= prev.draft_tokens_total
    for state in states:
        assert state.up and state.degraded is not True
        assert_sane_route(state)
    assert all(s.state_errors_total == 0 for s in snapshots)
    # After the jump the route still reports an acceptance ratio (the windows did not wedge on old timestamps).
    assert "1m" in after[-1].route("r0").acceptance_ratio and "1m" in later[-1].route("r0").acceptance_ratio
    assert after[-1].timestamp == pytest.approx(before[-1].timestamp - 3600 + 40 * INTERVAL)
    # Detector state was still persisted after the jump (the flush timer did not wait an hour to catch up).
    store = BaselineStore.in_state_dir(str(tmp_path))
    try:
        state = store.route_state("r0")
        assert state is not None
    finally:
        store.close()


def test_non_finite_and_negative_counters_never_poison_totals(tmp_path):
    engine = SimulatedEngine(seed=3)
    clock = FakeClock()
    daemon = Daemon(make_config(tmp_path), source_factory=lambda r, c: engine, clock=clock)
    try:
        snapshots = run_cycles(daemon, clock, 30)
        for poison in (float("nan"), float("inf"), float("-inf"), -5.0, float("nan")):
            engine.poison = poison
            snapshots += run_cycles(daemon, clock, 3)
    finally:
        daemon.close()
    states = [s.route("r0") for s in snapshots]
    for prev, cur in zip(states, states[1:]):
        assert cur.drafts_total >= prev.drafts_total and cur.accepted_tokens_total >= prev.accepted_tokens_total
    for snapshot in snapshots:
        state = snapshot.route("r0")
        assert_sane_route(state)
        assert state.degraded is not True
        assert all(math.isfinite(v) for v in exported(snapshot).values())
    # Totals keep counting the real traffic (one poisoned sample is skipped, not a restart from zero).
    assert states[-1].drafts_total > states[29].drafts_total


class ExplodedSource:
    """One route whose engine reports 10,000 DP engines (label values), each counting up cheaply."""

    def __init__(self, engines: int = 10_000) -> None:
        self.engines = engines
        self.calls = 0

    def sample(self, now: float) -> EngineSample:
        self.calls += 1
        n = 10.0 * self.calls
        counters = tuple(EngineCounters(engine=str(i), drafts=n, draft_tokens=4 * n, accepted_tokens=2 * n,
                                        accepted_per_pos=(0.8 * n, 0.6 * n, 0.4 * n, 0.2 * n), running=1.0)
                         for i in range(self.engines))
        return EngineSample(ts=now, engine_kind="vllm", acceptance_source="counter", model_name="llama",
                            engine_version="0.33.0", num_speculative_tokens=4, engines=counters)

    def close(self) -> None:
        pass


def test_label_explosion_is_bounded_in_output_and_time(tmp_path):
    """10,000 engines on one route: /metrics stays per route, and the cycle stays cheap."""
    source = ExplodedSource()
    clock = FakeClock()
    daemon = Daemon(make_config(tmp_path), source_factory=lambda r, c: source, clock=clock)
    try:
        snapshots = run_cycles(daemon, clock, 3)
    finally:
        daemon.close()
    samples = exported(snapshots[-1])
    assert len(samples) < 200, "series must not scale with the engine's label values"
    state = snapshots[-1].route("r0")
    assert state.up and state.acceptance_ratio["1m"] == pytest.approx(0.5)
    # Building the 10,000-engine sample is included; still far inside the 5 s interval on a shared CI box.
    assert max(s.evaluation_duration_seconds for s in snapshots) < 2.0


def test_gpu_lost_mid_run_costs_only_that_gpu(tmp_path):
    nvml = fake_nvml.gpu_lost_mid_run()
    engine = SimulatedEngine(seed=5)
    clock = FakeClock()
    config = make_config(tmp_path, gpu={"enabled": "true"})
    daemon = Daemon(config, source_factory=lambda r, c: engine, clock=clock,
                    gpu_source_factory=lambda g: nvml_source.make_gpu_source(g, nvml=nvml))
    try:
        healthy = run_cycles(daemon, clock, 3)[-1]
        nvml.gpus[1].lost = True
        lost = run_cycles(daemon, clock, 3)[-1]
        nvml.gpus[1].lost = False
        back = run_cycles(daemon, clock, 3)[-1]
    finally:
        daemon.close()
    up = {(s.index): s.up for s in healthy.gpus}
    assert up == {0: True, 1: True} and healthy.nvml_up
    metrics = exported(lost)
    assert lost.nvml_up and metrics[("specwatch_gpu_up", (("gpu", "1"),))] == 0.0
    assert metrics[("specwatch_gpu_up", (("gpu", "0"),))] == 1.0
    assert not any(name.startswith("specwatch_gpu_") and name not in ("specwatch_gpu_up", "specwatch_gpu_info")
                   and ("gpu", "1") in labels
                   for name, labels in metrics), "a lost GPU exports no stale field values"
    assert any(name == "specwatch_gpu_power_watts" and ("gpu", "0") in labels for name, labels in metrics)
    assert lost.route("r0").up  # the engine routes are not affected
    assert {s.index: s.up for s in back.gpus} == {0: True, 1: True}


def test_state_db_corrupted_under_a_running_daemon_is_moved_aside_at_the_next_start(tmp_path):
    engine = SimulatedEngine(seed=6)
    clock = FakeClock()
    daemon = Daemon(make_config(tmp_path), source_factory=lambda r, c: engine, clock=clock)
    try:
        learned = run_cycles(daemon, clock, 60)[-1].route("r0").baseline_ratio
        for name in (DB_NAME, f"{DB_NAME}-wal"):  # scribble over the live files in place, as a bad disk would
            path = tmp_path / name
            path.write_bytes(random.Random(0).randbytes(path.stat().st_size))
        running = run_cycles(daemon, clock, 30)  # past the 60 s persist period: the store writes again
    finally:
        daemon.close()
    # SQLite works from its cache and WAL index: the running daemon carries on with what it knows.
    assert learned is not None
    assert all(s.route("r0").up and s.route("r0").baseline_ratio is not None for s in running)
    assert not any(s.route("r0").degraded for s in running)

    restarted = Daemon(make_config(tmp_path), source_factory=lambda r, c: engine, clock=clock)
    try:
        after = run_cycles(restarted, clock, 60)
    finally:
        restarted.close()
    assert after[-1].state_errors_total == 1, "the corrupt file is reported once"
    assert list(tmp_path.glob(f"{DB_NAME}.corrupt-*")), "and kept aside for a post-mortem"
    assert all(s.route("r0").up for s in after) and after[-1].route("r0").baseline_ratio is not None  # relearned
    errors: list[str] = []
    reopened = BaselineStore.in_state_dir(str(tmp_path), errors)
    try:
        assert errors == [] and reopened.route_state("r0") is not None  # the fresh file is healthy and in use
    finally:
        reopened.close()


# ---------------------------------------------------------------------------- state on a read-only or full disk
_CHILD = textwrap.dedent("""
    import json, resource, sys
    sys.path.insert(0, sys.argv[1])
    from test_faults import FakeClock, SimulatedEngine, make_config, run_cycles
    from specwatch.daemon import Daemon
    state_dir, mode = sys.argv[2], sys.argv[3]
    engines = {}
    clock = FakeClock()
    daemon = Daemon(make_config(state_dir, routes=8), clock=clock,
                    source_factory=lambda r, c: engines.setdefault(r.name, SimulatedEngine(seed=len(engines))))
    report = {}
    run_cycles(daemon, clock, 2)
    if mode == "full":
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        # No file in the state dir may grow past its current size: every write that extends one fails (EFBIG).
        resource.setrlimit(resource.RLIMIT_FSIZE, (1, hard))
    snaps = run_cycles(daemon, clock, 60)
    report["during"] = [[s.route(f"r{i}").up for i in range(8)] for s in snaps]
    report["degraded"] = any(s.route(f"r{i}").degraded for s in snaps for i in range(8))
    report["baselines"] = sum(s.route(f"r{i}").baseline_ratio is not None for s in snaps[-1:] for i in range(8))
    report["errors_during"] = snaps[-1].state_errors_total
    if mode == "full":
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        snaps = run_cycles(daemon, clock, 30)
        report["errors_after"] = snaps[-1].state_errors_total
        snaps = run_cycles(daemon, clock, 30)
        report["errors_later"] = snaps[-1].state_errors_total
    daemon.close()
    print(json.dumps(report))
""")


def _run_child(state_dir: str, mode: str, prefix: Sequence[str] = ()) -> dict[str, Any]:
    proc = subprocess.run([*prefix, sys.executable, "-c", _CHILD, str(REPO / "tests"), state_dir, mode],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_full_disk_counts_state_errors_and_recovers_without_corruption(tmp_path):
    report = _run_child(str(tmp_path), "full")
    assert all(all(up) for up in report["during"]), "a full disk must not take routes down"
    assert report["baselines"] == 8 and not report["degraded"], "detection goes on in memory"
    assert report["errors_during"] >= 1
    # Space back: the store writes again, so the error counter stops climbing.
    assert report["errors_later"] == report["errors_after"]
    errors: list[str] = []
    store = BaselineStore.in_state_dir(str(tmp_path), errors)
    try:
        assert errors == [], "the file the failed writes left behind is a valid database"
        assert set(store.routes()) >= {f"r{i}" for i in range(8)}
    finally:
        store.close()


def test_read_only_state_dir_keeps_detecting_in_memory(tmp_path):
    state_dir = tmp_path / "state"
    BaselineStore.in_state_dir(str(state_dir)).close()  # an existing database, as after an upgrade
    state_dir.chmod(0o555)
    (state_dir / DB_NAME).chmod(0o444)
    # Root ignores file modes: as root the child runs without the DAC-override capabilities.
    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv(1): a read-only directory cannot be simulated")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
    try:
        report = _run_child(str(state_dir), "read_only", prefix=prefix)
    finally:
        state_dir.chmod(0o755)
    assert all(all(up) for up in report["during"])
    assert report["baselines"] == 8 and not report["degraded"]
    assert report["errors_during"] >= 1  # exported as specwatch_state_errors_total, so it can be alerted on
