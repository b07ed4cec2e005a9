"""Fault injection: every fault the daemon must survive, and the behaviour specwatch must show under it.

Each test asserts what the operator sees (route up/down, the error reason, totals that never go backwards, no
acceptance page, a state file that survives), not merely that nothing raised. Faults already covered well
elsewhere are referenced rather than duplicated. This index is the one place that maps each fault to its tests
(in this file unless another is named); `test_the_fault_index_names_only_existing_tests` keeps it honest.

engine killed and restarted (counters reset, no negative rate, no acceptance page)
    test_engine_restart_resets_counters_without_negative_rates_or_a_page
    test_tracking.py::test_two_engine_vllm_sequence_with_restart_sums_exactly_and_never_goes_backwards
engine killed mid-response (body shorter than its Content-Length)
    test_http_response_cut_short_is_a_failed_scrape_not_a_partial_sample
engine hanging (timeout)
    test_http_hanging_engine_times_out_and_the_loop_goes_on
    test_http_hung_engines_listed_first_mark_no_healthy_route_down_from_the_first_cycle
    test_cli_core.py::test_run_stops_in_seconds_on_sigterm_while_an_nvml_call_hangs
    test_daemon.py::test_failing_sources_cost_only_their_route_and_metrics_still_answer
slow-drip response
    test_http_slow_drip_is_cut_at_the_scrape_timeout
100 MB body (capped, source down)
    test_http_100mb_body_is_capped_and_the_route_is_down
binary garbage, HTML error page, invalid UTF-8
    test_http_bad_bodies_are_parse_errors
    test_http_html_error_status_is_http_status
duplicate series
    test_http_duplicate_series_do_not_double_count
NaN / Inf / negative counter values
    test_non_finite_and_negative_counters_never_poison_totals
    test_http_nan_inf_negative_values_are_survived
    test_tracking.py::test_nan_and_infinite_values_never_poison_the_sums
one impossible counter sample (2^64, a jump no engine makes, more accepted than drafted)
    test_rejected_samples.py::test_one_bogus_counter_sample_is_rejected_and_tracking_resumes
    test_rejected_samples.py::test_a_bogus_persisted_learner_starts_afresh_on_restart
label explosion (10,000 series)
    test_label_explosion_is_bounded_in_output_and_time
    test_http_label_explosion_10000_series
NVML GPU lost mid-run
    test_gpu_lost_mid_run_costs_only_that_gpu
    test_nvml.py::test_lost_gpu_is_down_while_the_others_continue_and_comes_back
state database corrupted
    test_state_db_corrupted_under_a_running_daemon_is_moved_aside_while_it_runs
    test_baselines.py::test_corrupt_file_is_moved_aside_and_counted
    test_state_store.py::test_corruption_while_running_is_noticed_and_nothing_is_lost
    test_state_store.py::test_commands_leave_a_corrupt_file_to_the_daemon
    test_state_store.py::test_the_daemon_writes_a_new_file_when_its_file_is_moved_and_sees_later_commands
    test_baselines.py::test_truncated_database_is_recovered
state directory read-only
    test_read_only_state_dir_keeps_detecting_in_memory
    test_baselines.py::test_unwritable_state_dir_keeps_working_in_memory
    test_state_store.py::test_a_read_only_state_dir_is_still_read_and_writes_are_counted
state on a full disk
    test_full_disk_counts_state_errors_and_recovers_without_corruption
    test_state_store.py::test_a_full_disk_logs_recovery_only_after_a_write_succeeds
    test_full_disk_at_start_is_retried_and_the_file_gets_what_was_learned
    test_state_store.py::test_a_state_dir_unusable_at_start_is_retried_and_gets_what_was_learned
kill -9 during a baseline write, then restart (baseline intact)
    test_baselines.py::test_kill_minus_nine_mid_write_keeps_last_committed
SIGHUP with a broken config (old config keeps running, reload metric 0)
    test_service_e2e.py::test_sighup_rejects_a_broken_config_and_applies_a_good_one
    test_cli_core.py::test_run_serves_reloads_on_sighup_and_stops_cleanly_on_sigterm
wall clock jumping backwards
    test_wall_clock_jumping_backwards_never_rewinds_totals_or_pages
    test_nvml.py::test_retries_follow_the_monotonic_clock_not_the_wall_clock_passed_in
fuzzed exposition bodies (parses or raises one error type, never hangs)
    test_fuzz_exposition.py::test_random_bytes_parse_or_raise_the_one_error
    test_fuzz_exposition.py::test_mutated_real_captures_parse_or_raise_the_one_error
    test_fuzz_exposition.py::test_the_engine_parse_path_raises_only_source_errors
hostile clients of specwatch's own HTTP server (bench/http_load.py and bench/http_servers.py measure the p99 under load)
    test_http_server.py::test_the_listen_backlog_is_the_kernels_maximum_not_five
    test_http_server.py::test_idle_connections_cost_no_thread_and_a_scrape_is_still_answered
    test_http_server.py::test_a_client_that_sends_its_request_slowly_is_cut_at_the_head_timeout
    test_http_server.py::test_connections_beyond_the_cap_are_answered_503_and_served_again_once_some_close
    test_http_server.py::test_oversized_or_too_many_header_fields_get_431
    test_http_server.py::test_a_body_sent_with_a_get_is_read_and_dropped_not_taken_for_a_second_request
    test_http_server.py::test_plain_http_to_the_tls_port_is_closed_unanswered_and_https_still_served
    test_http_server.py::test_scrapes_are_answered_while_hostile_clients_hold_connections
    test_webconfig.py::test_a_cached_right_password_is_not_held_up_by_wrong_ones_being_checked
hostile admin requests (a scrape account, a cross-origin page, a foreign Host) change nothing and are logged
    test_admin_protections.py::test_a_scrape_user_may_scrape_but_is_refused_admin_and_an_admin_user_may_act
    test_admin_protections.py::test_without_auth_a_cross_origin_text_plain_or_form_post_is_refused
    test_admin_protections.py::test_a_foreign_origin_is_refused_and_the_own_or_an_allowed_origin_served
    test_admin_protections.py::test_a_foreign_host_is_refused_on_every_path_when_allowed_hosts_is_set
    test_admin_protections.py::test_every_admin_request_is_logged_with_user_remote_route_and_before_after
soak (no RSS, fd or thread growth; the full runs are bench/soak.py)
    test_soak_smoke_accelerated_two_hours_of_eight_routes_stays_flat
fleet Prometheus (seed_from) trickling, hanging, huge, or answering NaN / Inf / out-of-range baselines
    test_fleet_seed_guards.py::test_a_bad_prometheus_never_slows_a_cycle_and_stores_nothing
    test_fleet_seed_guards.py::test_sigterm_does_not_wait_for_a_hanging_prometheus
    test_fleet_seed_guards.py::test_a_stored_poisoned_seed_is_not_used_after_a_restart_and_the_route_heals

The HTTP-level tests drive the real engine source (`specwatch.sources.engines.make_source`) against loopback
servers; in a build without it they are skipped, saying so.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import resource
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Sequence

import pytest

from specwatch import daemon as daemon_module
from specwatch.config import parse_config
from specwatch.daemon import Daemon
from specwatch.export.prometheus import render_families
from specwatch.snapshot import EngineCounters, EngineSample, Snapshot
from specwatch.sources import nvml as nvml_source
from specwatch.sources.base import SourceError
from specwatch.state.store import DB_NAME, StateStore
from testbed import fake_nvml
from fakes import FakeClock, vllm_sample

REPO = Path(__file__).resolve().parent.parent
START = 1_800_000_000.0
INTERVAL = 5.0
# Detection tuned so a baseline is learned in minutes of fake time (the defaults want 30 minutes of traffic).
FAST_DETECTION = {
    "warmup_duration": "2m",
    "warmup_drafted_tokens": 2000,
    "min_duration": "1m",
    "min_drafted_tokens": 500,
}


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
                reached = sum(
                    1 for _ in range(int(reached)) if self.rng.random() < p / (self.POSITIONS[j - 1] if j else 1.0)
                )
                e["per_pos"][j] += reached
            drafts, accepted = e["drafts"], sum(e["per_pos"])
            if self.poison is not None:
                drafts = accepted = self.poison
            counters.append(
                EngineCounters(
                    engine=str(index),
                    drafts=drafts,
                    draft_tokens=self.K * drafts,
                    accepted_tokens=accepted,
                    accepted_per_pos=tuple(e["per_pos"]),
                    created=e["created"],
                    running=8.0,
                    kv_usage=0.3,
                )
            )
        self.poison = None
        return vllm_sample(now, counters, self.K, model_name="llama")

    def close(self) -> None:
        self.closed = True


def make_config(state_dir: Path | str, routes: int = 1, **top: Any) -> Any:
    raw = {
        "interval": f"{INTERVAL:g}s",
        "state_dir": str(state_dir),
        "scrape": {"timeout": "2s"},  # in-process engines answer at once; 2 s leaves room for a loaded host
        "gpu": {"enabled": "false"},
        "detection": FAST_DETECTION,
        "routes": [
            {"name": f"r{i}", "url": f"http://127.0.0.1:9/r{i}", "crossover": {"batch_size": 16}} for i in range(routes)
        ],
        **top,
    }
    return parse_config(raw)


def exported(snapshot: Snapshot) -> dict[tuple[str, tuple], float]:
    """The /metrics samples of a snapshot, keyed by (name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in render_families(snapshot)
        for s in family.samples
    }


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
    clock = FakeClock(START)
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
    clock = FakeClock(START)
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
    store = StateStore.in_state_dir(str(tmp_path))
    try:
        state = store.route_state("r0")
        assert state is not None
    finally:
        store.close()


def test_non_finite_and_negative_counters_never_poison_totals(tmp_path):
    engine = SimulatedEngine(seed=3)
    clock = FakeClock(START)
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
        counters = tuple(
            EngineCounters(
                engine=str(i),
                drafts=n,
                draft_tokens=4 * n,
                accepted_tokens=2 * n,
                accepted_per_pos=(0.8 * n, 0.6 * n, 0.4 * n, 0.2 * n),
                running=1.0,
            )
            for i in range(self.engines)
        )
        return vllm_sample(now, counters, 4, model_name="llama")

    def close(self) -> None:
        pass


@pytest.mark.slow
def test_label_explosion_is_bounded_in_output_and_time(tmp_path):
    """10,000 engines on one route: /metrics stays per route, and the cycle stays cheap."""
    source = ExplodedSource()
    clock = FakeClock(START)
    # Building 10,000 engines' counters takes the source a while on a loaded box: give the scrape the most the
    # interval allows, so what is judged is the daemon's output and CPU, not the wall clock.
    config = make_config(tmp_path, scrape={"timeout": "4900ms"})
    daemon = Daemon(config, source_factory=lambda r, c: source, clock=clock)
    cpu = time.process_time()
    try:
        snapshots = run_cycles(daemon, clock, 3)
    finally:
        daemon.close()
    cpu_per_cycle = (time.process_time() - cpu) / 3
    samples = exported(snapshots[-1])
    assert len(samples) < 200, "series must not scale with the engine's label values"
    state = snapshots[-1].route("r0")
    assert state.up and state.acceptance_ratio["1m"] == pytest.approx(0.5)
    # Building the 10,000-engine sample is included. CPU time, not wall time: other work on a loaded machine
    # stretches the wall clock, not this process's CPU; the bound catches worse than linear, not noise.
    assert cpu_per_cycle < 2.0, f"{cpu_per_cycle:.2f} CPU seconds a cycle"


def test_gpu_lost_mid_run_costs_only_that_gpu(tmp_path):
    nvml = fake_nvml.gpu_lost_mid_run()
    engine = SimulatedEngine(seed=5)
    clock = FakeClock(START)
    config = make_config(tmp_path, gpu={"enabled": "true"})
    daemon = Daemon(
        config,
        source_factory=lambda r, c: engine,
        clock=clock,
        gpu_source_factory=lambda g: nvml_source.make_gpu_source(g, nvml=nvml),
    )
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
    assert not any(
        name.startswith("specwatch_gpu_")
        and name not in ("specwatch_gpu_up", "specwatch_gpu_info")
        and ("gpu", "1") in labels
        for name, labels in metrics
    ), "a lost GPU exports no stale field values"
    assert any(name == "specwatch_gpu_power_watts" and ("gpu", "0") in labels for name, labels in metrics)
    assert lost.route("r0").up  # the engine routes are not affected
    assert {s.index: s.up for s in back.gpus} == {0: True, 1: True}


def test_state_db_corrupted_under_a_running_daemon_is_moved_aside_while_it_runs(tmp_path):
    engine = SimulatedEngine(seed=6)
    clock = FakeClock(START)
    daemon = Daemon(make_config(tmp_path), source_factory=lambda r, c: engine, clock=clock)
    try:
        learned = run_cycles(daemon, clock, 60)[-1].route("r0").baseline_ratio
        for name in (DB_NAME, f"{DB_NAME}-wal"):  # scribble over the live files in place, as a bad disk would
            path = tmp_path / name
            path.write_bytes(random.Random(0).randbytes(path.stat().st_size))
        running = run_cycles(daemon, clock, 30)  # past the 60 s persist period: the store checks its file
    finally:
        daemon.close()
    assert learned is not None
    assert all(s.route("r0").up and s.route("r0").baseline_ratio is not None for s in running)
    assert not any(s.route("r0").degraded for s in running)
    assert running[-1].state_errors_total == 1, "the corrupt file is reported once, while running"
    assert list(tmp_path.glob(f"{DB_NAME}.corrupt-*")), "and kept aside for a post-mortem"

    restarted = Daemon(make_config(tmp_path), source_factory=lambda r, c: engine, clock=clock)
    try:
        after = run_cycles(restarted, clock, 5)
    finally:
        restarted.close()
    assert after[-1].state_errors_total == 0, "the fresh file is healthy"
    assert all(s.route("r0").baseline_ratio is not None for s in after), "and it held the baseline: not relearned"


# ---------------------------------------------------------------------------- state on a read-only or full disk
_CHILD = textwrap.dedent("""
    import json, os, resource, sys
    sys.path[:0] = [sys.argv[1], os.path.dirname(sys.argv[1])]  # tests/, and the checkout for testbed/
    from test_faults import START, FakeClock, SimulatedEngine, make_config, run_cycles
    from specwatch.daemon import Daemon
    state_dir, mode = sys.argv[2], sys.argv[3]
    engines = {}
    clock = FakeClock(START)
    if mode == "full_at_start":  # the daemon cannot even write its new state file's header
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1, hard))
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
    if mode in ("full", "full_at_start"):
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        snaps = run_cycles(daemon, clock, 30)
        report["errors_after"] = snaps[-1].state_errors_total
        snaps = run_cycles(daemon, clock, 30)
        report["errors_later"] = snaps[-1].state_errors_total
    daemon.close()
    print(json.dumps(report))
""")


def _run_child(state_dir: str, mode: str, prefix: Sequence[str] = ()) -> dict[str, Any]:
    proc = subprocess.run(
        [*prefix, sys.executable, "-c", _CHILD, str(REPO / "tests"), state_dir, mode],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_full_disk_counts_state_errors_and_recovers_without_corruption(tmp_path):
    report = _run_child(str(tmp_path), "full")
    assert all(all(up) for up in report["during"]), "a full disk must not take routes down"
    assert report["baselines"] == 8 and not report["degraded"], "detection goes on in memory"
    assert report["errors_during"] >= 1
    # Space back: the store writes again, so the error counter stops climbing.
    assert report["errors_later"] == report["errors_after"]
    errors: list[str] = []
    store = StateStore.in_state_dir(str(tmp_path), errors)
    try:
        assert errors == [], "the file the failed writes left behind is a valid database"
        assert set(store.routes()) >= {f"r{i}" for i in range(8)}
    finally:
        store.close()


@pytest.mark.slow
def test_full_disk_at_start_is_retried_and_the_file_gets_what_was_learned(tmp_path):
    report = _run_child(str(tmp_path), "full_at_start")
    assert all(all(up) for up in report["during"]) and not report["degraded"]
    assert report["baselines"] == 8 and report["errors_during"] >= 1, "learned in memory, the failures counted"
    assert report["errors_later"] == report["errors_after"], "space back: opened again, errors stop climbing"
    errors: list[str] = []
    store = StateStore.in_state_dir(str(tmp_path), errors)
    try:
        assert errors == [] and set(store.routes()) == {f"r{i}" for i in range(8)}
        assert len(store.baselines()) == 8, "the baselines learned while the disk was full reached the file"
    finally:
        store.close()


@pytest.mark.slow
def test_read_only_state_dir_keeps_detecting_in_memory(tmp_path):
    state_dir = tmp_path / "state"
    StateStore.in_state_dir(str(state_dir)).close()  # an existing database, as after an upgrade
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


# ============================================================================ HTTP-level faults (real engine source)
HTTP_TIMEOUT = 0.5
GENEROUS_TIMEOUT = "4.5s"  # under the configs' 5 s interval; for faults that must not end in a timeout


def vllm_text(
    drafts: float = 1000.0,
    engines: Sequence[str] = ("0",),
    per_pos: Sequence[float] = (0.8, 0.6, 0.45, 0.3),
    value: str | None = None,
    duplicate: bool = False,
) -> str:
    """A vLLM V1 exposition with the spec-decode families (k=4). `value` replaces every counter value verbatim
    (e.g. "NaN"); `duplicate` repeats every sample line, as a broken multi-process merge would."""
    families = {
        "vllm:spec_decode_num_drafts": lambda d: [("", d)],
        "vllm:spec_decode_num_draft_tokens": lambda d: [("", 4 * d)],
        "vllm:spec_decode_num_accepted_tokens": lambda d: [("", d * sum(per_pos))],
        "vllm:spec_decode_num_accepted_tokens_per_pos": lambda d: [
            (f',position="{j}"', d * p) for j, p in enumerate(per_pos)
        ],
    }
    lines = []
    for name, series in families.items():
        lines += [f"# HELP {name} {name}", f"# TYPE {name} counter"]
        for engine in engines:
            for extra, v in series(drafts):
                line = f'{name}_total{{engine="{engine}",model_name="m"{extra}}} {value if value else repr(float(v))}'
                lines += [line, line] if duplicate else [line]
    lines += ["# HELP vllm:num_requests_running running", "# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{engine="{e}",model_name="m"}} 4.0' for e in engines]
    return "\n".join(lines) + "\n"


class FaultServer:
    """Loopback engine endpoints, one fault per path. `release` ends hanging and dripping handlers."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.bodies: dict[str, bytes] = {}
        self.drafts = 1000.0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - stdlib naming
                path = self.path.rstrip("/")
                try:
                    if path.endswith("/version"):
                        self._send(404, b"no", "text/plain")
                    elif path == "/hang":
                        server.release.wait(10)  # bounded, so a source without a timeout fails the test, not CI
                    elif path == "/drip":
                        self.send_response(200)
                        self.send_header("Content-Type", "text/plain")
                        self.end_headers()
                        # One byte every 50 ms for 10 s: every read makes progress, only a total deadline helps.
                        for char in vllm_text().encode()[:200]:
                            if server.release.wait(0.05):
                                return
                            self.wfile.write(bytes([char]))
                            self.wfile.flush()
                    elif path in ("/huge", "/huge_undeclared"):
                        self.send_response(200)
                        self.send_header("Content-Type", "text/plain")
                        if path == "/huge":
                            self.send_header("Content-Length", str(100 * 2**20))
                        else:  # no length: the body ends when the connection closes, so only reading tells
                            self.send_header("Connection", "close")
                            self.close_connection = True
                        self.end_headers()
                        chunk = vllm_text().encode() * 64
                        sent = 0
                        while sent < 100 * 2**20 and not server.release.is_set():
                            self.wfile.write(chunk)
                            sent += len(chunk)
                    elif path == "/cut":  # the engine dies mid-response: fewer bytes than Content-Length
                        body = vllm_text().encode()
                        self.send_response(200)
                        self.send_header("Content-Type", "text/plain")
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        self.wfile.write(body[: len(body) // 2])
                        self.close_connection = True
                    elif path == "/ok":
                        server.drafts += 500
                        self._send(200, vllm_text(server.drafts).encode(), "text/plain; version=0.0.4")
                    else:
                        status, body, kind = server.bodies[path]
                        self._send(status, body, kind)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up, which is what these faults are for

            def _send(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def serve(self, path: str, body: bytes | str, status: int = 200, kind: str = "text/plain; version=0.0.4") -> str:
        self.bodies[path] = (status, body.encode() if isinstance(body, str) else body, kind)
        return self.url(path)

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def engines():
    from specwatch.sources import engines

    return engines


@pytest.fixture
def fault_server():
    server = FaultServer()
    yield server
    server.close()


def http_config(*urls: str, **scrape: Any) -> Any:
    return parse_config(
        {
            "interval": "5s",
            "state_dir": "/nonexistent-specwatch-test",
            "gpu": {"enabled": "false"},
            "scrape": {"timeout": f"{HTTP_TIMEOUT * 1000:g}ms", **scrape},
            "routes": [{"name": f"r{i}", "url": url, "engine": "vllm"} for i, url in enumerate(urls)],
        }
    )


def scrape_once(engines: Any, url: str, **scrape: Any) -> tuple[Any, float]:
    """One sample through the real source: (EngineSample or the SourceError raised, seconds taken)."""
    config = http_config(url, **scrape)
    source = engines.make_source(config.routes[0], config)
    begin = time.monotonic()
    try:
        result: Any = source.sample(START)
    except SourceError as exc:
        result = exc
    finally:
        source.close()
    return result, time.monotonic() - begin


@pytest.mark.slow
def test_http_hanging_engine_times_out_and_the_loop_goes_on(engines, fault_server, monkeypatch):
    result, took = scrape_once(engines, fault_server.url("/hang"))
    assert isinstance(result, SourceError) and result.reason == "timeout"
    assert took < HTTP_TIMEOUT + 1.0
    # Through the daemon: the healthy route beside it keeps counting, the hung one is down with reason timeout.
    monkeypatch.setattr(daemon_module, "build_route_evaluators", lambda ctx, route: [])
    config = http_config(fault_server.url("/hang"), fault_server.url("/ok"))
    clock = FakeClock(START)
    daemon = Daemon(config, clock=clock)
    try:
        begin = time.monotonic()
        snapshots = run_cycles(daemon, clock, 3)
        took = time.monotonic() - begin
    finally:
        daemon.close()
    assert took < 3 * (daemon_module.DEADLINE_FACTOR * HTTP_TIMEOUT + 1.0)
    hung, ok = snapshots[-1].route("r0"), snapshots[-1].route("r1")
    assert not hung.up and hung.error_reason == "timeout" and hung.errors_total["timeout"] == 3
    assert ok.up and ok.drafts_total > snapshots[0].route("r1").drafts_total


@pytest.mark.slow
def test_http_hung_engines_listed_first_mark_no_healthy_route_down_from_the_first_cycle(engines, monkeypatch):
    """8 routes on an engine that accepts and never answers, listed before 8 healthy ones, over real HTTP: every
    healthy route is up in every cycle, the first included, when no route has shown yet whether it is quick.
    Executors that queued calls behind hung ones had healthy routes down there (docs/benchmarks.md)."""
    from specwatch.simulator.hostile import HostileEngines

    monkeypatch.setattr(daemon_module, "build_route_evaluators", lambda ctx, route: [])
    hostile = HostileEngines(["silent"])
    hung = [hostile.url("silent").replace("/metrics", f"/h{i}/metrics") for i in range(8)]
    healthy = [hostile.url("healthy").replace("/metrics", f"/ok{i}/metrics") for i in range(8)]
    # A timeout generous for a loaded 2-core box: a healthy loopback scrape takes milliseconds.
    clock = FakeClock(START)
    daemon = Daemon(http_config(*hung, *healthy, timeout="2s"), clock=clock)
    try:
        for cycle, snapshot in enumerate(run_cycles(daemon, clock, 2)):
            routes = snapshot.routes
            down = [(r.name, r.error_reason) for r in routes[len(hung) :] if not r.up]
            assert not down, f"cycle {cycle + 1}: healthy routes down {down}"
            assert all(r.error_reason == "timeout" for r in routes[: len(hung)]), cycle
    finally:
        daemon.close()
        hostile.close()


@pytest.mark.slow
def test_http_slow_drip_is_cut_at_the_scrape_timeout(engines, fault_server):
    """Every read makes progress, so only a deadline on the whole response stops it (not a per-read timeout)."""
    result, took = scrape_once(engines, fault_server.url("/drip"))
    assert isinstance(result, SourceError) and result.reason == "timeout"
    assert took < HTTP_TIMEOUT + 1.0


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/huge", "/huge_undeclared"])
def test_http_100mb_body_is_capped_and_the_route_is_down(engines, fault_server, path):
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # A generous timeout: on a loaded box the cap must still be what ends the scrape, never the clock.
    result, took = scrape_once(engines, fault_server.url(path), max_body_bytes=1 << 20, timeout=GENEROUS_TIMEOUT)
    assert isinstance(result, SourceError) and result.reason == "too_large", result
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
    assert grown_mib < 32, f"the body must be streamed and cut at the cap, not read whole ({grown_mib:.0f} MiB)"


@pytest.mark.slow
def test_a_refused_body_is_not_kept_alive_by_the_error_kept_for_the_cycle(engines, fault_server):
    """Routes of one cycle share their endpoint's outcome, kept until the next cycle. A kept error must not carry
    its traceback: the failed call's frames would hold what the hostile engine sent (here 1 MiB, up to the
    cap, on every hostile route) for a whole cycle."""
    config = http_config(fault_server.url("/huge"), max_body_bytes=1 << 20, timeout="2s")
    source = engines.make_source(config.routes[0], config)
    try:
        with pytest.raises(SourceError) as raised:
            source.sample(START)
        assert raised.value.reason == "too_large"
        kept = source.endpoint._body  # noqa: SLF001 - what the endpoint keeps for the cycle's other routes
        assert isinstance(kept, SourceError)
        assert kept.__traceback__ is None and kept.__context__ is None
    finally:
        source.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, body, kind",
    [
        ("garbage", random.Random(7).randbytes(64 * 1024), "application/octet-stream"),
        (
            "html_200",
            "<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head><body><h1>502</h1></body></html>",
            "text/html",
        ),
        (
            "invalid_utf8",
            vllm_text().encode().replace(b'model_name="m"', b'model_name="\xff\xfe\xc3("', 1),
            "text/plain",
        ),
    ],
)
def test_http_bad_bodies_are_parse_errors(engines, fault_server, name, body, kind):
    # A generous timeout: the body, not a loaded box's clock, must be what fails the scrape.
    result, took = scrape_once(engines, fault_server.serve(f"/{name}", body, kind=kind), timeout=GENEROUS_TIMEOUT)
    assert isinstance(result, SourceError), f"{name}: {result!r}"
    assert result.reason in ("parse", "no_spec_metrics"), f"{name}: {result.reason}: {result}"
    assert str(result), "the message says what was wrong"


@pytest.mark.slow
def test_http_response_cut_short_is_a_failed_scrape_not_a_partial_sample(engines, fault_server):
    result, _ = scrape_once(engines, fault_server.url("/cut"), timeout=GENEROUS_TIMEOUT)
    assert isinstance(result, SourceError) and result.reason in ("connection", "parse"), repr(result)


@pytest.mark.slow
def test_http_html_error_status_is_http_status(engines, fault_server):
    url = fault_server.serve("/html_503", "<html><body>Service Unavailable</body></html>", status=503, kind="text/html")
    result, _ = scrape_once(engines, url, timeout=GENEROUS_TIMEOUT)
    assert isinstance(result, SourceError) and result.reason == "http_status" and "503" in str(result)


@pytest.mark.slow
def test_http_duplicate_series_do_not_double_count(engines, fault_server):
    result, _ = scrape_once(
        engines, fault_server.serve("/dup", vllm_text(1000.0, duplicate=True)), timeout=GENEROUS_TIMEOUT
    )
    if isinstance(result, SourceError):  # refusing the scrape, as Prometheus does, is acceptable
        assert result.reason == "parse"
        return
    (engine,) = result.engines
    assert engine.drafts == 1000.0 and engine.draft_tokens == 4000.0, "a duplicated series is not summed"


@pytest.mark.slow
def test_http_too_many_series_is_refused_unparsed_with_its_own_reason(engines, fault_server):
    """A label explosion past scrape.max_series (default 100,000) is refused before its lines are read: the route is
    down with reason too_many_series, not `timeout` from parsing 200,000 series every cycle."""
    line = 'vllm:spec_decode_num_drafts_total{{engine="{}",model_name="m"}} 1.0\n'
    body = "".join(line.format(i) for i in range(200_000))
    url = fault_server.serve("/explosion", body)
    # A body cap above its 14 MB (the default 4 MiB would refuse it first, as too_large): the series count decides.
    result, _ = scrape_once(engines, url, timeout="4.5s", max_body_bytes=16 << 20)
    assert isinstance(result, SourceError) and result.reason == "too_many_series", repr(result)
    assert "100000" in str(result)


class ScheduledSource:
    """Scrapes `sources[schedule[i]]` on call i: one route whose engine answers well, then badly, then well."""

    def __init__(self, sources: Sequence[Any], schedule: Sequence[int]) -> None:
        self.sources, self.schedule = sources, iter(schedule)

    def sample(self, now: float) -> EngineSample:
        return self.sources[next(self.schedule)].sample(now)

    def close(self) -> None:
        for source in self.sources:
            source.close()


@pytest.mark.slow
@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "-5.0"])
def test_http_nan_inf_negative_values_are_survived(engines, fault_server, value, monkeypatch):
    monkeypatch.setattr(daemon_module, "build_route_evaluators", lambda ctx, route: [])
    good = fault_server.url("/ok")
    bad = fault_server.serve("/bad", vllm_text(value=value))
    config = http_config(good)
    clock = FakeClock(START)
    route = config.routes[0]
    source = ScheduledSource(
        [engines.make_source(route, config), engines.make_source(dataclasses.replace(route, url=bad), config)],
        schedule=[0, 0, 1, 1, 0, 0],
    )
    daemon = Daemon(config, clock=clock, source_factory=lambda r, c: source)
    try:
        snapshots = run_cycles(daemon, clock, 6)
    finally:
        daemon.close()
    totals = [s.route("r0").drafts_total for s in snapshots]
    assert totals == sorted(totals) and all(math.isfinite(t) for t in totals)
    for snapshot in snapshots:
        assert all(math.isfinite(v) for v in exported(snapshot).values())
        assert_sane_route(snapshot.route("r0"))
    assert snapshots[-1].route("r0").up


@pytest.mark.slow
def test_http_label_explosion_10000_series(engines, fault_server):
    engine_labels = [str(i) for i in range(10_000)]
    noise = "".join(f'vllm:unrelated_total{{engine="{i}",model_name="m",x="{i}"}} 1.0\n' for i in range(10_000))
    for path, body in (
        ("/many_engines", vllm_text(10.0, engines=engine_labels)),
        ("/many_unrelated", "# TYPE vllm:unrelated counter\n" + noise + vllm_text(10.0)),
    ):
        cpu = time.process_time()
        # A body cap above its 6.7 MB (the default 4 MiB would refuse it unparsed): the parse's cost is the test.
        result, _ = scrape_once(engines, fault_server.serve(path, body), timeout="4.5s", max_body_bytes=16 << 20)
        took = time.process_time() - cpu  # the server's threads too: both sides of the scrape, in CPU seconds
        if isinstance(result, SourceError):
            raise AssertionError(f"{path}: {result.reason}: {result}")
        # ~2 s here for 90,000 wanted lines (6.7 MB); the bound catches anything worse than linear, not noise,
        # and CPU time does not stretch when other work loads the machine.
        assert took < 8.0, f"{path}: {took:.2f} CPU seconds"
        expected = 10_000 if path == "/many_engines" else 1
        assert len(result.engines) == expected
        assert sum(e.drafts for e in result.engines) == 10.0 * expected


# ============================================================================ soak smoke (the soak is bench/soak.py)
@pytest.mark.slow
def test_soak_smoke_accelerated_two_hours_of_eight_routes_stays_flat():
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "soak.py"),
            "accelerated",
            "--routes",
            "8",
            "--duration",
            "7200",
            "--warmup",
            "3700",
            "--report-every",
            "500",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0 and result["ok"], proc.stdout + proc.stderr
    assert result["state_errors"] == 0 and result["rss_growth_mib"] < 5


def test_the_fault_index_names_only_existing_tests():
    tests_dir = Path(__file__).parent
    entries = [line.strip() for line in __doc__.splitlines() if line.startswith("    test")]
    assert len(entries) >= 30
    for entry in entries:
        filename, _, name = entry.rpartition("::")
        source = (tests_dir / filename).read_text() if filename else Path(__file__).read_text()
        assert f"def {name}(" in source, f"the fault index names a test that does not exist: {entry}"
