#!/usr/bin/env python3
"""Time SDPA attention alone, as `measure_steptimes.py` runs and times it, across GQA ratios (torch only).

Why: the step-time tables show plain-decode attention streaming KV faster per byte on the MHA shape
(Llama-2-7B) than on the GQA shapes. This isolates the attention kernel from the rest of the forward: the
decode pass (q = 1, native GQA, no mask) and the verify pass (q = 3 and 5, the `gqa-aligned-float` mask),
for query/KV head pairs at head dim 128 (and 64), batches 16 to 256, context 1024. Each point is a captured
CUDA graph of 8 back-to-back calls on 8 distinct KV buffers (so they stream from HBM, not L2), median of
CUDA-event-timed replays. It also records the CUDA kernels each case launches (torch.profiler).

    python3 bench/probe_attention.py --out DIR        # about 30 s on an H200

`--verify packed` times the verify pass as serving engines run it instead (`measure_steptimes.packed_attention`:
the GQA group's query heads x q packed onto each KV head, no mask) and names the file `...-packed.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

# time_graph: the tables' own timing, the median of CUDA-event-timed graph replays
from measure_steptimes import cuda_provenance, packed_attention, time_graph

CONTEXT = 1024
BATCHES = (16, 64, 128, 256)
# (query heads, KV heads, head dim): MHA at several widths, then GQA 2..8 at 32 query heads, and the shipped shapes'.
HEADS = (
    (32, 32, 128),
    (16, 16, 128),
    (40, 40, 128),
    (32, 16, 128),
    (32, 8, 128),
    (32, 4, 128),
    (64, 8, 128),
    (12, 2, 128),
    (40, 8, 128),
    (32, 32, 64),
    (32, 8, 64),
)
REPLAYS = 15  # timed replays a point (fewer only for a graph slower than REPLAY_TARGET_S / 15: none is)
REPLAY_TARGET_S = 10.0
COPIES = 8  # distinct KV buffers per graph: together far larger than the 50 MB L2 at every batch but the smallest


def verify_mask(q: int, device: torch.device) -> torch.Tensor:
    """The `gqa-aligned-float` verify mask of measure_steptimes.py: bottom-right causal, rows padded to 8."""
    width = -(-(CONTEXT + q) // 8) * 8
    keep = torch.ones(q, width, dtype=torch.bool, device=device).tril(diagonal=CONTEXT)
    full = torch.zeros(q, width, dtype=torch.bfloat16, device=device).masked_fill(~keep, float("-inf"))
    return full[:, : CONTEXT + q]


def case(batch: int, hq: int, hkv: int, hd: int, q: int, device: torch.device, packed: bool = False):
    kv = [
        (
            torch.randn(batch, hkv, CONTEXT + q, hd, device=device, dtype=torch.bfloat16),
            torch.randn(batch, hkv, CONTEXT + q, hd, device=device, dtype=torch.bfloat16),
        )
        for _ in range(COPIES)
    ]
    query = torch.randn(batch, hq, q, hd, device=device, dtype=torch.bfloat16)
    mask = verify_mask(q, device) if q > 1 and not packed else None

    def run() -> None:
        for k, v in kv:
            if q > 1 and packed:
                packed_attention(query, k, v)
            else:
                F.scaled_dot_product_attention(query, k, v, attn_mask=mask, enable_gqa=hq != hkv)

    return run


def kernels(fn) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = []
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.name not in names:
            names.append(event.name)
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument(
        "--heads", help="query/KV/head-dim layouts to time, e.g. 32/32/128,40/40/128 (default: all eleven)"
    )
    parser.add_argument("--verify", choices=("masked", "packed"), default="masked", help="verify attention kernel")
    args = parser.parse_args()
    packed = args.verify == "packed"
    batches = [int(b) for b in args.batches.split(",")]
    heads = [tuple(int(x) for x in h.split("/")) for h in args.heads.split(",")] if args.heads else list(HEADS)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    points = []
    kernel_names = {}
    for hq, hkv, hd in heads:
        for q in (1, 3, 5):
            for batch in batches:
                fn = case(batch, hq, hkv, hd, q, device, packed)
                ms = time_graph(fn, device, target_s=REPLAY_TARGET_S, max_reps=REPLAYS) / COPIES
                kv_bytes = 2 * batch * hkv * (CONTEXT + q) * hd * 2
                points.append(
                    {
                        "heads": hq,
                        "kv_heads": hkv,
                        "head_dim": hd,
                        "q": q,
                        "batch": batch,
                        "ms": round(ms, 5),
                        "kv_bytes": kv_bytes,
                        "ps_per_key_kv_head": round(ms * 1e9 / (batch * (CONTEXT + q) * hkv), 2),
                        "kv_tb_per_s": round(kv_bytes / ms / 1e9, 3),
                    }
                )
                if batch == 128:
                    kernel_names[f"{hq}/{hkv}/{hd} q{q}"] = kernels(fn)
                print(json.dumps(points[-1]), flush=True)
                del fn
                torch.cuda.empty_cache()
    doc = {
        "provenance": {
            **cuda_provenance(device, "bench/probe_attention.py"),
            "context": CONTEXT,
            "kv_buffers_per_graph": COPIES,
            "verify_kernel": "packed" if packed else "unpacked",
        },
        "points": points,
        "kernels_at_batch_128": kernel_names,
    }
    os.makedirs(args.out, exist_ok=True)
    slug = "h200" if "H200" in torch.cuda.get_device_name(device) else "h100"
    name = f"{slug}-attention-probe-ctx1024{'-packed' if packed else ''}.json"
    with open(os.path.join(args.out, name), "w") as fh:
        json.dump(doc, fh, indent=1)
    for name, names in kernel_names.items():
        print(name, names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
