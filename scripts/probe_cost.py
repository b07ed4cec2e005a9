#!/usr/bin/env python3
"""GPU-seconds of one canary probe round on an H200-class 8B route, from the packaged step-time table.

    .venv/bin/python scripts/probe_cost.py [--prompts 32] [--max-tokens 128] [--k 3] [--alpha 0.7]

One prompt decodes `max_tokens` tokens in ceil(max_tokens / (1 + E[X])) verify steps, E[X] the expected
accepted drafts per step for a per-position acceptance alpha; a step at batch B costs the target's
(k + 1)-token verify pass plus k draft steps (simulator/steptime.py `step_seconds`, measured on one H200 for a
Llama-3-8B-shaped model, specwatch/data/README.md). Prefill of the short prompts is left out (about 1 ms each).
Printed: the round's busy GPU time alone on the GPU at each concurrency, and its marginal cost when the
route already runs a batch of B organic requests (the extra step time of B + c over B, per step).
"""

from __future__ import annotations

import argparse
import math

from specwatch.simulator.speculation import AcceptanceProfile
from specwatch.simulator.steptime import load_table, step_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--alpha", type=float, default=0.7, help="conditional acceptance per position")
    args = parser.parse_args()
    table = load_table(context=1024)
    tau = AcceptanceProfile.iid(args.alpha, args.k).mean_tokens_per_step()
    steps = math.ceil(args.max_tokens / tau)
    print(
        f"{args.prompts} prompts x {args.max_tokens} tokens, k={args.k}, alpha={args.alpha}: "
        f"{tau:.2f} tokens/step, {steps} steps per prompt"
    )
    for c in (1, 4, 8):
        alone = math.ceil(args.prompts / c) * steps * step_seconds(table, c, args.k)
        print(f"  concurrency {c}: {alone:.1f} GPU-seconds alone on the GPU")
    for b in (8, 32):
        extra = step_seconds(table, b + 1, args.k) - step_seconds(table, b, args.k)
        busy = args.prompts * steps * extra
        print(f"  beside a batch of {b} (concurrency 1): {busy:.1f} GPU-seconds of extra step time")


if __name__ == "__main__":
    main()
