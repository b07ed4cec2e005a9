#!/usr/bin/env python3
"""Two checks behind docs/benchmarks.md's Llama-2-7B and MoE notes (one H200, about 45 s; torch only).

(A) Re-time Llama-2-7B plain, verify (q = 3, 5) and draft steps at batch 128-256 with the step-time tables'
    own forward and timing (`measure_steptimes.py`, `gqa-aligned-float`, median of CUDA-event-timed graph
    replays, 0.25 s and at most 30 replays a point): how far its gamma 2 / 4, alpha 0.6 crossover moves
    between H200 leases.
(B) Profile the Qwen3-30B-A3B forward (plain and q = 3 at batch 1, 8, 64, 256) kernel by kernel under
    torch.profiler, as `profile_steptimes.py` does for the dense shapes.

    python3 scripts/retime_llama2_7b_and_profile_moe.py     # writes $OUT/run2.json (OUT defaults to /tmp/out)
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import measure_steptimes as ms
from torch.profiler import ProfilerActivity, profile

out = os.environ.get("OUT", "/tmp/out")
dev = torch.device("cuda")
ms.VARIANT.clear()
ms.VARIANT.update(ms.VARIANTS["gqa-aligned-float"])
gen = torch.Generator().manual_seed(0)
start = time.perf_counter()
doc = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "retime": {}, "moe": []}


def save():
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "run2.json"), "w") as fh:
        json.dump(doc, fh)


cfg = ms.SHAPES["llama2-7b"]
model = ms.Model(cfg, dev, 80e9)
draft = ms.Model(dict(cfg), dev, 1e12, vocab=ms.DRAFT_VOCAB, n_layers=1)
for b in (128, 160, 192, 224, 256):
    for q in (1, 3, 5):
        fn, _ = model.step_fn(b, q, 1024, 24e9, gen)
        doc["retime"][f"{b}x{q}"] = ms.time_graph(fn, dev, 0.25, 30)
        del fn
    dfn, _ = draft.step_fn(b, 1, 1024, 24e9, gen)
    doc["retime"][f"draft{b}"] = ms.time_graph(dfn, dev, 0.25, 30)
    del dfn
    torch.cuda.empty_cache()
    print(
        b,
        {k: round(v, 3) for k, v in doc["retime"].items() if k.startswith(f"{b}x") or k == f"draft{b}"},
        f"t={time.perf_counter() - start:.0f}",
        flush=True,
    )
save()
del model, draft
torch.cuda.empty_cache()


def devtime(e):
    for a in ("device_time_total", "cuda_time_total"):
        if hasattr(e, a):
            return getattr(e, a)
    return 0.0


cfg = ms.SHAPES["qwen3-30b-a3b"]
model = ms.Model(cfg, dev, 80e9)
model.layers.moe_impl = "grouped_mm"
for b in (1, 8, 64, 256):
    for q in (1, 3):
        if time.perf_counter() - start > 240:
            break
        fn, info = model.step_fn(b, q, 1024, 24e9, gen)
        g = ms.time_graph(fn, dev, 0.15, 10)
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            fn()
            fn()
            torch.cuda.synchronize()
        ops = [
            [e.key, str(e.input_shapes), e.count // 2, round(devtime(e) / 2, 2)]
            for e in prof.key_averages(group_by_input_shape=True)
            if devtime(e) > 0 and e.key.startswith("aten::")
        ]
        kern = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                kern[e.name[:160]] = kern.get(e.name[:160], 0.0) + e.time_range.elapsed_us() / 2
        doc["moe"].append(
            dict(batch=b, q=q, graph_ms=g, experts_touched=info["experts_touched"], ops=ops, kernels=kern)
        )
        print(
            f"moe B{b} q{q} graph {g:.3f} kernel sum {sum(kern.values()) / 1e3:.3f}",
            flush=True,
        )
        del fn
        save()
save()
print("done", time.perf_counter() - start)
