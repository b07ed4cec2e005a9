#!/usr/bin/env python3
"""Time one decoder layer's verify attention under each kernel layout, beside plain decode and the layer's
dense GEMMs (torch only).

Why: whether the verify pass reads the KV cache once per KV head (engines that pack a GQA group's query heads
with the draft tokens, as FlashInfer and FlashAttention-3 do) or once per query head decides the crossover at
long context (docs/crossover.md). One Qwen2.5-14B-shaped layer (40 query / 8 KV heads, head dim 128, hidden
5120, FFN 13824) at (context, batch) = (1024, 64), (8192, 16), (8192, 64):

- plain: decode, q = 1, SDPA with native GQA, no mask (what the step tables time for q = 1);
- masked-bool: verify q = 3, SDPA with a boolean bottom-right causal mask (`measure_steptimes.py --variant gqa`);
- masked-aligned-float: verify q = 3 with the step tables' `gqa-aligned-float` mask;
- enable-gqa: verify q = 3, SDPA `enable_gqa`, no mask;
- packed: verify q = 3, `measure_steptimes.packed_attention` (group x q rows per KV head, no mask);
- flash-attn-pack-gqa: verify q = 3 through flash_attn's kvcache kernel, where the package is installed;
- dense GEMMs q = 3: the layer's QKV, O, gate-up and down projections at B x 3 rows.

Each attention point is a CUDA graph of `COPIES` calls on distinct KV buffers (they stream from HBM), the median
of CUDA-event-timed replays, divided by `COPIES`. The CUDA kernels each case launches are recorded.

    python3 bench/probe_verify_kernels.py --out DIR      # about 30 s on an H100
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

from measure_steptimes import cuda_provenance, packed_attention, randn, time_graph
from probe_attention import kernels

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, FFN = 40, 8, 128, 5120, 13824
POINTS = ((1024, 64), (8192, 16), (8192, 64))
Q = 3
COPIES = 4


def mask_for(context: int, q: int, kind: str, device: torch.device) -> torch.Tensor:
    width = context + q
    if kind == "float":
        width = -(-width // 8) * 8
    keep = torch.ones(q, width, dtype=torch.bool, device=device).tril(diagonal=context)
    if kind == "float":
        return torch.zeros(q, width, dtype=torch.bfloat16, device=device).masked_fill(~keep, float("-inf"))[
            :, : context + q
        ]
    return keep


def attention_case(name: str, context: int, batch: int, device: torch.device, tiny: bool = False):
    hq, hkv, hd = (4, 2, 16) if tiny else (HEADS, KV_HEADS, HEAD_DIM)
    q = 1 if name == "plain" else Q
    kv = [
        (randn((batch, hkv, context + q, hd), device, 1.0), randn((batch, hkv, context + q, hd), device, 1.0))
        for _ in range(COPIES)
    ]
    query = randn((batch, hq, q, hd), device, 1.0)
    if name == "flash-attn-pack-gqa":
        from flash_attn import flash_attn_with_kvcache  # type: ignore[import-not-found]

        # flash_attn's layout is (batch, seqlen, heads, dim); it groups query heads onto KV heads itself.
        q_bshd = query.transpose(1, 2).contiguous()
        kv_bshd = [(k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()) for k, v in kv]

        def run_fa() -> None:
            for k, v in kv_bshd:
                flash_attn_with_kvcache(q_bshd, k, v, causal=True)

        return run_fa
    mask = None
    if name == "masked-bool":
        mask = mask_for(context, q, "bool", device)
    elif name == "masked-aligned-float":
        mask = mask_for(context, q, "float", device)

    def run() -> None:
        for k, v in kv:
            if name == "packed":
                packed_attention(query, k, v)
            else:
                F.scaled_dot_product_attention(query, k, v, attn_mask=mask, enable_gqa=True)

    return run


def gemm_case(batch: int, device: torch.device, tiny: bool = False):
    d, hq, hkv, hd, f = (64, 4, 2, 16, 128) if tiny else (HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN)
    x = randn((batch * Q, d), device)
    w = {
        "qkv": randn(((hq + 2 * hkv) * hd, d), device),
        "o": randn((d, hq * hd), device),
        "gate_up": randn((2 * f, d), device),
        "down": randn((d, f), device),
    }
    o_in = randn((batch * Q, hq * hd), device)
    d_in = randn((batch * Q, f), device)

    def run() -> None:
        F.linear(x, w["qkv"])
        F.linear(o_in, w["o"])
        F.linear(x, w["gate_up"])
        F.linear(d_in, w["down"])

    return run


CASES = ("plain", "masked-bool", "masked-aligned-float", "enable-gqa", "packed", "flash-attn-pack-gqa")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU, to test the code path")
    args = parser.parse_args()
    tiny = args.dry_run
    if not tiny and not torch.cuda.is_available():
        print("needs a CUDA device (or --dry-run)", file=sys.stderr)
        return 2
    device = torch.device("cpu" if tiny else "cuda")
    try:
        import flash_attn  # type: ignore[import-not-found]

        flash_version = flash_attn.__version__
    except ImportError:
        flash_version = None
    cases = [c for c in CASES if c != "flash-attn-pack-gqa" or flash_version]
    points = ((16, 2), (32, 2)) if tiny else POINTS
    rows = []
    kernel_names: dict[str, list[str]] = {}
    for context, batch in points:
        row: dict = {"context": context, "batch": batch}
        for name in cases:
            fn = attention_case(name, context, batch, device, tiny)
            row[name] = round(time_graph(fn, device, 0.5, 50) / COPIES, 5)
            if not tiny and (context, batch) == POINTS[-1]:
                kernel_names[name] = kernels(fn)
            del fn
        fn = gemm_case(batch, device, tiny)
        row["dense_gemms_q3"] = round(time_graph(fn, device, 0.5, 50), 5)
        del fn
        if not tiny:
            torch.cuda.empty_cache()
        rows.append(row)
        print(json.dumps(row), flush=True)
    doc = {
        "provenance": {
            **(cuda_provenance(device, "bench/probe_verify_kernels.py") if not tiny else {"gpu": "cpu (dry run)"}),
            "layer": {"heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "hidden": HIDDEN, "ffn": FFN},
            "q_verify": Q,
            "kv_buffers_per_graph": COPIES,
            "flash_attn": flash_version,
            "unit": "ms per layer",
        },
        "rows": rows,
        "kernels_at_last_point": kernel_names,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "verify-kernels-qwen2.5-14b-layer.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
    for name, names in kernel_names.items():
        print(name, names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
