#!/usr/bin/env python3
"""Capture engine /metrics fixtures by running vLLM's and SGLang's own metric code with synthetic traffic.

Run it inside the capture venv (CPU torch + the engines installed with --no-deps, see
scripts/capture/README.md):

    .capture-venv/bin/python scripts/capture_fixtures.py --out tests/fixtures            # every fixture
    .capture-venv/bin/python scripts/capture_fixtures.py --out tests/fixtures vllm/v1_k4_2engines

Each fixture is captured in a fresh process (vLLM's logger unregisters and re-registers its collectors;
SGLang needs PROMETHEUS_MULTIPROC_DIR set before prometheus_client is imported). Every fixture gets a
provenance header of `# ` comment lines (ignored by text format 0.0.4 parsers) and a `.truth.json` sidecar
with the exact counter values fed to the engine, so tests can check formulas against ground truth.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

SCRIPT = Path(__file__).resolve()


@dataclass(frozen=True)
class Fixture:
    name: str  # path under --out, without extension
    engine: str  # "vllm" | "sglang" (captured from the installed engine) | "vllm-v0" | "sglang-legacy"
    engines: int
    k: int | None  # speculative tokens (vLLM) / speculative steps (SGLang); None = speculation off
    scrapes: int = 1  # a second scrape after more traffic gives tests counter deltas
    tp: int = 1  # SGLang: scheduler TP ranks reporting (--enable-metrics-for-all-schedulers)
    steps: int = 40  # vLLM: scheduler steps per engine per scrape; SGLang: finished requests per scrape
    running: int = 16  # upper bound of running requests per engine
    accept_p: float = 0.8
    seed: int = 1
    model: str = "llama-3.1-8b-instruct"
    routes: tuple[str, ...] = field(default=("chat", "code"))
    version: str = ""  # sglang-legacy: the SGLang version whose name set is reproduced


FIXTURES = {
    f.name: f
    for f in (
        Fixture("vllm/v1_k4_2engines", "vllm", engines=2, k=4, scrapes=2, seed=11),
        Fixture("vllm/v1_k1_1engine", "vllm", engines=1, k=1, scrapes=2, seed=13, accept_p=0.7),
        Fixture("vllm/v1_nospec_1engine", "vllm", engines=1, k=None, scrapes=1, seed=15),
        Fixture("sglang/0.5.23_dp1_tp2", "sglang", engines=1, k=3, tp=2, scrapes=1, seed=21),
        Fixture("sglang/0.5.23_dp2", "sglang", engines=2, k=3, scrapes=2, seed=22, accept_p=0.75),
        Fixture("vllm/v0_lifetime_gauges", "vllm-v0", engines=1, k=4, seed=31, steps=20),
        Fixture("sglang/0.4.3_gauges", "sglang-legacy", engines=1, k=3, seed=41, version="0.4.3"),
        Fixture("sglang/0.5.4_accept_rate", "sglang-legacy", engines=1, k=3, seed=42, version="0.5.4"),
    )
}
INVENTORY = Path(__file__).resolve().parent.parent / "docs" / "reference" / "sglang-metrics-inventory.tsv"
_MULTIPROCESS = ("sglang", "sglang-legacy")


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


_DRIVERS = {
    "vllm": "vllm.v1.metrics.loggers.PrometheusStatLogger fed SchedulerStats(SpecDecodingStats) + IterationStats",
    "sglang": "sglang.srt.observability.metrics_collector SchedulerMetricsCollector.log_stats + "
    "TokenizerMetricsCollector.observe_one_finished_request",
    "vllm-v0": "scripts/capture/legacy.py: prometheus_client with the metric definitions of V0 "
    "vllm/engine/metrics.py transcribed (NOT captured from an installed V0 engine)",
    "sglang-legacy": "scripts/capture/legacy.py: prometheus_client with names/types/labels/HELP from "
    "sglang-metrics-inventory.tsv (NOT captured from an installed SGLang of this version)",
}


def _engine_line(fx: Fixture) -> str:
    if fx.engine == "vllm-v0":
        return "engine: vllm V0 engine name set (removed by v0.10.0); synthetic traffic"
    if fx.engine == "sglang-legacy":
        return f"engine: sglang {fx.version} name set; synthetic traffic"
    return f"engine: {fx.engine} {_version(fx.engine)} (the engine's own metric code; synthetic traffic)"


def _header(fx: Fixture, argv: list[str]) -> str:
    mode = (
        "multiprocess (PROMETHEUS_MULTIPROC_DIR + MultiProcessCollector, like the server)"
        if fx.engine in _MULTIPROCESS
        else "single-process (prometheus_client.generate_latest)"
    )
    spec = (
        "off"
        if fx.k is None
        else (f"k={fx.k}" if fx.engine.startswith("vllm") else f"steps={fx.k} draft_tokens={fx.k + 1}")
    )
    lines = [
        _engine_line(fx),
        f"torch: {_version('torch')}, prometheus_client {_version('prometheus_client')}, "
        f"python {sys.version.split()[0]}",
        f"driver: {_DRIVERS[fx.engine]}",
        f"capture: scripts/capture_fixtures.py {' '.join(argv)}",
        f"args: engines={fx.engines} tp={fx.tp} {spec} model_name={fx.model} "
        + (f"finished_requests_per_scrape={fx.steps} " if fx.engine == "sglang" else f"scheduler_steps={fx.steps} ")
        + f"running<={fx.running} accept_p={fx.accept_p} seed={fx.seed}"
        + (f" routes={','.join(fx.routes)} priority_scheduling=on" if fx.engine == "sglang" else ""),
        f"mode: {mode}",
        f"date: {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')}",
        "ground truth fed to the engine: the .truth.json file beside this one",
    ]
    return "".join(f"# {line}\n" for line in lines)


def capture_one(fx: Fixture, out: Path, argv: list[str]) -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    args = SimpleNamespace(**{**fx.__dict__, "routes": list(fx.routes), "inventory": str(INVENTORY)})
    if fx.engine == "vllm":
        from capture.vllm_capture import capture
    elif fx.engine == "sglang":
        from capture.sglang_capture import capture
    elif fx.engine == "vllm-v0":
        from capture.legacy import capture_vllm_v0 as capture
    else:
        from capture.legacy import capture_sglang_legacy as capture
    header = _header(fx, argv)
    for suffix, text, truth in capture(args):
        path = out / f"{fx.name}{suffix}.prom"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(header + text, encoding="utf-8")
        path.with_suffix(".truth.json").write_text(json.dumps(truth, indent=1, sort_keys=True) + "\n")
        print(f"wrote {path} ({path.stat().st_size} bytes)")


def _shown(path: Path) -> str:
    """The path as the header records it: relative to the repository when inside it."""
    try:
        return str(path.resolve().relative_to(SCRIPT.parent.parent))
    except ValueError:
        return str(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=SCRIPT.parent.parent / "tests" / "fixtures")
    parser.add_argument("names", nargs="*", help=f"fixtures to capture (default: all): {', '.join(FIXTURES)}")
    parser.add_argument("--in-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in FIXTURES]
    if unknown:
        parser.error(f"unknown fixture(s): {', '.join(unknown)}")
    names = args.names or list(FIXTURES)
    if args.in_child:
        fx = FIXTURES[names[0]]
        capture_one(fx, args.out, [f"--out {_shown(args.out)}", fx.name])
        return 0
    for name in names:
        env = dict(os.environ)
        with tempfile.TemporaryDirectory(prefix="specwatch-capture-") as multiproc_dir:
            if FIXTURES[name].engine in _MULTIPROCESS:
                env["PROMETHEUS_MULTIPROC_DIR"] = multiproc_dir
            else:
                env.pop("PROMETHEUS_MULTIPROC_DIR", None)
            subprocess.run(
                [sys.executable, str(SCRIPT), "--in-child", "--out", str(args.out), name], env=env, check=True
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
