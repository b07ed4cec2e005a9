"""`specwatch recommend ROUTE`: the throughput-best draft length and a batch-size schedule for vLLM, SGLang and
TensorRT-LLM (with its acceptance gate from the route's pinned baseline, when a daemon is read).

Acceptance comes from a running daemon's /api/v1/routes (the route's 5m per-position acceptance and batch) or,
with `--sweep` alone, from the sweep file. Step times come from the sweep (`--sweep`) or the calibrated
roofline (`--gpu/--params/...`, as in `crossover estimate`).
"""

from __future__ import annotations

import argparse
import json
import sys

from specwatch.commands.crossover import add_model_arguments, estimate_inputs
from specwatch.commands.status import DEFAULT_URL, Unreachable, fetch_routes
from specwatch.crossover.estimate import build_step_model
from specwatch.crossover.recommend import ModelStepTimes, Recommendation, SweepStepTimes, recommend
from specwatch.crossover.sweepfile import load_sweep
from specwatch.integrations.trtllm import acceptance_gate, draft_len_schedules


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("route", help="route name (with --sweep and no daemon: a label for the output)")
    parser.add_argument(
        "--url",
        default=None,
        help=f"a running daemon to read the route's acceptance from (default {DEFAULT_URL} unless --sweep is given)",
    )
    parser.add_argument(
        "--sweep",
        metavar="CROSSOVER_JSON",
        help="step times (and, without --url, acceptance) from a `specwatch sweep` file",
    )
    add_model_arguments(parser)
    parser.add_argument("--context", type=float, default=1024.0, help="mean KV tokens per sequence for the model")
    parser.add_argument("--batch", type=float, help="batch to recommend k for (default: the route's live batch)")
    parser.add_argument("--max-batch", type=int, default=256, help="last batch size of the schedule (default 256)")
    parser.add_argument("--json", action="store_true", help="print the recommendation as JSON")


def main(args: argparse.Namespace) -> int:
    try:
        rec, positions, route = _recommend(args)
    except (ValueError, Unreachable) as exc:
        print(f"specwatch recommend: {exc}", file=sys.stderr)
        return 2
    vllm = {
        "num_speculative_tokens": len(positions),
        "num_speculative_tokens_per_batch_size": [list(r) for r in rec.ranges],
    }
    trtllm = _trtllm(rec, positions, route)
    if args.json:
        print(
            json.dumps(
                {
                    "route": args.route,
                    "k": rec.k_now,
                    "batch": rec.batch_now,
                    "predicted_speedup_ratio": round(rec.speedup_now, 3),
                    "vllm": vllm,
                    "sglang_adaptive_config": rec.sglang,
                    "trtllm": trtllm,
                },
                indent=2,
            )
        )
        return 0
    p = " ".join(f"{x:.2f}" for x in positions)
    print(f"route {args.route}: k = {len(positions)} now, per-position acceptance {p}")
    print(f"best k at batch {rec.batch_now:g}: {rec.k_now} (predicted {rec.speedup_now:.2f}x plain decode)")
    print()
    print("vLLM --speculative-config (merge into yours):")
    print("  " + json.dumps(vllm))
    print(f"  why: {rec.vllm_reason}")
    print()
    print("SGLang --speculative-adaptive --speculative-adaptive-config FILE, with FILE:")
    print("  " + json.dumps(rec.sglang))
    print(f"  why: {rec.sglang_reason}")
    print()
    print("TensorRT-LLM speculative_config (merge into yours; pick the meaning your version has):")
    for meaning, snippet in trtllm["draft_len_schedule"].items():
        print(f"  {meaning}: " + json.dumps(snippet["speculative_config"]))
        print(f"    matches {snippet['source']}")
    if not trtllm["draft_len_schedule"]:
        print("  drafting does not pay from batch 1: leave speculation off")
    gate = trtllm["acceptance_gate"]
    if gate is not None:
        print("  acceptance gate: " + json.dumps(gate["speculative_config"]))
        print(f"    matches {gate['source']}")
    return 0


def _trtllm(rec: Recommendation, positions: tuple[float, ...], route: dict | None) -> dict:
    """TensorRT-LLM's schedule in each key meaning, and the acceptance gate where the route has a pinned
    baseline and a page threshold."""
    gate = None
    baseline, threshold = (route or {}).get("baseline_ratio"), (route or {}).get("acceptance_threshold_ratio")
    if baseline and threshold:
        try:
            gate = acceptance_gate(float(baseline), float(threshold), len(positions))
        except ValueError:
            gate = None
    return {"draft_len_schedule": draft_len_schedules(rec.ranges), "acceptance_gate": gate}


def _recommend(args: argparse.Namespace) -> tuple[Recommendation, tuple[float, ...], dict | None]:
    sweep = load_sweep(args.sweep) if args.sweep else None
    batch = args.batch
    route = None
    if args.url or not sweep:
        route = _daemon_route(args.url or DEFAULT_URL, args.route)
        positions = tuple(float(p) for p in route.get("position_acceptance_ratio") or ())
        if batch is None:
            batch = route.get("batch_size") or route.get("running_requests")
    else:
        positions = tuple(float(p) for p in sweep.get("position_acceptance") or ())
    if not positions:
        raise ValueError(
            f"route {args.route}: no per-position acceptance yet (the engine must expose per-position "
            "counters and have drafted in the last 5 minutes)"
        )
    times: SweepStepTimes | ModelStepTimes
    if sweep:
        times = SweepStepTimes(sweep)
    elif args.gpu or args.params or args.hf_config or args.layers:
        times = ModelStepTimes(build_step_model(estimate_inputs(args)), args.context)
    else:
        raise ValueError(
            "step times needed: give --sweep FILE, or the model (--gpu, --params or --hf-config, "
            "--draft) for the calibrated roofline"
        )
    return recommend(positions, times, float(batch or 1.0), args.max_batch), positions, route


def _daemon_route(url: str, name: str) -> dict:
    doc = fetch_routes(url)
    for route in doc["routes"]:
        if route.get("name") == name:
            return route
    known = ", ".join(r.get("name", "?") for r in doc["routes"]) or "none"
    raise ValueError(f"no route {name!r} at {url} (routes: {known})")
