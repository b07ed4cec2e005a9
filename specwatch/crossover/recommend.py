"""Choose the draft length k per batch size from measured per-position acceptance and step times.

    G(B, k) = (1 + p_1 + ... + p_k) / T_step(B, k),  T_step(B, 0) = T_plain(B)

(docs/design/crossover-research.md §7)

k*(B) = argmax_k G over 0..K, where K is the draft length now running: acceptance beyond K is censored, so
the schedule never proposes more than K. The per-batch k* is written out as vLLM's
`num_speculative_tokens_per_batch_size` and as an SGLang `--speculative-adaptive-config` file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from specwatch.crossover.speedup import StepModel

NEAR_OPTIMAL = 0.95  # SGLang candidates: draft lengths within 5% of the best throughput at the slot's batch


class StepTimes(Protocol):
    def step_s(self, batch: float, k: int) -> float:
        """Seconds of one decode step at `batch` drafting k tokens (k = 0: plain decode)."""
        ...


class ModelStepTimes:
    """Step times from the calibrated roofline."""

    def __init__(self, model: StepModel, context: float) -> None:
        self.model, self.context = model, context

    def step_s(self, batch: float, k: int) -> float:
        if k == 0:
            return self.model.target_step_s(batch, 1, self.context)
        return self.model.spec_step_s(batch, k, self.context)


# Share of a speculative step's extra cost (over a plain step) that does not shrink with k: switching to a
# multi-token verify kernel, rejection sampling, draft launch. On the H200 table, verify gamma 2 vs 4 at
# B >= 16 puts it at 0.49-0.50 (0.31 at B = 1). A sweep measures only k = 0 and k = K, so it cannot split
# the cost itself; this split is assumed.
FIXED_SPEC_SHARE = 0.5


class SweepStepTimes:
    """Step times measured by a sweep: plain = TPOT, spec at the swept K = TPOT x tau.

    For 0 < k < K: T(k) = T(0) + (T(K) - T(0)) x (s + (1 - s) k / K), with s = FIXED_SPEC_SHARE. Pure
    linear interpolation (s = 0) would make short drafts look nearly free and keep k = 1 far past the
    crossover. Batches between levels interpolate linearly; beyond the last level the last segment is
    extended (step times keep growing).
    """

    def __init__(self, sweep: dict) -> None:
        self.k = int(sweep.get("num_speculative_tokens") or 0)
        self.plain: list[tuple[float, float]] = []
        self.spec: list[tuple[float, float]] = []
        for lv in sweep["levels"]:
            plain, spec = lv.get("plain") or {}, lv.get("spec") or {}
            tau = spec.get("mean_acceptance_length")
            if plain.get("tpot_p50_s") and spec.get("tpot_p50_s") and tau:
                self.plain.append((float(lv["concurrency"]), float(plain["tpot_p50_s"])))
                self.spec.append((float(lv["concurrency"]), float(spec["tpot_p50_s"]) * float(tau)))
        if self.k < 1 or len(self.plain) < 2:
            raise ValueError(
                "the sweep needs the spec server's acceptance (num_speculative_tokens) and TPOT at "
                "two or more levels to give step times"
            )

    def step_s(self, batch: float, k: int) -> float:
        plain = _interpolate(self.plain, batch)
        if k == 0:
            return plain
        share = FIXED_SPEC_SHARE + (1 - FIXED_SPEC_SHARE) * min(k, self.k) / self.k
        return plain + share * (_interpolate(self.spec, batch) - plain)


def _interpolate(points: Sequence[tuple[float, float]], x: float) -> float:
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = points[-2], points[-1]
    return max(y1, y1 + (y1 - y0) * (x - x1) / (x1 - x0))


def goodput(positions: Sequence[float], times: StepTimes, batch: float, k: int) -> float:
    """Expected tokens per second per sequence at `batch` drafting k tokens."""
    return (1.0 + sum(positions[:k])) / times.step_s(batch, k)


def best_k(positions: Sequence[float], times: StepTimes, batch: float) -> int:
    scores = [goodput(positions, times, batch, k) for k in range(len(positions) + 1)]
    return max(range(len(scores)), key=lambda k: (scores[k], -k))  # ties: the shorter draft


@dataclass(frozen=True)
class Recommendation:
    k_now: int  # best k at the current batch
    batch_now: float
    speedup_now: float  # G(k_now) / G(0) at the current batch
    ranges: tuple[tuple[int, int, int], ...]  # vLLM [[start_bs, end_bs, K], ...], inclusive
    sglang: dict[str, dict[str, list[int]]]  # {"<start_bs>": {"candidate_steps": [...]}}
    vllm_reason: str
    sglang_reason: str


def recommend(positions: Sequence[float], times: StepTimes, batch_now: float, max_batch: int = 256) -> Recommendation:
    if not positions:
        raise ValueError("no per-position acceptance yet: nothing to recommend")
    if max_batch < 1:
        raise ValueError("max batch must be >= 1")
    # k never rises with batch: verify cost only grows with it, and the step-time model's tile-quantization
    # ripples must not make a schedule draft more at a larger batch than at a smaller one.
    per_batch: list[int] = []
    for b in range(1, max_batch + 1):
        k = best_k(positions, times, b)
        per_batch.append(min(k, per_batch[-1]) if per_batch else k)
    ranges: list[list[int]] = []
    for b, k in enumerate(per_batch, start=1):
        if ranges and ranges[-1][2] == k:
            ranges[-1][1] = b
        else:
            ranges.append([b, b, k])
    sglang = {}
    for start, _, k in ranges:
        best = goodput(positions, times, start, k)
        near = [j for j in range(len(positions) + 1) if goodput(positions, times, start, j) >= NEAR_OPTIMAL * best]
        sglang[str(start)] = {"candidate_steps": sorted(set(near) | {k})}
    k_now = best_k(positions, times, max(1.0, batch_now))
    b_now = max(1.0, batch_now)
    speedup_now = goodput(positions, times, b_now, k_now) / goodput(positions, times, b_now, 0)
    off = next((start for start, _, k in ranges if k == 0), None)
    vllm_reason = f"k falls from {ranges[0][2]} as verify cost grows with batch" + (
        f" and drafting stops from batch {off}, where a plain step yields more tokens per second"
        if off is not None
        else "; drafting pays up to batch " + str(max_batch)
    )
    sglang_reason = (
        "each slot offers the draft lengths within 5% of the best at its batch, so SGLang's "
        "acceptance EMA picks among them" + ("; [0] slots never draft" if off is not None else "")
    )
    return Recommendation(
        k_now=k_now,
        batch_now=batch_now,
        speedup_now=speedup_now,
        ranges=tuple((start, end, k) for start, end, k in ranges),
        sglang=sglang,
        vllm_reason=vllm_reason,
        sglang_reason=sglang_reason,
    )
