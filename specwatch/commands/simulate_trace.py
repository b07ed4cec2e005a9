"""`specwatch simulate-trace`: write a realistic SIMULATED acceptance trace (JSONL) for replay and tests."""

from __future__ import annotations

import argparse
import sys

from specwatch.commands import add_deprecated_alias
from specwatch.config import parse_duration
from specwatch.offline.tracegen import PROFILES, Drop, ModelChange, TraceSpec, generate


def _duration(text: str) -> float:
    seconds = parse_duration(text)
    if seconds is None or seconds < 0:
        raise argparse.ArgumentTypeError(f"not a duration like 90s, 30m, 2h, 3d: {text!r}")
    return seconds


def _drop(text: str) -> Drop:
    """AT:RATIO[:UNTIL], e.g. 6h:0.2 or 6h:0.2:8h."""
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        ratio = float(parts[1])
        if not 0.0 < ratio < 1.0:
            raise ValueError
        return Drop(start=_duration(parts[0]), ratio=ratio, end=_duration(parts[2]) if len(parts) == 3 else None)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(
            f"--drop wants AT:RATIO[:UNTIL] like 6h:0.2 or 6h:0.2:8h, got {text!r}"
        ) from None


def _change(text: str) -> ModelChange:
    at, sep, name = text.partition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--model-change wants AT:MODEL like 12h:llama-v2, got {text!r}")
    return ModelChange(at=_duration(at), model_name=name)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = TraceSpec()
    parser.add_argument("--output", "-o", default="-", help="file to write (default stdout)")
    parser.add_argument("--route", default=d.route)
    parser.add_argument("--model", dest="model_name", default=d.model_name)
    parser.add_argument("--profile", choices=sorted(PROFILES), default=d.profile, help="per-position acceptance")
    parser.add_argument(
        "--draft.length", dest="k", type=int, default=d.k, metavar="K", help="draft length (num_speculative_tokens)"
    )
    add_deprecated_alias(parser, "--k", "--draft.length", "k", type=int)
    parser.add_argument("--rate", type=float, default=d.rate, help="requests per second, daily mean (1/60 = 1 req/min)")
    parser.add_argument("--duration", type=_duration, default=d.duration, help="trace length (default 1d)")
    parser.add_argument("--interval", type=_duration, default=d.interval, help="scrape interval (default 15s)")
    parser.add_argument("--start", type=float, default=d.start, help="unix time of the trace start")
    parser.add_argument(
        "--kappa",
        type=float,
        default=d.kappa,
        help="request heterogeneity: Beta concentration (lower = more varied requests; 10-30 is realistic)",
    )
    parser.add_argument("--mean-tokens", type=float, default=d.mean_tokens, help="mean output tokens per request")
    parser.add_argument("--diurnal", type=float, default=d.diurnal, help="relative daily traffic swing")
    parser.add_argument(
        "--drop",
        type=_drop,
        action="append",
        default=[],
        metavar="AT:RATIO[:UNTIL]",
        help="inject an acceptance drop, e.g. 6h:0.2:8h (repeatable)",
    )
    parser.add_argument(
        "--model-change",
        type=_change,
        action="append",
        default=[],
        metavar="AT:MODEL",
        help="rename the model and restart the counters at AT (repeatable)",
    )
    parser.add_argument("--seed", type=int, default=0)


def main(args: argparse.Namespace) -> int:
    try:
        spec = TraceSpec(
            route=args.route,
            model_name=args.model_name,
            profile=args.profile,
            k=args.k,
            rate=args.rate,
            start=args.start,
            duration=args.duration,
            interval=args.interval,
            kappa=args.kappa,
            mean_tokens=args.mean_tokens,
            diurnal=args.diurnal,
            drops=tuple(args.drop),
            changes=tuple(args.model_change),
            seed=args.seed,
        )
        out = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")
    except (ValueError, OSError) as exc:
        print(f"specwatch simulate-trace: {exc}", file=sys.stderr)
        return 2
    try:
        for sample in generate(spec):
            out.write(sample.to_json() + "\n")
    finally:
        if out is sys.stdout:
            out.flush()
        else:
            out.close()
    return 0
