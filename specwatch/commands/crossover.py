"""`specwatch crossover estimate|calibrate`: the roofline crossover estimate and its calibration."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from specwatch.commands import add_deprecated_alias
from specwatch.crossover.calibrate import fit_efficiency, reference_points, sweep_points
from specwatch.crossover.estimate import (
    EstimateInputs,
    assumptions,
    build_step_model,
    params_in_billions,
    with_kernel,
    describe_band,
    estimate_band,
    validation_warnings,
)
from specwatch.crossover.capacity import kv_capacity_batch
from specwatch.crossover.speedup import BYTES_PER_WEIGHT, LLAMA3_8B, positions_from_alpha
from specwatch.crossover.reference import load_reference

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="crossover_command", metavar="ACTION")
    est = sub.add_parser("estimate", help="predict B* and the speedup per batch from a calibrated roofline")
    add_model_arguments(est)
    est.add_argument(
        "--draft.length",
        dest="draft_length",
        type=int,
        default=4,
        metavar="K",
        help="draft tokens per step, k (default 4)",
    )
    add_deprecated_alias(est, "--gamma", "--draft.length", "draft_length", type=int)
    rates = est.add_mutually_exclusive_group()
    rates.add_argument("--alpha", type=float, default=0.7, help="iid per-token acceptance (default 0.7)")
    rates.add_argument(
        "--positions",
        type=_ratios,
        metavar="P1,P2,...",
        help="measured per-position acceptance p_j (share of drafts accepted at position j); sets the draft length "
        "to their count",
    )
    est.add_argument("--context", type=float, default=1024.0, help="mean tokens in the KV cache per sequence")
    est.add_argument(
        "--attention-kernel",
        choices=("packed", "unpacked"),
        default="packed",
        help="the engine's verify attention: packed reads the KV cache once per KV head (vLLM and SGLang on "
        "Hopper, the default), unpacked once per query head",
    )
    est.add_argument("--gpus", type=int, default=1, help="GPUs per engine (tensor parallel), for the KV capacity")
    est.add_argument(
        "--batches",
        type=_batches,
        default=DEFAULT_BATCHES,
        metavar="B1,B2,...",
        help="batches to print the speedup for",
    )
    est.add_argument(
        "--calibrate-from", metavar="CROSSOVER_JSON", help="fit the GPU's efficiencies to a sweep's step times first"
    )
    est.add_argument("--json", action="store_true", help='print {"crossover_batch_size": ..., "speedup": {...}}')

    cal = sub.add_parser("calibrate", help="fit achieved efficiencies to measured step times")
    add_model_arguments(cal)
    src = cal.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--reference", nargs="?", const="", metavar="PATH", help="the H200 reference table (default: the packaged copy)"
    )
    src.add_argument("--sweep", metavar="CROSSOVER_JSON", help="a file written by `specwatch sweep`")
    cal.add_argument("--context", type=int, default=1024, help="reference run to fit (default 1024)")


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", default="", help="GPU name (H200, H100-SXM, ...); default: detected through NVML")
    p.add_argument(
        "--params",
        type=float,
        help="target parameters in billions (70 for a 70B model); a raw count such as 70e9 is converted",
    )
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp8", "int8", "int4", "fp4"))
    p.add_argument("--layers", type=int)
    p.add_argument("--hidden-size", type=int)
    p.add_argument("--kv-heads", type=int)
    p.add_argument("--head-dim", type=int)
    p.add_argument("--hf-config", default="", metavar="PATH", help="a Hugging Face config.json (or its folder)")
    p.add_argument("--draft", default="eagle", help="eagle | eagle3 | mtp | ngram | model:<billions> (default eagle)")


def _ratios(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of ratios: {text!r}") from None
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"ratios must lie in [0, 1]: {text!r}")
    return values


def _batches(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of batch sizes: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be >= 1: {text!r}")
    return values


def estimate_inputs(args: argparse.Namespace) -> EstimateInputs:
    params = None
    if args.params is not None:
        params, note = params_in_billions(args.params)
        if note:
            print(f"specwatch crossover: {note}", file=sys.stderr)
    return EstimateInputs(
        gpu=args.gpu,
        params=params,
        dtype=args.dtype,
        layers=args.layers,
        hidden_size=args.hidden_size,
        kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        hf_config=args.hf_config,
        draft=args.draft,
    )


def main(args: argparse.Namespace) -> int:
    try:
        if args.crossover_command == "estimate":
            return _estimate(args)
        if args.crossover_command == "calibrate":
            return _calibrate(args)
    except ValueError as exc:
        print(f"specwatch crossover: {exc}", file=sys.stderr)
        return 2
    print("specwatch crossover: say estimate or calibrate (see --help)", file=sys.stderr)
    return 2


def _estimate(args: argparse.Namespace) -> int:
    inputs = estimate_inputs(args)
    model = with_kernel(build_step_model(inputs), args.attention_kernel)
    positions = args.positions or positions_from_alpha(args.alpha, args.draft_length)
    gamma = len(positions)
    if args.calibrate_from:
        from specwatch.crossover.sweepfile import load_sweep

        sweep = load_sweep(args.calibrate_from)
        points = sweep_points(
            sweep["levels"],
            int(sweep.get("num_speculative_tokens") or gamma),
            float(sweep.get("context_tokens") or args.context),
        )
        eff, rms = fit_efficiency(model, points, source="")
        model = model.with_efficiency(replace(eff, source=f"fitted to {args.calibrate_from}, RMS {rms:.0%}"))
    capacity = kv_capacity_batch(
        model.shape, model.hardware, BYTES_PER_WEIGHT[model.dtype], args.context, max(1, args.gpus)
    )
    bstar = model.crossover(positions, args.context)
    beyond = bstar is not None and capacity >= 1 and bstar > capacity
    band = estimate_band(model, inputs, None if beyond else bstar, args.context, positions)
    speedups = {str(b): round(model.speedup(b, positions, args.context), 3) for b in args.batches}
    if args.json:
        print(
            json.dumps(
                {
                    "crossover_batch_size": None if bstar is None or beyond else round(bstar, 1),
                    "attention_kernel": args.attention_kernel,
                    "kv_capacity_batch": capacity,
                    "model_crossover_beyond_capacity": round(bstar, 1) if beyond and bstar is not None else None,
                    "band": {
                        "lower": None if band.lower is None else round(band.lower, 1),
                        "upper": None if band.upper is None else round(band.upper, 1),
                        "validated": band.validated,
                        "basis": band.basis,
                    },
                    "speedup": speedups,
                    "assumptions": assumptions(model, inputs, positions, args.context),
                    "warnings": validation_warnings(model, inputs, args.context),
                }
            )
        )
        return 0
    print("Assumptions:")
    for line in assumptions(model, inputs, positions, args.context):
        print(f"  {line}")
    for line in validation_warnings(model, inputs, args.context):
        print(f"warning: {line}")
    print(
        f"  verify attention {args.attention_kernel}; KV cache fits {capacity} sequences of {args.context:g} tokens "
        f"on {max(1, args.gpus)} GPU(s)"
    )
    if beyond and bstar is not None:
        print(f"B*: none below the largest batch that fits ({capacity}; the model's B* {bstar:.0f} is beyond it)")
    elif bstar is None:
        print("B*: none (speculation wins at every batch up to 4096)")
    else:
        print(f"B*: {bstar:.1f}  (speculation loses throughput above about {bstar:.0f} running requests per engine)")
    print(f"    {describe_band(bstar, band)}")
    print(f"{'batch':>6}  {'speedup':>7}")
    for b, s in speedups.items():
        print(f"{b:>6}  {s:>7.3f}")
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    inputs = estimate_inputs(args)
    if args.reference is not None:  # the reference table is an H200 running a Llama-3-8B shape, EAGLE-3 head
        inputs = replace(inputs, gpu=inputs.gpu or "H200", draft="eagle3")
    model = build_step_model(inputs, default_shape=LLAMA3_8B)
    if args.sweep:
        from specwatch.crossover.sweepfile import load_sweep

        sweep = load_sweep(args.sweep)
        gamma = int(sweep.get("num_speculative_tokens") or 0)
        points = sweep_points(sweep["levels"], gamma, float(sweep.get("context_tokens") or 1024))
        source = f"fitted: {args.sweep}"
    else:
        run = load_reference(args.reference or None).run(args.context)
        points = reference_points(run)
        source = f"fitted: reference table, context {args.context}, plain + gamma 4 + draft"
    eff, rms = fit_efficiency(model, points, source)
    print(f"{len(points)} step times, RMS relative error {rms:.1%}")
    print(
        f"memory {eff.memory:.3f}  compute {eff.compute:.3f}  verify_attention {eff.verify_attention:.3f}  "
        f"step_overhead {eff.step_overhead_s * 1e3:.3f} ms"
    )
    return 0
