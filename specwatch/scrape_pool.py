"""Where source calls run: two stock `ThreadPoolExecutor`s, one thread for calls that were quick last cycle and
one thread per call for the rest, so a slow, hung or hostile engine never queues a healthy one.

One thread for the quick calls because 64 of them (a loopback GET and a parse each, nearly all CPU under one
GIL) cost about 1.3-1.5x the CPU when 66 threads take turns at them (bench/scrape_executors.py).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

# A call that failed or took this long (a healthy one takes milliseconds, tens on a loaded box) runs in the slow
# lane next cycle; the quick thread busy this long on one call is stuck on an engine that just turned slow or
# hung, and the calls queued behind it move to the slow lane.
STALL_SECONDS = 0.25


class ScrapeLanes:
    """The quick lane (one thread, calls back to back) and the slow lane (a thread for every call in flight)."""

    def __init__(self, max_calls: int, name: str = "specwatch-scrape") -> None:
        self._name = name
        self.max_calls = max(1, max_calls)
        self.quick = ThreadPoolExecutor(1, thread_name_prefix=name)
        self.slow = ThreadPoolExecutor(self.max_calls, thread_name_prefix=f"{name}-slow")
        self._quick_since: float | None = None  # when the quick thread's current call began; None between calls

    def submit(self, quick: bool, fn: Callable[..., Any], *args: Any) -> Future:
        if quick:
            return self.quick.submit(self._run_quick, fn, *args)
        return self.slow.submit(fn, *args)

    def quick_stuck(self, stall: float) -> bool:
        """Whether the quick thread has been on one call for `stall` seconds or more."""
        since = self._quick_since
        return since is not None and time.monotonic() - since >= stall

    def _run_quick(self, fn: Callable[..., Any], *args: Any) -> Any:
        self._quick_since = time.monotonic()
        try:
            return fn(*args)
        finally:
            self._quick_since = None

    def resize(self, max_calls: int) -> None:
        """At most `max_calls` calls are ever in flight (one per source): a slow lane that could have fewer
        threads is replaced, its running calls left to finish on their own threads."""
        if max_calls > self.max_calls:
            old, self.max_calls = self.slow, max_calls
            self.slow = ThreadPoolExecutor(max_calls, thread_name_prefix=f"{self._name}-slow")
            old.shutdown(wait=False)

    def shutdown(self) -> None:
        """Queued calls are cancelled; running ones are never joined (a hung call must not hang shutdown)."""
        self.quick.shutdown(wait=False, cancel_futures=True)
        self.slow.shutdown(wait=False, cancel_futures=True)
