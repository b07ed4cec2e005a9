"""The crossover model: a calibrated roofline for step times plus Leviathan's expected tokens per step.

Pure functions and frozen values, no I/O. A decode step of the target streams its weights once
(memory-bound) until the tokens it processes, batch x q, reach the compute roof; KV-cache reads grow with
batch x context and stay memory-bound. Speculation with draft length gamma pays

    speedup(B) = tau x T(B, 1) / (T(B, gamma + 1) + gamma x T_draft(B))

and the crossover B* is the smallest batch where that falls below 1 (`docs/crossover.md`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from specwatch.crossover.stepcost import forward_s

BYTES_PER_WEIGHT = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5, "fp32": 4.0}
KV_BYTES = 2.0  # KV cache kept in bf16/fp16 whatever the weight format (the common serving default)
EAGLE3_DRAFT_VOCAB = 32_000
MAX_BATCH = 4096.0  # beyond this no engine schedules a batch; "no crossover" above it


@dataclass(frozen=True)
class ModelShape:
    """A decoder. `params` counts every weight (embedding and LM head included).

    Dense by default; with `experts` > 0 each layer's MLP is `experts` gated experts of width
    `intermediate_size`, `experts_per_token` of them used per token (uniform routing assumed).
    """

    layers: int
    hidden_size: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    attention_heads: int
    experts: int = 0
    experts_per_token: int = 0

    @property
    def attention_params(self) -> float:
        attn = 2 * self.hidden_size * self.attention_heads * self.head_dim  # q, o
        return attn + 2 * self.hidden_size * self.kv_heads * self.head_dim  # k, v

    @property
    def layer_params(self) -> float:
        if self.experts:
            mlp = self.experts * 3 * self.hidden_size * self.intermediate_size + self.hidden_size * self.experts
        else:
            mlp = 3 * self.hidden_size * self.intermediate_size  # gated MLP
        return self.attention_params + mlp

    @property
    def mlp_width_per_token(self) -> int:
        """FFN width one token passes through: top-k x expert width for an MoE."""
        return self.intermediate_size * (self.experts_per_token if self.experts else 1)

    @property
    def gqa_ratio(self) -> float:
        return self.attention_heads / self.kv_heads

    @property
    def active_params(self) -> float:
        """Weights one token is multiplied by (every layer's active part plus the LM head)."""
        mlp = 3 * self.hidden_size * self.mlp_width_per_token
        return self.layers * (self.attention_params + mlp) + self.vocab_size * self.hidden_size

    @property
    def params(self) -> float:
        return self.layers * self.layer_params + 2 * self.vocab_size * self.hidden_size

    @property
    def gemm_params(self) -> float:
        """Weights multiplied per token: every layer plus the LM head (the embedding is a lookup)."""
        return self.layers * self.layer_params + self.vocab_size * self.hidden_size

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * KV_BYTES

    @classmethod
    def from_params(cls, billions: float) -> "ModelShape":
        """A Llama-like shape of about `billions` parameters when only the size is known.

        Scales Llama-3-8B's width and depth (d ~ P^(1/3) each way), GQA 4, head dim 128. Good to
        first order for weight bytes and FLOPs; pass the real shape for the KV term.
        """
        scale = (billions / 8.03) ** (1 / 3)
        hidden = max(128, int(round(4096 * scale / 128)) * 128)
        layers = max(1, int(round(32 * scale)))
        heads = hidden // 128
        return cls(
            layers=layers,
            hidden_size=hidden,
            kv_heads=max(1, heads // 4),
            head_dim=128,
            intermediate_size=int(hidden * 3.5),
            vocab_size=128_256,
            attention_heads=heads,
        )


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
class Hardware:
    """Peak figures of one GPU: HBM bandwidth (B/s), dense FLOP/s by GEMM precision, memory (B)."""

    name: str
    bandwidth: float
    flops_bf16: float
    flops_fp8: float | None
    memory_bytes: float
    sms: int = 132  # streaming multiprocessors (compute units): the wave size of a GEMM's tiles
    # Rows and columns a GEMM's output is padded to: a tensor-core tile on a GPU. A CPU's GEMM has no tile to
    # fill (its register blocks are a few rows), so a CPU row pads to (1, 1).
    gemm_padding: tuple[int, int] = (64, 128)
    flops_fp32: float | None = None  # only CPU rows: GPU engines serve 16-bit or narrower weights

    def flops(self, dtype: str) -> float:
        if dtype == "fp32":
            if self.flops_fp32 is None:
                raise ValueError(f"{self.name} has no fp32 GEMM figure (fp32 is for CPU engines)")
            return self.flops_fp32
        # Weight-only int4 runs its GEMMs in bf16; fp8/fp4 use the FP8 tensor path where the GPU has one.
        if dtype in ("fp8", "fp4", "int8") and self.flops_fp8:
            return self.flops_fp8
        return self.flops_bf16


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of peak and a fixed cost, calibrated per GPU (`calibrate.py`).

    memory: weight and decode-KV streaming (q = 1 attention). compute: GEMMs past the ridge.
    verify_attention: KV reads of a multi-token (verify) query, whose kernels are often not the
    decode-optimized ones; verify_key_s: that kernel's fixed work per key (`stepcost.attention_s`).
    step_overhead_s: launch and framework cost per forward.
    """

    memory: float = 0.85
    compute: float = 0.65
    verify_attention: float = 0.85
    step_overhead_s: float = 0.0
    source: str = "default derating (uncalibrated)"
    decode_attention: float = 0.85  # KV streaming of a plain decode step (q = 1)
    layer_overhead_s: float = 0.0  # fixed cost per layer (kernel boundaries)
    # Seconds of GPU time per (sequence, key, work head) of the verify kernel, besides streaming the key's
    # bytes: the softmax and rescaling over the kernel's query tile, whose size does not follow head_dim.
    verify_key_s: float = 0.0
    # Seconds per FLOP of a decode kernel's dot products (4 x head_dim per key and *query* head): a GQA decode
    # kernel reads each KV head once but scores it against every query head of its group.
    decode_attention_flop_s: float = 0.0
    # Seconds per key of one work item of an attention kernel (one thread block's loop over a (sequence, head)
    # slice of the KV cache): however many blocks run, a call lasts at least one slice at a single block's
    # rate, so small calls stream below the device rate (`stepcost.attention_s`).
    attention_slice_key_s: float = 0.0
    # Fixed seconds per touched expert of a grouped (MoE) GEMM launch: each expert's group of rows is its own
    # small GEMM inside the launch, with its own setup and pipeline fill (`stepcost.grouped_gemm_s`).
    expert_group_s: float = 0.0
    # True: the verify pass reads KV once per query head (attention kernels without GQA packing, e.g. the
    # SDPA kernel of the H200 tables); False: once per KV head, like decode.
    verify_reads_per_query_head: bool = False
    # Share of the HBM rate the elementwise kernels (norms, RoPE, residual adds, SiLU, KV writes) reach on the
    # bytes `stepcost.activation_bytes_per_token` counts.
    elementwise: float = 0.85


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
        return tau(positions) * self.target_step_s(batch, 1, context) / self.spec_step_s(batch, gamma, context)

    def crossover(self, positions: Sequence[float], context: float, max_batch: float = MAX_BATCH) -> float | None:
        return crossover_batch(lambda b: self.speedup(b, positions, context), max_batch)

    def with_efficiency(self, efficiency: Efficiency) -> "StepModel":
        return replace(self, efficiency=efficiency)


def crossover_batch(speedup_at, max_batch: float = MAX_BATCH, tolerance: float = 1e-3) -> float | None:
    """Smallest batch in [1, max_batch] where speedup_at(batch) drops below 1; None if it never does.

    Scans geometrically (speedup is not monotone at tiny batches) then bisects the first bracket.
    """
    if speedup_at(1.0) < 1.0:
        return 1.0
    lo = 1.0
    while lo < max_batch:
        hi = min(lo * 1.05, max_batch)
        if speedup_at(hi) < 1.0:
            while hi - lo > tolerance * lo:
                mid = (lo + hi) / 2
                if speedup_at(mid) < 1.0:
                    hi = mid
                else:
                    lo = mid
            return (lo + hi) / 2
        lo = hi
    return None


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
    """Crossover from measured (batch, speedup) points: linear between the last point >= 1 and the first
    point < 1 after it (in log batch with `log_x`, for geometrically spaced levels drawn on a log axis);
    None when no point is below 1; the first batch if all are."""
    pts = sorted(points)
    if not pts:
        return None
    if pts[0][1] < 1.0:
        return pts[0][0]
    for (b0, s0), (b1, s1) in zip(pts, pts[1:]):
        if s1 < 1.0 <= s0:
            share = (s0 - 1.0) / (s0 - s1)
            if log_x:
                return math.exp(math.log(b0) + share * (math.log(b1) - math.log(b0)))
            return b0 + share * (b1 - b0)
    return None
