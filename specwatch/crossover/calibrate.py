"""Fit a GPU's achieved efficiencies from measured step times: the reference table, or a sweep file.

Minimises the mean squared log error of predicted vs measured step times over (memory, compute,
verify_attention, step_overhead_s) by a deterministic pattern search from the best of a coarse grid: four
smooth parameters and a few dozen points need nothing heavier (and no scipy).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Any, Iterable, Sequence

from specwatch.crossover.inputs import Efficiency
from specwatch.crossover.speedup import StepModel
from specwatch.crossover.stepcost import attention_s

# (lower, upper) bounds per parameter; overheads in seconds.
BOUNDS: dict[str, tuple[float, float]] = {
    "memory": (0.2, 1.0),
    "compute": (0.05, 1.0),
    "verify_attention": (0.02, 1.0),
    "step_overhead_s": (0.0, 0.02),
    "decode_attention": (0.1, 1.0),
    "layer_overhead_s": (0.0, 0.0005),
    "verify_key_s": (0.0, 1e-9),
    "decode_attention_flop_s": (0.0, 2e-13),
    "attention_slice_key_s": (0.0, 1e-7),
    "expert_group_s": (0.0, 5e-6),
    "elementwise": (0.05, 1.0),
}
# Everything the per-kernel model has: what a table with plain, verify and draft times of several shapes fits.
ALL_PARAMETERS = (
    "memory",
    "compute",
    "verify_attention",
    "decode_attention",
    "layer_overhead_s",
    "step_overhead_s",
    "verify_key_s",
    "decode_attention_flop_s",
    "attention_slice_key_s",
    "expert_group_s",
    "elementwise",
)


@dataclass(frozen=True)
class StepPoint:
    """One measured step. kind: "target" (one forward with q tokens per sequence), "draft" (one draft
    step), "spec" (a whole speculative step: verify with q = gamma + 1 plus gamma draft steps) or
    "attention" (one layer's attention kernel alone, q query tokens per sequence)."""

    batch: float
    q: int
    context: float
    seconds: float
    kind: str = "target"


def predict(model: StepModel, p: StepPoint) -> float:
    if p.kind == "attention":
        return attention_s(p.batch, p.q, p.context, model.shape, model.hardware, model.efficiency, model.hardware.sms)
    if p.kind == "draft":
        return model.draft_step_s(p.batch, p.context)
    if p.kind == "spec":
        return model.spec_step_s(p.batch, p.q - 1, p.context)
    return model.target_step_s(p.batch, p.q, p.context)


def loss(model: StepModel, points: Sequence[StepPoint]) -> float:
    """Mean squared log error: relative, so 5 ms and 80 ms steps weigh alike."""
    return _sum_sq_log(model, points) / len(points)


def _sum_sq_log(model: StepModel, points: Sequence[StepPoint]) -> float:
    total = 0.0
    for p in points:
        predicted = predict(model, p)
        if predicted <= 0 or p.seconds <= 0:
            return math.inf
        total += math.log(predicted / p.seconds) ** 2
    return total


def fit_efficiency(
    model: StepModel, points: Sequence[StepPoint], source: str, names: Sequence[str] | None = None
) -> tuple[Efficiency, float]:
    """Best efficiencies for `points` and the RMS relative (log) error of the fit.

    By default fits memory, compute and the per-forward overhead, plus verify_attention when there are
    multi-token points; parameters the points cannot inform keep the model's values (no multi-token point ->
    verify_attention stays equal to memory).
    """
    return fit_models([(model, points)], source, names)


def fit_models(
    groups: Sequence[tuple[StepModel, Sequence[StepPoint]]],
    source: str,
    names: Sequence[str] | None = None,
    tolerance: float = 1e-4,
    tie_decode_attention: bool = True,
    tie_verify_attention: bool = False,
    bounds: dict[str, tuple[float, float]] | None = None,
) -> tuple[Efficiency, float]:
    """One efficiency for several (model, points) groups, e.g. several shapes on one GPU.

    With `tie_decode_attention` (a fit from scratch) decode attention follows memory unless fitted; without
    it, it keeps the model's value (a refit of a calibrated GPU). With `tie_verify_attention` the verify
    kernel streams KV bytes at the decode kernel's rate (the same bytes through the same memory), so only
    its fixed per-key cost (`verify_key_s`) is fitted: the two cannot be told apart on shapes that share a
    head dimension. `bounds` narrows parameters' search ranges; the search resolves each to `tolerance` of
    its range, so a fixed cost of tens of microseconds needs a range of about a millisecond, not 20.
    """
    limits = {**BOUNDS, **(bounds or {})}
    points_total = sum(len(points) for _, points in groups)
    if not points_total:
        raise ValueError("calibration needs at least one measured step time")
    base = groups[0][0].efficiency
    has_verify = any(p.q > 1 for _, points in groups for p in points)
    if names is None:
        names = ["memory", "compute", "step_overhead_s"] + (["verify_attention"] if has_verify else [])
    names = list(names)

    def efficiency(values: dict[str, Any]) -> Efficiency:
        eff = replace(base, **values)
        if not has_verify:
            eff = replace(eff, verify_attention=eff.memory)
        if tie_decode_attention and "decode_attention" not in values:
            eff = replace(eff, decode_attention=eff.memory)
        if tie_verify_attention:
            eff = replace(eff, verify_attention=eff.decode_attention)
        return eff

    def evaluate(values: dict[str, float]) -> float:
        eff = efficiency(values)
        return sum(_sum_sq_log(model.with_efficiency(eff), points) for model, points in groups) / points_total

    # Coarse grid over the two roofs, then pattern search over everything.
    start = {n: getattr(base, n) for n in names}
    best, best_loss = dict(start), evaluate(start)
    for mem, comp in itertools.product((0.4, 0.6, 0.8), (0.2, 0.4, 0.7)):
        cand = {**start, "memory": mem, "compute": comp}
        if has_verify and "verify_attention" in names:
            cand["verify_attention"] = mem / 2
        cand_loss = evaluate(cand)
        if cand_loss < best_loss:
            best, best_loss = cand, cand_loss
    steps = {n: (hi - lo) / 8 for n, (lo, hi) in limits.items()}
    while max(steps[n] / (limits[n][1] - limits[n][0]) for n in names) > tolerance:
        improved = False
        for n in names:
            for sign in (1, -1):
                lo, hi = limits[n]
                cand = {**best, n: min(hi, max(lo, best[n] + sign * steps[n]))}
                cand_loss = evaluate(cand)
                if cand_loss < best_loss - 1e-15:
                    best, best_loss, improved = cand, cand_loss, True
        if not improved:
            steps = {n: s / 2 for n, s in steps.items()}
    return replace(efficiency(best), source=source), math.sqrt(best_loss)


def reference_points(run, qs: Iterable[int] = (1, 5), with_draft: bool = True) -> list[StepPoint]:
    """Step points of one `ReferenceRun`; by default plain + gamma 4 verify + draft (gamma 2/7 held out)."""
    qs = set(qs)
    points = [StepPoint(b, q, run.context, s) for (b, q), s in sorted(run.target_s.items()) if q in qs]
    if with_draft:
        points += [StepPoint(b, 1, run.context, s, kind="draft") for b, s in sorted(run.draft_s.items())]
    return points


def sweep_points(levels: Sequence[dict], gamma: int, context: float) -> list[StepPoint]:
    """Step points from a sweep's levels: a plain step lasts one TPOT; a spec step yields tau tokens per
    request, so it lasts TPOT x tau. Levels without a TPOT or an acceptance are skipped."""
    points = []
    for level in levels:
        batch = float(level["concurrency"])
        plain = (level.get("plain") or {}).get("tpot_p50_s")
        spec = (level.get("spec") or {}).get("tpot_p50_s")
        tau = (level.get("spec") or {}).get("mean_acceptance_length")
        if plain:
            points.append(StepPoint(batch, 1, context, float(plain)))
        if spec and tau and gamma:
            points.append(StepPoint(batch, gamma + 1, context, float(spec) * float(tau), kind="spec"))
    return points
