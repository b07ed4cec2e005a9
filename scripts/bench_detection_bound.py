#!/usr/bin/env python3
"""The information limit of acceptance-drop detection on a quiet route, on SIMULATED traces.

scripts/bench_detection.py asks for zero false pages in 30 clean and 30 5%-drop route-days AND a detection p95
within the tier's target. This script measures how fast *any* detector fed these traces could be, by running an
oracle that is better placed than specwatch in every way:

- it sees every request on its own (its accepted / drafted ratio), where /metrics only shows 15-second sums;
- it knows the true baseline r0 and the true per-request variance v(D) = a + b/D (fitted on 200 simulated days),
  where specwatch learns both from the route's own first day;
- it is a plain Gaussian CUSUM with no duration, token or confirmation gate;
- its threshold h is calibrated in-sample: for each of --samples independent sets of 60 route-days (6 clean and
  6 5%-drop routes of 5 days, as bench_detection.py builds them) the smallest h that gives no alarm there.

The traces are `specwatch.tracegen.request_stream`: the same model, draws and daily swing as the traces of
bench_detection.py. Drops are placed the same way (20 h + U(0, 4 h) into the trace, 20%, 4 h long).

    .venv/bin/python scripts/bench_detection_bound.py                       # about 2 minutes
    .venv/bin/python scripts/bench_detection_bound.py --write docs/benchmarks.md
    .venv/bin/python scripts/bench_detection_bound.py --quick               # a small version (tests use it)
"""

from __future__ import annotations

import argparse
import logging
import math
import platform
import random
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from specwatch.tracegen import DAY, Drop, RequestDraw, TraceSpec, request_stream

RATE = 1 / 60  # the 1 req/min tier of bench_detection.py
TARGET_MINUTES = 90.0
WARM_SECONDS, DROP_SECONDS = 20 * 3600.0, 4 * 3600.0  # as bench_detection.py
ROUTE_DAYS = 5.0
ROUTES = 6  # 6 x 5 = 30 route-days clean and 30 with a 5% drop
# (r_ok, r_bad) as fractions of r0: specwatch's pair, and the one that is optimal for exactly this benchmark
# (Lorden: the likelihood ratio of the injected 20% drop against the 5% drift that must not page)
PAIRS = ((0.95, 0.85), (0.95, 0.80))
QUANTILES = (0.5, 0.8, 0.9)


@dataclass(frozen=True)
class RequestModel:
    """What the oracle knows: the baseline and the variance of one request's ratio, by its drafted tokens."""

    r0: float  # the mean ratio under the oracle's own weights 1 / v(D)
    a: float  # v(D) = a + b / D: heterogeneity (a) and within-request noise (b / D)
    b: float

    def variance(self, drafted: float) -> float:
        return self.a + self.b / drafted

    @classmethod
    def fit(cls, draws: list[RequestDraw]) -> "RequestModel":
        """Least squares of (x - r)² on 1 / D, then r re-centred with the fitted weights (twice)."""
        r = sum(d.accepted for d in draws) / sum(d.drafted for d in draws)
        a = b = 0.0
        for _ in range(2):
            xs = [1.0 / d.drafted for d in draws]
            ys = [(d.accepted / d.drafted - r) ** 2 for d in draws]
            mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
            b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
            a = my - b * mx
            weights = [1.0 / (a + b / d.drafted) for d in draws]
            r = sum(w * d.accepted / d.drafted for w, d in zip(weights, draws)) / sum(weights)
        return cls(r, a, b)


def cusum_path(draws: Iterable[RequestDraw], model: RequestModel, pair: tuple[float, float]
               ) -> Iterator[tuple[float, float]]:
    """(t, S) after each request: S = max(0, S + ℓ), ℓ the Gaussian log-likelihood ratio of r_bad vs r_ok."""
    ok, bad = pair[0] * model.r0, pair[1] * model.r0
    mid, gap = (ok + bad) / 2, ok - bad
    s = 0.0
    for d in draws:
        s = max(0.0, s + gap * (mid - d.accepted / d.drafted) / model.variance(d.drafted))
        yield d.t, s


def zero_alarm_threshold(sample: int, model: RequestModel, pair: tuple[float, float], kappa: float) -> float:
    """The smallest h with no alarm in one set of 30 clean + 30 5%-drop route-days (the max of S there)."""
    highest = 0.0
    for i in range(ROUTES):
        seed = 10_000 * (sample + 1) + i
        for spec in (TraceSpec(rate=RATE, duration=ROUTE_DAYS * DAY, kappa=kappa, seed=seed),
                     TraceSpec(rate=RATE, duration=ROUTE_DAYS * DAY, kappa=kappa, seed=seed + 1000,
                               drops=(Drop(start=DAY, ratio=0.05),))):
            highest = max(highest, max((s for _, s in cusum_path(request_stream(spec), model, pair)), default=0.0))
    return highest


def detection_minutes(drops: int, model: RequestModel, pair: tuple[float, float], kappa: float,
                      thresholds: list[float], seed: int) -> dict[float, list[float]]:
    """Minutes from drop start to the first S >= h, per h (inf: not detected while the drop lasted)."""
    rng = random.Random(seed)
    thresholds = list(dict.fromkeys(thresholds))  # two quantiles may pick the same h
    out: dict[float, list[float]] = {h: [] for h in thresholds}
    for i in range(drops):
        start = WARM_SECONDS + rng.uniform(0, 4 * 3600.0)
        spec = TraceSpec(rate=RATE, duration=start + DROP_SECONDS, kappa=kappa, seed=seed * 100_000 + i,
                         drops=(Drop(start=start, ratio=0.20, end=start + DROP_SECONDS),))
        first: dict[float, float] = {}
        for t, s in cusum_path(request_stream(spec), model, pair):
            if t >= start:
                for h in thresholds:
                    if h not in first and s >= h:
                        first[h] = (t - start) / 60
        for h in thresholds:
            out[h].append(first.get(h, math.inf))
    return out


def quantile(values: list[float], q: float) -> float:
    """The nearest-rank quantile (bench_detection.py's percentile)."""
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q * len(v) + 0.5) - 1))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=20, help="independent sets of 60 route-days to calibrate h on")
    p.add_argument("--drops", type=int, default=200, help="injected 20%% drops")
    p.add_argument("--kappa", type=float, default=30.0, help="request heterogeneity (bench_detection's default)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fit-days", type=float, default=200.0, help="simulated days the oracle's v(D) is fitted on")
    p.add_argument("--quick", action="store_true", help="3 samples, 20 drops, specwatch's pair only")
    p.add_argument("--write", type=Path, help="replace the 'Detection limit' section of this markdown file")
    args = p.parse_args(argv)
    pairs = PAIRS[:1] if args.quick else PAIRS
    if args.quick:
        args.samples, args.drops = 3, 20
    logging.basicConfig(level=logging.ERROR)
    started, cpu_started = time.perf_counter(), time.process_time()
    fit_days = min(args.fit_days, 30.0) if args.quick else args.fit_days
    model = RequestModel.fit(list(request_stream(TraceSpec(rate=RATE, duration=fit_days * DAY, kappa=args.kappa,
                                                           seed=7))))
    rows = []
    for pair in pairs:
        hs = sorted(zero_alarm_threshold(s, model, pair, args.kappa) for s in range(args.samples))
        picked = [quantile(hs, q) for q in QUANTILES]
        minutes = detection_minutes(args.drops, model, pair, args.kappa, picked, args.seed)
        for q, h in zip(QUANTILES, picked):
            rows.append((pair, q, h, quantile(minutes[h], 0.5), quantile(minutes[h], 0.95)))
        print(f"pair {pair}: zero-alarm h over {args.samples} samples {[round(h, 2) for h in hs]}", file=sys.stderr)
    body = markdown(rows, model, args, time.perf_counter() - started, time.process_time() - cpu_started)
    print(body)
    if args.write:
        write_section(args.write, body)
    return 0


def markdown(rows: list[tuple[tuple[float, float], float, float, float, float]], model: RequestModel,
             args: argparse.Namespace, seconds: float, cpu_seconds: float) -> str:
    quick = " --quick" if args.quick else ""
    lines = [
        f"Measured with `.venv/bin/python scripts/bench_detection_bound.py{quick}` ({seconds:.0f} s wall, "
        f"{cpu_seconds:.0f} s CPU on {platform.machine()}, Python {platform.python_version()}, seed {args.seed}). "
        f"SIMULATED requests from `specwatch.tracegen.request_stream` (the model of the traces above: κ="
        f"{args.kappa:g}, 1 req/min with the ±30% daily swing). An oracle CUSUM sees every request's own ratio and "
        f"knows r0 = {model.r0:.4f} and the variance of one request's ratio, v(D) = {model.a:.5f} + {model.b:.3f}/D "
        f"(sd {math.sqrt(model.variance(400)):.3f} at 400 drafted tokens); no gates. h is the smallest with no "
        f"alarm in one set of 30 clean + 30 5%-drop route-days, over {args.samples} independent sets; detection "
        f"is over {args.drops} injected 20% drops placed as above.",
        "",
        "| pair (r_ok, r_bad) × r0 | zero false pages in | h | detect p50 | detect p95 | p95 within 90 min |",
        "|---|---|---|---|---|---|",
    ]
    for pair, q, h, p50, p95 in rows:
        lines.append(f"| {pair[0]:g}, {pair[1]:g} | {q:.0%} of the sets | {h:.2f} | {p50:.1f} min | {p95:.1f} min "
                     f"| {'yes' if p95 <= TARGET_MINUTES else 'no'} |")
    meeting = [q for _, q, _, _, p95 in rows if p95 <= TARGET_MINUTES]
    if len(meeting) == len(rows):
        reading = (f"the oracle meets the {TARGET_MINUTES:g} min p95 at every h shown, up to the one that keeps "
                   f"{max(meeting):.0%} of the sets of 60 route-days free of false pages")
    elif meeting:
        reading = (f"the oracle meets the {TARGET_MINUTES:g} min p95 only with an h that keeps at most "
                   f"{max(meeting):.0%} of the sets of 60 route-days free of false pages")
    else:
        reading = f"the oracle misses the {TARGET_MINUTES:g} min p95 at every h shown"
    lines += ["", "0.95, 0.85 is specwatch's pair; 0.95, 0.80 is the best pair for exactly this benchmark (a 20% "
              f"drop against a 5% drift that must not page). In this run {reading}."]
    return "\n".join(lines)


def write_section(path: Path, body: str) -> None:
    text = path.read_text(encoding="utf-8")
    pattern = re.compile(r"(## Detection limit \(oracle\)\n)(.*?)(?=\n## )", re.S)
    if not pattern.search(text):
        raise SystemExit(f"{path}: no '## Detection limit (oracle)' section")
    path.write_text(pattern.sub(lambda m: m.group(1) + body + "\n", text, count=1), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
