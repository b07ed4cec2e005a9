"""The threads that run source calls: one worker while calls are quick, more only while calls are slow or hang.

A healthy cycle is 64 short calls (a loopback GET and a parse, well under a millisecond each), nearly all
CPU under one GIL: one worker runs them back to back, without the futex wake-ups and GIL hand-offs of
several threads taking turns. Side by side in one process on the H200 host (figure 2's 64 routes;
docs/benchmarks.md), a cycle cost 41.5 ms of CPU with one worker, 46.1 with two, 47.8 with four and 49.0
with eight. But a slow or hung source must cost only its own route, so the pool grows:

- a worker busy on one call for `stall_seconds` (far above a healthy call) is *stalled* and stops counting
  against `core_workers`; when every working thread is stalled while calls wait, a thread is woken or
  started for each waiting call;
- while the oldest waiting call has waited `stall_seconds` (calls are slow, not hung: an engine answering
  /metrics in 100 ms), the number of working threads doubles every `stall_seconds`.

So a healthy call waits behind hung ones for about `stall_seconds`, and a backlog of slow calls gets more
threads within a few `stall_seconds`, up to `max_workers`. Idle threads are woken last-in first-out, so
those beyond the core ones stay idle once the hang is over, and exit after `idle_seconds`.

The daemon submits at most one call per source at a time (a source whose last call still hangs is
skipped), so `max_workers` = sources + spare never leaves a call waiting for a thread that cannot come.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable

CORE_WORKERS = 1
STALL_SECONDS = 0.25
IDLE_SECONDS = 60.0


class _Worker:
    __slots__ = ("wake", "busy_since", "stalled")

    def __init__(self, lock: threading.Lock) -> None:
        self.wake = threading.Condition(lock)
        self.busy_since: float | None = None  # monotonic start of the current call; None between calls
        self.stalled = False


class ScrapePool:
    """A small executor (`submit` -> `concurrent.futures.Future`) that grows only past hung calls and slow backlogs."""

    def __init__(
        self,
        max_workers: int,
        *,
        core_workers: int = CORE_WORKERS,
        stall_seconds: float = STALL_SECONDS,
        idle_seconds: float = IDLE_SECONDS,
        name: str = "specwatch-scrape",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_workers < 1 or core_workers < 1 or stall_seconds <= 0 or idle_seconds <= 0:
            raise ValueError("ScrapePool needs max_workers >= 1, core_workers >= 1 and positive durations")
        self.max_workers = max_workers
        self.core_workers = core_workers
        self.stall_seconds = stall_seconds
        self.idle_seconds = idle_seconds
        self._name = name
        self._clock = clock
        self._lock = threading.Lock()
        self._backlog = threading.Condition(self._lock)  # wakes the supervisor when calls are queued
        self._queue: deque[tuple[Future, Callable[..., Any], tuple, float]] = deque()  # ..., queued at
        self._workers: list[_Worker] = []
        self._idle: list[_Worker] = []  # a stack: the most recently idle worker is woken first
        self._running = 0  # workers woken or in a call, stalled ones included
        self._stalled = 0
        self._watching = False  # the supervisor is timing the current backlog
        self._shutdown = False
        self._serial = 0
        self._supervisor: threading.Thread | None = None

    # ------------------------------------------------------------------ public
    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("ScrapePool is shut down")
            self._queue.append((future, fn, args, self._clock()))
            if self._running - self._stalled < self.core_workers:
                self._add_worker()
            if not self._watching:
                self._watching = True
                self._start_supervisor()
                self._backlog.notify()
        return future

    def resize(self, max_workers: int, stall_seconds: float) -> None:
        """New limits (sources added or removed, another scrape timeout); running calls are not affected."""
        with self._lock:
            self.max_workers = max(1, max_workers)
            self.stall_seconds = stall_seconds

    @property
    def threads(self) -> int:
        """Worker threads alive (the supervisor not counted)."""
        with self._lock:
            return len(self._workers)

    def shutdown(self, cancel_futures: bool = True) -> None:
        """Stop taking calls and let idle workers exit. Running calls are never joined: a hung call must
        not hang the daemon's shutdown."""
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                while self._queue:
                    self._queue.popleft()[0].cancel()
            while self._idle:  # woken, each finds the pool shut down and exits
                self._add_worker()
            self._backlog.notify()

    # ------------------------------------------------------------------ workers
    def _add_worker(self) -> bool:
        """Put one more worker to work: the most recently idle one, else a new thread. Lock held."""
        if self._idle:
            worker = self._idle.pop()
            worker.wake.notify()
        elif len(self._workers) < self.max_workers:
            worker = _Worker(self._lock)
            self._workers.append(worker)
            self._serial += 1
            threading.Thread(
                target=self._work, args=(worker,), name=f"{self._name}-{self._serial}", daemon=True
            ).start()
        else:
            return False
        self._running += 1
        return True

    def _work(self, worker: _Worker) -> None:
        lock = self._lock
        lock.acquire()
        try:
            while True:
                if self._queue:
                    future, fn, args, _ = self._queue.popleft()
                    worker.busy_since = self._clock()
                    lock.release()
                    try:
                        _run(future, fn, args)
                    finally:
                        del future, fn, args  # drop the call's references before waiting for the next one
                        lock.acquire()
                    worker.busy_since = None
                    if worker.stalled:
                        worker.stalled = False
                        self._stalled -= 1
                    continue
                self._running -= 1
                if self._shutdown:
                    self._workers.remove(worker)
                    return
                self._idle.append(worker)
                if worker.wake.wait(self.idle_seconds) or worker not in self._idle:
                    continue  # woken (the waker counted it as running again)
                self._idle.remove(worker)
                if len(self._workers) > self.core_workers:
                    self._workers.remove(worker)  # a thread grown for a hang, no longer needed
                    return
                self._running += 1  # a core worker: look at the queue and go idle again
        finally:
            lock.release()

    # ------------------------------------------------------------------ growth
    def _start_supervisor(self) -> None:
        """The thread that times stalled workers, started with the first backlog. Lock held."""
        if self._supervisor is None:
            self._supervisor = threading.Thread(target=self._supervise, name=f"{self._name}-supervisor", daemon=True)
            self._supervisor.start()

    def _supervise(self) -> None:
        with self._lock:
            while not self._shutdown:
                if not self._queue:
                    self._watching = False
                    self._backlog.wait()  # asleep while the workers keep up
                    continue
                now = self._clock()
                next_check = self.stall_seconds
                for worker in self._workers:
                    if worker.busy_since is None or worker.stalled:
                        continue
                    busy = now - worker.busy_since
                    if busy >= self.stall_seconds:
                        worker.stalled = True
                        self._stalled += 1
                    else:
                        next_check = min(next_check, self.stall_seconds - busy)
                working = self._running - self._stalled
                waited = now - self._queue[0][3]
                if working == 0:
                    # Every working thread is stuck on one call: one for each waiting call, so none of
                    # them waits behind another hang.
                    wanted = len(self._queue)
                elif waited >= self.stall_seconds:  # calls are slow, not stuck: double the working threads
                    wanted = min(len(self._queue), working)
                else:  # replace stuck workers, up to the core number of working threads
                    wanted = min(len(self._queue), self.core_workers - working)
                    next_check = min(next_check, self.stall_seconds - waited)
                for _ in range(wanted):
                    if not self._add_worker():
                        break
                self._backlog.wait(next_check)


def _run(future: Future, fn: Callable[..., Any], args: tuple) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = fn(*args)
    except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
        future.set_exception(exc)
    else:
        future.set_result(result)
