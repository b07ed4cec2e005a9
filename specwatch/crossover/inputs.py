"""What the crossover model is computed from: a decoder's shape, a GPU's peak figures, its achieved efficiencies.

Frozen values, no I/O. A leaf module: the step-cost kernels (`stepcost.py`) and the model over them
(`speedup.py`) both read these types, and it imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass

KV_BYTES = 2.0  # KV cache kept in bf16/fp16 whatever the weight format (the common serving default)


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
    # Fixed seconds per wave of verify-kernel blocks (a block's setup, query-tile load and output write):
    # the part of a verify call that does not grow with the context (`stepcost.attention_s`).
    verify_block_s: float = 0.0
    # True: the verify pass reads KV once per query head (attention kernels without GQA packing, e.g. the
    # SDPA kernel of the H200 tables); False: once per KV head, like decode.
    verify_reads_per_query_head: bool = False
    # A packed verify kernel that splits each (sequence, KV head) slice across idle SMs when there are fewer
    # slices than SMs, as decode does (FlashAttention-3's num_splits_heuristic, hopper/heuristics.h). False:
    # one block per slice whatever the batch (PyTorch SDPA's flash kernel for q > 1, the packed tables' kernel).
    verify_split_kv: bool = True
    # Share of the HBM rate the elementwise kernels (norms, RoPE, residual adds, SiLU, KV writes) reach on the
    # bytes `stepcost.activation_bytes_per_token` counts.
    elementwise: float = 0.85
    # Fixed seconds per layer of the elementwise kernels whatever the bytes (each kernel's shortest run), read
    # from a profiled forward with `elementwise`; the rest of a layer's fixed cost is `layer_overhead_s`.
    elementwise_layer_s: float = 0.0


@dataclass(frozen=True)
class EngineOverhead:
    """Seconds a serving engine adds to each step beyond the kernels the step model prices (scheduling,
    sampling, rejection, launches outside the CUDA graph), fitted from its live step times (`overhead.py`).

    step_s is paid once per step, token_s once per token the target scores in it (batch x q: B x (k + 1) in a
    verify step, B in a plain one). Both are taken to apply to plain steps as to speculative ones: a speculating
    engine never shows a plain step, so nothing observed can split them."""

    step_s: float = 0.0
    token_s: float = 0.0

    def seconds(self, batch: float, q: int) -> float:
        return self.step_s + self.token_s * batch * q
