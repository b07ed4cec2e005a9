#!/usr/bin/env python3
"""Accuracy of the crossover estimator and the sweep, against the H200 reference table.

1. Estimator: fit the H200 efficiencies on context 1024 plain + gamma 4 verify + draft step times, then
   predict B* for gamma 2, 4, 7 x alpha 0.5-0.9 and compare with the table's interpolated crossover.
   gamma 2 and 7 verify times are held out of the fit; gamma 4 is scored on data it was fitted on.
2. Sweep: `specwatch sweep` against two simulated engines whose step times are the table (k 0 and k 4,
   alpha 0.7), in real time; its crossover vs the table's.

    .venv/bin/python scripts/bench_crossover.py [--skip-sweep] [--write-docs]

Prints Markdown; --write-docs replaces the "Crossover estimator and sweep" section of docs/benchmarks.md and
writes the sweep's plot to docs/img/crossover-sweep-simulated.png.
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

from specwatch.crossover import gpus  # noqa: E402
from specwatch.crossover.calibrate import fit_efficiency, loss, reference_points  # noqa: E402
from specwatch.crossover.model import (LLAMA3_8B, Draft, Efficiency, StepModel, closed_form_crossover,  # noqa: E402
                                       positions_from_alpha)
from specwatch.crossover.reference import load_reference  # noqa: E402

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
    base = StepModel(LLAMA3_8B, hardware, Efficiency(), draft=Draft.parse("eagle3", LLAMA3_8B))
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
            out.append(f"| {g} | {a} | {fmt(meas)} | {fmt(est)} | {'-' if e is None else f'{e:+.0%}'} | "
                       f"{fmt(raw)} | {'-' if e_raw is None else f'{e_raw:+.0%}'} | {'yes' if target else ''} |")
    out += ["", f"**Worst error over the target cells (γ 2 and 4, α 0.6-0.8): {worst_target:.0%}** (target: 25%).",
            ""]
    long_run = table.run(8192)
    out += ["Context 8192, same efficiencies (not a target: the table's verify pass uses SDPA without a decode "
            "kernel and costs 1.65x plain already at B=1, see `docs/crossover.md`):", "",
            "| γ | α | measured B* | estimated B* |", "|---|---|---:|---:|"]
    for g in (2, 4):
        for a in (0.6, 0.7, 0.8):
            out.append(f"| {g} | {a} | {fmt(long_run.measured_crossover(g, a))} | "
                       f"{fmt(model.crossover(positions_from_alpha(a, g), 8192))} |")
    peak = Efficiency(memory=1.0, compute=1.0, verify_attention=1.0)
    cf = closed_form_crossover(LLAMA3_8B, hardware, peak, positions_from_alpha(0.7, 4), 0.1, context=0)
    out += ["", f"Closed form of `crossover.md` §3 at peak specs (γ 4, α 0.7, c 0.1, short context): B* = {cf:.1f} "
            "(doc: ≈ 98).", ""]
    return out


def sweep_section(write_plot: bool) -> list[str]:
    from specwatch.crossover.sweep import SweepSettings, run_sweep
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
        from specwatch.crossover.plot import plot_sweep
        (ROOT / PLOT).parent.mkdir(parents=True, exist_ok=True)
        plot_sweep(doc, ROOT / PLOT)
    table = run.speedup(4, 0.7)
    out = ["### Sweep vs two simulated engines", "",
           "`specwatch simulate`-style engines in process, real time, step times from the table (context 1024); "
           "plain k=0 and spec k=4 with iid α=0.7; default levels, max_tokens 96, 2 requests per client, built-in "
           f"prompts; {wall:.0f} s wall" + (f"; failure: {outcome.failure}" if outcome.failure else "") + ".", "",
           "| concurrency | plain tok/s | spec tok/s | measured speedup | table speedup | acceptance |",
           "|---:|---:|---:|---:|---:|---:|"]
    for lv in doc["levels"]:
        c = lv["concurrency"]
        ref = table.get(c)
        out.append(f"| {c} | {lv['plain']['output_tokens_per_s']:.0f} | {lv['spec']['output_tokens_per_s']:.0f} | "
                   f"{lv['speedup']:.3f} | {'-' if ref is None else f'{ref:.3f}'} | "
                   f"{lv['spec'].get('acceptance_ratio', float('nan')):.3f} |")
    got = doc["crossover_concurrency"]
    out += ["", f"**Sweep crossover {fmt(got)} vs table {table_bstar:.1f}** (levels 64 and 96 bracket the table's; "
            "acceptance: within one level). The sweep reads high because per-request HTTP and streaming cost on "
            "this 2-core box lowers the plain server's measured throughput more (one token per chunk) than the "
            "spec server's.", ""]
    if write_plot:
        out += [f"![sweep against the simulated pair]({PLOT.removeprefix('docs/')})", ""]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-sweep", action="store_true", help="estimator only (the sweep takes ~30 s)")
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md and the plot")
    args = parser.parse_args()
    lines = [SECTION, "",
             f"Measured with `.venv/bin/python scripts/bench_crossover.py --write-docs` on {platform.node()} "
             f"({platform.processor() or platform.machine()}, Python {platform.python_version()}), "
             f"{time.strftime('%Y-%m-%d', time.gmtime())}. The reference table is "
             "`specwatch/data/h200-crossover-llama3-8b.json` (one H200, kernel-level step times).", ""]
    lines += estimator_section()
    if not args.skip_sweep:
        lines += sweep_section(args.write_docs)
    text = "\n".join(lines).rstrip() + "\n"
    print(text)
    if args.write_docs:
        docs = ROOT / "docs" / "benchmarks.md"
        current = docs.read_text(encoding="utf-8")
        start = current.index(SECTION)
        end = current.find("\n## ", start + len(SECTION))
        docs.write_text(current[:start] + text + ("\n" + current[end + 1:] if end != -1 else ""), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
