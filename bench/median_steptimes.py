#!/usr/bin/env python3
"""Merge repeated runs of bench/measure_steptimes.py into one table: the per-point median step time.

A crossover on a flat speedup curve moves by tens of batch units between runs a fraction of a percent apart
(docs/benchmarks.md, "Estimator across shapes"); one run cannot resolve it, a median of several can. Every
run must measure the same shape, context, batches and variant. The merged file keeps the schema of a single
run (so `specwatch.crossover.reference` loads it), recomputes `derived` from the medians, takes each GPM
metric's median, and records every run's provenance with the merge command.

    python3 bench/median_steptimes.py --out specwatch/data/h200-steptimes-llama2-7b-ctx1024.json RUN1 RUN2 RUN3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specwatch.crossover.speedup import expected_tokens

GAMMAS = (2, 4, 7)
ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)
SAME_IN_EVERY_RUN = ("shape", "context", "shape_config")


def derive(target: dict[str, float], draft: dict[str, float]) -> dict:
    """Speedups as measure_steptimes.derive computes them (that script needs torch to import)."""
    out = {}
    for gamma in GAMMAS:
        for alpha in ALPHAS:
            speedup = {
                b: round(expected_tokens(alpha, gamma) * target[f"{b}x1"] / (target[f"{b}x{gamma + 1}"] + gamma * d), 3)
                for b, d in draft.items()
                if f"{b}x1" in target and f"{b}x{gamma + 1}" in target
            }
            below = [int(b) for b, s in speedup.items() if s < 1]
            out[f"gamma={gamma},alpha={alpha}"] = {
                "speedup": speedup,
                "first_batch_below_1": min(below) if below else None,
            }
    return out


def merge(documents: list[dict], command: str) -> dict:
    runs = [doc["runs"][0] for doc in documents]
    first = runs[0]
    problems = [
        f"run {n}: {key} differs from run 1"
        for n, run in enumerate(runs[1:], 2)
        for key in (*SAME_IN_EVERY_RUN, "target", "draft")
        if (run[key] if key in SAME_IN_EVERY_RUN else sorted(run[key]))
        != (first[key] if key in SAME_IN_EVERY_RUN else sorted(first[key]))
    ]
    variants = {doc["provenance"].get("variant") for doc in documents}
    if len(variants) != 1:
        problems.append(f"the runs used different variants: {sorted(map(str, variants))}")
    if problems:
        raise ValueError("; ".join(problems))
    target = {k: statistics.median(r["target"][k] for r in runs) for k in first["target"]}
    draft = {k: statistics.median(r["draft"][k] for r in runs) for k in first["draft"]}
    gpm = {
        b: {m: statistics.median(r["gpm_plain"][b][m] for r in runs) for m in first["gpm_plain"][b]}
        for b in first.get("gpm_plain") or {}
        if all(r.get("gpm_plain", {}).get(b) for r in runs)
    }
    merged = {key: first[key] for key in SAME_IN_EVERY_RUN}
    merged.update(
        target=target,
        draft=draft,
        gpm_plain=gpm,
        derived=derive(target, draft),
        measurement={"median_of_runs": len(runs), "runs": [r.get("measurement") for r in runs]},
    )
    provenance = dict(documents[0]["provenance"])
    provenance.update(
        command=command,
        merged="per-point median of the runs below (bench/median_steptimes.py)",
        runs=[doc["provenance"] for doc in documents],
    )
    return {"gpu": documents[0]["gpu"], "torch": documents[0]["torch"], "provenance": provenance, "runs": [merged]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="measure_steptimes.py output files of one shape")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--note", default="", help="where and how the runs were taken (kept in provenance)")
    args = parser.parse_args(argv)
    if len(args.runs) < 2:
        parser.error("give at least two runs")
    documents = [json.loads(path.read_text(encoding="utf-8")) for path in args.runs]
    try:
        merged = merge(documents, "median_steptimes.py " + " ".join(sys.argv[1:] if argv is None else argv))
    except ValueError as exc:
        print(f"median_steptimes: {exc}", file=sys.stderr)
        return 2
    if args.note:
        merged["provenance"]["note"] = args.note
    args.out.write_text(json.dumps(merged, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: median of {len(documents)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
