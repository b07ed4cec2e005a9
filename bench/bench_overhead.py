#!/usr/bin/env python3
"""Overhead benchmarks: what specwatch costs the GPU host, five figures against their targets.

    .venv/bin/python bench/bench_overhead.py            # all five, about 7 minutes on 2 cores
    .venv/bin/python bench/bench_overhead.py --json     # the same, plus one JSON line at the end
    .venv/bin/python bench/bench_overhead.py --baseline HEAD~3   # also figure 2 of that commit, side by side
    .venv/bin/python bench/bench_overhead.py --baseline DIR      # ... of the tree in DIR (where there is no git)

1. Parse and extraction of a full vLLM exposition (2 DP engines, k=4, populated histograms) by specwatch's
   engine source vs `prometheus_client.parser.text_string_to_metric_families` on the same bytes: >= 10x.
2. Daemon CPU at a 5 s interval with 64 routes and 8 GPUs (fake NVML through the real GPU source), in steady
   state: one cycle plus a third of a /metrics render (Prometheus scraping every 15 s): < 1% of one core.
3. Steady-state RSS of that daemon process after more than an hour of cycles (the 1 h windows full): < 80 MB.
4. Rendering /metrics for that 64-route Snapshot: < 20 ms. Measured as the HTTP server serves it to Prometheus
   for a new Snapshot (its RenderCache, cold; OpenMetrics, gzipped, as Prometheus asks), beside prometheus_client's
   generate_latest (0.0.4 text, not gzipped) on the same Snapshot.
5. Figure 2's CPU against the exporter a team would write first (requests + prometheus_client's parser and
   Gauges, every /metrics fetched whole and parsed, its own /metrics rendered at 15 s) on the same 64
   endpoints, measured in the same run: <= 0.1x.

2 and 3 are measured for three layouts, each in its own child process: 64 routes on 64 separate vLLM
endpoints that answer `?name[]=` as vLLM with one API server (the default) does, so specwatch fetches only
the series it reads (sources/name_filter.py); the same 64 endpoints answering it with nothing, as vLLM with
several API servers and SGLang do, so each is fetched whole (~85 KB); and 8 endpoints with 8 routes each
(routes told apart by `engines`), where each endpoint is fetched and parsed once per cycle. Targets are
judged on the first; the other two are printed beside it.

2-4 run in a fresh child process holding only the daemon, so the figures are the daemon's own. Its clock is
fake (cycles run back to back, each stamped 5 s after the previous) but everything else is real: the engine
source scrapes simulated vLLM servers on loopback (bench/soak.py), parses and tracks them, the detectors
and the SQLite state store run, APScheduler is the only part left out.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import soak  # noqa: E402  (bench/soak.py: simulated engines, fake GPUs)

INTERVAL = 5.0
ROUTES = 64
GPUS = 8
ROUTES_PER_SHARED_ENDPOINT = 8
# 64 endpoints x 1 route that filter `?name[]=` (vLLM with one API server, the default), the same 64 that cannot
# (vLLM with several API servers; SGLang), and 8 endpoints x 8 routes.
LAYOUTS = ("separate", "multiprocess", "shared")
WARMUP_SECONDS = 3900.0  # > the longest (1 h) window, so the windows and rings are full
MEASURE_CYCLES = 120
PROMETHEUS_SCRAPE_SECONDS = 15.0
TARGETS = {"parse_speedup": 10.0, "cpu_percent": 1.0, "rss_mb": 80.0, "render_ms": 20.0, "plain_ratio": 0.1}


def median_seconds(
    fn: Callable[[], Any], repeat: int, min_time: float = 0.2, timer: Callable[[], float] = time.perf_counter
) -> float:
    """Median of `repeat` timings, each of a loop long enough (>= min_time / repeat) to rise above timer noise."""
    begin = time.perf_counter()
    fn()
    one = max(time.perf_counter() - begin, 1e-7)
    n = max(1, int(min_time / repeat / one))
    times = []
    for _ in range(repeat):
        begin = timer()
        for _ in range(n):
            fn()
        times.append((timer() - begin) / n)
    return statistics.median(times)


# ------------------------------------------------------------------------------------------ 1. parse
def vllm_exposition() -> tuple[bytes, str]:
    """The captured fixture (vLLM's own metric code, 2 DP engines, k=4) if present, else the simulator's."""
    fixtures = sorted((REPO / "tests" / "fixtures" / "vllm").glob("*"))
    for path in fixtures:
        if not path.is_file():
            continue
        data = path.read_bytes()
        if b"vllm:spec_decode_num_accepted_tokens_per_pos" in data and b'engine="1"' in data and b"_bucket" in data:
            return data, str(path.relative_to(REPO))
    sim = soak.SimulatedVllm("bench", seed=0)
    for _ in range(20):
        data = sim.render()
    return data, "simulator exposition (specwatch.simulator.metrics_vllm, 2 DP engines, k=4)"


def bench_parse() -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    data, origin = vllm_exposition()
    text = data.decode()

    def reference() -> None:  # what a client_python-based exporter does: parse everything, then pick
        for family in text_string_to_metric_families(data.decode()):
            for _ in family.samples:
                pass

    result: dict[str, Any] = {"fixture": origin, "bytes": len(data), "lines": text.count("\n")}
    result["reference_ms"] = median_seconds(reference, 7) * 1e3
    parse = specwatch_parse_function()
    sample = parse(data)
    result["specwatch_ms"] = median_seconds(lambda: parse(data), 7) * 1e3
    result["speedup"] = result["reference_ms"] / result["specwatch_ms"]
    result["extracted"] = f"{len(sample.engines)} engines, k={sample.num_speculative_tokens}"
    return result


def specwatch_parse_function() -> Callable[[bytes], Any]:
    """Body bytes -> EngineSample through the engine source's own parse + extraction (all but the HTTP GET)."""
    from specwatch.config import parse_config

    from specwatch.sources import engines

    route = parse_config(
        {"gpu": {"enabled": "false"}, "routes": [{"name": "r", "engine": "vllm", "url": "http://127.0.0.1:9/metrics"}]}
    ).routes[0]
    return lambda body: engines.parse_engine_sample("vllm", body, route, 0.0)


# ------------------------------------------------------------------------------------------ 2-4. the daemon
def shared_endpoint_config(state_dir: str, base_url: str) -> Any:
    """soak.daemon_config's 64 routes, but 8 to an endpoint, each reading one of its 2 DP engines."""
    from specwatch.config import parse_config

    return parse_config(
        {
            "interval": f"{INTERVAL:g}s",
            "state_dir": state_dir,
            "scrape": {"timeout": f"{min(2.0, 0.8 * INTERVAL) * 1000:g}ms"},
            "gpu": {"enabled": "true"},
            "routes": [
                {
                    "name": f"r{i:02d}",
                    "url": f"{base_url}/r{i // ROUTES_PER_SHARED_ENDPOINT:02d}/metrics",
                    "engine": "vllm",
                    "engines": [str(i % 2)],
                    "gpus": [i % GPUS],
                    "crossover": {"batch_size": 32},
                }
                for i in range(ROUTES)
            ],
        }
    )


def daemon_child(layout: str = "separate") -> dict[str, Any]:
    """Runs in a fresh process: warm up a 64-route, 8-GPU daemon, then measure CPU, RSS and /metrics render."""
    from prometheus_client import CollectorRegistry, generate_latest

    from specwatch.daemon import Daemon
    from specwatch.export.http import RenderCache
    from specwatch.export.prometheus import SnapshotCollector

    start = 1_700_000_000.0
    clock = SimpleNamespace(now=start)
    state_dir = tempfile.mkdtemp(prefix="specwatch-bench-")
    if layout == "shared":
        farm, base_url = soak.start_engine_farm(ROUTES // ROUTES_PER_SHARED_ENDPOINT, per_scrape_seconds=INTERVAL)
        config = shared_endpoint_config(state_dir, base_url)
    else:
        farm, base_url = soak.start_engine_farm(
            ROUTES, per_scrape_seconds=INTERVAL, multiprocess=layout == "multiprocess"
        )
        config = soak.daemon_config(ROUTES, INTERVAL, state_dir, base_url, gpus=True)
    daemon = Daemon(config, gpu_source_factory=soak.fake_gpu_factory(GPUS), clock=lambda: clock.now)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: daemon.snapshot))

    def serve_metrics() -> bytes:  # what the HTTP server sends Prometheus for a Snapshot it has not rendered yet
        return RenderCache(lambda: daemon.snapshot).body(soak.PROMETHEUS_ACCEPT, "gzip")[0]

    def serve_text() -> bytes:  # what curl gets: the 0.0.4 text format, checked against generate_latest
        return RenderCache(lambda: daemon.snapshot).body("", "")[0]

    def cycle() -> Any:
        clock.now += INTERVAL
        return daemon.tick(clock.now)

    try:
        for i in range(int(WARMUP_SECONDS / INTERVAL)):
            snap = cycle()
            if i % 3 == 0:
                serve_metrics()
        gc.collect()
        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        wall_before = time.perf_counter()
        for _ in range(MEASURE_CYCLES):
            snap = cycle()
        wall = time.perf_counter() - wall_before
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
        render = median_seconds(serve_metrics, 15)
        render_cpu = median_seconds(serve_metrics, 15, timer=time.thread_time)
        reference_render_cpu = median_seconds(lambda: generate_latest(registry), 15, timer=time.thread_time)
        body = serve_text()
        assert body == generate_latest(registry), "the served /metrics differs from generate_latest's"
        rss_mb = soak.process_figures(0).rss_bytes / 1e6
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6
    finally:
        daemon.close()
        farm.terminate()
        farm.wait(timeout=10)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return {
        "layout": layout,
        "cycle_cpu_ms": cpu / MEASURE_CYCLES * 1e3,
        "cycle_wall_ms": wall / MEASURE_CYCLES * 1e3,
        "render_ms": render * 1e3,
        "render_cpu_ms": render_cpu * 1e3,
        "generate_latest_cpu_ms": reference_render_cpu * 1e3,
        "metrics_bytes": len(body),
        "metrics_series": sum(not line.startswith(b"#") for line in body.splitlines()),
        "rss_mb": rss_mb,
        "peak_rss_mb": peak_mb,
        "routes_up": sum(r.up for r in snap.routes),
        "gpus_up": sum(g.up for g in snap.gpus),
        "eval_ms_reported": snap.evaluation_duration_seconds * 1e3,
    }


# ------------------------------------------------------------------------------------------ 5. a plain exporter
PLAIN_CYCLES = 24
PLAIN_FAMILIES = {  # what a hand-written exporter would re-export from vLLM's /metrics
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
    "vllm:num_requests_running": "running",
}


def plain_exporter_child() -> dict[str, Any]:
    """Runs in a fresh process: the exporter a team would write first, with requests and prometheus_client,
    against the same 64 simulated endpoints. Each cycle it GETs every /metrics (whole: it knows no `?name[]=`),
    parses it with `text_string_to_metric_families`, sets one gauge per figure and route, and renders its own
    /metrics with `generate_latest` every third cycle (Prometheus at 15 s)."""
    import requests
    from prometheus_client import CollectorRegistry, Gauge, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    farm, base_url = soak.start_engine_farm(ROUTES, per_scrape_seconds=INTERVAL)
    registry = CollectorRegistry()
    gauges = {name: Gauge(f"plain_{name}", name, ["route"], registry=registry) for name in PLAIN_FAMILIES.values()}
    session = requests.Session()
    urls = [f"{base_url}/r{i:02d}/metrics" for i in range(ROUTES)]

    def cycle(render: bool) -> None:
        for i, url in enumerate(urls):
            totals: dict[str, float] = {}
            for family in text_string_to_metric_families(session.get(url, timeout=10).text):
                name = PLAIN_FAMILIES.get(family.name)
                if name is not None:
                    totals[name] = sum(s.value for s in family.samples if not s.name.endswith("_created"))
            for name, value in totals.items():
                gauges[name].labels(route=f"r{i:02d}").set(value)
        if render:
            generate_latest(registry)

    try:
        for i in range(3):
            cycle(render=i == 0)
        gc.collect()
        before = resource.getrusage(resource.RUSAGE_SELF)
        for i in range(PLAIN_CYCLES):
            cycle(render=i % 3 == 0)
        after = resource.getrusage(resource.RUSAGE_SELF)
        exported = sum(1 for _ in gauges["draft_tokens"].collect()[0].samples)
    finally:
        farm.terminate()
        farm.wait(timeout=10)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    per_interval_ms = cpu / PLAIN_CYCLES * 1e3
    return {
        "cycle_cpu_ms": per_interval_ms,
        "cpu_percent_of_one_core": per_interval_ms / (INTERVAL * 1e3) * 100,
        "routes_exported": exported,
    }


def bench_plain_exporter() -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(Path(__file__)), "_plain-child"], capture_output=True, text=True, timeout=1800
    )
    if proc.returncode != 0:
        raise RuntimeError(f"plain exporter benchmark child failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_daemon(layout: str = "separate", script: Path = Path(__file__)) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(script), "_daemon-child", layout], capture_output=True, text=True, timeout=1800
    )
    if proc.returncode != 0:
        raise RuntimeError(f"daemon benchmark child failed:\n{proc.stderr}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # Daemon CPU per interval: one cycle plus the share of /metrics renders a 15 s Prometheus scrape causes.
    per_interval_ms = result["cycle_cpu_ms"] + result["render_cpu_ms"] * INTERVAL / PROMETHEUS_SCRAPE_SECONDS
    result["cpu_percent_of_one_core"] = per_interval_ms / (INTERVAL * 1e3) * 100
    return result


def bench_baseline(revision: str) -> dict[str, Any]:
    """Figure 2 (64 separate endpoints) of another commit: its tree, exported from git, runs this tree's child
    and simulated engines (bench/bench_overhead.py and bench/soak.py are copied over its own)."""
    tree = export_tree(revision)
    try:
        result = bench_daemon("separate", tree / "bench" / "bench_overhead.py")
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    result["revision"] = short_revision(revision)
    return result


def export_tree(revision: str) -> Path:
    """`revision`'s tree in a temporary folder, with this tree's harness over its own. `revision` is a git
    revision, or a folder that holds the tree already (`git archive REV | tar -x -C DIR`, for a machine
    without git or without this repository's history)."""
    tree = Path(tempfile.mkdtemp(prefix="specwatch-baseline-"))
    if Path(revision).is_dir():
        shutil.copytree(revision, tree, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    else:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", revision], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    # One harness measures both trees: this tree's benchmark, soak and fake NVML, placed where they live here
    # (a tree from before bench/ existed gets the folders).
    for harness in ("bench/bench_overhead.py", "bench/soak.py", "testbed/fake_nvml.py"):
        (tree / harness).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / harness, tree / harness)
    return tree


def short_revision(revision: str) -> str:
    if Path(revision).is_dir():
        return Path(revision).name
    return subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", revision], capture_output=True, text=True, check=True
    ).stdout.strip()


def bench_pairs(revision: str, pairs: int) -> int:
    """Figure 2 alone, `revision` and this tree alternately, `pairs` times each: a change smaller than the
    box's drift between two runs still shows in the per-pair ratios."""
    tree = export_tree(revision)
    try:
        ratios, before, after = [], [], []
        for i in range(pairs):
            old = bench_daemon("separate", tree / "bench" / "bench_overhead.py")["cpu_percent_of_one_core"]
            new = bench_daemon("separate")["cpu_percent_of_one_core"]
            before.append(old), after.append(new), ratios.append(new / old)
            print(
                f"pair {i + 1}: {short_revision(revision)} {old:.2f}% -> this tree {new:.2f}% ({new / old:.3f}x)",
                flush=True,
            )
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    print(
        f"figure 2 medians: {statistics.median(before):.2f}% -> {statistics.median(after):.2f}%, "
        f"median ratio {statistics.median(ratios):.3f}x over {pairs} pairs"
    )
    return 0


# ------------------------------------------------------------------------------------------ report
def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "_daemon-child":
        print(json.dumps(daemon_child(sys.argv[2])))
        return 0
    if argv is None and len(sys.argv) == 2 and sys.argv[1] == "_plain-child":
        print(json.dumps(plain_exporter_child()))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="also print every figure as one JSON line")
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="also measure figure 2 (64 endpoints) for git revision REV (or the tree in folder REV), side by side",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        metavar="N",
        help="with --baseline: only figure 2, REV and this tree alternately, N times each",
    )
    args = parser.parse_args(argv)
    if args.pairs:
        if not args.baseline:
            parser.error("--pairs needs --baseline REV")
        return bench_pairs(args.baseline, args.pairs)

    cpus = Path("/proc/cpuinfo").read_text().count("processor")
    print(
        f"python {sys.version.split()[0]}, {cpus} CPUs, load average at start {os.getloadavg()[0]:.2f} "
        f"(figures are wall time unless marked CPU; a busy box inflates them)"
    )
    parse = bench_parse()
    print(f"1. parse {parse['fixture']} ({parse['bytes']} bytes, {parse['lines']} lines)")
    print(f"   prometheus_client text_string_to_metric_families: {parse['reference_ms']:.3f} ms")
    ok = {}
    ok["parse"] = parse["speedup"] >= TARGETS["parse_speedup"]
    print(f"   specwatch parse + extraction ({parse['extracted']}): {parse['specwatch_ms']:.3f} ms")
    print(
        f"   speedup {parse['speedup']:.1f}x (target >= {TARGETS['parse_speedup']:g}x): "
        f"{'PASS' if ok['parse'] else 'MISS'}"
    )

    daemon = bench_daemon()
    print(
        f"   daemon: {ROUTES} routes (engine sources scraping {ROUTES} simulated vLLM servers on loopback), "
        f"{GPUS} fake-NVML GPUs, routes up {daemon['routes_up']}, GPUs up {daemon['gpus_up']}"
    )
    ok["cpu"] = daemon["cpu_percent_of_one_core"] < TARGETS["cpu_percent"]
    print(
        f"2. CPU: cycle {daemon['cycle_cpu_ms']:.1f} ms (wall {daemon['cycle_wall_ms']:.1f} ms) + render share "
        f"{daemon['render_cpu_ms'] * INTERVAL / PROMETHEUS_SCRAPE_SECONDS:.1f} ms per {INTERVAL:g} s = "
        f"{daemon['cpu_percent_of_one_core']:.2f}% of one core (target < {TARGETS['cpu_percent']:g}%): "
        f"{'PASS' if ok['cpu'] else 'MISS'}"
    )
    ok["rss"] = daemon["rss_mb"] < TARGETS["rss_mb"]
    print(
        f"3. steady-state RSS after {WARMUP_SECONDS / 3600:.2f} h of cycles: {daemon['rss_mb']:.1f} MB "
        f"(peak {daemon['peak_rss_mb']:.1f} MB; target < {TARGETS['rss_mb']:g} MB): "
        f"{'PASS' if ok['rss'] else 'MISS'}"
    )
    ok["render"] = daemon["render_ms"] < TARGETS["render_ms"]
    print(
        f"4. /metrics render, {daemon['metrics_series']} series, {daemon['metrics_bytes']} bytes: "
        f"{daemon['render_ms']:.2f} ms wall, {daemon['render_cpu_ms']:.2f} ms CPU "
        f"(target < {TARGETS['render_ms']:g} ms wall): {'PASS' if ok['render'] else 'MISS'}; "
        f"prometheus_client generate_latest of the same Snapshot {daemon['generate_latest_cpu_ms']:.2f} ms CPU"
    )
    plain = bench_plain_exporter()
    ok["plain"] = daemon["cpu_percent_of_one_core"] / plain["cpu_percent_of_one_core"] <= TARGETS["plain_ratio"]
    print(
        f"5. a plain requests + prometheus_client exporter on the same {ROUTES} endpoints "
        f"({plain['routes_exported']} routes exported): {plain['cycle_cpu_ms']:.1f} ms CPU per {INTERVAL:g} s = "
        f"{plain['cpu_percent_of_one_core']:.2f}% of one core; specwatch / plain = "
        f"{daemon['cpu_percent_of_one_core'] / plain['cpu_percent_of_one_core']:.3f}x "
        f"(target <= {TARGETS['plain_ratio']:g}x): {'PASS' if ok['plain'] else 'MISS'}"
    )
    if args.baseline:
        before = bench_baseline(args.baseline)
        print(
            f"2. before/after, 64 endpoints: {args.baseline} ({before['revision']}) cycle "
            f"{before['cycle_cpu_ms']:.1f} ms + render share "
            f"{before['render_cpu_ms'] * INTERVAL / PROMETHEUS_SCRAPE_SECONDS:.1f} ms = "
            f"{before['cpu_percent_of_one_core']:.2f}% -> this tree {daemon['cycle_cpu_ms']:.1f} ms + "
            f"{daemon['render_cpu_ms'] * INTERVAL / PROMETHEUS_SCRAPE_SECONDS:.1f} ms = "
            f"{daemon['cpu_percent_of_one_core']:.2f}%"
        )
    unfiltered = bench_daemon("multiprocess")
    print(
        f"   the same {ROUTES} endpoints answering ?name[]= with nothing, as vLLM with several API servers and "
        f"SGLang do, so each is scraped whole (not judged against the targets):"
    )
    print(
        f"2. CPU: cycle {unfiltered['cycle_cpu_ms']:.1f} ms (wall {unfiltered['cycle_wall_ms']:.1f} ms) + render "
        f"share {unfiltered['render_cpu_ms'] * INTERVAL / PROMETHEUS_SCRAPE_SECONDS:.1f} ms per {INTERVAL:g} s = "
        f"{unfiltered['cpu_percent_of_one_core']:.2f}% of one core"
    )
    print(f"3. steady-state RSS: {unfiltered['rss_mb']:.1f} MB (peak {unfiltered['peak_rss_mb']:.1f} MB)")
    shared = bench_daemon("shared")
    endpoints = ROUTES // ROUTES_PER_SHARED_ENDPOINT
    print(
        f"   the usual layout, {endpoints} endpoints x {ROUTES_PER_SHARED_ENDPOINT} routes (each route one of its "
        f"endpoint's 2 DP engines), routes up {shared['routes_up']} (not judged against the targets):"
    )
    print(
        f"2. CPU: cycle {shared['cycle_cpu_ms']:.1f} ms (wall {shared['cycle_wall_ms']:.1f} ms) + render share "
        f"{shared['render_cpu_ms'] * INTERVAL / PROMETHEUS_SCRAPE_SECONDS:.1f} ms per {INTERVAL:g} s = "
        f"{shared['cpu_percent_of_one_core']:.2f}% of one core"
    )
    print(f"3. steady-state RSS: {shared['rss_mb']:.1f} MB (peak {shared['peak_rss_mb']:.1f} MB)")
    if args.json:
        figures = {
            "parse": parse,
            "daemon": daemon,
            "daemon_multiprocess": unfiltered,
            "daemon_shared": shared,
            "plain_exporter": plain,
            "ok": ok,
        }
        if args.baseline:
            figures["daemon_baseline"] = before
        print(json.dumps(figures))
    return 0 if all(ok.values()) and "speedup" in parse else 1


if __name__ == "__main__":
    raise SystemExit(main())
