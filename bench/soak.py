#!/usr/bin/env python3
"""Soak test: the whole daemon over many routes for a long time; RSS, file descriptors and threads must stay flat.

Two modes, both printing one line per report period and a JSON verdict at the end (exit 1 on a failed limit):

  live         Real time. The daemon (APScheduler loop, real engine sources, the /metrics HTTP server scraped
               every 15 s as Prometheus does, OpenMetrics + gzip, 8 fake-NVML GPUs) scrapes ROUTES simulated
               vLLM engines (2 DP engines, k=4) served by a child process on loopback, at --interval, for
               --duration.
               `--sources trace` feeds the routes from in-process traces instead (no engine scraping).
                   .venv/bin/python bench/soak.py live --routes 64 --interval 1 --duration 900
  accelerated  Fake clock. The same daemon ticks through --duration of trace time (specwatch.offline.tracegen, the
               replay traces) as fast as it can, rendering /metrics as served to Prometheus every 15 trace seconds.
                   .venv/bin/python bench/soak.py accelerated --routes 64 --interval 5 --duration 86400

Limits: after --warmup, RSS grows by less than 5 MB and the fd and thread counts do not grow. The
live warm-up (6 minutes) outlasts the daemon's 5-minute windows, which fill first (LIVE_WARMUP_SECONDS).
`live --sources http` needs the engine sources (`specwatch.sources.engines`); without them it exits 2.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import logging
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs
from typing import Any, Callable, Iterator

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]  # specwatch from this checkout; testbed/fake_nvml.py for GPUs

from specwatch.config import Config, parse_config
from specwatch.daemon import Daemon
from specwatch.snapshot import EngineCounters, EngineSample

RSS_GROWTH_LIMIT_BYTES = 5 * 1024 * 1024
# The daemon's per-cycle state (the window ring's exact part, the drop detector's confirm window, the per-position
# acceptance window) spans 5 minutes: at 1 s it fills for 300 cycles, about 2.2 MiB a minute for 64 routes
# (accelerated, fake clock), then stays flat. Growth is measured once it is full.
LIVE_WARMUP_SECONDS = 360.0
# What Prometheus 2.42 sends when it scrapes (captured), so the soak exercises the render Prometheus gets.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
K = 4
POSITION_ACCEPTANCE = (0.78, 0.60, 0.45, 0.33)  # p_j: chance a draft's position j is accepted


# ----------------------------------------------------------------------------------------- process figures
@dataclass(frozen=True)
class ProcessFigures:
    at: float  # seconds since the start (trace seconds in accelerated mode)
    rss_bytes: int
    fds: int
    threads: int


def process_figures(at: float) -> ProcessFigures:
    status = Path("/proc/self/status").read_text()
    rss_kib = int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1))
    threads = int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1))
    return ProcessFigures(at=at, rss_bytes=rss_kib * 1024, fds=len(os.listdir("/proc/self/fd")), threads=threads)


def verdict(figures: list[ProcessFigures], warmup: float) -> dict[str, Any]:
    """RSS: growth from the first figure after warm-up to the last. Fds and threads: the most seen in the second
    half after warm-up may not exceed the most seen in the first half (transient HTTP handler threads come and go;
    a leak keeps climbing)."""
    steady = [f for f in figures if f.at >= warmup]
    if len(steady) < 4:
        return {"ok": False, "problems": ["the run ended before there were four figures after warm-up"]}
    first, last = steady[0], steady[-1]
    early, late = steady[: len(steady) // 2], steady[len(steady) // 2 :]
    fds = [max(f.fds for f in early), max(f.fds for f in late)]
    threads = [max(f.threads for f in early), max(f.threads for f in late)]
    result: dict[str, Any] = {
        "seconds_measured": round(last.at - first.at, 1),
        "rss_after_warmup_mib": round(first.rss_bytes / 2**20, 2),
        "rss_end_mib": round(last.rss_bytes / 2**20, 2),
        "rss_max_mib": round(max(f.rss_bytes for f in steady) / 2**20, 2),
        "rss_growth_mib": round((last.rss_bytes - first.rss_bytes) / 2**20, 2),
        "fds_max_first_second_half": fds,
        "threads_max_first_second_half": threads,
    }
    problems = []
    if last.rss_bytes - first.rss_bytes >= RSS_GROWTH_LIMIT_BYTES:
        problems.append("RSS grew by 5 MB or more after warm-up")
    if fds[1] > fds[0]:
        problems.append("file descriptors grew")
    if threads[1] > threads[0]:
        problems.append("threads grew")
    result["ok"] = not problems
    result["problems"] = problems
    return result


def daemon_config(routes: int, interval: float, state_dir: str, base_url: str, gpus: bool) -> Config:
    return parse_config(
        {
            "interval": f"{interval:g}s",
            "state_dir": state_dir,
            "scrape": {"timeout": f"{min(2.0, 0.8 * interval) * 1000:g}ms"},  # must be shorter than the interval
            "gpu": {"enabled": "true" if gpus else "false"},
            # Each route pinned to one of the 8 GPUs, as on a packed host (the fake GPUs' processes are not real
            # PIDs, so auto-mapping would retry every 10 s forever and measure that instead).
            "routes": [
                {
                    "name": f"r{i:02d}",
                    "url": f"{base_url}/r{i:02d}/metrics",
                    "engine": "vllm",
                    "gpus": [i % 8],
                    "crossover": {"batch_size": 32},
                }
                for i in range(routes)
            ],
        }
    )


def fake_gpu_factory(count: int = 8) -> Callable[[Any], Any]:
    """8 H200s behind the fake pynvml of the test suite, through the real GPU source."""
    from testbed import fake_nvml
    from specwatch.sources import nvml as nvml_source

    nvml = fake_nvml.basic_h200(count)
    return lambda gpu_cfg: nvml_source.make_gpu_source(gpu_cfg, nvml=nvml)


# ----------------------------------------------------------------------------------------- simulated engines
class SimulatedVllm:
    """One simulated vLLM server (2 DP engines, k=4): the simulator's exposition, advanced lazily at scrape time
    by the steps a busy engine would have run since the last scrape (cheap enough for 64 in one process).

    `per_scrape_seconds` (the overhead benchmark): every scrape advances the engines by that many seconds,
    however little wall time passed, so cycles run back to back on a fake clock each see new counts as a 5 s
    interval would. Between full renders the spec-decode counter lines of the cached body are rewritten.
    """

    STEPS_PER_SECOND = 40.0
    BATCH = 24
    # Re-render at most this often: 64 prometheus_client renders a second would need more than the one core the
    # simulated engines get, and the daemon only needs counters that move between its cycles now and then.
    REFRESH_SECONDS = 10.0
    _SPEC_LINE = re.compile(
        rb"^(vllm:spec_decode_num_(?:drafts|draft_tokens|accepted_tokens|accepted_tokens_per_pos)"
        rb"_total)\{([^}]*)\} \S+$",
        re.M,
    )
    _ENGINE = re.compile(rb'engine="(\d+)"')
    _POSITION = re.compile(rb'position="(\d+)"')

    def __init__(self, name: str, seed: int, per_scrape_seconds: float = 0.0, multiprocess: bool = False) -> None:
        from specwatch.simulator.metrics_vllm import VllmMetrics

        self.metrics = VllmMetrics(f"model-{name}", engines=2, k=K)
        self.rng = random.Random(seed)
        self.per_scrape_seconds = per_scrape_seconds
        self.multiprocess = multiprocess
        self.last = time.monotonic() - self.REFRESH_SECONDS * self.rng.random()  # spread the refreshes
        self.lock = threading.Lock()
        self.body = b""
        self.totals: dict[tuple[bytes, int, int], int] = {}  # (family, engine, position or -1) -> count

    def render(self, names: list[str] | None = None) -> bytes:
        """The exposition; with `names` (`?name[]=...`) only those samples, as vLLM with one API server serves
        them, or nothing at all when `multiprocess` (vLLM with several API servers, and SGLang)."""
        with self.lock:
            now = time.monotonic()
            due = not self.body or now - self.last >= self.REFRESH_SECONDS
            if names:
                if self.per_scrape_seconds:
                    self._step(now, self.per_scrape_seconds, finished=False)
                elif due:
                    elapsed, self.last = now - self.last, now
                    self._step(now, elapsed, finished=True)
                    self.body = b""  # stale now: the next whole scrape renders afresh
                return b"" if self.multiprocess else self.metrics.render(names)
            if self.per_scrape_seconds:
                self._step(now, self.per_scrape_seconds, finished=due)
                if due:
                    self.last = now
                    self.body = self.metrics.render()
                else:
                    self.body = self._SPEC_LINE.sub(self._current, self.body)
            elif due:
                elapsed, self.last = now - self.last, now
                self._step(now, elapsed, finished=True)
                self.body = self.metrics.render()
            return self.body

    def _current(self, m: re.Match) -> bytes:
        labels = m.group(2)
        position = self._POSITION.search(labels)
        key = (m.group(1), int(self._ENGINE.search(labels).group(1)), int(position.group(1)) if position else -1)
        return b"%s{%s} %d.0" % (m.group(1), labels, self.totals.get(key, 0))

    def _step(self, now: float, elapsed: float, finished: bool) -> None:
        from specwatch.simulator.engine import StepRecord

        steps = max(1, round(elapsed * self.STEPS_PER_SECOND))
        for engine in (0, 1):
            drafts = steps * self.BATCH
            per_pos = [round(drafts * p * self.rng.uniform(0.97, 1.03)) for p in POSITION_ACCEPTANCE]
            accepted = sum(per_pos)
            self.metrics.on_step(
                engine,
                StepRecord(
                    now=now,
                    duration=0.025,
                    running=self.BATCH,
                    waiting=self.rng.randrange(4),
                    kv_usage=self.rng.uniform(0.2, 0.6),
                    prompt_tokens=steps * 40,
                    emitted_tokens=drafts + accepted,
                    drafts=drafts,
                    draft_tokens=K * drafts,
                    accepted_tokens=accepted,
                    accepted_per_pos=per_pos,
                ),
            )
            for family, value in (
                (b"vllm:spec_decode_num_drafts_total", drafts),
                (b"vllm:spec_decode_num_draft_tokens_total", K * drafts),
                (b"vllm:spec_decode_num_accepted_tokens_total", accepted),
            ):
                self.totals[(family, engine, -1)] = self.totals.get((family, engine, -1), 0) + value
            for j, value in enumerate(per_pos):
                key = (b"vllm:spec_decode_num_accepted_tokens_per_pos_total", engine, j)
                self.totals[key] = self.totals.get(key, 0) + value
            for _ in range(self.rng.randrange(1, 4) if finished else 0):  # finished requests fill the histograms
                self.metrics.on_finish(
                    engine,
                    SimpleNamespace(
                        finish_reason="stop",
                        arrival=now - 3.0,
                        scheduled_at=now - 2.9,
                        first_token_at=now - 2.7,
                        generated=self.rng.randrange(50, 800),
                        prompt_tokens=self.rng.randrange(100, 2000),
                        max_tokens=1024,
                    ),
                    now,
                )


def serve_engines(routes: int, port: int, per_scrape_seconds: float = 0.0, multiprocess: bool = False) -> None:
    """The child process of `live`: ROUTES simulated servers on one loopback port, as /rNN/metrics."""
    engines = {
        f"r{i:02d}": SimulatedVllm(
            f"r{i:02d}", seed=i, per_scrape_seconds=per_scrape_seconds, multiprocess=multiprocess
        )
        for i in range(routes)
    }

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's uvicorn and SGLang's servers do
        # TCP_NODELAY, as uvicorn's asyncio transports set it: headers and body go out in two writes, and with
        # Nagle on, a small body waits ~40 ms for the client's delayed ACK of the headers.
        disable_nagle_algorithm = True

        def do_GET(self) -> None:  # noqa: N802 - stdlib naming
            path, _, query = self.path.partition("?")
            parts = path.strip("/").split("/")
            engine = engines.get(parts[0]) if parts else None
            if engine is None or parts[1:] != ["metrics"]:
                self.send_error(404)
                return
            body = engine.render(parse_qs(query).get("name[]"))
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        # As uvicorn's 2048: every route connects at once on the first cycle, and http.server's backlog of 5 drops
        # SYNs, each a 1 s retransmit that the scrape timeout then charges to the client.
        request_queue_size = 2048

    server = Server(("127.0.0.1", port), Handler)
    print("ready", flush=True)
    server.serve_forever()


def start_engine_farm(
    routes: int, per_scrape_seconds: float = 0.0, multiprocess: bool = False
) -> tuple[subprocess.Popen, str]:
    """ROUTES simulated vLLM servers in a child process; `per_scrape_seconds`, `multiprocess`: see SimulatedVllm."""
    from specwatch.simulator.launch import free_port

    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "serve-engines",
            "--routes",
            str(routes),
            "--port",
            str(port),
            "--per-scrape-seconds",
            str(per_scrape_seconds),
        ]
        + ["--multiprocess"] * multiprocess,
        stdout=subprocess.PIPE,
        text=True,
    )
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError("the simulated engines did not start")
    return proc, f"http://127.0.0.1:{port}"


# ----------------------------------------------------------------------------------------- trace sources
class TraceSource:
    """An engine source replaying one `specwatch.offline.tracegen` trace: one sample per call."""

    def __init__(self, samples: Iterator[Any]) -> None:
        self.samples = samples

    def sample(self, now: float) -> EngineSample:
        s = next(self.samples)
        engine = EngineCounters(
            engine="0",
            drafts=s.drafts,
            draft_tokens=s.draft_tokens,
            accepted_tokens=s.accepted_tokens,
            accepted_per_pos=tuple(s.accepted_per_pos),
            running=s.running,
        )
        return EngineSample(
            ts=now,
            engine_kind="vllm",
            acceptance_source="counter",
            model_name=s.model_name,
            engine_version="0.33.0",
            num_speculative_tokens=K,
            engines=(engine,),
        )

    def close(self) -> None:
        pass


def trace_source_factory(start: float, interval: float, duration: float) -> Callable[[Any, Any], TraceSource]:
    from specwatch.offline.tracegen import TraceSpec, generate

    def factory(route_cfg: Any, config: Any) -> TraceSource:
        seed = int(route_cfg.name[1:])
        spec = TraceSpec(
            route=route_cfg.name,
            start=start,
            interval=interval,
            duration=duration + 10 * interval,
            rate=2.0 + seed % 5,
            seed=seed,
        )
        return TraceSource(generate(spec))

    return factory


# ----------------------------------------------------------------------------------------- the two modes
def report_line(f: ProcessFigures, extra: str = "") -> None:
    print(
        f"t={f.at:8.0f}s rss={f.rss_bytes / 2**20:7.2f} MiB fds={f.fds:3d} threads={f.threads:3d} {extra}", flush=True
    )


def scrape_like_prometheus(url: str) -> bool:
    """GET /metrics with the headers Prometheus sends (OpenMetrics first, gzip); True if a whole body came back."""
    request = urllib.request.Request(url, headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            body = resp.read()
            if resp.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
    except (OSError, EOFError):  # gzip.BadGzipFile is an OSError
        return False
    return body.endswith(b"# EOF\n")


def run_live(args: argparse.Namespace) -> dict[str, Any]:
    from specwatch.export.http import serve
    from specwatch.scheduler import start_scheduler

    state_dir = tempfile.mkdtemp(prefix="specwatch-soak-")
    farm = None
    if args.sources == "http":
        farm, base_url = start_engine_farm(args.routes)
        daemon = Daemon(
            daemon_config(args.routes, args.interval, state_dir, base_url, gpus=True),
            gpu_source_factory=fake_gpu_factory(),
        )
    else:
        daemon = Daemon(
            daemon_config(args.routes, args.interval, state_dir, "http://127.0.0.1:9", gpus=True),
            gpu_source_factory=fake_gpu_factory(),
            source_factory=trace_source_factory(time.time(), args.interval, args.duration * 2),
        )
    server = serve("127.0.0.1:0", lambda: daemon.snapshot)
    metrics_url = f"{server.url}/metrics"
    scheduler = start_scheduler(daemon, args.interval, first_run_in=0.1)
    figures: list[ProcessFigures] = []
    begin = time.monotonic()
    next_report, next_scrape = begin, begin + 1.0
    scrape_failures = 0
    try:
        while (now := time.monotonic()) - begin < args.duration:
            # Figures first: our own /metrics scrape below is synchronous, so none is in flight when they are taken.
            if now >= next_report:
                snap = daemon.snapshot
                f = process_figures(now - begin)
                figures.append(f)
                report_line(
                    f,
                    f"routes_up={sum(r.up for r in snap.routes)}/{len(snap.routes)} "
                    f"eval={snap.evaluation_duration_seconds * 1e3:.1f}ms "
                    f"overruns={snap.evaluation_overruns_total:g}",
                )
                next_report += args.report_every
            if now >= next_scrape:  # a Prometheus scrape of our /metrics
                if not scrape_like_prometheus(metrics_url):
                    scrape_failures += 1
                next_scrape += 15.0
            time.sleep(0.2)
    finally:
        scheduler.shutdown(wait=True)
        snap = daemon.snapshot
        server.shutdown()
        daemon.close()
        if farm is not None:
            farm.terminate()
            farm.wait(timeout=10)
    result = verdict(figures, args.warmup)
    result.update(
        mode="live",
        sources=args.sources,
        routes=args.routes,
        interval=args.interval,
        duration=args.duration,
        metrics_scrape_failures=scrape_failures,
        overruns=snap.evaluation_overruns_total,
        routes_up_at_end=sum(r.up for r in snap.routes),
    )
    if scrape_failures or result["routes_up_at_end"] != args.routes:
        result["ok"] = False
        result.setdefault("problems", []).append("routes down or /metrics failing at the end")
    return result


def run_accelerated(args: argparse.Namespace) -> dict[str, Any]:
    from specwatch.export.http import RenderCache

    start = 1_700_000_000.0
    clock = SimpleNamespace(now=start)
    state_dir = tempfile.mkdtemp(prefix="specwatch-soak-")
    daemon = Daemon(
        daemon_config(args.routes, args.interval, state_dir, "http://127.0.0.1:9", gpus=True),
        source_factory=trace_source_factory(start, args.interval, args.duration),
        gpu_source_factory=fake_gpu_factory(),
        clock=lambda: clock.now,
    )
    renders = RenderCache(lambda: daemon.snapshot)  # what the HTTP server renders /metrics with
    figures: list[ProcessFigures] = []
    ticks = int(args.duration // args.interval)
    next_render = next_report = 0.0
    wall = time.monotonic()
    try:
        for i in range(1, ticks + 1):
            clock.now = start + i * args.interval
            snap = daemon.tick(clock.now)
            at = i * args.interval
            if at >= next_render:
                renders.body(PROMETHEUS_ACCEPT, "gzip")
                next_render += 15.0
            if at >= next_report:
                gc.collect()  # figures at comparable points, not wherever the collector happened to be
                f = process_figures(at)
                figures.append(f)
                report_line(
                    f,
                    f"routes_up={sum(r.up for r in snap.routes)}/{len(snap.routes)} "
                    f"wall={time.monotonic() - wall:.0f}s",
                )
                next_report += args.report_every
    finally:
        daemon.close()
    result = verdict(figures, args.warmup)
    result.update(
        mode="accelerated",
        routes=args.routes,
        interval=args.interval,
        trace_seconds=args.duration,
        wall_seconds=round(time.monotonic() - wall, 1),
        state_errors=snap.state_errors_total,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    for name, interval, duration, warmup, every in (
        ("live", 1.0, 900.0, LIVE_WARMUP_SECONDS, 30.0),
        ("accelerated", 5.0, 86400.0, 7200.0, 3600.0),
    ):
        p = sub.add_parser(name)
        p.add_argument("--routes", type=int, default=64)
        p.add_argument("--interval", type=float, default=interval, help="seconds between cycles")
        p.add_argument("--duration", type=float, default=duration, help="seconds (trace seconds if accelerated)")
        p.add_argument("--warmup", type=float, default=warmup, help="growth is measured after this many seconds")
        p.add_argument("--report-every", type=float, default=every)
        if name == "live":
            p.add_argument(
                "--sources",
                choices=("http", "trace"),
                default="http",
                help="http: engine sources scraping simulated engines; trace: in-process trace sources",
            )
    p = sub.add_parser("serve-engines", help="internal: the simulated engines of `live`")
    p.add_argument("--routes", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument(
        "--per-scrape-seconds",
        type=float,
        default=0.0,
        help="advance the engines this much per scrape, not by wall time (the overhead benchmark)",
    )
    p.add_argument(
        "--multiprocess",
        action="store_true",
        help="answer ?name[]=... with nothing, as vLLM with several API servers (and SGLang) do",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.mode == "serve-engines":
        serve_engines(args.routes, args.port, args.per_scrape_seconds, args.multiprocess)
        return 0
    result = run_live(args) if args.mode == "live" else run_accelerated(args)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
