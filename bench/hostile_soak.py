#!/usr/bin/env python3
"""The daemon against a hostile engine on each of 8 routes (or `--hostile N`), plus one healthy route: does RSS stay
under the unit's MemoryMax, and does the healthy route miss any cycle?

    .venv/bin/python bench/hostile_soak.py                 # 10 minutes
    .venv/bin/python bench/hostile_soak.py --minutes 2     # a quick check
    .venv/bin/python bench/hostile_soak.py --hostile 14 --arena-max 0 --tree /path/to/main   # side by side

`--hostile N` cycles through the faults (14: all eight, then endless, slowloris, huge_length, gzip_bomb,
invalid_utf8 and many_series again, each a route of its own on the same server). `--tree PATH` runs a second daemon
from that checkout (PYTHONPATH) at the same time, on the same engines, so both see the same minutes.

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
    parser.add_argument("--hostile", type=int, default=8, help="hostile routes, cycling through the faults")
    parser.add_argument("--tree", action="append", default=[], help="another checkout to run beside this one")
    args = parser.parse_args(argv)
    ceiling = memory_max_bytes()
    engines = subprocess.Popen(
        [sys.executable, "-m", "specwatch.simulator.hostile"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    daemons: dict[str, Soaked] = {}
    try:
        assert engines.stdout is not None
        urls = dict(engines.stdout.readline().split() for _ in range(9))
        faults = [f for f in urls if f != "healthy"]
        routes = {
            f"{faults[i % len(faults)]}{'' if i < len(faults) else i // len(faults) + 1}": urls[faults[i % len(faults)]]
            for i in range(args.hostile)
        }
        routes["healthy"] = urls["healthy"]
        for tree in ["", *args.tree]:
            daemons[tree or "this tree"] = Soaked(routes, args.arena_max, tree)
        end = time.monotonic() + args.minutes * 60
        begin, next_report = time.monotonic(), time.monotonic() + 30
        while time.monotonic() < end:
            time.sleep(1.0)
            for label, soaked in daemons.items():
                if not soaked.poll():
                    print(f"{label}: the daemon exited with status {soaked.proc.returncode}")
                    return 1
            if time.monotonic() >= next_report:  # the peak of each 30 s, to tell growth from a plateau
                print(
                    f"  {time.monotonic() - begin:4.0f} s: peak RSS "
                    + ", ".join(f"{label} {s.take_window() / 2**20:.0f} MiB" for label, s in daemons.items()),
                    flush=True,
                )
                next_report += 30
        arena = f"MALLOC_ARENA_MAX={args.arena_max}" if args.arena_max else "glibc's default arenas"
        print(f"{args.minutes:g} min, {args.hostile} hostile routes + 1 healthy, {arena}, interval {INTERVAL:g} s")
        ok = True
        for label, s in daemons.items():
            under = s.peak < ceiling
            print(
                f"{label}: peak RSS {s.peak / 2**20:.0f} MiB against MemoryMax {ceiling / 2**20:.0f} MiB: "
                f"{'under' if under else 'OVER'}; evaluations seen {len(s.evaluations)}, missing from the "
                f"{INTERVAL:g} s grid {s.missed}; healthy route down in {s.healthy_down} of them"
            )
            for route, counts in sorted(s.reasons.items()):
                failing = {reason: int(n) for reason, n in counts.items() if n}
                print(f"    {route}: {failing or 'no failed scrapes'}")
            if label == "this tree":
                ok = under and s.healthy_down == 0 and s.missed == 0 and bool(s.evaluations)
        return 0 if ok else 1
    finally:
        for s in daemons.values():
            s.stop()
        engines.terminate()
        engines.wait(timeout=10)


class Soaked:
    """One `specwatch run` (from this checkout, or `tree`) on the routes, and what the bench saw of it."""

    def __init__(self, routes: dict[str, str], arena_max: int, tree: str) -> None:
        state_dir = tempfile.mkdtemp(prefix="specwatch-hostile-soak-")
        config = Path(state_dir) / "specwatch.yml"
        config.write_text(
            f"interval: {INTERVAL:g}s\nstate_dir: {state_dir}\ngpu:\n  enabled: 'false'\nroutes:\n"
            + "".join(f"  - name: {name}\n    url: {url}\n    engine: vllm\n" for name, url in routes.items())
        )
        port = free_port()
        env = dict(os.environ)
        env.pop("MALLOC_ARENA_MAX", None)
        if arena_max:
            env["MALLOC_ARENA_MAX"] = str(arena_max)
        if tree:  # `-m` puts the working directory first on sys.path: run from the tree, not from this checkout
            env["PYTHONPATH"] = str(Path(tree).resolve())
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "specwatch",
                "run",
                f"--config.file={config}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            env=env,
            cwd=Path(tree).resolve() if tree else REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.metrics = f"http://127.0.0.1:{port}/metrics"
        self.peak = self.window = 0
        self.evaluations: list[float] = []
        self.missed = self.healthy_down = 0
        self.reasons: dict[str, dict[str, float]] = {}

    def poll(self) -> bool:
        """Read RSS and /metrics once; False when the daemon has exited."""
        if self.proc.poll() is not None:
            return False
        rss = rss_bytes(self.proc.pid)
        self.peak, self.window = max(self.peak, rss), max(self.window, rss)
        try:
            last, up, self.reasons = scrape(self.metrics)
        except OSError:
            return True  # still starting
        if last and (not self.evaluations or last != self.evaluations[-1]):
            if self.evaluations and round((last - self.evaluations[-1]) / INTERVAL) > 1:
                self.missed += round((last - self.evaluations[-1]) / INTERVAL) - 1
            self.evaluations.append(last)
            self.healthy_down += up.get("healthy", 0.0) != 1.0
        return True

    def take_window(self) -> int:
        window, self.window = self.window, 0
        return window

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


if __name__ == "__main__":
    raise SystemExit(main())
