"""Where source calls run: one stock `ThreadPoolExecutor` with a thread for every call that can be in flight,
so no call ever waits in a queue behind a slow, hung or hostile one.

What can be in flight: one call per source (the daemon does not call a source whose last call is still running)
plus the calls left running by sources a reload removed or replaced. A stock executor starts a thread only when
every one it has is busy, so its size is a ceiling, not a cost: the pool is sized at twice what can be in
flight, which keeps it from ever reaching the ceiling (where it would queue), and replaced by a larger one when
that grows.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Callable


class ScrapePool:
    """Runs source calls, keeping the pool larger than what can be in flight, and knows which are still running."""

    def __init__(self, name: str = "specwatch-scrape") -> None:
        self._name = name
        self._pool: ThreadPoolExecutor | None = None
        self.size = 0
        self._running: dict[Future, str] = {}  # calls not finished, in this pool or one it replaced -> source name

    def reserve(self, calls: int) -> None:
        """Before submitting up to `calls` calls: make room for them beside every call still running."""
        self._running = {f: name for f, name in self._running.items() if not f.done()}
        needed = len(self._running) + calls
        if self._pool is None or 2 * needed > self.size:
            old, self.size = self._pool, 2 * max(1, needed)
            self._pool = ThreadPoolExecutor(self.size, thread_name_prefix=self._name)
            if old is not None:
                old.shutdown(wait=False)  # its running calls finish on their own threads, which then exit

    def submit(self, source: str, fn: Callable[..., Any], *args: Any) -> Future:
        if self._pool is None:
            raise RuntimeError("reserve() first")
        future = self._pool.submit(fn, *args)
        self._running[future] = source
        return future

    def running(self, timeout: float = 0.0) -> list[str]:
        """The sources whose calls are still running after waiting up to `timeout` seconds for them."""
        if timeout > 0 and self._running:
            wait(list(self._running), timeout=timeout)
        return sorted(name for f, name in self._running.items() if not f.done())

    def shutdown(self) -> None:
        """Queued calls are cancelled; running ones are never joined (a hung call must not hang shutdown)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool, self.size = None, 0
