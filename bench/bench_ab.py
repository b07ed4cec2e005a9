#!/usr/bin/env python3
"""Two trees' costs side by side in ONE process, for changes smaller than a noisy box's drift.

    .venv/bin/python bench/bench_ab.py DIR http     # figure 2's daemon (64 routes over HTTP), both trees
    .venv/bin/python bench/bench_ab.py DIR trace    # the same fed from in-process traces: tracking + detectors
    .venv/bin/python bench/bench_ab.py DIR parse    # parse + vllm.extract of a full and a filtered body

DIR holds the other tree (`git archive REV | tar -x -C DIR`). Its `specwatch` package is copied under the name
`specwatch_base` (imports rewritten), so both trees load into this process; their daemons then tick in
alternating batches of 5 cycles (parse: alternating timing loops), and the output is the ratio of this tree's
CPU to the other's. A 2-core VM's speed drifts by 2x within a minute; interleaving in one process lets that drift
hit both trees alike, which separate runs (bench_overhead.py --pairs) cannot do there.
"""

from __future__ import annotations

import json
import re
import resource
import shutil
import statistics
import sys
import tempfile
import time
from importlib import import_module
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
BATCH = 5  # cycles per turn


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def renamed_copy(tree: Path, into: Path) -> None:
    """tree's `specwatch` as `specwatch_base`, and its soak harness as `soak_base`, importable from `into`."""

    def rename(text: str) -> str:
        text = re.sub(r"\bspecwatch\.", "specwatch_base.", text)
        return re.sub(r"(from|import) specwatch\b(?!_)", r"\1 specwatch_base", text)

    shutil.copytree(tree / "specwatch", into / "specwatch_base", ignore=shutil.ignore_patterns("__pycache__"))
    for path in (into / "specwatch_base").rglob("*.py"):
        path.write_text(rename(path.read_text()))
    soak = tree / "bench" / "soak.py"
    if not soak.exists():  # trees from before bench/ existed
        soak = tree / "scripts" / "soak.py"
    (into / "soak_base.py").write_text(rename(soak.read_text()))


def daemon(package: str, soak: ModuleType, mode: str, base_url: str) -> tuple[Any, SimpleNamespace]:
    start = 1_700_000_000.0
    clock = SimpleNamespace(now=start)
    daemon_class = import_module(package + ".daemon").Daemon
    state_dir = tempfile.mkdtemp()
    if mode == "trace":
        cfg = soak.daemon_config(64, 5.0, state_dir, "http://127.0.0.1:9", gpus=True)
        return daemon_class(
            cfg,
            gpu_source_factory=soak.fake_gpu_factory(8),
            clock=lambda: clock.now,
            source_factory=soak.trace_source_factory(start, 5.0, 5000 * 5),
        ), clock
    cfg = soak.daemon_config(64, 5.0, state_dir, base_url, gpus=True)
    return daemon_class(cfg, gpu_source_factory=soak.fake_gpu_factory(8), clock=lambda: clock.now), clock


def bench_daemons(mode: str, rounds: int) -> dict[str, Any]:
    import soak
    import soak_base

    farms, urls = [], ["", ""]
    if mode == "http":  # one simulated farm per tree, so neither waits behind the other's requests
        for i in range(2):
            farm, urls[i] = soak.start_engine_farm(64, per_scrape_seconds=5.0)
            farms.append(farm)
    sides = {
        "base": daemon("specwatch_base", soak_base, mode, urls[0]),
        "this": daemon("specwatch", soak, mode, urls[1]),
    }
    try:
        for d, clock in sides.values():  # warm: the 1 h windows full (trace), connections and caches (http)
            for _ in range(780 if mode == "trace" else 200):
                clock.now += 5
                d.tick(clock.now)
        per: dict[str, list[float]] = {"base": [], "this": []}
        for r in range(rounds):
            for name in ("base", "this") if r % 2 == 0 else ("this", "base"):
                d, clock = sides[name]
                begin = cpu()
                for _ in range(BATCH):
                    clock.now += 5
                    d.tick(clock.now)
                per[name].append((cpu() - begin) / BATCH * 1e3)
    finally:
        for d, _ in sides.values():
            d.close()
        for farm in farms:
            farm.terminate()
    return {
        "mode": mode,
        "base_cycle_cpu_ms": round(statistics.mean(per["base"]), 2),
        "this_cycle_cpu_ms": round(statistics.mean(per["this"]), 2),
        "ratio_of_sums": round(sum(per["this"]) / sum(per["base"]), 3),
        "median_turn_ratio": round(statistics.median(t / b for b, t in zip(per["base"], per["this"])), 3),
    }


def bench_parse(rounds: int) -> list[dict[str, Any]]:
    from specwatch.sources import engines, vllm

    base_engines = import_module("specwatch_base.sources.engines")
    base_vllm = import_module("specwatch_base.sources.vllm")

    def timed(fn: Callable[[], Any], n: int = 300) -> float:
        begin = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - begin) / n * 1e6

    import soak

    # What the simulated farm of figure 2 answers to `?name[]=`: a body filtered down to the wanted families.
    engine = soak.SimulatedVllm("r00", seed=0, per_scrape_seconds=5.0)
    filtered = engine.render(sorted(import_module("specwatch.sources.engines").FILTER_NAMES))
    bodies = {"full": (REPO / "tests/fixtures/vllm/v1_k4_2engines.prom").read_bytes(), "filtered": filtered}
    out = []
    for label, body in bodies.items():
        # Each tree's own parse of a vLLM body, with the options its daemon passes (parse_families).
        ours = engines.parse_families("vllm", body)[1]
        theirs = base_engines.parse_families("vllm", body)[1]
        times: dict[str, list[float]] = {k: [] for k in ("parse_base", "parse_this", "extract_base", "extract_this")}
        for _ in range(rounds):
            times["parse_base"].append(timed(lambda: base_engines.parse_families("vllm", body)))
            times["parse_this"].append(timed(lambda: engines.parse_families("vllm", body)))
            times["extract_base"].append(timed(lambda: base_vllm.extract(theirs, {}, (), 1.0, "")))
            times["extract_this"].append(timed(lambda: vllm.extract(ours, {}, (), 1.0, "")))
        row: dict[str, Any] = {"body": label, "bytes": len(body)}
        for step in ("parse", "extract"):
            base, this = min(times[f"{step}_base"]), min(times[f"{step}_this"])
            row.update(
                {
                    f"{step}_base_us": round(base, 1),
                    f"{step}_this_us": round(this, 1),
                    f"{step}_ratio": round(this / base, 3),
                }
            )
        out.append(row)
    return out


def main() -> int:
    if len(sys.argv) < 3 or sys.argv[2] not in ("http", "trace", "parse"):
        print(__doc__, file=sys.stderr)
        return 2
    into = Path(tempfile.mkdtemp(prefix="specwatch-ab-"))
    try:
        renamed_copy(Path(sys.argv[1]), into)
        # bench/ for soak; testbed/ for the fake NVML of a base tree's soak that imports it as `fake_nvml`
        sys.path[:0] = [str(REPO), str(REPO / "bench"), str(REPO / "testbed"), str(into)]
        rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 30
        if sys.argv[2] == "parse":
            for row in bench_parse(rounds):
                print(json.dumps(row))
        else:
            print(json.dumps(bench_daemons(sys.argv[2], rounds)))
    finally:
        shutil.rmtree(into, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
