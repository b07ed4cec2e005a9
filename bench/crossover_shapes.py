#!/usr/bin/env python3
"""Leave-one-shape-out validation of the crossover estimator on the shipped H200 step-time tables.

For each shape: fit the GPU efficiencies on the other shapes, predict the held-out shape's B* for gamma 2 and
4, alpha 0.6-0.8, context 1024, and compare with the B* interpolated from its measured speedups. Prints the
markdown table used in docs/benchmarks.md (about 15 s on one core).

    .venv/bin/python bench/crossover_shapes.py
"""

from __future__ import annotations

import sys

from specwatch.crossover import gpus
from specwatch.crossover.reference import load_reference
from specwatch.crossover.speedup import positions_from_alpha
from specwatch.crossover.shapes import (
    SCORED_ALPHAS,
    SCORED_GAMMAS,
    fit,
    leave_one_shape_out,
    load_tables,
    near_one_range,
    table_model,
)

TARGET = 0.25


def cell(measured: float | None, predicted: float | None, error: float | None, largest: int) -> str:
    meas = f">{largest}" if measured is None else f"{measured:.0f}"
    pred = "none" if predicted is None else f"{predicted:.0f}"
    err = "miss" if error is None else f"{error:+.0%}"
    return f"{meas} / {pred} ({err})"


def span(batch: float | None, largest: int) -> str:
    return f">{largest}" if batch is None else f"{batch:.0f}"


def main() -> int:
    tables = load_tables()
    header = [f"γ{g} α{a}" for g in SCORED_GAMMAS for a in SCORED_ALPHAS]
    print("| Held-out shape | GQA | " + " | ".join(header) + " | worst | fit RMS |")
    print("|---|---:|" + "---:|" * len(header) + "---:|---:|")
    failures = []
    notes = []
    for name, (eff, rms, cells) in leave_one_shape_out(tables).items():
        shape = next(t.shape for t in tables if t.name == name)
        errors = [c.error for c in cells]
        worst = None if any(e is None for e in errors) else max(abs(e) for e in errors)
        if worst is None or worst > TARGET:
            failures.append(name)
            table = next(t for t in tables if t.name == name)
            model = table_model(table, eff)
            for c in cells:
                if c.measured is None or (c.error is not None and abs(c.error) <= TARGET):
                    continue
                high, low = near_one_range(table.run, c.gamma, c.alpha)
                predicted = model.speedup(c.measured, positions_from_alpha(c.alpha, c.gamma), table.run.context)
                notes.append(
                    f"  {name} γ{c.gamma} α{c.alpha}: measured B* {c.measured:.0f}; measured speedup within "
                    f"±3% of 1 from B {span(high, c.largest)} to {span(low, c.largest)}; predicted "
                    f"speedup at B {c.measured:.0f}: {predicted:.3f}"
                )
        print(
            f"| {name} | {shape.gqa_ratio:g} | "
            + " | ".join(cell(c.measured, c.predicted, c.error, c.largest) for c in cells)
            + f" | {'miss' if worst is None else f'{worst:.0%}'} | {rms:.1%} |"
        )
    if notes:
        print("\nCells over the target, with the measured curve's flatness:")
        print("\n".join(notes))
    eff, rms = fit(tables, "all")
    print(f"\nAll shapes: {eff}\nRMS step-time error {rms:.1%}; shipped: {gpus.CALIBRATED['H200']}")
    ref = load_reference().run(1024)
    print("\nThe 8B reference table (a different benchmark), predicted with the shipped calibration:")
    from specwatch.crossover.speedup import LLAMA3_8B, Draft, StepModel

    hardware, shipped = gpus.lookup("H200")
    model = StepModel(LLAMA3_8B, hardware, shipped, draft=Draft.parse("eagle3", LLAMA3_8B))
    for g in SCORED_GAMMAS:
        for a in SCORED_ALPHAS:
            measured = ref.measured_crossover(g, a)
            predicted = model.crossover(positions_from_alpha(a, g), 1024)
            print(f"  γ{g} α{a}: {cell(measured, predicted, (predicted - measured) / measured, 256)}")
    print(f"\nShapes over the {TARGET:.0%} target: {', '.join(failures) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
