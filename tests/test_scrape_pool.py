"""The scrape lanes: quick calls on one thread, the rest on a thread each, a stuck quick thread noticed."""

from __future__ import annotations

import threading
import time

import pytest

from specwatch.scrape_pool import ScrapeLanes


@pytest.fixture
def gate():
    """An event hung calls wait on; set at teardown so no thread outlives its test."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def lanes():
    pool = ScrapeLanes(8)
    yield pool
    pool.shutdown()


def test_results_and_exceptions_come_back_through_the_futures_of_both_lanes(lanes):
    for quick in (True, False):
        assert lanes.submit(quick, lambda a, b: a + b, 2, 3).result(timeout=5) == 5
        with pytest.raises(ZeroDivisionError):
            lanes.submit(quick, lambda: 1 / 0).result(timeout=5)


def test_quick_calls_run_back_to_back_on_one_thread(lanes):
    futures = [lanes.submit(True, lambda: threading.get_ident()) for _ in range(64)]
    assert len({f.result(timeout=5) for f in futures}) == 1


def test_every_slow_call_in_flight_has_a_thread_of_its_own(lanes, gate):
    hung = [lanes.submit(False, gate.wait, 10) for _ in range(7)]  # max_calls 8: one left
    assert lanes.submit(False, lambda: "ran").result(timeout=5) == "ran"
    assert lanes.submit(True, lambda: "quick too").result(timeout=5) == "quick too"
    gate.set()
    assert all(f.result(timeout=5) for f in hung)


def test_a_quick_thread_stuck_on_one_call_is_reported(lanes, gate):
    started = threading.Event()
    assert not lanes.quick_stuck(0.0)  # idle
    lanes.submit(True, lambda: started.set() or gate.wait(10))
    assert started.wait(5)
    assert lanes.quick_stuck(0.0) and not lanes.quick_stuck(3600.0)
    queued = lanes.submit(True, lambda: "behind")
    assert queued.cancel(), "a call queued behind a stuck one can be taken back (and run on the slow lane)"
    gate.set()
    deadline = time.monotonic() + 5
    while lanes.quick_stuck(0.0) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not lanes.quick_stuck(0.0)


def test_growing_replaces_the_slow_lane_and_leaves_its_running_calls_alone(gate):
    pool = ScrapeLanes(2)
    try:
        hung = [pool.submit(False, gate.wait, 10) for _ in range(2)]
        pool.resize(4)
        assert pool.max_calls == 4
        assert [pool.submit(False, lambda: "ran").result(timeout=5) for _ in range(2)] == ["ran", "ran"]
        gate.set()
        assert all(f.result(timeout=5) for f in hung)
    finally:
        pool.shutdown()


def test_shutdown_cancels_queued_calls_and_refuses_new_ones(gate):
    pool = ScrapeLanes(1)
    started = threading.Event()
    running = pool.submit(True, lambda: started.set() or gate.wait(10))
    assert started.wait(5)
    queued = pool.submit(True, lambda: "never")
    pool.shutdown()
    assert queued.cancelled()
    with pytest.raises(RuntimeError):
        pool.submit(True, lambda: None)
    gate.set()
    assert running.result(timeout=5) is True
