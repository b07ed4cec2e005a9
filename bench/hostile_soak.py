#!/usr/bin/env python3
"""The daemon against a hostile engine on each of 8 routes, plus one healthy route: does RSS stay under the unit's
MemoryMax, and does the healthy route miss any cycle?

    .venv/bin/python bench/hostile_soak.py                 # 10 minutes
    .venv/bin/python bench/hostile_soak.py --minutes 2     # a quick check

The engines (specwatch/simulator/hostile.py, in a child process, one loopback port each): an endless chunked
body, slowloris, a 1 GiB Content-Length, a gzip bomb, invalid UTF-8, 200,000 series, every series twice, and a
server that accepts and never answers; and one healthy vLLM endpoint. The daemon is `specwatch run` in a child
process with the unit's environment (MALLOC_ARENA_MAX=2, `--arena-max 0` to leave glibc's default) and the
default scrape settings at a 5 s interval. Every second the bench reads the daemon's RSS (/proc) and its
/metrics; for each new `specwatch_last_evaluation_timestamp_seconds` it records whether the healthy route was
up, and it counts evaluations missing from the 5 s grid. It prints the peak RSS against MemoryMax (read from
systemd/specwatch.service), the cycles, those the healthy route missed, and each hostile route's last reason.
Exit status 0 when RSS stayed under MemoryMax and the healthy route missed nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INTERVAL = 5.0
_SAMPLE = re.compile(
    r'^(specwatch_route_up|specwatch_last_evaluation_timestamp_seconds)(?:\{route="([^"]*)"\})? (\S+)$'
)
_REASON = re.compile(r'^specwatch_source_errors_total\{reason="([^"]+)",route="([^"]+)"\} (\S+)$')


def memory_max_bytes() -> int:
    """The unit's MemoryMax= (e.g. 512M) in bytes."""
    text = (REPO / "systemd" / "specwatch.service").read_text()
    match = re.search(r"^MemoryMax=(\d+)([KMG]?)\s*$", text, re.M)
    if match is None:
        raise SystemExit("no MemoryMax= in systemd/specwatch.service")
    return int(match.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[match.group(2)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def scrape(url: str) -> tuple[float, dict[str, float], dict[str, dict[str, float]]]:
    """(last evaluation timestamp, route -> up, route -> reason -> errors) from the daemon's /metrics."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    last, up, reasons = 0.0, {}, {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            if m.group(1) == "specwatch_route_up":
                up[m.group(2)] = float(m.group(3))
            else:
                last = float(m.group(3))
            continue
        m = _REASON.match(line)
        if m:
            reasons.setdefault(m.group(2), {})[m.group(1)] = float(m.group(3))
    return last, up, reasons


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--arena-max", type=int, default=2, help="MALLOC_ARENA_MAX for the daemon; 0: unset")
    args = parser.parse_args(argv)
    ceiling = memory_max_bytes()
    engines = subprocess.Popen(
        [sys.executable, "-m", "specwatch.simulator.hostile"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    daemon = None
    try:
        assert engines.stdout is not None
        urls = dict(engines.stdout.readline().split() for _ in range(9))
        state_dir = tempfile.mkdtemp(prefix="specwatch-hostile-soak-")
        config = Path(state_dir) / "specwatch.yml"
        config.write_text(
            f"interval: {INTERVAL:g}s\nstate_dir: {state_dir}\ngpu:\n  enabled: 'false'\nroutes:\n"
            + "".join(f"  - name: {name}\n    url: {url}\n    engine: vllm\n" for name, url in urls.items())
        )
        port = free_port()
        env = dict(os.environ)
        env.pop("MALLOC_ARENA_MAX", None)
        if args.arena_max:
            env["MALLOC_ARENA_MAX"] = str(args.arena_max)
        daemon = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "specwatch",
                "run",
                f"--config.file={config}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        metrics = f"http://127.0.0.1:{port}/metrics"
        end = time.monotonic() + args.minutes * 60
        peak, evaluations, missed, healthy_down, reasons = 0, [], 0, 0, {}
        begin, window_peak, next_report = time.monotonic(), 0, time.monotonic() + 30
        while time.monotonic() < end:
            time.sleep(1.0)
            if daemon.poll() is not None:
                print(f"the daemon exited with status {daemon.returncode}")
                return 1
            rss = rss_bytes(daemon.pid)
            peak, window_peak = max(peak, rss), max(window_peak, rss)
            if time.monotonic() >= next_report:  # the peak of each 30 s, to tell growth from a plateau
                print(f"  {time.monotonic() - begin:4.0f} s: peak RSS {window_peak / 2**20:.0f} MiB", flush=True)
                window_peak, next_report = 0, next_report + 30
            try:
                last, up, reasons = scrape(metrics)
            except OSError:
                continue  # still starting
            if last and (not evaluations or last != evaluations[-1]):
                if evaluations and round((last - evaluations[-1]) / INTERVAL) > 1:
                    missed += round((last - evaluations[-1]) / INTERVAL) - 1
                    print(f"  evaluations {evaluations[-1]:.1f} -> {last:.1f}: {missed} missing so far", flush=True)
                evaluations.append(last)
                healthy_down += up.get("healthy", 0.0) != 1.0
        arena = f"MALLOC_ARENA_MAX={args.arena_max}" if args.arena_max else "glibc's default arenas"
        print(f"{args.minutes:g} min, 8 hostile routes + 1 healthy, {arena}, interval {INTERVAL:g} s")
        print(
            f"peak RSS {peak / 2**20:.0f} MiB against MemoryMax {ceiling / 2**20:.0f} MiB: "
            f"{'under' if peak < ceiling else 'OVER'}"
        )
        print(
            f"evaluations seen {len(evaluations)}, missing from the {INTERVAL:g} s grid {missed}; "
            f"healthy route down in {healthy_down} of them"
        )
        for route, counts in sorted(reasons.items()):
            failing = {reason: int(n) for reason, n in counts.items() if n}
            print(f"  {route}: {failing or 'no failed scrapes'}")
        return 0 if peak < ceiling and healthy_down == 0 and missed == 0 and evaluations else 1
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.terminate()
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
        engines.terminate()
        engines.wait(timeout=10)


if __name__ == "__main__":
    raise SystemExit(main())
