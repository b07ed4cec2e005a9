"""The scrape pool: a thread for every call that can be in flight, hung calls never waited for."""

from __future__ import annotations

import threading

import pytest

from specwatch.scrape_pool import ScrapePool


@pytest.fixture
def gate():
    """An event hung calls wait on; set at teardown so no thread outlives its test."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def pool():
    scrape_pool = ScrapePool()
    yield scrape_pool
    scrape_pool.shutdown()


def test_results_and_exceptions_come_back_through_the_futures(pool):
    pool.reserve(2)
    assert pool.submit("a", lambda a, b: a + b, 2, 3).result(timeout=5) == 5
    with pytest.raises(ZeroDivisionError):
        pool.submit("b", lambda: 1 / 0).result(timeout=5)


def test_calls_left_hanging_cycle_after_cycle_never_keep_a_new_call_waiting(pool, gate):
    """Each cycle, every source but one answers and one hangs for good (a reload replaced it, so it is called
    again beside its hung call): the hung calls pile up, and each new call still gets a thread at once."""
    sources = 4
    for cycle in range(6):
        pool.reserve(sources)
        hung = pool.submit(f"hung{cycle}", gate.wait, 30)
        answers = [pool.submit(f"s{i}", lambda: "ran") for i in range(sources - 1)]
        assert [f.result(timeout=10) for f in answers] == ["ran"] * (sources - 1), cycle
        assert not hung.done()
    assert pool.size >= 2 * (6 + sources - 1)  # grown past what was in flight, with room to spare


def test_threads_are_reused_while_calls_answer(pool):
    """A stock executor starts a thread only when every one is busy: cycles of quick calls stay within the size."""
    seen = set()
    for _ in range(20):
        pool.reserve(4)
        futures = [pool.submit(f"s{i}", threading.get_ident) for i in range(4)]
        seen.update(f.result(timeout=5) for f in futures)
    assert len(seen) <= pool.size == 8


def test_running_names_the_sources_whose_calls_have_not_returned(pool, gate):
    pool.reserve(3)
    pool.submit("route stuck", gate.wait, 30)
    pool.submit("GPU", gate.wait, 30)
    pool.submit("route fine", lambda: None).result(timeout=5)
    assert pool.running(timeout=0.05) == ["GPU", "route stuck"]
    gate.set()
    assert pool.running(timeout=10) == []


def test_shutdown_leaves_running_calls_alone_and_a_later_cycle_gets_a_new_pool(gate):
    pool = ScrapePool()
    pool.reserve(1)
    hung = pool.submit("stuck", gate.wait, 30)
    pool.shutdown()  # returns with the call still running: it is never joined
    assert not hung.done() and pool.running() == ["stuck"]
    pool.reserve(1)
    assert pool.submit("next", lambda: "ran").result(timeout=5) == "ran"
    pool.shutdown()
    gate.set()
    assert hung.result(timeout=10) is True
