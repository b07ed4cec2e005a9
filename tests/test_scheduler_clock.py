"""The evaluation loop keeps its pace when the wall clock steps: the monotonic clock drives it.

APScheduler reads the wall clock through `datetime.now`; the tests replace it (and the monotonic clock) with a
fake clock and call the scheduler's own job-processing step, so no thread sleeps through a jump.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

import pytest
from apscheduler.executors import base as executors_base
from apscheduler.schedulers import base as schedulers_base
from apscheduler.schedulers.base import BaseScheduler

from specwatch import scheduler as scheduler_module

INTERVAL = 5.0


class FakeClock:
    def __init__(self) -> None:
        self.wall = 1_800_000_000.0
        self.mono = 1_000.0

    def advance(self, seconds: float, wall_step: float = 0.0) -> None:
        """`seconds` pass; the wall clock is also set by `wall_step` (negative: back) meanwhile."""
        self.mono += seconds
        self.wall += seconds + wall_step


class FakeDaemon:
    def __init__(self) -> None:
        self.ticks = 0
        self.ticked = threading.Event()

    def tick(self) -> object:
        self.ticks += 1
        self.ticked.set()
        return object()

    def count_overrun(self) -> None:
        pass


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()

    class FakeDatetime(datetime):
        @classmethod
        def now(cls, tz=None):  # type: ignore[override]
            return datetime.fromtimestamp(fake.wall, tz or timezone.utc)

    monkeypatch.setattr(schedulers_base, "datetime", FakeDatetime)
    monkeypatch.setattr(executors_base, "datetime", FakeDatetime)
    return fake


@pytest.fixture
def loop(clock):
    """A scheduler with the one evaluation job, running but without its thread: the test steps it."""
    sched = scheduler_module.MonotonicScheduler(timezone="UTC", wall=lambda: clock.wall, monotonic=lambda: clock.mono)
    sched._event = threading.Event()
    BaseScheduler.start(sched)
    daemon = FakeDaemon()
    scheduler_module.schedule(sched, daemon, INTERVAL)  # type: ignore[arg-type]
    yield sched, daemon
    BaseScheduler.shutdown(sched, wait=True)  # no thread to join


def wait_for_tick(daemon: FakeDaemon, count: int) -> None:
    deadline = time.monotonic() + 60
    while daemon.ticks < count and time.monotonic() < deadline:
        daemon.ticked.wait(0.05)
    assert daemon.ticks == count


def test_setting_the_clock_back_ten_minutes_does_not_stop_evaluation(loop, clock):
    sched, daemon = loop
    assert sched._process_jobs() == pytest.approx(INTERVAL)  # the first run is one interval away
    clock.advance(INTERVAL, wall_step=-600.0)  # someone sets the clock back 10 min during the wait
    wait = sched._process_jobs()
    wait_for_tick(daemon, 1)  # the run due now ran, 5 s after the last, not 605 s
    assert wait <= INTERVAL + 0.001
    clock.advance(wait)
    sched._process_jobs()
    wait_for_tick(daemon, 2)


def test_setting_the_clock_forward_does_not_skip_runs(loop, clock):
    sched, daemon = loop
    sched._process_jobs()
    clock.advance(INTERVAL, wall_step=+600.0)
    wait = sched._process_jobs()
    wait_for_tick(daemon, 1)  # due now, not missed by 600 s (past the misfire grace time)
    assert wait <= INTERVAL + 0.001


def test_small_wall_clock_noise_moves_nothing(loop, clock):
    sched, _ = loop
    sched.follow_wall_clock()
    before = sched.get_jobs()[0].next_run_time
    clock.advance(INTERVAL, wall_step=0.2)
    assert sched.follow_wall_clock() == 0.0
    assert sched.get_jobs()[0].next_run_time == before
