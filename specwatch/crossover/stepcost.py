"""Step time of one decoder forward, kernel by kernel: what makes model shapes differ.

A forward with B sequences, q new tokens each (M = B x q rows) and context L costs, per layer:
- **GEMMs** (QKV, O, MLP; the LM head once): each the slower of streaming its weights (memory roof) and its
  FLOPs (compute roof). The compute side is counted in output tiles (on a GPU, rows padded to 64 and columns
  to 128; a CPU pads nothing), spread evenly over the SMs: a library GEMM splits K over idle SMs below one
  wave and balances the last, partial wave the same way above it (split-K, stream-K), so a GEMM with 65 rows
  costs like one with 128 but one whose tiles fill 1.1 waves costs 1.1, not 2. Where the knee sits depends
  on M, N and K of each GEMM, not only on the parameter count.
- **MoE experts**: only experts that receive a token stream their weights. With top-k of E experts and
  uniform routing, E x (1 - (1 - k/E)^M) experts are touched, each with M k / touched rows; the compute side
  is tiled per expert and, as a grouped launch has no split-K or stream-K, in whole waves; so is the memory
  side (each SM streams its own tiles' weights, so a last, partial wave streams at its share of the SMs: 186
  tiles on 132 SMs stream at 70% of the rate). Each touched
  expert's group also costs a fixed `expert_group_s` (its own small GEMM's setup and pipeline fill). Small
  batches of an MoE therefore grow their weight traffic with B until every expert is touched, which pushes
  B* far out.
- **Attention**: plain decode (q = 1) reads each sequence's KV cache once: the measured kernel (cuDNN's flash
  forward with a 16-row query tile) runs one block per (sequence, KV head) with the group's query heads as its
  rows, so GQA costs almost nothing beyond the bytes (`decode_attention_flop_s`, 4 x head_dim FLOPs per key
  and query head, fits to about 0 on the H200 probe). A verify pass (q > 1) on a kernel that packs GQA (the
  serving engines' on Hopper, `kernel.py`) costs the same bytes, q times the score FLOPs. A verify pass on a
  kernel that is not decode-optimised (cuDNN's 64-row-tile kernel, one block per sequence and *query* head)
  reads it once per query head, i.e. GQA-ratio times the bytes; with fewer (sequence, head) blocks than SMs
  the kernel cannot fill the GPU. Besides its bytes, each key costs the verify kernel a fixed `verify_key_s`:
  the kernel runs a 64-row query tile whatever q, and its per-key softmax, masking and output rescaling over
  those rows do not shrink with the head dimension. A head-dim-64 shape therefore pays more per KV byte than a
  head-dim-128 one. Every attention call also lasts at least one block's loop over its slice, (context + q) x
  `attention_slice_key_s`: however many blocks run, none finishes faster than one block streams its keys, so a
  small call streams below the device rate.
- **Elementwise kernels** (norms, RoPE, residual adds, SiLU and the gate multiply, KV-cache writes, MoE
  gather/scatter) move the bytes `activation_bytes_per_token` counts kernel by kernel, per token and layer,
  at their own rate (`elementwise`): unfused PyTorch kernels on strided head-major views run far below the
  weight-streaming rate (about 1.9 TB/s against 3.9 on the H200 profile). RoPE and the KV write scale with
  the KV heads, so an MHA shape moves about 15% more elementwise bytes per token than a GQA shape of the
  same width.
- **Fixed costs**: per layer, the elementwise kernels' shortest runs (`elementwise_layer_s`, read with their
  rate from a profiled forward) and the other kernels' (`layer_overhead_s`); and a per-forward one.

Efficiencies are fitted per GPU (`calibrate.py`); tile sizes are the common cuBLAS/CUTLASS Hopper choices.
"""

from __future__ import annotations

import math

from specwatch.crossover.inputs import KV_BYTES, Efficiency, Hardware, ModelShape

TILE_N = 128


def tile_m(m: float) -> int:
    """Row tile the GEMM libraries pick: narrow tiles for skinny (decode) GEMMs."""
    return 64 if m <= 64 else 128


def gemm_s(
    m: float, n: float, k: float, weight_bytes: float, hw: Hardware, eff: Efficiency, dtype_flops: float
) -> float:
    """One GEMM of m x k activations by a k x n weight: max(memory roof, tile-quantized compute roof)."""
    if m <= 0:
        return 0.0
    memory = (n * k * weight_bytes + 2.0 * m * (n + k)) / (eff.memory * hw.bandwidth)
    # Rows are padded to 64, not to the 128-row tile: libraries pick among 64-, 128- and 256-row tiles to waste
    # least. The padded tiles spread evenly over the SMs: with fewer tiles than SMs the library splits K across
    # the idle SMs (split-K); past one wave it balances the last, partial wave the same way (stream-K), so no
    # whole wave is wasted and the compute side is the padded FLOPs at the device rate.
    pad_m, pad_n = hw.gemm_padding
    padded_flops = 2.0 * math.ceil(m / pad_m) * pad_m * math.ceil(n / pad_n) * pad_n * k
    compute = padded_flops / (eff.compute * dtype_flops)
    return max(memory, compute)


def waves(tiles: float, sms: int) -> float:
    """Rounds of one tile per SM for a grouped (MoE) launch, which has no split-K or stream-K: fewer tiles than
    SMs spread as a share of one wave; more, and the last, partial wave costs a whole one."""
    if tiles < sms:
        return tiles / sms
    return float(math.ceil(tiles / sms))


def experts_touched(m_tokens: float, experts: int, top_k: int) -> float:
    """Expected distinct experts receiving at least one of m tokens under uniform top-k routing."""
    return experts * (1.0 - (1.0 - top_k / experts) ** m_tokens)


def grouped_gemm_s(
    m_tokens: float,
    touched: float,
    n: float,
    k: float,
    weight_bytes: float,
    hw: Hardware,
    eff: Efficiency,
    dtype_flops: float,
    sms: int,
) -> float:
    """Experts' GEMMs in one grouped launch: touched experts' weights, tiles counted per expert."""
    if m_tokens <= 0 or touched <= 0:
        return 0.0
    rows = m_tokens / touched
    tm = tile_m(rows)
    tiles = touched * math.ceil(rows / tm) * math.ceil(n / TILE_N)
    # A grouped launch has no split-K or stream-K: its tiles run in whole waves, each SM streaming its own tiles'
    # weights, so only the share of SM slots the tiles fill streams (fewer tiles than SMs, or a last, partial wave).
    fill = tiles / (sms * math.ceil(tiles / sms))
    memory = (touched * n * k * weight_bytes + 2.0 * m_tokens * (n + k)) / (eff.memory * fill * hw.bandwidth)
    compute = waves(tiles, sms) * 2.0 * tm * TILE_N * k / (eff.compute * dtype_flops / sms)
    return max(memory, compute) + touched * eff.expert_group_s


def activation_bytes_per_token(shape: ModelShape) -> float:
    """Bytes the elementwise kernels of one layer move per token (bf16), counted kernel by kernel as the
    measured forward runs them: two RMSNorms (read and write d each), two residual adds (read 2d, write d),
    RoPE on q and k as five kernels (multiply, negate half, concatenate, multiply, add: 10 element passes),
    the KV-cache write of k and v (read and write each), SiLU (read and write f) and the gate multiply (read
    2f, write f)."""
    d = shape.hidden_size
    q_width = shape.attention_heads * shape.head_dim
    kv_width = shape.kv_heads * shape.head_dim
    ffn = shape.mlp_width_per_token
    # MoE dispatch: gather the routed rows (read and write k d), weight them (read and write k d), zero the
    # output (write d) and scatter-add into it (read k d, read and write the output rows: 3 k d).
    dispatch = 7 * d * shape.experts_per_token + d if shape.experts else 0
    return 2.0 * (10 * d + 10 * q_width + 14 * kv_width + 5 * ffn + dispatch)


# Kernels per layer in the measured forward: a dense layer runs about 24; an MoE layer replaces the MLP's 4
# with about 10 (router, gather, two grouped GEMMs, activation, gate, zero-fill, scatter-add).
DENSE_LAYER_KERNELS = 24
MOE_LAYER_KERNELS = 30


def attention_s(
    batch: float, q: int, context: float, shape: ModelShape, hw: Hardware, eff: Efficiency, sms: int
) -> float:
    """One layer's attention over the KV cache (context + q positions per sequence)."""
    per_key = shape.head_dim * 2 * KV_BYTES  # K and V of one head, one position
    keys = context + q
    if q == 1 or not eff.verify_reads_per_query_head:
        # Plain decode, or a verify kernel that packs each KV head's group of query heads with the q new tokens
        # into one tile's rows (FlashAttention-3's pack_gqa, FlashInfer; `kernel.py`): either reads each
        # sequence's KV cache once per KV head, so a packed verify costs what decode costs plus q times the
        # score FLOPs.
        # Split-KV (flash-decoding): a call with fewer (sequence, KV head) blocks than SMs splits each slice of
        # the cache so the blocks fill the GPU, so its critical path is a 1/splits share of one slice.
        splits = max(1, sms // max(1, int(batch * shape.kv_heads))) if q == 1 or eff.verify_split_kv else 1
        scores = q * batch * keys * shape.attention_heads * 4 * shape.head_dim  # QK and PV FLOPs
        return (
            batch * keys * per_key * shape.kv_heads / (eff.decode_attention * hw.bandwidth)
            + scores * eff.decode_attention_flop_s
            + keys / splits * eff.attention_slice_key_s
        )
    # The unpacked verify kernel runs one block per (sequence, query head) over its whole slice, no split: each
    # wave of blocks lasts one block's loop over its keys (its KV bytes at an SM's share of the rate, plus the
    # per-key work of its query tile) and its fixed setup and epilogue, in whole waves (every slice the same
    # length): 192 blocks on 132 SMs cost two.
    blocks = batch * shape.attention_heads / sms
    rounds = max(1.0, math.ceil(blocks))
    per_block_key = sms * (per_key / (eff.verify_attention * hw.bandwidth) + eff.verify_key_s)
    return rounds * (keys * per_block_key + eff.verify_block_s)


def forward_s(
    shape: ModelShape,
    batch: float,
    q: int,
    context: float,
    hw: Hardware,
    eff: Efficiency,
    dtype: str,
    weight_bytes: float,
    sms: int,
    lm_head_vocab: int | None = None,
) -> float:
    """Seconds of one forward of `shape` (all its layers, then its LM head over every new token)."""
    m = batch * q
    flops = hw.flops(dtype)
    d, hd = shape.hidden_size, shape.head_dim
    layer = gemm_s(m, (shape.attention_heads + 2 * shape.kv_heads) * hd, d, weight_bytes, hw, eff, flops)
    layer += gemm_s(m, d, shape.attention_heads * hd, weight_bytes, hw, eff, flops)
    if shape.experts:
        touched = experts_touched(m, shape.experts, shape.experts_per_token)
        routed = m * shape.experts_per_token
        layer += gemm_s(m, shape.experts, d, weight_bytes, hw, eff, flops)  # router
        layer += grouped_gemm_s(routed, touched, 2 * shape.intermediate_size, d, weight_bytes, hw, eff, flops, sms)
        layer += grouped_gemm_s(routed, touched, d, shape.intermediate_size, weight_bytes, hw, eff, flops, sms)
    else:
        layer += gemm_s(m, 2 * shape.intermediate_size, d, weight_bytes, hw, eff, flops)
        layer += gemm_s(m, d, shape.intermediate_size, weight_bytes, hw, eff, flops)
    layer += attention_s(batch, q, context, shape, hw, eff, sms)
    layer += m * activation_bytes_per_token(shape) / (eff.elementwise * hw.bandwidth)
    kernels = (MOE_LAYER_KERNELS if shape.experts else DENSE_LAYER_KERNELS) / DENSE_LAYER_KERNELS
    layer += (eff.layer_overhead_s + eff.elementwise_layer_s) * kernels
    vocab = lm_head_vocab or shape.vocab_size
    head = gemm_s(m, vocab, d, weight_bytes, hw, eff, flops)
    return eff.step_overhead_s + shape.layers * layer + head
