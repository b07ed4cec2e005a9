"""The evaluation loop: one APScheduler interval job whose body is `daemon.tick()`.

`max_instances=1` stops a slow tick from overlapping the next, and `coalesce=True` turns a backlog after a
stall (a suspended VM, a stopped process) into one catch-up run instead of a burst. A tick longer than
the interval is an overrun: counted in `specwatch_evaluation_overruns_total` and logged.

The monotonic clock drives the loop: APScheduler 3 times jobs by the wall clock, so `MonotonicScheduler`
moves the job by any wall-clock step (NTP, an operator) before it looks at it; wall-clock time only labels.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from apscheduler.schedulers.background import BackgroundScheduler

from specwatch.daemon import Daemon
from specwatch.snapshot import Snapshot

log = logging.getLogger(__name__)

JOB_ID = "evaluate"
# A wall-clock step smaller than this is scheduling noise, not a jump.
CLOCK_JUMP_TOLERANCE_SECONDS = 1.0


class MonotonicScheduler(BackgroundScheduler):
    """APScheduler's background scheduler on the monotonic clock: before each look at its jobs it compares how
    far the wall clock moved with how far the monotonic clock did, and moves every job by the difference, so
    setting the clock back ten minutes does not stop the loop for ten minutes (nor forward skip runs)."""

    def __init__(
        self,
        *args: Any,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._wall = wall
        self._monotonic = monotonic
        self._anchor: tuple[float, float] | None = None

    def wall_now(self) -> datetime:
        return datetime.fromtimestamp(self._wall(), timezone.utc)

    def _process_jobs(self) -> Any:
        self.follow_wall_clock()
        return super()._process_jobs()

    def follow_wall_clock(self) -> float:
        """Move every job by the wall clock's step since the last call; the step in seconds (0 when none)."""
        wall, mono = self._wall(), self._monotonic()
        anchor, self._anchor = self._anchor, (wall, mono)
        if anchor is None:
            return 0.0
        jump = (wall - anchor[0]) - (mono - anchor[1])
        if abs(jump) <= CLOCK_JUMP_TOLERANCE_SECONDS:
            return 0.0
        for job in self.get_jobs():
            if job.next_run_time is not None:
                job.modify(next_run_time=job.next_run_time + timedelta(seconds=jump))
        log.warning("the wall clock stepped %+.1fs; the evaluation loop keeps its pace", jump)
        return jump


def run_tick(daemon: Daemon, interval_seconds: float, on_tick: Callable[[Snapshot], None] | None = None) -> None:
    """The job body: one tick, overrun accounting, then `on_tick` (e.g. the systemd watchdog) only when the
    tick really completed."""
    begin = time.monotonic()
    try:
        snapshot = daemon.tick()
    except Exception:  # noqa: BLE001 - tick() is not supposed to raise; if it does, keep the loop alive
        log.exception("evaluation cycle failed")
        return
    took = time.monotonic() - begin
    if took > interval_seconds:
        daemon.count_overrun()
        log.warning(
            "evaluation took %.2fs, longer than the %gs interval; the next cycle is skipped or late",
            took,
            interval_seconds,
        )
    if on_tick is not None:
        try:
            on_tick(snapshot)
        except Exception:  # noqa: BLE001
            log.exception("post-evaluation hook failed")


def start_scheduler(
    daemon: Daemon,
    interval_seconds: float,
    on_tick: Callable[[Snapshot], None] | None = None,
    first_run_in: float | None = None,
) -> MonotonicScheduler:
    """Start the loop in a background thread; the first run is one interval from now unless `first_run_in`."""
    aps_log = logging.getLogger("apscheduler")
    if aps_log.level == logging.NOTSET:  # it logs every run at INFO; keep its warnings (skipped runs)
        aps_log.setLevel(logging.WARNING)
    scheduler = MonotonicScheduler(timezone="UTC")
    schedule(scheduler, daemon, interval_seconds, on_tick, first_run_in)
    scheduler.start()
    return scheduler


def schedule(
    scheduler: MonotonicScheduler,
    daemon: Daemon,
    interval_seconds: float,
    on_tick: Callable[[Snapshot], None] | None = None,
    first_run_in: float | None = None,
) -> None:
    """Add (or replace, on a reload that changed the interval) the one evaluation job."""
    delay = interval_seconds if first_run_in is None else first_run_in
    scheduler.add_job(
        run_tick,
        "interval",
        seconds=interval_seconds,
        args=(daemon, interval_seconds, on_tick),
        id=JOB_ID,
        replace_existing=True,
        max_instances=1,
        coalesce=True,
        # A run later than this (the process was stopped, the previous tick hung) is skipped, not queued.
        misfire_grace_time=max(1, int(interval_seconds)),
        next_run_time=scheduler.wall_now() + timedelta(seconds=delay),
    )
