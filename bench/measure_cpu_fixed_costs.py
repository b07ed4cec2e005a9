"""Where the real vLLM CPU engine's fixed step costs sit: per forward or per layer (the live calibration's prior).

Spec steps alone cannot split a fixed cost between per forward and per layer, and the split decides the plain
step the live calibration predicts (docs/crossover.md, "The fit"). This measures it on plain steps instead:
the heavy successor models (docs/testbed.md) of 1, 4 and 16 layers, same width, each served plain by the real
vLLM CPU engine in turn, timed at batch 1 by the gaps between streamed tokens (median over a request's gaps,
then over requests). A line through (layers, step) gives the cost of a forward (intercept) and of a layer
(slope: its weights streaming plus its fixed cost). About 3 minutes on a quiet machine.

    .venv/bin/python bench/measure_cpu_fixed_costs.py --out /tmp/fixed-costs
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import requests

from testbed.engine_env import cpu_support, ensure_engine_env
from testbed.models import build_heavy_successor
from testbed.vllm_server import VllmServer, VllmServerSpec

DEPTHS = (1, 4, 16)


def token_gaps(base_url: str, max_tokens: int) -> list[float]:
    """Seconds between a streamed greedy request's tokens (its decode steps at batch 1)."""
    arrivals = []
    body = {"model": "tiny", "prompt": "The quick brown fox", "max_tokens": max_tokens, "temperature": 0}
    body.update(stream=True, ignore_eos=True)
    with requests.post(f"{base_url}/v1/completions", json=body, stream=True, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith(b"data:") and b"[DONE]" not in line:
                arrivals.append(time.perf_counter())
    return [b - a for a, b in zip(arrivals, arrivals[1:])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("/tmp/specwatch-fixed-costs"))
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=80)
    args = parser.parse_args(argv)
    supported, reason = cpu_support()
    if not supported:
        print(f"the real vLLM engine cannot run on this machine: {reason}", file=sys.stderr)
        return 2
    env = ensure_engine_env()
    _, drafter = build_heavy_successor(env, 0.2)  # the one-layer model
    models = {1: drafter, **{layers: build_heavy_successor(env, 0.2, layers)[0] for layers in DEPTHS[1:]}}
    steps: dict[int, float] = {}
    for layers, model in models.items():
        server = VllmServer(env, VllmServerSpec(model=model, max_num_seqs=1), args.out / f"{layers}-layers")
        try:
            server.start()
            token_gaps(server.base_url, 8)  # warm-up
            medians = [statistics.median(token_gaps(server.base_url, args.max_tokens)) for _ in range(args.requests)]
        finally:
            server.stop()
        steps[layers] = statistics.median(medians)
        each = [round(m * 1e3, 1) for m in medians]
        print(f"{layers:>2} layers: step {steps[layers] * 1e3:.1f} ms (requests: {each})")
    xs, ys = list(steps), list(steps.values())
    slope = statistics.linear_regression(xs, ys).slope
    intercept = statistics.fmean(ys) - slope * statistics.fmean(xs)
    print(f"per forward {intercept * 1e3:.2f} ms, per layer {slope * 1e3:.2f} ms")
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"step_s": steps, "per_forward_s": intercept, "per_layer_s": slope}
    (args.out / "fixed_costs.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
