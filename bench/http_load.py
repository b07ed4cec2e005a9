#!/usr/bin/env python3
"""The daemon's HTTP server under hostile load: a Prometheus-like scrape's latency while other clients hammer it.

    .venv/bin/python bench/http_load.py                     # 200 scrapers + 100 slow connections, 30 s
    .venv/bin/python bench/http_load.py --scrapers 50 --slow 700 --seconds 60

Three processes on loopback: the server (`specwatch.export.http.serve` over a 64-route, 8-GPU Snapshot, a new
one every 5 s as the daemon publishes); the load (N threads scraping /metrics back to back on kept-alive
connections, and M slow connections that send a request head one byte a second and reconnect when cut); and
this one, scraping /metrics as Prometheus does (OpenMetrics, gzip, 10 s timeout) every `--every` seconds. It
prints that scrape's p50/p99/max, the load held (scrapes a second, slow connections open) and the server's
threads and RSS. Target: p99 under 1 s, and no scrape past Prometheus's 10 s timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PROMETHEUS_ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"


def snapshot(timestamp: float):  # noqa: ANN201 - a Snapshot; imported lazily so --help stays fast
    from specwatch import catalog
    from specwatch.snapshot import GpuSample, RouteState, Snapshot

    routes = tuple(
        RouteState(
            name=f"route-{i:02d}",
            up=True,
            engine_kind="vllm",
            model_name="meta-llama/Llama-3.1-8B-Instruct",
            engine_version="0.33.0",
            acceptance_source="counter",
            drafts_total=120000.0 + i,
            draft_tokens_total=480000.0 + i,
            accepted_tokens_total=288000.0 + i,
            acceptance_ratio={"1m": 0.58, "5m": 0.6, "1h": 0.62},
            mean_acceptance_length={"1m": 2.74, "5m": 2.8, "1h": 2.86},
            position_acceptance_ratio=(0.8, 0.6, 0.4, 0.3),
            draft_length=4.0,
            speculation_active=True,
            running_requests=24.0,
            waiting_requests=2.0,
            kv_usage_ratio=0.41,
            scrape_duration_seconds=0.012,
            errors_total={"connection": 0.0, "timeout": 2.0},
            gpus=(i % 8,),
            evaluator_errors_total={"above_crossover": 0.0, "acceptance_drop": 0.0},
            baseline_ratio=0.7,
            drop_ratio=0.14,
            degraded=False,
            cusum_statistic=3.5,
            crossover_batch_size=32.0,
            crossover_source="sweep",
            batch_size=12.0,
            above_crossover=False,
            predicted_speedup_ratio=1.35,
            compute_bound=False,
            live_crossover_batch_size=40.0,
            live_crossover_lower=35.0,
            live_crossover_upper=46.0,
        )
        for i in range(64)
    )
    keys = [m.name[len(catalog.PREFIX) :] for m in catalog.METRICS if m.labels == ("gpu",)]
    fields = {key: 0.25 if key.endswith("_ratio") else 100.0 + n for n, key in enumerate(keys)}
    gpus = tuple(GpuSample(index=g, up=True, uuid=f"GPU-{g}", name="NVIDIA H200", fields=fields) for g in range(8))
    return Snapshot(timestamp=timestamp, routes=routes, gpus=gpus, nvml_up=True)


def serve_child() -> None:
    from specwatch.export.http import serve

    current = {"snapshot": snapshot(time.time())}
    server = serve("127.0.0.1:0", lambda: current["snapshot"])
    print(server.port, flush=True)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    while not stop.wait(5.0):  # a new Snapshot every 5 s, as the daemon's evaluation publishes one
        current["snapshot"] = replace(current["snapshot"], timestamp=time.time())
    server.shutdown()


def load_child(port: int, scrapers: int, slow: int) -> None:
    import requests

    stop = threading.Event()
    counts = {"scrapes": 0, "scrape_errors": 0, "slow_opened": 0, "slow_cut": 0}
    held = [0]
    lock = threading.Lock()

    def scraper() -> None:
        with requests.Session() as session:
            while not stop.is_set():
                try:
                    ok = session.get(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 200
                except requests.RequestException:
                    ok = False
                with lock:
                    counts["scrapes" if ok else "scrape_errors"] += 1

    def slow_client() -> None:
        head = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 10_000
        while not stop.is_set():
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            except OSError:
                time.sleep(0.5)
                continue
            with lock:
                counts["slow_opened"] += 1
                held[0] += 1
            try:
                for byte in head:  # one byte a second: never a whole head
                    sock.send(bytes([byte]))
                    if stop.wait(1.0):
                        break
            except OSError:
                pass
            finally:
                sock.close()
                with lock:
                    held[0] -= 1
                    counts["slow_cut"] += 0 if stop.is_set() else 1

    threads = [threading.Thread(target=slow_client, daemon=True) for _ in range(slow)]
    threads += [threading.Thread(target=scraper, daemon=True) for _ in range(scrapers)]
    for t in threads:
        t.start()
    held_samples = []
    begin = time.monotonic()
    stopper = threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True)
    stopper.start()
    while not stop.wait(1.0):
        held_samples.append(held[0])
    elapsed = time.monotonic() - begin
    print(
        json.dumps(
            {
                **counts,
                "scrapes_per_second": counts["scrapes"] / elapsed,
                "slow_held_median": statistics.median(held_samples) if held_samples else 0,
                "slow_held_min": min(held_samples) if held_samples else 0,
            }
        ),
        flush=True,
    )


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_threads_and_rss(pid: int) -> tuple[int, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0]) / 1024


def probe(
    port: int, seconds: float, every: float = 0.25, after_each: Callable[[], None] = lambda: None
) -> tuple[list[float], int]:
    """A Prometheus-like scraper (OpenMetrics, gzip) every `every` s for `seconds`: the answered scrapes'
    latencies, sorted, and the number that failed; `after_each` runs after every scrape (to sample the server)."""
    import requests

    latencies, failures = [], 0
    with requests.Session() as prometheus:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            begin = time.monotonic()
            try:
                answer = prometheus.get(
                    f"http://127.0.0.1:{port}/metrics",
                    headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"},
                    timeout=10,
                )
                ok = answer.status_code == 200 and answer.text.endswith("# EOF\n")
            except requests.RequestException:
                ok = False
            took = time.monotonic() - begin
            if ok:
                latencies.append(took)
            else:
                failures += 1
            after_each()
            time.sleep(max(0.0, every - took))
    return sorted(latencies), failures


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_serve":
        serve_child()
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "_load":
        load_child(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scrapers", type=int, default=200, help="clients scraping /metrics back to back")
    parser.add_argument("--slow", type=int, default=100, help="connections sending a request head a byte a second")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the Prometheus-like scraper runs")
    parser.add_argument("--every", type=float, default=0.25, help="seconds between its scrapes")
    args = parser.parse_args()

    server = subprocess.Popen([sys.executable, __file__, "_serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert server.stdout is not None and server.stdin is not None
    port = int(server.stdout.readline())
    load = subprocess.Popen(
        [sys.executable, __file__, "_load", str(port), str(args.scrapers), str(args.slow)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    peak_threads, peak_rss = 0, 0.0

    def sample_server() -> None:
        nonlocal peak_threads, peak_rss
        threads, rss = server_threads_and_rss(server.pid)
        peak_threads, peak_rss = max(peak_threads, threads), max(peak_rss, rss)

    try:
        time.sleep(3.0)  # let the load connect
        cpu_before, wall_before = cpu_seconds(server.pid), time.monotonic()
        latencies, failures = probe(port, args.seconds, args.every, after_each=sample_server)
        server_cpu = (cpu_seconds(server.pid) - cpu_before) / (time.monotonic() - wall_before)
    finally:
        assert load.stdin is not None
        load.stdin.close()
        held = json.loads(load.stdout.read().strip().splitlines()[-1]) if load.stdout else {}
        load.wait(30)
        server.stdin.close()
        server.wait(30)
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else float("inf")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    print(
        f"load held: {args.scrapers} scrapers at {held.get('scrapes_per_second', 0):.0f} scrapes/s "
        f"({held.get('scrape_errors', 0)} failed), slow connections open median {held.get('slow_held_median')} "
        f"(min {held.get('slow_held_min')}; {held.get('slow_cut')} cut by the server and reopened)"
    )
    print(
        f"Prometheus-like scrape (OpenMetrics, gzip), {len(latencies)} answered, {failures} failed: "
        f"p50 {statistics.median(latencies) * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms, max {latencies[-1] * 1e3:.0f} ms "
        f"(target p99 < 1000 ms): {'PASS' if p99 < 1.0 and not failures else 'MISS'}"
    )
    print(
        f"server: at most {peak_threads} threads, {peak_rss:.0f} MB RSS, {server_cpu:.2f} cores busy, "
        f"{server_cpu / max(held.get('scrapes_per_second', 0), 1) * 1e6:.0f} us CPU per scrape served"
    )
    return 0 if p99 < 1.0 and not failures else 1


if __name__ == "__main__":
    raise SystemExit(main())
