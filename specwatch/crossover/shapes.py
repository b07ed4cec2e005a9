"""The shipped multi-shape H200 step-time tables, and leave-one-shape-out scoring of the crossover model.

Each `specwatch/data/h200-steptimes-<shape>-ctx1024.json` holds one shape's measured plain, verify and draft
step times (`specwatch/data/README.md`). Fitting the GPU's efficiencies on all shapes but one and predicting
the held-out shape's B* is how the estimator is validated for shapes it was not fitted on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from specwatch.crossover import gpus
from specwatch.crossover.calibrate import ALL_PARAMETERS, StepPoint, fit_models, reference_points
from specwatch.crossover.model import (
    Draft,
    Efficiency,
    ModelShape,
    StepModel,
    interpolate_crossover,
    positions_from_alpha,
)
from specwatch.crossover.reference import ReferenceRun, load_reference

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
TABLE_GLOB = "h200-steptimes-*-ctx1024.json"
FIT_TOLERANCE = 2e-3  # pattern-search step, as a share of each parameter's range
SCORED_GAMMAS = (2, 4)
SCORED_ALPHAS = (0.6, 0.7, 0.8)
# The shipped tables' verify pass runs SDPA's memory-efficient kernel, which reads KV once per query head.
TABLE_EFFICIENCY = Efficiency(verify_reads_per_query_head=True)


@dataclass(frozen=True)
class ShapeTable:
    name: str
    shape: ModelShape
    run: ReferenceRun


def shape_from_table(cfg: Mapping) -> ModelShape:
    """The `shape_config` of a step-time table as a ModelShape."""
    experts = int(cfg.get("experts") or 0)
    return ModelShape(
        layers=int(cfg["layers"]),
        hidden_size=int(cfg["d_model"]),
        kv_heads=int(cfg["kv_heads"]),
        head_dim=int(cfg["head_dim"]),
        intermediate_size=int(cfg["expert_ffn"] if experts else cfg["ffn"]),
        vocab_size=int(cfg["vocab"]),
        attention_heads=int(cfg["heads"]),
        experts=experts,
        experts_per_token=int(cfg.get("experts_per_token") or 0),
    )


def load_tables(paths: Iterable[Path] | None = None) -> list[ShapeTable]:
    """The shipped tables (sorted by parameter count), or the given files."""
    paths = sorted(paths) if paths is not None else sorted(DATA_DIR.glob(TABLE_GLOB))
    tables = []
    for path in paths:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        run = load_reference(path).runs[0]
        tables.append(ShapeTable(run.shape, shape_from_table(raw["runs"][0]["shape_config"]), run))
    return sorted(tables, key=lambda t: t.shape.params)


def table_model(table: ShapeTable, efficiency: Efficiency) -> StepModel:
    hardware, _ = gpus.lookup("H200")
    return StepModel(table.shape, hardware, efficiency, draft=Draft.parse("eagle3", table.shape))


def table_points(table: ShapeTable) -> list[StepPoint]:
    """Plain, every verify length and the draft: everything a table measured."""
    return reference_points(table.run, qs=(1, 3, 5, 8))


# Verify KV bytes stream at the decode rate; the verify kernel's own cost is its per-key term.
SHAPE_FIT_PARAMETERS = tuple(n for n in ALL_PARAMETERS if n != "verify_attention")


def fit(tables: Sequence[ShapeTable], source: str = "fit") -> tuple[Efficiency, float]:
    groups = [(table_model(t, TABLE_EFFICIENCY), table_points(t)) for t in tables]
    return fit_models(groups, source, SHAPE_FIT_PARAMETERS, tolerance=FIT_TOLERANCE, tie_verify_attention=True)


@dataclass(frozen=True)
class CellScore:
    shape: str
    gamma: int
    alpha: float
    measured: float | None  # None: speedup >= 1 at every measured batch (up to `largest`)
    predicted: float | None
    largest: int

    @property
    def error(self) -> float | None:
        """Relative B* error; for a censored measurement (> largest) the shortfall below `largest`, if any."""
        if self.measured is None:
            if self.predicted is None:
                return 0.0
            return min(0.0, self.predicted - self.largest) / self.largest
        if self.predicted is None:
            return None
        return (self.predicted - self.measured) / self.measured


def score(table: ShapeTable, efficiency: Efficiency) -> list[CellScore]:
    model = table_model(table, efficiency)
    cells = []
    for gamma in SCORED_GAMMAS:
        for alpha in SCORED_ALPHAS:
            cells.append(
                CellScore(
                    table.name,
                    gamma,
                    alpha,
                    table.run.measured_crossover(gamma, alpha),
                    model.crossover(positions_from_alpha(alpha, gamma), table.run.context),
                    max(table.run.batches),
                )
            )
    return cells


def near_one_range(
    run: ReferenceRun, gamma: int, alpha: float, band: float = 0.03
) -> tuple[float | None, float | None]:
    """Batches where the measured speedup first falls below 1 + band and below 1 - band (interpolated like
    B*; None: not within the measured batches). A wide range means B* moves far on a small step-time error."""
    points = list(run.speedup(gamma, alpha).items())
    return (
        interpolate_crossover([(b, s / (1 + band)) for b, s in points]),
        interpolate_crossover([(b, s / (1 - band)) for b, s in points]),
    )


def leave_one_shape_out(tables: Sequence[ShapeTable]) -> dict[str, tuple[Efficiency, float, list[CellScore]]]:
    """For each shape: the efficiency fitted on the others, its RMS step-time error there, and B* scores."""
    out = {}
    for held in tables:
        others = [t for t in tables if t is not held]
        eff, rms = fit(others, source=f"fitted without {held.name}")
        out[held.name] = (eff, rms, score(held, eff))
    return out


def validated_range(tables: Sequence[ShapeTable] | None = None) -> dict[str, tuple[float, float]]:
    """What the estimator was validated on: parameters (billions), GQA ratio, context."""
    tables = tables if tables is not None else load_tables()
    params = [t.shape.params / 1e9 for t in tables]
    ratios = [t.shape.gqa_ratio for t in tables]
    contexts = [float(t.run.context) for t in tables]
    return {
        "params_billions": (min(params), max(params)),
        "gqa_ratio": (min(ratios), max(ratios)),
        "context": (min(contexts), max(contexts)),
    }
