"""The error band of an estimated B*, read from the held-out validation of the estimator.

`bench/crossover_contexts.py` fits the H200 efficiencies without one (shape, context) cell's shape and without
its context, predicts the cell's B* and records the signed error e = predicted / measured - 1 per gamma and
alpha (`specwatch/data/h200-crossover-validation.json`), and the same with only the shape held out. An estimate
then says how far its B* may be from the truth: among the validated cells of its shape class (dense GQA, MHA or
MoE), the largest over- and under-prediction give measured B* in [B* / (1 + over), B* / (1 - under)]. At a
measured context (within `NEAR_CONTEXT`) the cells are that context's, held out by shape (the shipped
calibration has that context's tables); between measured contexts they are the two bracketing contexts', held
out by shape and context.
A packed-kernel estimate reads its errors from the packed tables' validation (`PACKED_VALIDATION_FILE`),
validated on the GPU those tables were measured on only.
Outside what was validated (another GPU, a context or size beyond the tables, another weight format, a shape
guessed from the parameter count) the errors are doubled and widened by a floor, and the estimate warns.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from specwatch.crossover.inputs import ModelShape

VALIDATION_FILE = Path(__file__).resolve().parent.parent / "data" / "h200-crossover-validation.json"
# The same validation on the tables whose verify pass was packed (an H100): the band of a packed-kernel estimate.
PACKED_VALIDATION_FILE = Path(__file__).resolve().parent.parent / "data" / "h100-crossover-validation-packed.json"
# Below this the measured B* says "speculation loses from the first batches": a relative error there (1 against
# 6) measures where a nearly flat curve first dips, not the model; such cells do not set the band.
SMALLEST_BANDED = 2.0
# Outside the validated range: each side's error doubled plus this much.
OUTSIDE_FACTOR = 2.0
OUTSIDE_FLOOR = 0.3
MAX_UNDER = 0.9  # an upper band of at most 10 x B*; beyond, "no upper bound"
NEAR_CONTEXT = 0.1  # a context within 10% of a measured one counts as measured
# A predicted speedup at batch 1 below 1 + this: speculation may lose from the first batch, whatever B* says.
# The tables measured 0.80-1.00 at batch 1 where B* (the last crossing) is 4-8: speculation pays at batch
# 2-4 and loses at 1.
SMALL_BATCH_MARGIN = 0.1


def shape_class(shape: ModelShape) -> str:
    if shape.experts:
        return "moe"
    return "mha" if shape.gqa_ratio == 1 else "gqa"


@dataclass(frozen=True)
class ValidatedCell:
    shape: str
    shape_class: str
    context: int
    measured: float | None
    error: float | None  # predicted / measured - 1; None: predicted no crossover where one was measured
    error_shape_out: float | None  # the same, fitted without the shape only


@dataclass(frozen=True)
class Band:
    lower: float | None  # None with B* None: no crossover predicted
    upper: float | None  # None: no upper bound (the truth may be "no crossover")
    over: float  # largest over-prediction applied (lower = B* / (1 + over))
    under: float  # largest under-prediction applied (upper = B* / (1 - under))
    validated: bool
    basis: str  # what the band rests on, one line

    def covers(self, batch: float) -> bool:
        return (self.lower is None or self.lower <= batch) and (self.upper is None or batch <= self.upper)


def load_validation(path: Path | None = None) -> list[ValidatedCell]:
    raw = json.loads((path or VALIDATION_FILE).read_text(encoding="utf-8"))
    return [
        ValidatedCell(
            str(c["shape"]),
            str(c["class"]),
            int(c["context"]),
            None if c["measured"] is None else float(c["measured"]),
            None if c["error"] is None else float(c["error"]),
            None if c["error_shape_out"] is None else float(c["error_shape_out"]),
        )
        for c in raw["cells"]
    ]


def validation_gpu(path: Path | None = None) -> str:
    """The hardware row of the GPU a validation file's tables were measured on."""
    raw = json.loads((path or VALIDATION_FILE).read_text(encoding="utf-8"))
    return str(raw["provenance"].get("gpu", "H200"))


def bracketing_contexts(context: float, contexts: Sequence[int]) -> list[int]:
    """The validated contexts nearest below and above `context` (one, at or beyond an end)."""
    ordered = sorted(set(contexts))
    below = [c for c in ordered if c <= context]
    above = [c for c in ordered if c >= context]
    picked = {below[-1] if below else ordered[0], above[0] if above else ordered[-1]}
    return sorted(picked)


def error_band(
    bstar: float | None,
    shape: ModelShape,
    context: float,
    validated: bool,
    cells: Sequence[ValidatedCell] | None = None,
    speedup_at_one: float | None = None,
) -> Band:
    """The band around `bstar` (None: no crossover predicted) for this shape class and context; its lower side
    is 1 when the predicted speedup at batch 1 (`speedup_at_one`) is within `SMALL_BATCH_MARGIN` of 1."""
    cells = load_validation() if cells is None else cells
    klass = shape_class(shape)
    measured_at = [c for c in sorted({c.context for c in cells}) if abs(context / c - 1) <= NEAR_CONTEXT]
    contexts = measured_at[:1] or bracketing_contexts(context, [c.context for c in cells])
    near = [c for c in cells if c.context in contexts]
    own = [c for c in near if c.shape_class == klass]
    used = own or near
    scored = [c for c in used if c.measured is not None and c.measured >= SMALLEST_BANDED]
    signed = [c.error_shape_out if measured_at else c.error for c in scored]
    missed = any(e is None for e in signed)
    errors = [e for e in signed if e is not None]
    over = max([0.0, *errors])
    under = max([0.0, *(-e for e in errors)])
    held = "shape" if measured_at else "shape and context"
    where = f"{klass.upper() if klass != 'gqa' else 'GQA'} shapes" if own else "all shapes"
    ctx = " and ".join(str(c) for c in contexts)
    if validated:
        basis = (
            f"validated within -{under:.0%}/+{over:.0%} on {len(scored)} cells ({where}, context {ctx}, "
            f"{held} held out)"
        )
    else:
        over, under = OUTSIDE_FACTOR * over + OUTSIDE_FLOOR, OUTSIDE_FACTOR * under + OUTSIDE_FLOOR
        basis = (
            f"outside the validated range: held-out errors at the nearest validated cells ({where}, context "
            f"{ctx}) doubled and widened by {OUTSIDE_FLOOR:.0%}"
        )
    if bstar is None:
        return Band(None, None, over, under, validated, basis)
    lower = max(1.0, bstar / (1.0 + over))
    if speedup_at_one is not None and speedup_at_one < 1.0 + SMALL_BATCH_MARGIN:
        lower = 1.0
    upper = None if missed or under >= MAX_UNDER else bstar / (1.0 - under)
    if upper is not None and not math.isfinite(upper):
        upper = None
    return Band(lower, upper, over, under, validated, basis)
