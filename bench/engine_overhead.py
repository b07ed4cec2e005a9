#!/usr/bin/env python3
"""How well the live engine-overhead fit (`specwatch/crossover/overhead.py`) recovers an engine's crossover.

An engine's speculative step times are a measured table's plus a known overhead (per step and per scored
token), at the live calibration's batches 8-256. The overhead is fitted against a step model's prediction and
the B* of model + fitted overhead is compared with the B* of table + true overhead (read on the table's grid,
as a measured B* is). Four scores, each beside the same model without the fit:

- `table`: the model is the table itself (no model error): what the fit alone does.
- `held-out shape`: the packed H100 tables, the model fitted on the other shapes' packed tables (every
  context), the cell's overhead fitted on its own step times.
- `other context`: the overhead fitted at one context (the shape's shortest) and carried to its other
  contexts, the model as above.
- `another engine`: the H200 tables (another GPU, verify unpacked), with and without the overheads, the model
  fitted on the other shapes' H200 tables (every context).
- `wrong kernel`: the H200 tables as they are, the model the calibrated H200 priced with a packed verify kernel:
  an engine whose kernel is slower than the one assumed. The overhead cannot stand in for it.

    .venv/bin/python bench/engine_overhead.py     # 10-20 minutes on one core: 5 packed and 10 H200 fits
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import replace
from typing import Callable, Sequence

from specwatch.crossover import gpus
from specwatch.crossover.inputs import EngineOverhead
from specwatch.crossover.livecal import MAX_OVERHEAD_RMS
from specwatch.crossover.overhead import fit_overhead
from specwatch.crossover.reference import ReferenceRun
from specwatch.crossover.shapes import (
    PACKED_SCORED_ALPHAS,
    SCORED_ALPHAS,
    SCORED_GAMMAS,
    ShapeTable,
    heads_of,
    fit,
    leave_shape_out,
    load_packed_tables,
    load_tables,
    table_model,
)
from specwatch.crossover.speedup import StepModel, expected_tokens, interpolate_crossover, positions_from_alpha

BINS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
OVERHEADS = {
    "1 ms a step": EngineOverhead(1e-3, 0.0),
    "3 ms + 10 us a token": EngineOverhead(3e-3, 10e-6),
    "5 us a token": EngineOverhead(0.0, 5e-6),
}
NONE = EngineOverhead()


def table_crossover(run: ReferenceRun, gamma: int, alpha: float, overhead: EngineOverhead) -> float | None:
    e = expected_tokens(alpha, gamma)
    points = [
        (
            b,
            e
            * (run.target_s[(b, 1)] + overhead.seconds(b, 1))
            / (run.target_s[(b, gamma + 1)] + gamma * run.draft_s[b] + overhead.seconds(b, gamma + 1)),
        )
        for b in run.batches
    ]
    return interpolate_crossover(points)


def observed(run: ReferenceRun, gamma: int, overhead: EngineOverhead) -> list[tuple[float, int, float]]:
    """The engine's speculative step time per live bin: the table's plus the overhead."""
    return [
        (b, gamma + 1, run.target_s[(b, gamma + 1)] + gamma * run.draft_s[b] + overhead.seconds(b, gamma + 1))
        for b in BINS
        if (b, gamma + 1) in run.target_s
    ]


def error(predicted: float | None, truth: float | None, largest: float) -> float | None:
    """Relative B* error; past the grid on one side only: the shortfall to the grid's end (0 if both)."""
    if truth is None:
        return 0.0 if predicted is None else min(0.0, predicted - largest) / largest
    if predicted is None:
        return (largest - truth) / truth
    return (predicted - truth) / truth


class Score:
    """Errors on the cells where table + overhead crosses within the grid; the others counted apart. `settles`:
    the fit reproduces the engine's steps within `MAX_OVERHEAD_RMS`, so live calibration would drive the flag."""

    def __init__(self) -> None:
        self.fitted: list[float] = []
        self.alone: list[float] = []
        self.settled: list[float] = []
        self.beyond = [0, 0, 0]  # cells past the grid; fitted says so; the model alone says so

    def add(self, fitted: float | None, alone: float | None, crosses: bool, settles: bool) -> None:
        if not crosses:
            self.beyond[0] += 1
            self.beyond[1] += fitted == 0.0
            self.beyond[2] += alone == 0.0
            return
        self.fitted.append(9.99 if fitted is None else abs(fitted))
        self.alone.append(9.99 if alone is None else abs(alone))
        if settles:
            self.settled.append(self.fitted[-1])

    def line(self, name: str) -> str:
        def one(errors: Sequence[float], beyond: int | None = None) -> str:
            if not errors:
                return "none"
            within = sum(e <= 0.10 for e in errors)
            within25 = sum(e <= 0.25 for e in errors)
            past = "" if beyond is None else f"; past 256 {beyond}/{self.beyond[0]}"
            return (
                f"{within}/{len(errors)} within 10%, {within25} within 25%, median {statistics.median(errors):.1%}, "
                f"worst {max(errors):.0%}{past}"
            )

        return (
            f"| {name} | {one(self.fitted, self.beyond[1])} | {one(self.settled)} | {one(self.alone, self.beyond[2])} |"
        )


def rms_of(overhead: EngineOverhead, points: Sequence[tuple[float, int, float]], predicted: Sequence[float]) -> float:
    errors = [math.log((m + overhead.seconds(b, q)) / t) for (b, q, t), m in zip(points, predicted)]
    return math.sqrt(sum(e * e for e in errors) / len(errors))


def score_cells(
    score: Score,
    run: ReferenceRun,
    model: StepModel,
    alphas: Sequence[float],
    overhead: EngineOverhead,
    fit_from: Callable[[int], tuple[EngineOverhead, float]],
) -> None:
    largest = float(max(run.batches))
    for gamma in SCORED_GAMMAS:
        fitted_overhead, rms = fit_from(gamma)
        fitted = replace(model, overhead=fitted_overhead)
        for alpha in alphas:
            truth = table_crossover(run, gamma, alpha, overhead)
            positions = positions_from_alpha(alpha, gamma)
            score.add(
                error(fitted.crossover(positions, run.context, largest), truth, largest),
                error(model.crossover(positions, run.context, largest), truth, largest),
                truth is not None,
                rms <= MAX_OVERHEAD_RMS,
            )


def fit_against(
    model: StepModel, run: ReferenceRun, gamma: int, overhead: EngineOverhead
) -> tuple[EngineOverhead, float]:
    points = observed(run, gamma, overhead)
    predicted = [model.spec_step_s(b, gamma, run.context) for b, _, _ in points]
    fitted = fit_overhead(points, predicted)
    return fitted, rms_of(fitted, points, predicted)


def main() -> int:
    packed = load_packed_tables()
    # The table as its own model: B* of table + fitted overhead.
    table_only = Score()
    for table in packed:
        run = table.run
        for overhead in OVERHEADS.values():
            for gamma in SCORED_GAMMAS:
                points = observed(run, gamma, overhead)
                spec = [run.target_s[(b, gamma + 1)] + gamma * run.draft_s[b] for b, _, _ in points]
                fitted = fit_overhead(points, spec)
                settles = rms_of(fitted, points, spec) <= MAX_OVERHEAD_RMS
                largest = float(max(run.batches))
                for alpha in PACKED_SCORED_ALPHAS:
                    truth = table_crossover(run, gamma, alpha, overhead)
                    table_only.add(
                        error(table_crossover(run, gamma, alpha, fitted), truth, largest),
                        error(table_crossover(run, gamma, alpha, NONE), truth, largest),
                        truth is not None,
                        settles,
                    )
    print("| Score | model + fitted overhead | where the fit settles (RMS <= 10%) | model alone |")
    print("|---|---|---|---|")
    print(table_only.line("table (no model error)"), flush=True)

    by_shape: dict[str, list[ShapeTable]] = {}
    for table in packed:
        by_shape.setdefault(table.name, []).append(table)
    held_out = Score()
    other_context = Score()
    for name, own in by_shape.items():
        others = [t for t in packed if t.name != name]
        eff, _ = fit(others, source=f"without {name}", exclude_heads=[heads_of(own[0].shape)], exclude_shapes=[name])
        shortest = min(own, key=lambda t: t.context)
        for overhead in OVERHEADS.values():
            for table in own:
                model = table_model(table, eff)
                score_cells(
                    held_out,
                    table.run,
                    model,
                    PACKED_SCORED_ALPHAS,
                    overhead,
                    lambda g, m=model, r=table.run, o=overhead: fit_against(m, r, g, o),
                )
                if table is not shortest:
                    base = table_model(shortest, eff)
                    score_cells(
                        other_context,
                        table.run,
                        model,
                        PACKED_SCORED_ALPHAS,
                        overhead,
                        lambda g, m=base, r=shortest.run, o=overhead: fit_against(m, r, g, o),
                    )
        print(f"  fitted without {name}", file=sys.stderr)
    print(held_out.line("held-out shape (packed H100)"))
    print(other_context.line("other context (packed H100)"), flush=True)

    h200 = load_tables()
    h200_held_out = Score()
    for (name, context), (eff, _, _) in leave_shape_out(h200).items():
        table = next(t for t in h200 if t.cell == (name, context))
        model = table_model(table, eff)
        for overhead in [NONE, *OVERHEADS.values()]:
            score_cells(
                h200_held_out,
                table.run,
                model,
                SCORED_ALPHAS,
                overhead,
                lambda g, m=model, r=table.run, o=overhead: fit_against(m, r, g, o),
            )
    print(h200_held_out.line("another engine: H200 tables (unpacked), held-out shape"), flush=True)

    another = Score()
    calibrated = gpus.CALIBRATED["H200"]
    for table in h200:
        model = table_model(table, calibrated)
        model = model.with_efficiency(
            replace(model.efficiency, verify_reads_per_query_head=False, verify_split_kv=True)
        )
        score_cells(
            another,
            table.run,
            model,
            SCORED_ALPHAS,
            NONE,
            lambda g, m=model, r=table.run: fit_against(m, r, g, NONE),
        )
    print(another.line("H200 tables (unpacked), the calibrated model priced packed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
