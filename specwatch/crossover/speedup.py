"""The crossover model: a calibrated roofline for step times plus Leviathan's expected tokens per step.

Pure functions and frozen values, no I/O. A decode step of the target streams its weights once
(memory-bound) until the tokens it processes, batch x q, reach the compute roof; KV-cache reads grow with
batch x context and stay memory-bound. Speculation with draft length gamma pays

    speedup(B) = tau x T(B, 1) / (T(B, gamma + 1) + gamma x T_draft(B))

and the crossover B* is the batch above which that stays below 1: the last downward crossing, so that
"batch above B*" means "speculation loses" at every batch the flag fires on (`docs/crossover.md`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from specwatch.crossover.inputs import Efficiency, EngineOverhead, Hardware, ModelShape
from specwatch.crossover.stepcost import forward_s

BYTES_PER_WEIGHT = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5, "fp32": 4.0}
EAGLE3_DRAFT_VOCAB = 32_000
MAX_BATCH = 4096.0  # beyond this no engine schedules a batch; "no crossover" above it
# The measured tables' batches, extended geometrically to MAX_BATCH.
BATCH_GRID = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)


LLAMA3_8B = ModelShape(
    layers=32,
    hidden_size=4096,
    kv_heads=8,
    head_dim=128,
    intermediate_size=14336,
    vocab_size=128_256,
    attention_heads=32,
)


@dataclass(frozen=True)
class Draft:
    """What one draft step runs: a small decoder `shape` (None for n-gram), its weights and KV bytes per token."""

    kind: str
    params: float
    kv_bytes_per_token: float
    shape: "ModelShape | None" = None

    @classmethod
    def parse(cls, spec: str, target: ModelShape) -> "Draft":
        """`eagle` (one layer + the target's vocab head), `eagle3` (32k head), `mtp`, `ngram`, `model:<B>`.

        A head's layer is dense and as wide as the target; for an MoE target its FFN is top-k x expert width.
        """
        if spec == "ngram":
            return cls("ngram", 0.0, 0.0)
        if spec in ("eagle", "mtp", "eagle3"):
            vocab = EAGLE3_DRAFT_VOCAB if spec == "eagle3" else target.vocab_size
            head = ModelShape(
                layers=1,
                hidden_size=target.hidden_size,
                kv_heads=target.kv_heads,
                head_dim=target.head_dim,
                intermediate_size=target.mlp_width_per_token,
                vocab_size=vocab,
                attention_heads=target.attention_heads,
            )
            return cls(spec, head.active_params, head.kv_bytes_per_token, head)
        if spec.startswith("model:"):
            try:
                billions = float(spec.split(":", 1)[1])
            except ValueError:
                raise ValueError(f"draft {spec!r}: expected model:<billions of parameters>, e.g. model:0.5") from None
            if not billions > 0:
                raise ValueError(f"draft {spec!r}: size must be positive")
            shape = ModelShape.from_params(billions)
            return cls(spec, billions * 1e9, shape.kv_bytes_per_token, shape)
        raise ValueError(f"unknown draft {spec!r}: use eagle, eagle3, mtp, ngram or model:<billions>")


# --------------------------------------------------------------------------- acceptance
def expected_tokens(alpha: float, gamma: int) -> float:
    """Leviathan et al.: E[tokens per verify step] = (1 - alpha^(gamma+1)) / (1 - alpha), bonus included."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def positions_from_alpha(alpha: float, gamma: int) -> tuple[float, ...]:
    """iid acceptance: p_j = alpha^j for j = 1..gamma."""
    return tuple(alpha**j for j in range(1, gamma + 1))


def tau(positions: Sequence[float]) -> float:
    """Tokens per verify step including the bonus token: 1 + sum p_j."""
    return 1.0 + sum(positions)


# --------------------------------------------------------------------------- step times
@dataclass(frozen=True)
class StepModel:
    """Step times of one target (+ draft) on one GPU at one weight precision."""

    shape: ModelShape
    hardware: Hardware
    efficiency: Efficiency
    dtype: str = "bf16"
    draft: Draft | None = None
    # The engine's own per-step costs beyond the kernels (live calibration fits it; zero elsewhere).
    overhead: EngineOverhead = EngineOverhead()

    def target_step_s(self, batch: float, q: int, context: float) -> float:
        return self._forward_s(self.shape, batch, q, context)

    def draft_step_s(self, batch: float, context: float) -> float:
        if self.draft is None or self.draft.shape is None:
            return 0.0
        return self._forward_s(self.draft.shape, batch, 1, context)

    def _forward_s(self, shape: ModelShape, batch: float, q: int, context: float) -> float:
        bytes_per_weight = BYTES_PER_WEIGHT[self.dtype]
        return forward_s(
            shape, batch, q, context, self.hardware, self.efficiency, self.dtype, bytes_per_weight, self.hardware.sms
        )

    def spec_step_s(self, batch: float, gamma: int, context: float) -> float:
        return self.target_step_s(batch, gamma + 1, context) + gamma * self.draft_step_s(batch, context)

    def speedup(self, batch: float, positions: Sequence[float], context: float) -> float:
        """Spec / plain throughput at `batch` for per-position acceptance p_1..p_gamma."""
        gamma = len(positions)
        if gamma == 0:
            return 1.0
        plain = self.target_step_s(batch, 1, context) + self.overhead.seconds(batch, 1)
        spec = self.spec_step_s(batch, gamma, context) + self.overhead.seconds(batch, gamma + 1)
        return tau(positions) * plain / spec

    def crossover(self, positions: Sequence[float], context: float, max_batch: float = MAX_BATCH) -> float | None:
        """B*. On the tables' verify kernel (whole waves of blocks) the speedup curve has steps between batches,
        so B* is read the way a measured one is: linearly between the points of `BATCH_GRID` that bracket 1."""
        if self.efficiency.verify_reads_per_query_head:
            grid = [b for b in BATCH_GRID if b <= max_batch]
            return interpolate_crossover([(b, self.speedup(b, positions, context)) for b in grid])
        return crossover_batch(lambda b: self.speedup(b, positions, context), max_batch)

    def with_efficiency(self, efficiency: Efficiency) -> "StepModel":
        return replace(self, efficiency=efficiency)


def crossover_batch(speedup_at, max_batch: float = MAX_BATCH, tolerance: float = 1e-3) -> float | None:
    """The last batch in [1, max_batch] where speedup_at(batch) falls below 1 for good; None if it is still
    >= 1 at max_batch, 1.0 if it is below 1 everywhere.

    Scans down geometrically from max_batch (speedup is not monotone at small batches: it can dip below 1 at
    batch 1 and pay again at 2-4) to the first batch where speculation pays, then bisects that bracket.
    """
    if speedup_at(max_batch) >= 1.0:
        return None
    hi = max_batch
    while hi > 1.0:
        lo = max(hi / 1.05, 1.0)
        if speedup_at(lo) >= 1.0:
            while hi - lo > tolerance * lo:
                mid = (lo + hi) / 2
                if speedup_at(mid) < 1.0:
                    hi = mid
                else:
                    lo = mid
            return (lo + hi) / 2
        hi = lo
    return 1.0


def closed_form_crossover(
    shape: ModelShape,
    hardware: Hardware,
    efficiency: Efficiency,
    positions: Sequence[float],
    draft_cost: float,
    context: float,
    dtype: str = "bf16",
) -> float | None:
    """The §3 closed form B* = (tau - gamma c) N_r / [(gamma+1) - (tau-1) rho(L)], for comparison and docs."""
    gamma = len(positions)
    t = tau(positions)
    bandwidth = efficiency.memory * hardware.bandwidth
    flops = efficiency.compute * hardware.flops(dtype)
    ridge = BYTES_PER_WEIGHT[dtype] * flops / (2 * bandwidth)
    rho = context * shape.kv_bytes_per_token * flops / (2 * shape.params * bandwidth)
    denominator = (gamma + 1) - (t - 1) * rho
    if denominator <= 0 or t - gamma * draft_cost <= 0:
        return None
    return (t - gamma * draft_cost) * ridge / denominator


def interpolate_crossover(points: Sequence[tuple[float, float]], log_x: bool = False) -> float | None:
    """Crossover from measured (batch, speedup) points: the last downward crossing, linear between the last
    point >= 1 and the point after it (in log batch with `log_x`, for geometrically spaced levels drawn on a
    log axis); None when the last point is >= 1; the first batch when no point is.

    The last crossing, not the first: the flag says "above B* speculation loses", which a dip below 1 at
    batch 1 followed by gains at 2-4 (or a wave step mid-curve) does not make true for the batches after it.
    """
    pts = sorted(points)
    if not pts or pts[-1][1] >= 1.0:
        return None
    paying = [i for i, (_, s) in enumerate(pts) if s >= 1.0]
    if not paying:
        return pts[0][0]
    (b0, s0), (b1, s1) = pts[paying[-1]], pts[paying[-1] + 1]
    share = (s0 - 1.0) / (s0 - s1)
    if log_x:
        return math.exp(math.log(b0) + share * (math.log(b1) - math.log(b0)))
    return b0 + share * (b1 - b0)
