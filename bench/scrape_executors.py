#!/usr/bin/env python3
"""The daemon's scrape executor against alternatives, side by side in ONE process (interleaved turns).

    .venv/bin/python bench/scrape_executors.py                        # the daemon's own executor vs stock pools
    .venv/bin/python bench/scrape_executors.py --custom-pool FILE     # also a ScrapePool class loaded from FILE
    .venv/bin/python bench/scrape_executors.py --turns 20 --variants daemon stock:66

Two measurements, each variant a Daemon of its own with 64 routes on 64 simulated vLLM endpoints (the overhead
benchmark's farm, `soak.py serve-engines`, in a child process so its CPU is not counted):

1. CPU per cycle, healthy engines: the daemons tick in alternating turns of 5 cycles (clock faked at 5 s a
   cycle), and each turn's process CPU (all threads) is charged to its variant; printed as ms a cycle, % of one
   core at a 5 s interval (the target is < 1% for the whole daemon, render share included) and the ratio to the
   first variant (median over turns too).
2. The fault the pool must survive: 8 of the 64 routes on an engine that accepts and never answers, listed
   before the healthy ones. Per cycle, the time from the cycle's start to the last healthy answer, against the
   cycle deadline (1.5 x the scrape timeout), and the cycles in which any healthy route was not up.

Variants: `daemon` (what Daemon uses), `stock:N` (one concurrent.futures.ThreadPoolExecutor of at most N
threads), `custom` (the ScrapePool class in --custom-pool FILE, e.g. a file from an older tree).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
INTERVAL = 5.0
TIMEOUT = 2.0  # the overhead benchmark's scrape timeout at a 5 s interval
ROUTES = 64
HUNG = 8
BATCH = 5


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def soak_script() -> Path:
    for place in ("bench", "scripts"):
        if (REPO / place / "soak.py").exists():
            return REPO / place / "soak.py"
    raise SystemExit("soak.py (the simulated engine farm) not found under bench/ or scripts/")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_farm(routes: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(soak_script()), "serve-engines", "--routes", str(routes), "--port", str(port)]
        + ["--per-scrape-seconds", str(INTERVAL)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # clients hanging up on it at the end
        text=True,
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError("the simulated engines did not start")
    return proc, f"http://127.0.0.1:{port}"


def silent_listener() -> tuple[socket.socket, str]:
    """An engine that accepts connections (the kernel does, from the backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    return sock, f"http://127.0.0.1:{sock.getsockname()[1]}/metrics"


def config(urls: list[str], state_dir: str) -> Any:
    from specwatch.config import parse_config

    return parse_config(
        {
            "interval": f"{INTERVAL:g}s",
            "state_dir": state_dir,
            "scrape": {"timeout": f"{TIMEOUT:g}s"},
            "gpu": {"enabled": "false"},
            "routes": [
                {"name": f"r{i:02d}", "url": url, "engine": "vllm", "crossover": {"batch_size": 32}}
                for i, url in enumerate(urls)
            ],
        }
    )


def executor_factory(variant: str, custom_pool: Path | None) -> Callable[[int], Any] | None:
    """None: the daemon's own; else a function of the number of sources that builds the executor."""
    if variant == "daemon":
        return None
    if variant.startswith("stock:"):
        workers = int(variant.split(":", 1)[1])
        return lambda sources: ThreadPoolExecutor(workers, thread_name_prefix="bench-stock")
    if variant == "custom":
        if custom_pool is None:
            raise SystemExit("variant custom needs --custom-pool FILE")
        spec = importlib.util.spec_from_file_location("bench_custom_pool", custom_pool)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        stall = min(module.STALL_SECONDS, TIMEOUT / 4)
        return lambda sources: module.ScrapePool(sources + 2, stall_seconds=stall)
    raise SystemExit(f"unknown variant {variant!r}")


class Timed:
    """Wraps an executor: records when each call's outcome came back, relative to the cycle's start, and the
    threads the calls ran on."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.begin = 0.0
        self.ok_done: list[float] = []
        self.threads: set[int] = set()

    def submit(self, source: str, fn: Callable[..., Any], *args: Any) -> Future:
        if hasattr(self.inner, "cancel_queued"):  # the daemon's own ScrapePool
            future = self.inner.submit(source, self._on_thread, fn, *args)
        else:  # a bare executor
            future = self.inner.submit(self._on_thread, fn, *args)
        future.add_done_callback(self._done)
        return future

    def _on_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        self.threads.add(threading.get_ident())
        return fn(*args)

    def _done(self, future: Future) -> None:
        if not future.cancelled() and future.exception() is None and getattr(future.result(), "ok", False):
            self.ok_done.append(time.monotonic() - self.begin)

    def cancel_queued(self) -> int:
        """The daemon's deadline; a bare executor's queued calls are left to run."""
        return self.inner.cancel_queued() if hasattr(self.inner, "cancel_queued") else 0

    def why_queued(self) -> str:
        return self.inner.why_queued() if hasattr(self.inner, "why_queued") else "queued in a bare executor"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def make_daemon(variant: str, urls: list[str], custom_pool: Path | None) -> tuple[Any, SimpleNamespace, Timed]:
    from specwatch.daemon import Daemon

    clock = SimpleNamespace(now=1_700_000_000.0)
    daemon = Daemon(config(urls, tempfile.mkdtemp(prefix="specwatch-bench-")), clock=lambda: clock.now)
    factory = executor_factory(variant, custom_pool)
    timed = Timed(daemon._pool if factory is None else factory(len(urls)))  # noqa: SLF001 - the bench swaps the pool
    daemon._pool = timed  # type: ignore[assignment]
    return daemon, clock, timed


def shut_down(executor: Any) -> None:
    """Without waiting for hung calls."""
    if isinstance(executor, ThreadPoolExecutor):
        executor.shutdown(wait=False, cancel_futures=True)
    elif hasattr(executor, "shutdown"):
        executor.shutdown()


def tick(daemon: Any, clock: SimpleNamespace, timed: Timed) -> Any:
    clock.now += INTERVAL
    timed.ok_done.clear()
    timed.begin = time.monotonic()
    return daemon.tick(clock.now)


def measure_cpu(variants: list[str], turns: int, custom_pool: Path | None) -> None:
    farm, base_url = start_farm(ROUTES)
    urls = [f"{base_url}/r{i:02d}/metrics" for i in range(ROUTES)]
    daemons = {v: make_daemon(v, urls, custom_pool) for v in variants}
    per_turn: dict[str, list[float]] = {v: [] for v in variants}
    try:
        for _ in range(3):  # warm-up: connections kept, name filters checked, detectors built
            for d, clock, timed in daemons.values():
                for _ in range(BATCH):
                    tick(d, clock, timed)
        for turn in range(turns):
            order = variants if turn % 2 == 0 else variants[::-1]
            for v in order:
                d, clock, timed = daemons[v]
                before = cpu()
                for _ in range(BATCH):
                    snap = tick(d, clock, timed)
                per_turn[v].append((cpu() - before) / BATCH * 1e3)
                assert all(r.up for r in snap.routes), f"{v}: a healthy route is down"
    finally:
        for d, _, timed in daemons.values():
            d.close()
            shut_down(timed.inner)
        farm.terminate()
        farm.wait(timeout=10)
    threads = {v: len(daemons[v][2].threads) for v in variants}
    first = variants[0]
    print(f"1. CPU a cycle, {ROUTES} routes on {ROUTES} endpoints, {turns} interleaved turns of {BATCH} cycles:")
    for v in variants:
        mean = statistics.mean(per_turn[v])
        ratios = [a / b for a, b in zip(per_turn[v], per_turn[first])]
        print(
            f"   {v:>10}: {mean:6.1f} ms a cycle = {mean / (INTERVAL * 1e3) * 100:.2f}% of one core at "
            f"{INTERVAL:g} s; / {first}: {mean / statistics.mean(per_turn[first]):.3f}x "
            f"(median turn {statistics.median(ratios):.3f}x); calls ran on {threads[v]} threads",
            flush=True,
        )


def measure_fault(variants: list[str], cycles: int, custom_pool: Path | None) -> None:
    farm, base_url = start_farm(ROUTES - HUNG)
    listener, hung_url = silent_listener()
    urls = [hung_url.replace("/metrics", f"/h{i}/metrics") for i in range(HUNG)]
    urls += [f"{base_url}/r{i:02d}/metrics" for i in range(ROUTES - HUNG)]
    deadline = 1.5 * TIMEOUT
    print(
        f"2. {HUNG} routes on an engine that never answers, listed first, {ROUTES - HUNG} healthy; "
        f"{cycles} cycles each, back to back; cycle deadline {deadline:g} s:"
    )
    try:
        for v in variants:
            d, clock, timed = make_daemon(v, urls, custom_pool)
            last, missed = [], 0
            try:
                for cycle in range(cycles):
                    snap = tick(d, clock, timed)
                    healthy = [r for r in snap.routes if int(r.name[1:]) >= HUNG]
                    down = [(r.name, r.error_reason) for r in healthy if not r.up]
                    missed += bool(down)
                    if down:
                        print(
                            f"   {v:>10}: cycle {cycle + 1}: {len(down)} healthy routes down ({down[0]}...)", flush=True
                        )
                    last.append(max(timed.ok_done, default=float("nan")))
            finally:
                d.close()
                shut_down(timed.inner)
            print(
                f"   {v:>10}: last healthy answer {statistics.median(last):.3f} s after the cycle's start (median), "
                f"{max(last):.3f} s (max), by cycle {' '.join(f'{x:.2f}' for x in last)}; "
                f"cycles with a healthy route down: {missed} of {cycles}",
                flush=True,
            )
    finally:
        listener.close()
        farm.terminate()
        farm.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--variants", nargs="+", default=None, help="default: custom (with --custom-pool), daemon, stock:32"
    )
    parser.add_argument(
        "--custom-pool", type=Path, help="a file defining ScrapePool(max_workers, stall_seconds=) and STALL_SECONDS"
    )
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--fault-cycles", type=int, default=6)
    args = parser.parse_args(argv)
    variants = args.variants or ["custom"] * bool(args.custom_pool) + ["daemon", "stock:32"]
    logging.basicConfig(level=logging.ERROR)
    print(f"python {sys.version.split()[0]}, load average at start {__import__('os').getloadavg()[0]:.2f}")
    measure_cpu(variants, args.turns, args.custom_pool)
    if args.fault_cycles:
        measure_fault(variants, args.fault_cycles, args.custom_pool)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
