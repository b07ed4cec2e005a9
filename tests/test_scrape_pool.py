"""The scrape pool: a thread for every call up to a fixed cap, queued calls past it, hung calls never waited for,
and no error out of `submit` when no thread can be started."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from specwatch import scrape_pool
from specwatch.scrape_pool import MAX_THREADS, ScrapePool, default_max_threads


@pytest.fixture
def gate():
    """An event hung calls wait on; set at teardown so no thread outlives its test."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def pool():
    scrape_pool = ScrapePool(max_threads=16)
    yield scrape_pool
    scrape_pool.shutdown()


def test_results_and_exceptions_come_back_through_the_futures(pool):
    assert pool.submit("a", lambda a, b: a + b, 2, 3).result(timeout=5) == 5
    with pytest.raises(ZeroDivisionError):
        pool.submit("b", lambda: 1 / 0).result(timeout=5)


def test_calls_left_hanging_cycle_after_cycle_never_keep_a_new_call_waiting_below_the_cap(pool, gate):
    """Each cycle, every source but one answers and one hangs for good: the hung calls pile up, and each new call
    still gets a thread at once while the threads are under the cap."""
    sources = 4
    for cycle in range(6):
        hung = pool.submit(f"hung{cycle}", gate.wait, 30)
        answers = [pool.submit(f"s{i}", lambda: "ran") for i in range(sources - 1)]
        assert [f.result(timeout=10) for f in answers] == ["ran"] * (sources - 1), cycle
        assert not hung.done()
    assert 6 < pool.threads <= pool.max_threads


def test_threads_are_reused_while_calls_answer(pool):
    """A thread is started only when none is idle: 80 quick calls, 4 at a time, run on a handful of threads. A
    thread that has just answered is marked idle a moment after its result is set (the stock executor's order),
    so on a loaded machine a call may start one more (11 seen at load 20): a few, never one a call (80)."""
    seen = set()
    for _ in range(20):
        futures = [pool.submit(f"s{i}", threading.get_ident) for i in range(4)]
        seen.update(f.result(timeout=5) for f in futures)
    assert len(seen) <= 20 and pool.threads <= 20


def test_past_the_cap_calls_queue_and_run_as_threads_free(gate):
    pool = ScrapePool(max_threads=3)
    try:
        hung = [pool.submit(f"hung{i}", gate.wait, 30) for i in range(3)]
        queued = [pool.submit(f"q{i}", lambda: "ran") for i in range(5)]
        assert pool.threads == 3
        assert not any(f.done() for f in queued)
        gate.set()
        assert [f.result(timeout=10) for f in queued] == ["ran"] * 5
        assert all(f.result(timeout=10) is True for f in hung)
        assert pool.threads == 3
    finally:
        pool.shutdown()


def test_the_deadline_cancels_calls_still_queued_and_leaves_running_ones(gate):
    pool = ScrapePool(max_threads=2)
    try:
        hung = [pool.submit(f"hung{i}", gate.wait, 30) for i in range(2)]
        queued = [pool.submit(f"q{i}", lambda: "ran") for i in range(3)]
        assert pool.cancel_queued() == 3
        assert all(f.cancelled() for f in queued)
        assert not any(f.done() for f in hung)
        assert "all 2 scrape threads busy" in pool.why_queued()
        gate.set()
        assert pool.submit("next", lambda: "ran").result(timeout=10) == "ran"  # cancelled calls are skipped
    finally:
        pool.shutdown()


def test_a_call_queued_below_the_cap_is_blamed_on_the_host_not_on_busy_threads(gate):
    pool = ScrapePool(max_threads=4)
    try:
        hung = pool.submit("hung", gate.wait, 30)
        assert pool.threads == 1
        why = pool.why_queued()
        assert "busy" not in why and "1 of at most 4" in why and "host overloaded" in why
        gate.set()
        hung.result(timeout=10)
    finally:
        pool.shutdown()


@pytest.fixture
def no_new_threads(monkeypatch):
    """Thread creation fails as it does at the task limit (TasksMax, RLIMIT_NPROC)."""

    def refuse(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)


def test_no_thread_at_all_gives_a_cancelled_call_not_an_exception(no_new_threads):
    pool = ScrapePool(max_threads=8)
    future = pool.submit("route a", lambda: "ran")
    assert future.cancelled()
    assert "can't start new thread" in pool.why_queued()
    pool.shutdown()


def test_a_thread_that_cannot_start_leaves_the_call_to_the_threads_there_are(gate, monkeypatch, caplog):
    pool = ScrapePool(max_threads=8)
    try:
        first = pool.submit("hung", gate.wait, 30)
        start = threading.Thread.start
        monkeypatch.setattr(threading.Thread, "start", lambda self: (_ for _ in ()).throw(RuntimeError("no")))
        queued = pool.submit("waits", lambda: "ran")
        assert not queued.done() and pool.threads == 1
        assert "could not start a scrape thread" in caplog.text
        monkeypatch.setattr(threading.Thread, "start", start)
        gate.set()
        assert first.result(timeout=10) is True and queued.result(timeout=10) == "ran"
    finally:
        pool.shutdown()


def test_running_names_the_sources_whose_calls_have_not_returned(pool, gate):
    pool.submit("route stuck", gate.wait, 30)
    pool.submit("GPU", gate.wait, 30)
    pool.submit("route fine", lambda: None).result(timeout=5)
    assert pool.running(timeout=0.05) == ["GPU", "route stuck"]
    gate.set()
    assert pool.running(timeout=10) == []


def test_shutdown_leaves_running_calls_alone_and_cancels_later_ones(gate):
    pool = ScrapePool(max_threads=4)
    hung = pool.submit("stuck", gate.wait, 30)
    pool.shutdown()  # returns with the call still running: it is never joined
    assert not hung.done() and pool.running() == ["stuck"]
    assert pool.submit("next", lambda: "ran").cancelled()
    gate.set()
    assert hung.result(timeout=10) is True


def test_the_cap_is_half_a_lower_task_limit_of_this_process(tmp_path, monkeypatch):
    """A pids cgroup (v1 or v2) below the unit's TasksMax lowers the cap; none keeps MAX_THREADS."""
    v2 = tmp_path / "v2" / "system.slice" / "specwatch.service"
    v2.mkdir(parents=True)
    (v2 / "pids.max").write_text("64\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/system.slice/specwatch.service\n")
    assert scrape_pool._cgroup_pids_max(proc, tmp_path / "v2") == 64
    v1 = tmp_path / "v1" / "pids" / "bench"
    v1.mkdir(parents=True)
    (v1 / "pids.max").write_text("max\n")
    proc.write_text("12:pids:/bench\n1:name=systemd:/\n")
    assert scrape_pool._cgroup_pids_max(proc, tmp_path / "v1") == 0
    assert scrape_pool._cgroup_pids_max(tmp_path / "absent", Path("/nonexistent")) == 0

    monkeypatch.setattr(scrape_pool, "_cgroup_pids_max", lambda: 64)
    assert default_max_threads() == 32
    monkeypatch.setattr(scrape_pool, "_cgroup_pids_max", lambda: 0)
    assert default_max_threads() <= MAX_THREADS
