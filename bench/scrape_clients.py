#!/usr/bin/env python3
"""The scrape client (specwatch/sources/http.py's HttpFetcher) against urllib3's connection handling, CPU per GET,
side by side in ONE process (alternating turns):

    .venv/bin/python bench/scrape_clients.py                 # 12 turns of 200 GETs per client and body
    .venv/bin/python bench/scrape_clients.py --turns 20

Both clients keep one connection alive to the same simulated vLLM engine (bench/soak.py's farm, in a child
process, so its CPU is not counted), send the same Accept header and read the whole body; urllib3 through a
`PoolManager` (what requests uses underneath), with its own decoding off as the scrape asks for none. Two
bodies: the full exposition (~85 KB) and the `?name[]=` filtered one a route fetches when the engine honours it.
Printed per body: median process CPU per GET (us) over the turns, and urllib3's ratio to HttpFetcher (the
issue's bar for taking a library's connection handling: within 1.2x).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--gets", type=int, default=200, help="GETs per turn")
    args = parser.parse_args(argv)

    import urllib3

    from specwatch.simulator.launch import free_port
    from specwatch.sources import vllm
    from specwatch.sources.http import ACCEPT, HttpFetcher

    port = free_port()
    farm = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / "soak.py"), "serve-engines", "--routes", "1", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert farm.stdout is not None
    if farm.stdout.readline().strip() != "ready":
        raise SystemExit("the simulated engine did not start")
    base = f"http://127.0.0.1:{port}/r00/metrics"
    filtered = base + "?" + "&".join(f"name[]={n}" for n in sorted(vllm.WANTED))
    fetcher = HttpFetcher(timeout_seconds=5.0)
    pool = urllib3.PoolManager(maxsize=1, retries=False, timeout=urllib3.Timeout(5.0))
    headers = {"Accept": ACCEPT}

    def ours(url: str) -> bytes:
        return fetcher.get(url)

    def theirs(url: str) -> bytes:
        response = pool.request("GET", url, headers=headers, preload_content=True, decode_content=False)
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}")
        return response.data

    clients: dict[str, Callable[[str], bytes]] = {"HttpFetcher": ours, "urllib3": theirs}
    try:
        for name, url in (("full", base), ("filtered", filtered)):
            sizes = {c: len(get(url)) for c, get in clients.items()}  # warm: connect once
            per_get: dict[str, list[float]] = {c: [] for c in clients}
            for turn in range(args.turns):
                order = list(clients) if turn % 2 == 0 else list(reversed(clients))
                for c in order:
                    get = clients[c]
                    begin = time.process_time()
                    for _ in range(args.gets):
                        get(url)
                    per_get[c].append((time.process_time() - begin) / args.gets * 1e6)
            med = {c: statistics.median(v) for c, v in per_get.items()}
            print(
                f"{name} body ({sizes['HttpFetcher']} bytes; urllib3 read {sizes['urllib3']}): "
                f"HttpFetcher {med['HttpFetcher']:.0f} us/GET, urllib3 {med['urllib3']:.0f} us/GET, "
                f"ratio {med['urllib3'] / med['HttpFetcher']:.2f}x (median of {args.turns} turns of {args.gets})"
            )
    finally:
        fetcher.close()
        pool.clear()
        farm.kill()
        farm.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
