"""The evaluation loop: one APScheduler interval job whose body is `daemon.tick()`.

`max_instances=1` stops a slow tick from overlapping the next, and `coalesce=True` turns a backlog after a
stall (a suspended VM, a stopped process) into one catch-up run instead of a burst. A tick longer than
the interval is an overrun: counted in `specwatch_evaluation_overruns_total` and logged.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from typing import Callable

from apscheduler.schedulers.background import BackgroundScheduler

from specwatch.daemon import Daemon
from specwatch.snapshot import Snapshot

log = logging.getLogger(__name__)

JOB_ID = "evaluate"


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
) -> BackgroundScheduler:
    """Start the loop in a background thread; the first run is one interval from now unless `first_run_in`."""
    aps_log = logging.getLogger("apscheduler")
    if aps_log.level == logging.NOTSET:  # it logs every run at INFO; keep its warnings (skipped runs)
        aps_log.setLevel(logging.WARNING)
    scheduler = BackgroundScheduler(timezone="UTC")
    schedule(scheduler, daemon, interval_seconds, on_tick, first_run_in)
    scheduler.start()
    return scheduler


def schedule(
    scheduler: BackgroundScheduler,
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
        next_run_time=datetime.now().astimezone() + timedelta(seconds=delay),
    )
