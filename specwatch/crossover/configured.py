"""The route's configured crossover source, answered for the live acceptance and k: B* and the predicted speedup.

Not the live calibration (`livecal.py`, which refits the model to the route's own step times).

Three kinds, one per `crossover:` config form:
- `FixedCrossover` (`batch_size: N`): B* = N, no speedup prediction.
- `EstimatedCrossover` (`estimate: {...}`): the calibrated roofline re-solved for the live p_j and context.
- `SweptCrossover` (`sweep: FILE`): the measured spec/plain curve, rescaled by live tau / swept tau (a step
  takes as long whatever its drafts' fate; only the tokens it yields change).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from specwatch.crossover.speedup import StepModel, interpolate_crossover, tau
from specwatch.crossover.sweepfile import speedup_points

DEFAULT_CONTEXT = 1024.0
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of HBM the engine claims (weights + KV)


@dataclass(frozen=True)
class LiveInputs:
    positions: tuple[float, ...]  # live p_1..p_k; empty when not yet known
    batch: float | None  # time-weighted running requests per engine
    kv_usage: float | None = None  # 0-1, mean over engines
    gpus_per_engine: int = 1


@dataclass(frozen=True)
class CrossoverAnswer:
    batch_size: float | None  # B*; None: no crossover (speculation wins at every batch) or unknown
    speedup: float | None  # predicted spec/plain throughput at the live batch
    known: bool = True  # False: not enough data yet to answer


class CrossoverSource(Protocol):
    name: str

    def answer(self, live: LiveInputs) -> CrossoverAnswer: ...


class FixedCrossover:
    name = "batch_size"

    def __init__(self, batch_size: float) -> None:
        self.batch_size = batch_size

    def answer(self, live: LiveInputs) -> CrossoverAnswer:
        return CrossoverAnswer(self.batch_size, None)


class EstimatedCrossover:
    name = "estimate"

    def __init__(self, model: StepModel, context: float | None) -> None:
        self.model = model
        self.context = context
        self._cache: dict[tuple, float | None] = {}

    def live_context(self, live: LiveInputs) -> float:
        """Configured context, else KV usage x KV capacity / running requests (§8), else 1024."""
        if self.context is not None:
            return self.context
        if live.kv_usage is None or not live.batch:
            return DEFAULT_CONTEXT
        hw, shape = self.model.hardware, self.model.shape
        weights = shape.gemm_params * 2.0  # bf16-equivalent upper bound; quantized weights leave more for KV
        capacity_tokens = (
            live.gpus_per_engine * GPU_MEMORY_UTILIZATION * hw.memory_bytes - weights
        ) / shape.kv_bytes_per_token
        if capacity_tokens <= 0:
            return DEFAULT_CONTEXT
        return max(1.0, live.kv_usage * capacity_tokens / live.batch)

    def answer(self, live: LiveInputs) -> CrossoverAnswer:
        if not live.positions:
            return CrossoverAnswer(None, None, known=False)
        context = self.live_context(live)
        # Round the inputs so a steady route hits the cache instead of re-solving every cycle.
        positions = tuple(round(p, 3) for p in live.positions)
        key = (positions, round(context, -1))
        if key not in self._cache:
            if len(self._cache) > 256:
                self._cache.clear()
            self._cache[key] = self.model.crossover(positions, key[1])
        speedup = self.model.speedup(live.batch, positions, context) if live.batch else None
        return CrossoverAnswer(self._cache[key], speedup)


class SweptCrossover:
    name = "sweep"

    def __init__(self, sweep: dict) -> None:
        self.points = speedup_points(sweep["levels"])
        self.swept_tau = sweep.get("mean_acceptance_length")
        self.swept_k = sweep.get("num_speculative_tokens")
        if not self.points:
            raise ValueError("the sweep has no level where both servers produced tokens")

    def _scale(self, live: LiveInputs) -> float:
        if not live.positions or not self.swept_tau:
            return 1.0  # no live acceptance yet: the curve as measured
        return tau(live.positions) / float(self.swept_tau)

    def answer(self, live: LiveInputs) -> CrossoverAnswer:
        scale = self._scale(live)
        curve = [(b, s * scale) for b, s in self.points]
        return CrossoverAnswer(interpolate_crossover(curve, log_x=True), _at(curve, live.batch))


def _at(curve: Sequence[tuple[float, float]], batch: float | None) -> float | None:
    """Linear interpolation of the curve at `batch`, clamped to its ends."""
    if batch is None or not curve:
        return None
    if batch <= curve[0][0]:
        return curve[0][1]
    for (b0, s0), (b1, s1) in zip(curve, curve[1:]):
        if batch <= b1:
            return s0 + (s1 - s0) * (batch - b0) / (b1 - b0)
    return curve[-1][1]


def positions_from_rate(rate: float, k: int) -> tuple[float, ...]:
    """iid p_j = alpha^j whose mean over k positions equals the per-token rate (for sources with no
    per-position counters, e.g. SGLang)."""
    if k <= 0 or not 0.0 <= rate <= 1.0:
        return ()
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if sum(mid**j for j in range(1, k + 1)) / k < rate:
            lo = mid
        else:
            hi = mid
    alpha = (lo + hi) / 2
    return tuple(alpha**j for j in range(1, k + 1))
