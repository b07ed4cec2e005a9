#!/usr/bin/env python3
"""Accuracy of the crossover estimator and the sweep, against the H200 reference table.

1. Estimator: fit the H200 efficiencies on context 1024 plain + gamma 4 verify + draft step times, then
   predict B* for gamma 2, 4, 7 x alpha 0.5-0.9 and compare with the table's interpolated crossover.
   gamma 2 and 7 verify times are held out of the fit; gamma 4 is scored on data it was fitted on.
2. Sweep: `specwatch sweep` against two simulated engines whose step times are the table (k 0 and k 4,
   alpha 0.7), in real time; its crossover vs the table's.
3. With --gpm, on an NVIDIA GPU with torch: GPM tensor and DRAM activity of Llama-3-8B-shaped GEMMs at
   growing tokens per forward, for the compute-bound thresholds (results: docs/crossover.md).

    .venv/bin/python bench/bench_crossover.py [--skip-sweep] [--write-plot]
    PYTHONPATH=. python3 bench/bench_crossover.py --gpm

Prints Markdown (the figures docs/benchmarks.md shows); --write-plot writes the sweep's plot to
docs/img/crossover-sweep-simulated.png.
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specwatch.crossover import gpus
from specwatch.crossover.calibrate import fit_efficiency, loss, reference_points
from specwatch.crossover.speedup import (
    LLAMA3_8B,
    Draft,
    Efficiency,
    StepModel,
    closed_form_crossover,
    positions_from_alpha,
)
from specwatch.crossover.reference import load_reference

GAMMAS = (2, 4, 7)
ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)
TARGET_CELLS = {(g, a) for g in (2, 4) for a in (0.6, 0.7, 0.8)}  # the 25% acceptance target
SECTION = "## Crossover estimator and sweep"
PLOT = "docs/img/crossover-sweep-simulated.png"


def fmt(x: float | None, digits: int = 1) -> str:
    return "none" if x is None else f"{x:.{digits}f}"


def error(est: float | None, meas: float | None) -> float | None:
    if est is None or meas is None:
        return None
    return est / meas - 1


def estimator_section() -> list[str]:
    table = load_reference()
    run = table.run(1024)
    hardware, shipped = gpus.lookup("H200")
    base = StepModel(
        LLAMA3_8B, hardware, Efficiency(verify_reads_per_query_head=True), draft=Draft.parse("eagle3", LLAMA3_8B)
    )
    started = time.perf_counter()
    fitted, rms = fit_efficiency(base, reference_points(run), "bench")
    fit_ms = (time.perf_counter() - started) * 1000
    model = base.with_efficiency(fitted)
    held_out = [p for p in reference_points(run, qs=(3, 8), with_draft=False)]
    held_rms = math.sqrt(loss(model, held_out))
    out = [
        "### Estimator vs the H200 table",
        "",
        "Model: Llama-3-8B shape, bf16, EAGLE-3-style head (one layer + 32k vocabulary), H200 peaks 4.8 TB/s and "
        "989 dense bf16 TFLOPS. Fitted on **context 1024 plain, gamma 4 verify and draft step times** "
        f"({len(reference_points(run))} points, {fit_ms:.0f} ms): memory {fitted.memory:.3f}, compute "
        f"{fitted.compute:.3f}, verify attention {fitted.verify_attention:.3f}, step overhead "
        f"{fitted.step_overhead_s * 1e3:.3f} ms (shipped in `gpus.py`: {shipped.memory:.3f} / {shipped.compute:.3f}"
        f" / {shipped.verify_attention:.3f} / {shipped.step_overhead_s * 1e3:.3f} ms). RMS step-time error "
        f"{rms:.1%} on the fitted points, **{held_rms:.1%} on the held-out gamma 2 and 7 verify times**.",
        "",
        "B* is the batch where speedup = E·T(B,1)/(T(B,γ+1)+γ·T_draft(B)) falls below 1; measured = linear "
        "interpolation of the table's own speedups. **γ=4 rows are scored on the data the efficiencies were "
        "fitted on; γ=2 and γ=7 are held out.** Uncalibrated = default derating (0.85 bandwidth, 0.65 FLOPs, "
        "no overhead).",
        "",
        "| γ | α | measured B* | estimated B* | error | uncalibrated B* | error | target cell |",
        "|---|---|---:|---:|---:|---:|---:|:-:|",
    ]
    worst_target = 0.0
    for g in GAMMAS:
        for a in ALPHAS:
            meas = run.measured_crossover(g, a)
            positions = positions_from_alpha(a, g)
            est = model.crossover(positions, 1024)
            raw = base.crossover(positions, 1024)
            e, e_raw = error(est, meas), error(raw, meas)
            target = (g, a) in TARGET_CELLS
            if target and e is not None:
                worst_target = max(worst_target, abs(e))
            out.append(
                f"| {g} | {a} | {fmt(meas)} | {fmt(est)} | {'-' if e is None else f'{e:+.0%}'} | "
                f"{fmt(raw)} | {'-' if e_raw is None else f'{e_raw:+.0%}'} | {'yes' if target else ''} |"
            )
    out += ["", f"**Worst error over the target cells (γ 2 and 4, α 0.6-0.8): {worst_target:.0%}** (target: 25%).", ""]
    long_run = table.run(8192)
    out += [
        "Context 8192, same efficiencies (not a target: the table's verify pass uses SDPA without a decode "
        "kernel and costs 1.65x plain already at B=1, see `docs/crossover.md`):",
        "",
        "| γ | α | measured B* | estimated B* |",
        "|---|---|---:|---:|",
    ]
    for g in (2, 4):
        for a in (0.6, 0.7, 0.8):
            out.append(
                f"| {g} | {a} | {fmt(long_run.measured_crossover(g, a))} | "
                f"{fmt(model.crossover(positions_from_alpha(a, g), 8192))} |"
            )
    peak = Efficiency(memory=1.0, compute=1.0, verify_attention=1.0)
    cf = closed_form_crossover(LLAMA3_8B, hardware, peak, positions_from_alpha(0.7, 4), 0.1, context=0)
    out += [
        "",
        f"Closed form of `crossover.md` §3 at peak specs (γ 4, α 0.7, c 0.1, short context): B* = {cf:.1f} "
        "(doc: ≈ 98).",
        "",
    ]
    return out


def sweep_section(write_plot: bool) -> list[str]:
    from specwatch.offline.sweep import SweepSettings, run_sweep
    from specwatch.crossover.sweepfile import load_sweep
    from specwatch.simulator.server import RunningSimulator
    from specwatch.simulator.simulation import Simulation, SimulationSpec

    run = load_reference().run(1024)
    table_bstar = run.measured_crossover(4, 0.7)
    plain = RunningSimulator(Simulation(SimulationSpec(k=0, time_scale=1.0, seed=1))).start()
    spec = RunningSimulator(Simulation(SimulationSpec(k=4, acceptance=0.7, time_scale=1.0, seed=2))).start()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "crossover.json"
        started = time.perf_counter()
        try:
            outcome = run_sweep(SweepSettings(plain.url, spec.url, max_tokens=96, requests_per_client=2), path)
        finally:
            plain.stop()
            spec.stop()
        wall = time.perf_counter() - started
        doc = load_sweep(path)
    if write_plot:
        from specwatch.offline.plot import plot_sweep

        (ROOT / PLOT).parent.mkdir(parents=True, exist_ok=True)
        plot_sweep(doc, ROOT / PLOT)
    table = run.speedup(4, 0.7)
    out = [
        "### Sweep vs two simulated engines",
        "",
        "`specwatch simulate`-style engines in process, real time, step times from the table (context 1024); "
        "plain k=0 and spec k=4 with iid α=0.7; default levels, max_tokens 96, 2 requests per client, built-in "
        f"prompts; {wall:.0f} s wall" + (f"; failure: {outcome.failure}" if outcome.failure else "") + ".",
        "",
        "| concurrency | plain tok/s | spec tok/s | measured speedup | table speedup | acceptance |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for lv in doc["levels"]:
        c = lv["concurrency"]
        ref = table.get(c)
        out.append(
            f"| {c} | {lv['plain']['output_tokens_per_s']:.0f} | {lv['spec']['output_tokens_per_s']:.0f} | "
            f"{lv['speedup']:.3f} | {'-' if ref is None else f'{ref:.3f}'} | "
            f"{lv['spec'].get('acceptance_ratio', float('nan')):.3f} |"
        )
    got = doc["crossover_concurrency"]
    out += [
        "",
        f"**Sweep crossover {fmt(got)} vs table {table_bstar:.1f}** (levels 64 and 96 bracket the table's; "
        "acceptance: within one level). The sweep reads high because per-request HTTP and streaming cost on "
        "this 2-core box lowers the plain server's measured throughput more (one token per chunk) than the "
        "spec server's.",
        "",
    ]
    if write_plot:
        out += [f"![sweep against the simulated pair]({PLOT.removeprefix('docs/')})", ""]
    return out


def gpm_section() -> list[str]:
    """On an NVIDIA GPU: GPM tensor activity and DRAM utilization while Llama-3-8B-shaped weight GEMMs run at
    growing tokens per forward (decode at small M, verify batches B x (k+1) at large M), and the verdict of
    the daemon's `compute_bound()` at each. Needs torch and nvidia-ml-py; attention is not included."""
    import threading

    import torch

    from specwatch.config import GpuConfig
    from specwatch.evaluators.above_crossover import DRAM_FIELD, TENSOR_FIELD, compute_bound
    from specwatch.sources.nvml import make_gpu_source

    dev = torch.device("cuda:0")
    torch.cuda.init()  # the load thread needs the context current before its first cuBLAS call
    shape = LLAMA3_8B
    h, f, kv = shape.hidden_size, shape.intermediate_size, shape.kv_heads * shape.head_dim
    # One layer's matrices x 32 distinct copies: ~14 GB streamed per forward, as a real 8B decode step.
    layers = [
        [torch.randn(h, n, device=dev, dtype=torch.bfloat16) for n in (h + 2 * kv, h, 2 * f)]
        + [torch.randn(f, h, device=dev, dtype=torch.bfloat16)]
        for _ in range(shape.layers)
    ]
    source = make_gpu_source(GpuConfig(enabled="true"))
    name = gpus.detect_gpu_name()
    out = [
        "### GPM during Llama-3-8B-shaped GEMMs (compute-bound thresholds)",
        "",
        f"GPU: {name} (table row: {gpus.lookup(name)[0].name if name else '-'}). Tokens per forward M = "
        "batch x (k+1); each forward multiplies M rows through 32 layers of distinct q/k/v, o, gate/up and "
        "down weights (7.0 B parameters, no attention). GPM over 1.5 s per M.",
        "",
        "| M (tokens per forward) | e.g. | forward ms | tensor active | DRAM utilization | compute_bound |",
        "|---:|---|---:|---:|---:|:-:|",
    ]
    examples = {
        1: "decode B=1",
        64: "decode B=64",
        128: "verify B=32, k=3",
        192: "verify B=48, k=3",
        256: "verify B=64, k=3",
        320: "verify B=64, k=4",
        640: "verify B=128, k=4",
        1280: "verify B=256, k=4",
        2048: "verify B=256, k=7",
    }
    for m in examples:
        x = torch.randn(m, h, device=dev, dtype=torch.bfloat16)
        xf = torch.randn(m, f, device=dev, dtype=torch.bfloat16)

        def forward() -> None:
            for qkv, o, gate_up, down in layers:
                torch.matmul(x, qkv)
                torch.matmul(x, o)
                torch.matmul(x, gate_up)
                torch.matmul(xf, down)

        forward()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(5):
            forward()
        torch.cuda.synchronize()
        forward_ms = (time.perf_counter() - start) / 5 * 1000
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                forward()
                torch.cuda.synchronize()

        worker = threading.Thread(target=load)
        worker.start()
        time.sleep(0.3)
        source.sample(time.time())  # GPM values cover the interval up to the next sample
        time.sleep(1.5)
        _, samples = source.sample(time.time())
        stop.set()
        worker.join()
        fields = samples[0].fields if samples else {}
        verdict = compute_bound(samples, (0,))
        out.append(
            f"| {m} | {examples[m]} | {forward_ms:.2f} | {fields.get(TENSOR_FIELD, float('nan')):.3f} | "
            f"{fields.get(DRAM_FIELD, float('nan')):.3f} | {verdict} |"
        )
    source.close()
    return out + [""]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-sweep", action="store_true", help="estimator only (the sweep takes ~30 s)")
    parser.add_argument("--write-plot", action="store_true", help=f"write the sweep's plot to {PLOT}")
    parser.add_argument("--gpm", action="store_true", help="only the GPM measurement (needs a GPU and torch)")
    args = parser.parse_args()
    if args.gpm:
        print("\n".join(gpm_section()))
        return 0
    lines = [
        SECTION,
        "",
        f"Measured with `.venv/bin/python bench/bench_crossover.py` on {platform.node()} "
        f"({platform.processor() or platform.machine()}, Python {platform.python_version()}), "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}. The reference table is "
        "`specwatch/data/h200-crossover-llama3-8b.json` (one H200, kernel-level step times).",
        "",
    ]
    lines += estimator_section()
    lines += [
        "GPM compute-bound thresholds were measured on the H200 with `--gpm` (needs the GPU); the table "
        "and its reading are in `docs/crossover.md`.",
        "",
    ]
    if not args.skip_sweep:
        lines += sweep_section(args.write_plot)
    text = "\n".join(lines).rstrip() + "\n"
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
