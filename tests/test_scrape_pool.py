"""The scrape pool: few threads while calls are healthy, more only past calls that hang, back when idle."""

from __future__ import annotations

import threading
import time

import pytest

from specwatch.scrape_pool import ScrapePool

STALL = 0.1
SLACK = 0.5  # scheduler jitter on a busy 2-core box; the point is 0.1 s against a 10 s hang


@pytest.fixture
def gate():
    """An event hung calls wait on; set at teardown so no thread outlives its test."""
    event = threading.Event()
    yield event
    event.set()


def test_results_and_exceptions_come_back_through_the_futures():
    pool = ScrapePool(8, core_workers=2, stall_seconds=STALL)
    try:
        assert pool.submit(lambda a, b: a + b, 2, 3).result(timeout=5) == 5
        with pytest.raises(ZeroDivisionError):
            pool.submit(lambda: 1 / 0).result(timeout=5)
    finally:
        pool.shutdown()


def test_healthy_calls_never_grow_the_pool_past_its_core_workers():
    # A stall time far above a 1 ms call even when a loaded box leaves a thread unscheduled for a while.
    pool = ScrapePool(66, core_workers=4, stall_seconds=5.0)
    try:
        for _ in range(5):
            futures = [pool.submit(time.sleep, 0.001) for _ in range(64)]
            for future in futures:
                future.result(timeout=5)
        assert pool.threads <= 4
    finally:
        pool.shutdown()


def test_hung_calls_in_front_do_not_delay_healthy_ones_past_the_stall_time(gate):
    core, hung = 2, 5  # more hung calls than core workers, all queued before the healthy ones
    pool = ScrapePool(hung + 8, core_workers=core, stall_seconds=STALL)
    try:
        begin = time.monotonic()
        for _ in range(hung):
            pool.submit(gate.wait, 10)
        healthy = [pool.submit(time.monotonic) for _ in range(8)]
        started = [f.result(timeout=5) - begin for f in healthy]
        assert max(started) < STALL + SLACK, f"healthy calls started {max(started):.2f}s late"
        assert pool.threads <= hung + 8
    finally:
        gate.set()
        pool.shutdown()


@pytest.mark.slow
def test_slow_calls_that_are_not_hung_get_more_threads_once_calls_wait_the_stall_time():
    # Twenty 0.3 s calls (an engine answering /metrics slowly, each call below the stall time of 0.5 s) take
    # 6 s on the one core worker; once the oldest waits 0.5 s the working threads double every 0.5 s.
    pool = ScrapePool(32, core_workers=1, stall_seconds=0.5)
    try:
        begin = time.monotonic()
        futures = [pool.submit(time.sleep, 0.3) for _ in range(20)]
        for future in futures:
            future.result(timeout=10)
        took = time.monotonic() - begin
        assert took < 4.0, f"20 slow calls took {took:.1f}s; one thread takes 6s"
        assert 1 < pool.threads < 20  # grown, but by doubling rather than a thread per call
    finally:
        pool.shutdown()


def test_the_pool_never_exceeds_max_workers_and_runs_the_backlog_once_calls_return(gate):
    pool = ScrapePool(3, core_workers=1, stall_seconds=STALL)
    try:
        hung = [pool.submit(gate.wait, 10) for _ in range(3)]
        waiting = pool.submit(lambda: "ran")
        time.sleep(3 * STALL)
        assert pool.threads == 3 and not waiting.done()
        gate.set()
        assert waiting.result(timeout=5) == "ran" and all(f.result(timeout=5) for f in hung)
    finally:
        pool.shutdown()


def test_threads_grown_for_a_hang_exit_after_idling_and_the_core_stays(gate):
    pool = ScrapePool(10, core_workers=1, stall_seconds=STALL, idle_seconds=0.2)
    try:
        hung = pool.submit(gate.wait, 10)
        quick = [pool.submit(time.sleep, 0.01) for _ in range(4)]
        for future in quick:
            future.result(timeout=5)
        assert pool.threads > 1
        gate.set()
        hung.result(timeout=5)
        deadline = time.monotonic() + 5
        while pool.threads > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.threads == 1
        assert pool.submit(lambda: 42).result(timeout=5) == 42
    finally:
        pool.shutdown()


def test_shutdown_cancels_queued_calls_and_refuses_new_ones(gate):
    pool = ScrapePool(1, core_workers=1, stall_seconds=STALL)
    started = threading.Event()
    running = pool.submit(lambda: started.set() or gate.wait(10))
    assert started.wait(5)
    queued = pool.submit(lambda: "never")
    pool.shutdown()
    assert queued.cancelled()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(lambda: None)
    gate.set()
    assert running.result(timeout=5) is True


def test_bad_limits_are_refused():
    with pytest.raises(ValueError):
        ScrapePool(0)
    with pytest.raises(ValueError):
        ScrapePool(4, stall_seconds=0)
