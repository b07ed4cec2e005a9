"""Where source calls run: at most `max_threads` threads, started only as calls need them, so the daemon fits its
unit's task limit at any route count.

1. `submit` hands a call to an idle thread, else starts a thread while fewer than `max_threads` exist, else
   queues the call. It never raises: a thread that cannot be started (the task limit reached anyway) leaves the
   call queued for the threads that exist, and with none the call is cancelled at once.
2. `cancel_queued` is the cycle's deadline: calls that never left the queue are cancelled (their routes are
   down with reason `overloaded`), so a queue never carries over into the next cycle.
3. `running` names the sources whose calls are still running; `shutdown` cancels queued calls and never joins a
   running one (a call hung in a socket or in NVML cannot be interrupted; its thread is a daemon thread).

Below the cap no call ever waits behind a slow or hung one: a thread is started whenever none is idle. A hung
call holds its thread (and its route is not called again until it returns), so the cap counts threads, busy or
idle.

The cap: `MAX_THREADS` is half the shipped unit's `TasksMax=256` (tests/test_systemd_unit.py holds them
together), leaving the other half to the HTTP server, the scheduler, probes and NVML. Where this process runs
under a lower task limit (a pids cgroup or RLIMIT_NPROC), `default_max_threads()` takes half of that instead.
"""

from __future__ import annotations

import logging
import os
import queue
import resource
import threading
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)

MAX_THREADS = 128  # TasksMax=256 in systemd/specwatch.service, halved


def _cgroup_pids_max(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> int:
    """This process's pids cgroup limit (v2 or v1), 0 where none is set or readable."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        place = root / path.lstrip("/") if hierarchy == "0" and not controllers else None
        if "pids" in controllers.split(","):
            place = root / "pids" / path.lstrip("/")
        if place is None:
            continue
        try:
            text = (place / "pids.max").read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return 0


def default_max_threads() -> int:
    """`MAX_THREADS`, or half of a lower task limit this process runs under (at least 2)."""
    limits = [MAX_THREADS * 2]
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY and os.geteuid() != 0:  # root is not held to RLIMIT_NPROC
        limits.append(soft)
    pids_max = _cgroup_pids_max()
    if pids_max:
        limits.append(pids_max)
    return max(2, min(limits) // 2)


class _Call:
    __slots__ = ("future", "fn", "args")

    def __init__(self, future: Future, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.future, self.fn, self.args = future, fn, args


class ScrapePool:
    """Runs source calls on at most `max_threads` threads and knows which are queued and which still running."""

    def __init__(self, max_threads: int | None = None, name: str = "specwatch-scrape") -> None:
        self.max_threads = default_max_threads() if max_threads is None else max(1, max_threads)
        self._name = name
        self._lock = threading.RLock()  # a cancel under it runs the done-callback that takes it again
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)  # released by each thread as it finishes a call
        self._threads: set[threading.Thread] = set()
        self._running: dict[Future, str] = {}  # calls submitted and not finished -> source name
        self._closed = False
        self.start_error = ""  # why the last thread could not be started ("" once one starts again)

    @property
    def threads(self) -> int:
        """Threads alive now: idle, busy or hung."""
        with self._lock:
            return len(self._threads)

    def submit(self, source: str, fn: Callable[..., Any], *args: Any) -> Future:
        """Run `fn(*args)` on a pool thread. Never raises; a call no thread can take comes back cancelled."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                future.cancel()
                return future
            self._running[future] = source
            future.add_done_callback(self._forget)
            self._queue.put(_Call(future, fn, args))
            if self._idle.acquire(blocking=False):
                return future
            if len(self._threads) < self.max_threads:
                self._start_thread()
            if not self._threads:
                future.cancel()  # queued for nobody; a worker that ever starts skips it
        return future

    def _forget(self, future: Future) -> None:
        with self._lock:
            self._running.pop(future, None)

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True)
        try:
            thread.start()
        except Exception as exc:  # noqa: BLE001 - RuntimeError "can't start new thread" at the task limit
            if not self.start_error:
                log.warning(
                    "could not start a scrape thread (%d running, cap %d): %s; calls wait for the threads there are",
                    len(self._threads),
                    self.max_threads,
                    exc,
                )
            self.start_error = f"no scrape thread could be started beside the {len(self._threads)} running: {exc}"
            return
        if self.start_error:
            log.info("scrape threads start again (%d running)", len(self._threads) + 1)
            self.start_error = ""
        self._threads.add(thread)

    def _work(self) -> None:
        try:
            while True:
                call = self._queue.get()
                if call is None:
                    return
                if call.future.set_running_or_notify_cancel():  # False: cancelled while queued
                    try:
                        result = call.fn(*call.args)
                    except BaseException as exc:  # noqa: BLE001 - handed to the caller through its future
                        call.future.set_exception(exc)
                    else:
                        call.future.set_result(result)
                del call
                self._idle.release()  # as the stock executor counts idle threads: one per call finished
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def why_queued(self) -> str:
        """Why a call did not start, for the route's error message."""
        if self.start_error:
            return self.start_error
        with self._lock:
            threads = len(self._threads)
        if threads >= self.max_threads:
            return f"all {self.max_threads} scrape threads busy"
        # Below the cap a thread was free or started: the host did not run it in time (CPU starved).
        return f"no scrape thread ran it in time ({threads} of at most {self.max_threads} alive): host overloaded"

    def cancel_queued(self) -> int:
        """Cancel every call still waiting in the queue; the number cancelled."""
        with self._lock:
            futures = list(self._running)
        return sum(f.cancel() for f in futures)

    def running(self, timeout: float = 0.0) -> list[str]:
        """The sources whose calls are still running (or queued) after waiting up to `timeout` seconds for them."""
        with self._lock:
            futures = dict(self._running)
        if timeout > 0 and futures:
            wait(list(futures), timeout=timeout)
        return sorted(name for f, name in futures.items() if not f.done())

    def shutdown(self) -> None:
        """Queued calls are cancelled; running ones are never joined. Idle threads exit; later calls come back
        cancelled."""
        self.cancel_queued()
        with self._lock:
            self._closed = True
            for _ in range(len(self._threads)):
                self._queue.put(None)
