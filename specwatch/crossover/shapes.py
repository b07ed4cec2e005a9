"""The shipped multi-shape H200 step-time tables, and held-out scoring of the crossover model.

Each `specwatch/data/h200-steptimes-<shape>-ctx<C>.json` holds one shape's measured plain, verify and draft
step times at context C (`specwatch/data/README.md`). Fitting the GPU's efficiencies without one shape and
one context and predicting that (shape, context) cell's B* is how the estimator is validated for shapes and
contexts it was not fitted on.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from specwatch.crossover import gpus
from specwatch.crossover.calibrate import ALL_PARAMETERS, StepPoint, fit_models, reference_points
from specwatch.crossover.inputs import Efficiency, ModelShape
from specwatch.crossover.speedup import (
    Draft,
    StepModel,
    interpolate_crossover,
    positions_from_alpha,
)
from specwatch.crossover.reference import ReferenceRun, load_reference
from specwatch.crossover.stepcost import activation_bytes_per_token

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
TABLE_GLOB = "h200-steptimes-*-ctx*.json"
# The second kernel's tables: the verify pass packed as FlashAttention-3 / FlashInfer run it on Hopper (`kernel.py`),
# measured on an H100.
PACKED_TABLE_GLOB = "h100-steptimes-*-ctx*-packed.json"
ATTENTION_PROBE = "h200-attention-probe-ctx1024.json"
PACKED_ATTENTION_PROBE = "h100-attention-probe-ctx1024-packed.json"
FORWARD_PROFILE = "h200-forward-profile-ctx1024.json"
# Profile points whose eager kernel sum exceeds the graph's time by more than this are left out: their kernels
# ran slower than in the graph the tables time.
PROFILE_EAGER_TOLERANCE = 1.03
FIT_TOLERANCE = 2e-3  # pattern-search step, as a share of each parameter's range
SCORED_GAMMAS = (2, 4)
SCORED_ALPHAS = (0.6, 0.7, 0.8)
# With the verify pass packed, speculation pays to batch 256 at alpha >= 0.7 in every measured cell: alpha 0.5 adds
# the cells that do cross.
PACKED_SCORED_ALPHAS = (0.5, 0.6, 0.7, 0.8)
# The shipped tables' verify pass runs cuDNN's 64-row-tile flash kernel, which reads KV once per query head.
TABLE_EFFICIENCY = Efficiency(verify_reads_per_query_head=True)


@dataclass(frozen=True)
class ShapeTable:
    name: str
    shape: ModelShape
    run: ReferenceRun
    gpu: str = "H200"  # the hardware row of the GPU it was measured on
    packed: bool = False  # the verify pass read KV once per KV head (provenance verify_kernel "packed")

    @property
    def context(self) -> int:
        return self.run.context

    @property
    def cell(self) -> tuple[str, int]:
        return (self.name, self.run.context)


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
    """The shipped tables (sorted by parameter count, then context), or the given files."""
    paths = sorted(paths) if paths is not None else sorted(DATA_DIR.glob(TABLE_GLOB))
    tables = []
    for path in paths:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        run = load_reference(path).runs[0]
        provenance = raw.get("provenance", {})
        hardware, _ = gpus.lookup(str(provenance.get("gpu") or raw.get("gpu") or "H200"))
        packed = provenance.get("verify_kernel") == "packed"
        tables.append(
            ShapeTable(run.shape, shape_from_table(raw["runs"][0]["shape_config"]), run, hardware.name, packed)
        )
    return sorted(tables, key=lambda t: (t.shape.params, t.context))


def load_packed_tables() -> list[ShapeTable]:
    """The shipped tables measured with the verify pass packed (`PACKED_TABLE_GLOB`)."""
    return load_tables(DATA_DIR.glob(PACKED_TABLE_GLOB))


def table_model(table: ShapeTable, efficiency: Efficiency) -> StepModel:
    """The model of a table's GPU, its verify kernel as the table measured it."""
    hardware, _ = gpus.lookup(table.gpu)
    # The packed tables ran SDPA's flash kernel, which does not split a slice across SMs for q > 1.
    efficiency = replace(efficiency, verify_reads_per_query_head=not table.packed, verify_split_kv=False)
    return StepModel(table.shape, hardware, efficiency, draft=Draft.parse("eagle3", table.shape))


def table_points(table: ShapeTable) -> list[StepPoint]:
    """Plain, every verify length and the draft: everything a table measured."""
    return reference_points(table.run, qs=(1, 3, 5, 8))


# A CUDA-graph replay's fixed costs are microseconds: search them over ranges that resolve that.
KERNEL_BOUNDS = {"step_overhead_s": (0.0, 1e-3), "layer_overhead_s": (0.0, 2e-4)}
# Fitted on the attention probe. Verify KV bytes stream at the decode rate (tied); the verify kernel's own
# cost is its per-key term.
ATTENTION_PARAMETERS = (
    "decode_attention",
    "verify_key_s",
    "decode_attention_flop_s",
    "attention_slice_key_s",
    "verify_block_s",
    "verify_attention",
)
# Where the attention fit starts. The pattern search is local: from the coarse grid's verify rate (half the
# memory rate) it settles with no per-key cost, the head-dim-64 verify kernel 20% short and Llama-3.2-1B's
# held-out B* 25% high; from here the verify kernel keeps a per-key cost (3.8% RMS against 4.1%).
ATTENTION_START = replace(TABLE_EFFICIENCY, decode_attention=0.95, verify_attention=0.95, verify_key_s=5e-11)
# Context deltas of plain decode below this batch are left out: a few microseconds between two forwards of
# several milliseconds, within the tables' run-to-run noise.
DELTA_MIN_DECODE_BATCH = 16
# Fitted on the step tables, the attention terms and the elementwise rate held.
FORWARD_PARAMETERS = tuple(
    n for n in ALL_PARAMETERS if n not in ATTENTION_PARAMETERS + ("verify_attention", "elementwise")
)


@dataclass(frozen=True)
class AttentionProbe:
    """Attention kernels timed alone (`bench/probe_attention.py`): one head layout, its points."""

    heads: tuple[int, int, int]  # query heads, KV heads, head dim
    points: tuple[StepPoint, ...]
    gpu: str = "H200"
    packed: bool = False  # its verify points ran the packed kernel

    def model(self, efficiency: Efficiency) -> StepModel:
        hq, hkv, hd = self.heads
        shape = ModelShape(
            layers=1,
            hidden_size=hq * hd,
            kv_heads=hkv,
            head_dim=hd,
            intermediate_size=hq * hd,
            vocab_size=1,
            attention_heads=hq,
        )
        hardware, _ = gpus.lookup(self.gpu)
        efficiency = replace(efficiency, verify_reads_per_query_head=not self.packed, verify_split_kv=False)
        return StepModel(shape, hardware, efficiency)


def load_attention_probe(path: Path | None = None) -> list[AttentionProbe]:
    """The shipped attention probe, one entry per head layout."""
    raw = json.loads((path or DATA_DIR / ATTENTION_PROBE).read_text(encoding="utf-8"))
    context = float(raw["provenance"]["context"])
    hardware, _ = gpus.lookup(str(raw["provenance"].get("gpu") or "H200"))
    packed = raw["provenance"].get("verify_kernel") == "packed"
    layouts: dict[tuple[int, int, int], list[StepPoint]] = {}
    for p in raw["points"]:
        key = (int(p["heads"]), int(p["kv_heads"]), int(p["head_dim"]))
        layouts.setdefault(key, []).append(
            StepPoint(float(p["batch"]), int(p["q"]), context, float(p["ms"]) / 1e3, kind="attention")
        )
    return [AttentionProbe(k, tuple(v), hardware.name, packed) for k, v in layouts.items()]


def heads_of(shape: ModelShape) -> tuple[int, int, int]:
    return (shape.attention_heads, shape.kv_heads, shape.head_dim)


@dataclass(frozen=True)
class ElementwisePoint:
    """One profiled target forward (`bench/profile_steptimes.py`): its elementwise kernels' GPU time."""

    shape: str
    layers: int
    tokens: float  # batch x q
    bytes_per_token: float  # `activation_bytes_per_token` of the shape, per layer
    seconds: float


def load_forward_profile(tables: Sequence[ShapeTable], path: Path | None = None) -> list[ElementwisePoint]:
    """The shipped forward profile's target points (drafts and eager-inflated points left out), each with its
    shape taken from the step-time table of the same name."""
    raw = json.loads((path or DATA_DIR / FORWARD_PROFILE).read_text(encoding="utf-8"))
    by_name = {t.name: t.shape for t in tables}
    points = []
    for p in raw["points"]:
        shape = by_name.get(p["shape"])
        if shape is None or p["draft"] or p["kernel_sum_ms"] > PROFILE_EAGER_TOLERANCE * p["graph_ms"]:
            continue
        points.append(
            ElementwisePoint(
                p["shape"],
                shape.layers,
                float(p["batch"] * p["q"]),
                activation_bytes_per_token(shape),
                float(p["kernels_ms"]["elementwise"]) / 1e3,
            )
        )
    return points


def fit_elementwise(points: Sequence[ElementwisePoint], bandwidth: float) -> tuple[float, float, float]:
    """The elementwise kernels' rate as a share of `bandwidth`, their fixed seconds per layer, and the RMS
    relative error: time = layers x (tokens x bytes_per_token / (rate x bandwidth) + fixed), a linear least
    squares in relative terms (each point weighted by 1 / time^2)."""
    if len(points) < 2:
        raise ValueError("the elementwise fit needs at least two profiled forwards")
    sxx = sxy = syy = bx = by = 0.0
    for p in points:
        x, y, w = p.layers * p.tokens * p.bytes_per_token, float(p.layers), 1.0 / p.seconds**2
        sxx, sxy, syy = sxx + w * x * x, sxy + w * x * y, syy + w * y * y
        bx, by = bx + w * x * p.seconds, by + w * y * p.seconds
    det = sxx * syy - sxy * sxy
    per_byte = (bx * syy - by * sxy) / det
    fixed = (sxx * by - sxy * bx) / det
    if per_byte <= 0:
        raise ValueError("the profiled elementwise times do not grow with the bytes counted")
    errors = [(p.layers * (p.tokens * p.bytes_per_token * per_byte + fixed)) / p.seconds - 1 for p in points]
    rms = math.sqrt(sum(e * e for e in errors) / len(errors))
    return 1.0 / (per_byte * bandwidth), fixed, rms


def context_deltas(tables: Sequence[ShapeTable]) -> list[tuple[ShapeTable, list[StepPoint]]]:
    """Per shape with tables at several contexts: how much longer one layer's attention takes at each longer
    context than at the shortest (the two forwards differ only there: weights, elementwise kernels and
    fixed costs cancel). Verify at every batch; plain decode from `DELTA_MIN_DECODE_BATCH`."""
    by_shape: dict[str, list[ShapeTable]] = {}
    for t in tables:
        by_shape.setdefault(t.name, []).append(t)
    out = []
    for group in by_shape.values():
        base = min(group, key=lambda t: t.context)
        for t in group:
            if t is base:
                continue
            points = []
            for (b, q), seconds in sorted(t.run.target_s.items()):
                delta = (seconds - base.run.target_s.get((b, q), math.inf)) / t.shape.layers
                if delta > 0 and (q > 1 or b >= DELTA_MIN_DECODE_BATCH):
                    points.append(StepPoint(b, q, t.context, delta, kind="attention_delta", base_context=base.context))
            out.append((t, points))
    return out


def fit(
    tables: Sequence[ShapeTable],
    source: str = "fit",
    probe: Sequence[AttentionProbe] | None = None,
    exclude_heads: Iterable[tuple[int, int, int]] = (),
    profile: Sequence[ElementwisePoint] | None = None,
    exclude_shapes: Iterable[str] = (),
) -> tuple[Efficiency, float]:
    """One H200 efficiency, in three stages, and its RMS step-time error on the tables.

    The attention terms are fitted on the attention probe (the kernels timed by themselves, context 1024) and
    on the tables' context deltas (`context_deltas`: what a longer context adds to a forward), and the
    elementwise rate on the forward profile's elementwise kernels; both are then held while the rest of the
    forward (weights, GEMM compute, fixed costs, MoE groups) is fitted on the tables' step times. Fitted on
    step times alone, what the rest of the model misses leaks into these terms: elementwise time grows with
    the tokens of a step as GEMM time does, and the tables cannot tell them apart.
    `exclude_heads`: probe layouts left out; `exclude_shapes`: profiled shapes left out (a held-out shape's
    own kernels are not fitted on). `profile` defaults to the shipped profile.
    """
    packed = bool(tables) and all(t.packed for t in tables)
    if probe is None:
        probe = load_attention_probe(DATA_DIR / PACKED_ATTENTION_PROBE) if packed else load_attention_probe()
    excluded = set(exclude_heads)
    skipped = set(exclude_shapes)
    profile = load_forward_profile(load_tables()) if profile is None else profile
    # The forward profile was taken on the H200: its elementwise rate, as a share of the H200's bandwidth, is
    # assumed to hold as the same share on another GPU.
    hardware, _ = gpus.lookup("H200")
    elementwise, elementwise_layer, _ = fit_elementwise(
        [p for p in profile if p.shape not in skipped], hardware.bandwidth
    )
    kernels = [(a.model(ATTENTION_START), list(a.points)) for a in probe if a.heads not in excluded]
    kernels += [(table_model(t, ATTENTION_START), points) for t, points in context_deltas(tables) if points]
    attention, _ = fit_models(
        kernels,
        source,
        ATTENTION_PARAMETERS,
        tolerance=FIT_TOLERANCE,
        tie_decode_attention=False,
        tie_verify_attention=False,
        bounds=KERNEL_BOUNDS,
    )
    held = replace(attention, elementwise=elementwise, elementwise_layer_s=elementwise_layer)
    groups = [(table_model(t, held), table_points(t)) for t in tables]
    return fit_models(
        groups,
        source,
        FORWARD_PARAMETERS,
        tolerance=FIT_TOLERANCE,
        tie_decode_attention=False,
        tie_verify_attention=False,
        bounds=KERNEL_BOUNDS,
    )


# Below this batch a B* is "speculation loses from the start": relative errors between 1 and 1.9 say nothing.
SMALLEST_SCORED = 2.0


@dataclass(frozen=True)
class CellScore:
    shape: str
    gamma: int
    alpha: float
    measured: float | None  # None: speedup >= 1 at every measured batch (up to `largest`)
    predicted: float | None
    largest: int
    context: int = 1024

    @property
    def error(self) -> float | None:
        """Relative B* error; for a censored measurement (> largest) the shortfall below `largest`, if any;
        0 when both sides put B* below `SMALLEST_SCORED` (speculation loses from the first batches)."""
        if self.measured is not None and self.measured < SMALLEST_SCORED:
            if self.predicted is not None and self.predicted < SMALLEST_SCORED:
                return 0.0
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
        for alpha in PACKED_SCORED_ALPHAS if table.packed else SCORED_ALPHAS:
            cells.append(
                CellScore(
                    table.name,
                    gamma,
                    alpha,
                    table.run.measured_crossover(gamma, alpha),
                    model.crossover(positions_from_alpha(alpha, gamma), table.run.context),
                    max(table.run.batches),
                    table.context,
                )
            )
    return cells


def near_one_range(
    run: ReferenceRun, gamma: int, alpha: float, band: float = 0.03
) -> tuple[float | None, float | None]:
    """Batches above which the measured speedup stays below 1 + band and below 1 - band (interpolated like
    B*; None: not within the measured batches). A wide range means B* moves far on a small step-time error."""
    points = list(run.speedup(gamma, alpha).items())
    return (
        interpolate_crossover([(b, s / (1 + band)) for b, s in points]),
        interpolate_crossover([(b, s / (1 - band)) for b, s in points]),
    )


def within_near_one(run: ReferenceRun, cell: CellScore, band: float = 0.03) -> bool:
    """The predicted B* lies where the measured speedup is within `band` of 1 (`near_one_range`): the
    prediction is off in B* but not in speedup, as where the measured curve peaks at 0.98 and the model's
    at 1.00 (B* 1 against 4)."""
    if cell.predicted is None:
        return False
    high, low = near_one_range(run, cell.gamma, cell.alpha, band)
    return high is not None and high <= cell.predicted <= (low if low is not None else math.inf)


def leave_one_shape_out(tables: Sequence[ShapeTable]) -> dict[str, tuple[Efficiency, float, list[CellScore]]]:
    """For each shape: the efficiency fitted on the others, its RMS step-time error there, and B* scores."""
    out = {}
    for held in tables:
        others = [t for t in tables if t is not held]
        eff, rms = fit(
            others,
            source=f"fitted without {held.name}",
            exclude_heads=[heads_of(held.shape)],
            exclude_shapes=[held.name],
        )
        out[held.name] = (eff, rms, score(held, eff))
    return out


def leave_cell_out(
    tables: Sequence[ShapeTable], cells: Iterable[tuple[str, int]] | None = None
) -> dict[tuple[str, int], tuple[Efficiency, float, list[CellScore]]]:
    """Leave-one-context-out and leave-one-shape-out together: for each (shape, context) cell, the efficiency
    fitted without any table of that shape and without any table at that context (and without the shape's
    probe layout and profiled forwards), its RMS step-time error there, and the cell's B* scores."""
    out = {}
    wanted = set(cells) if cells is not None else None
    for held in tables:
        if wanted is not None and held.cell not in wanted:
            continue
        others = [t for t in tables if t.name != held.name and t.context != held.context]
        eff, rms = fit(
            others,
            source=f"fitted without {held.name} and without context {held.context}",
            exclude_heads=[heads_of(held.shape)],
            exclude_shapes=[held.name],
        )
        out[held.cell] = (eff, rms, score(held, eff))
    return out


def leave_shape_out(tables: Sequence[ShapeTable]) -> dict[tuple[str, int], tuple[Efficiency, float, list[CellScore]]]:
    """Leave-one-shape-out at every context: for each shape, the efficiency fitted without any of its tables
    (every other shape at every context kept), scored on each of its (shape, context) cells."""
    out = {}
    for name in dict.fromkeys(t.name for t in tables):
        held = [t for t in tables if t.name == name]
        others = [t for t in tables if t.name != name]
        eff, rms = fit(
            others,
            source=f"fitted without {name}",
            exclude_heads=[heads_of(held[0].shape)],
            exclude_shapes=[name],
        )
        for t in held:
            out[t.cell] = (eff, rms, score(t, eff))
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
