#!/usr/bin/env python3
"""Where a measured step's GPU time goes: the forward of `measure_steptimes.py`, kernel by kernel (torch only).

Why: the step-time tables give one number per (shape, batch, q). Fitting the crossover model on them alone
cannot tell a slow GEMM from slow elementwise kernels: both grow with the tokens a step processes. This runs
the tables' own forward (`gqa-aligned-float` variant) for a few shapes and batches, times it as the tables do
(a CUDA graph, median of CUDA-event-timed replays) and runs it eagerly under torch.profiler, summing CUDA
kernel time by kind: GEMM (cuBLAS nvjet / CUTLASS kernels), attention (cuDNN SDPA and its memset) and
elementwise (everything else: norms, RoPE, residual adds, SiLU, gate multiply, KV-cache writes). Eager kernel
times can differ from the graph's by a few percent (the `kernel_sum_ms` beside `graph_ms` shows how much).

    python3 bench/profile_steptimes.py --out DIR        # about 100 s on an H200
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import measure_steptimes as ms

PLAN = {
    "llama2-7b": (64, 128, 192, 256),
    "llama3-8b": (64, 128, 192, 256),
    "llama2-13b": (128, 256),
    "qwen2.5-14b": (128, 256),
    "qwen1.5-1.8b": (128, 256),
    "qwen2.5-1.5b": (128, 256),
}
QUERY_LENGTHS = (1, 3, 5)


def kind(kernel: str) -> str:
    if "sdpa" in kernel or kernel.startswith("Memset"):
        return "attention"
    if any(tag in kernel for tag in ("nvjet", "cutlass", "xmma", "splitK")) or "gemm" in kernel.lower():
        return "gemm"
    return "elementwise"


def profiled(fn, reps: int = 2) -> tuple[dict[str, float], list[list]]:
    """Per-kind kernel ms of one eager forward, and the aten ops with their input shapes and device ms."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    kinds = {"gemm": 0.0, "attention": 0.0, "elementwise": 0.0}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kinds[kind(event.name)] += event.time_range.elapsed_us() / reps / 1e3
    ops = [
        [e.key, str(e.input_shapes), e.count // reps, round(e.device_time_total / reps / 1e3, 4)]
        for e in prof.key_averages(group_by_input_shape=True)
        if e.key.startswith("aten::") and e.device_time_total > 0
    ]
    return {k: round(v, 4) for k, v in kinds.items()}, ops


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--deadline-s", type=float, default=300.0, help="start no new shape after this long")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    ms.VARIANT.clear()
    ms.VARIANT.update(ms.VARIANTS["gqa-aligned-float"])
    generator = torch.Generator().manual_seed(0)
    started = time.perf_counter()
    points = []
    for name, batches in PLAN.items():
        if time.perf_counter() - started > args.deadline_s:
            print(f"deadline: skipping {name}", flush=True)
            continue
        cfg = ms.SHAPES[name]
        model = ms.Model(cfg, device, 80e9)
        draft = ms.Model(dict(cfg), device, 1e12, vocab=ms.DRAFT_VOCAB, n_layers=1)
        for batch in batches:
            steps = [(model, q, False) for q in QUERY_LENGTHS] + [(draft, 1, True)]
            for which, q, is_draft in steps:
                fn, _ = which.step_fn(batch, q, args.context, 24e9, generator)
                graph_ms = ms.time_graph(fn, device, 0.15, 10)
                kinds, ops = profiled(fn)
                points.append(
                    dict(
                        shape=name,
                        batch=batch,
                        q=q,
                        draft=is_draft,
                        graph_ms=round(graph_ms, 4),
                        kernel_sum_ms=round(sum(kinds.values()), 4),
                        kernels_ms=kinds,
                        ops=ops,
                    )
                )
                print(
                    f"{name} B{batch} q{q}{' draft' if is_draft else ''}: graph {graph_ms:.3f} ms {kinds}", flush=True
                )
                del fn
            torch.cuda.empty_cache()
        del model, draft
        torch.cuda.empty_cache()
    doc = {
        "provenance": {
            **ms.cuda_provenance(device, "bench/profile_steptimes.py"),
            "context": args.context,
            "variant": "gqa-aligned-float",
        },
        "points": points,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "h200-forward-profile-ctx1024.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
