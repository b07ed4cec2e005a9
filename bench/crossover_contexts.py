#!/usr/bin/env python3
"""Leave-one-context-out and leave-one-shape-out validation of the crossover estimator, together.

For each measured (shape, context) cell of the shipped H200 step-time tables: fit the GPU efficiencies without
any table of that shape and without any table at that context (`shapes.leave_cell_out`), predict the cell's B*
for gamma 2 and 4, alpha 0.6-0.8, and compare with the B* interpolated from its measured speedups. Prints the
markdown table used in docs/benchmarks.md and writes the per-cell errors as JSON with `--json FILE`: the file
`specwatch crossover estimate` reads its error band from (about 3 minutes on one core).

    .venv/bin/python bench/crossover_contexts.py --json specwatch/data/h200-crossover-validation.json

With `--kernel packed` it scores the tables measured with the verify pass packed (`h100-steptimes-*-packed.json`,
an H100; gamma 2 and 4, alpha 0.5-0.8) instead, and `--json` writes the packed kernel's validation file:

    .venv/bin/python bench/crossover_contexts.py --kernel packed \
        --json specwatch/data/h100-crossover-validation-packed.json

With `--limit RUN...` (repeated `measure_steptimes.py` runs of cells over the target) it fits nothing: for each
such cell it prints how well the data determine its measured B*, against the validation file's predictions.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
from pathlib import Path

from specwatch.crossover.band import shape_class
from specwatch.crossover.speedup import interpolate_crossover
from specwatch.crossover.shapes import (
    PACKED_SCORED_ALPHAS,
    SCORED_ALPHAS,
    SCORED_GAMMAS,
    leave_cell_out,
    leave_shape_out,
    load_packed_tables,
    load_tables,
    table_model,
    within_near_one,
)
from specwatch.crossover.speedup import positions_from_alpha

TARGET = 0.20
SIGMAS = 2.0
VALIDATION = Path(__file__).resolve().parent.parent / "specwatch/data/h200-crossover-validation.json"


def limit(paths: list[str]) -> int:
    """Per cell over the target: the repeats' speedup noise within one lease (pooled sigma), the shift from the
    shipped table (another lease), and the batches where the repeats' mean speedup is within SIGMAS of 1."""
    shipped = {t.cell: t for t in load_tables()}
    repeats: dict[tuple[str, int], list] = {}
    for table in load_tables([Path(p) for p in paths]):
        repeats.setdefault(table.cell, []).append(table.run)
    cells = json.loads(VALIDATION.read_text(encoding="utf-8"))["cells"]
    fits = leave_cell_out(list(shipped.values()), cells=repeats)
    print(
        "| cell | repeats' B* | σ within | shift from table (RMS) | σ | B with speedup within 2σ of 1 "
        "| predicted (LOCO+LOSO / LOSO) | inside | LOCO+LOSO model speedup at B |"
    )
    print("|---|---|---:|---:|---:|---|---|---|---|")
    for c in cells:
        key = (c["shape"], c["context"])
        if key not in repeats or (c["error"] is not None and abs(c["error"]) <= TARGET):
            continue
        runs, table = repeats[key], shipped[key].run
        curves = [run.speedup(c["gamma"], c["alpha"]) for run in runs]
        batches = sorted(set.intersection(*(set(curve) for curve in curves)))
        mean = {b: statistics.mean(curve[b] for curve in curves) for b in batches}
        within = math.sqrt(statistics.mean(statistics.variance([cu[b] for cu in curves]) for b in batches))
        ref = table.speedup(c["gamma"], c["alpha"])
        shift = math.sqrt(statistics.mean((ref[b] - mean[b]) ** 2 for b in batches if b in ref))
        sigma = math.hypot(within, shift / math.sqrt(2))  # two leases: each off the middle by shift / sqrt 2
        # Both ends interpolated as B* is: the last batch whose mean + 2 sigma reaches 1, the last whose - 2 sigma does.
        low = interpolate_crossover([(b, mean[b] - SIGMAS * sigma) for b in batches]) or math.inf
        high = interpolate_crossover([(b, mean[b] + SIGMAS * sigma) for b in batches]) or math.inf
        stars = [interpolate_crossover(list(curve.items())) for curve in curves]
        if low == high == batches[0]:
            span = f"none: speedup below 1 at every batch by >= {min((1 - m) / sigma for m in mean.values()):.0f}σ"
        else:
            span = f"{low:.0f}-{high:.0f}"
        predicted = [c["predicted"], c["predicted_shape_out"]]
        near = min(batches, key=lambda b: abs(mean[b] - 1))
        model = table_model(shipped[key], fits[key][0])
        modelled = model.speedup(near, positions_from_alpha(c["alpha"], c["gamma"]), key[1]) / mean[near] - 1
        inside = ["yes" if p is not None and low <= p <= max(high, low) else "no" for p in predicted]
        print(
            f"| {key[0]} ctx {key[1]} γ{c['gamma']} α{c['alpha']} | "
            + ", ".join("none" if s is None else f"{s:.0f}" for s in stars)
            + f" | {within:.4f} | {shift:.4f} | {sigma:.4f} | {span} | "
            + " / ".join("none" if p is None else f"{p:.0f}" for p in predicted)
            + f" | {' / '.join(inside)} | {modelled:+.1%} (B {near}) |"
        )
    return 0


def cell(measured: float | None, predicted: float | None, error: float | None, largest: int) -> str:
    meas = f">{largest}" if measured is None else f"{measured:.0f}"
    pred = "none" if predicted is None else f"{predicted:.0f}"
    err = "miss" if error is None else f"{error:+.0%}"
    return f"{meas} / {pred} ({err})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write every cell's measured and predicted B* here")
    parser.add_argument("--limit", nargs="+", metavar="RUN", help="repeated runs of cells over the target (no fit)")
    parser.add_argument(
        "--kernel", choices=("unpacked", "packed"), default="unpacked", help="which verify kernel's tables to score"
    )
    args = parser.parse_args()
    if args.limit:
        return limit(args.limit)
    packed = args.kernel == "packed"
    tables = load_packed_tables() if packed else load_tables()
    alphas = PACKED_SCORED_ALPHAS if packed else SCORED_ALPHAS
    header = [f"γ{g} α{a}" for g in SCORED_GAMMAS for a in alphas]
    print("| Held-out cell | GQA | " + " | ".join(header) + " | worst | fit RMS |")
    print("|---|---:|" + "---:|" * len(header) + "---:|---:|")
    records = []
    worst_all = 0.0
    over = []
    loso = {cell: {(c.gamma, c.alpha): c for c in cells} for cell, (_, _, cells) in leave_shape_out(tables).items()}
    for (name, context), (_, rms, cells) in sorted(leave_cell_out(tables).items(), key=lambda kv: kv[0]):
        table = next(t for t in tables if t.cell == (name, context))
        shape = table.shape
        errors = [c.error for c in cells]
        worst = None if any(e is None for e in errors) else max(abs(e) for e in errors)
        worst_all = max(worst_all, 9.99 if worst is None else worst)
        flat = [c for c in cells if (c.error is None or abs(c.error) > TARGET) and within_near_one(table.run, c)]
        if worst is None or worst > TARGET:
            note = f" ({len(flat)} of them with the speedup at the predicted B* within 3% of 1)" if flat else ""
            over.append(f"{name} ctx {context}{note}")
        print(
            f"| {name}, ctx {context} | {shape.gqa_ratio:g} | "
            + " | ".join(cell(c.measured, c.predicted, c.error, c.largest) for c in cells)
            + f" | {'miss' if worst is None else f'{worst:.0%}'} | {rms:.1%} |"
        )
        records += [
            {
                "shape": name,
                "class": shape_class(shape),
                "gqa_ratio": shape.gqa_ratio,
                "params_billions": round(shape.params / 1e9, 2),
                "context": context,
                "gamma": c.gamma,
                "alpha": c.alpha,
                "measured": c.measured,
                "predicted": c.predicted,
                "largest": c.largest,
                "error": c.error,
                "predicted_shape_out": loso[(name, context)][(c.gamma, c.alpha)].predicted,
                "error_shape_out": loso[(name, context)][(c.gamma, c.alpha)].error,
                "speedup_within_3pct_at_predicted": within_near_one(table.run, c),
            }
            for c in cells
        ]
    print(f"\nWorst cell error {worst_all:.0%}; cells over the {TARGET:.0%} target: {', '.join(over) or 'none'}")
    print("\nLeave-one-shape-out only (every other shape at every context fitted on), worst error per cell:")
    for (name, context), by_key in sorted(loso.items()):
        errors = [c.error for c in by_key.values()]
        worst = "miss" if any(e is None for e in errors) else f"{max(abs(e) for e in errors if e is not None):.0%}"
        cells_text = " | ".join(cell(c.measured, c.predicted, c.error, c.largest) for c in by_key.values())
        print(f"| {name}, ctx {context} | {cells_text} | {worst} |")
    if args.json:
        provenance = {
            "command": "bench/crossover_contexts.py " + ("--kernel packed " if packed else "") + "--json " + args.json,
            "date": datetime.date.today().isoformat(),
            "method": "error: each (shape, context) cell fitted without its shape and without its context; "
            "error_shape_out: fitted without its shape only; speedup_within_3pct_at_predicted: the measured "
            "speedup is within 3% of 1 at the predicted B*",
            "gpu": tables[0].gpu,
            "verify_kernel": args.kernel,
        }
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"provenance": provenance, "cells": records}, fh, indent=1)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
