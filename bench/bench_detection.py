#!/usr/bin/env python3
"""Detection benchmark: specwatch's acceptance-drop detector vs the naive rule, on SIMULATED traces.

Per traffic tier (2 req/s, 0.2 req/s, 1 req/min):
- 30 route-days without a drop, and 30 route-days with a 5% drop (from day 1 on): every page is false;
- 50 injected 20% drops (every fifth coinciding with a model change and engine restart), each after a
  day of clean traffic, lasting 4 h, then recovering: precision, recall, detection time p50/p95, reset time.

Both detectors see the same traces through the same replay path. The naive rule is "5-minute acceptance
ratio <= 0.85 x baseline for 10 minutes", with the baseline specwatch learned, so only the rule differs.

    .venv/bin/python bench/bench_detection.py                # full run, prints the tables (about 3 minutes)
    .venv/bin/python bench/bench_detection.py --write FILE   # replace FILE's Detection section
    .venv/bin/python bench/bench_detection.py --quick        # a small version (tests use it)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import platform
import random
import re
import sys
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from specwatch.config import Config
from specwatch.offline.replay import Replayer
from specwatch.offline.tracegen import DAY, Drop, ModelChange, TraceSpec, generate

# name -> (requests per second, detection target in seconds)
TIERS: dict[str, tuple[float, float]] = {
    "2 req/s": (2.0, 300.0),
    "0.2 req/s": (0.2, 900.0),
    "1 req/min": (1 / 60, 5400.0),
}
DROP_RATIO = 0.20
DROP_SECONDS = 4 * 3600.0
WARM_SECONDS = 20 * 3600.0
RECOVERY_SECONDS = 2 * 3600.0
NAIVE_WINDOW, NAIVE_FOR, NAIVE_FACTOR = 300.0, 600.0, 0.85
# Every route's traffic: 30% ± 20% (daily) of requests of a second class at 0.85 x α (e.g. code edits beside chat),
# so the route's mean acceptance swings by a few percent a day with no regression. `--no-mix` turns it off.
TRAFFIC_MIX = {"mix_share": 0.3, "mix_swing": 0.2, "mix_scale": 0.85}


class NaiveRule:
    """ratio over the last 5 minutes <= 0.85 x baseline, held for 10 minutes (Prometheus `for: 10m`)."""

    def __init__(self) -> None:
        self.window: deque[tuple[float, float, float]] = deque()
        self.accepted = self.drafted = 0.0
        self.since: float | None = None
        self.firing = False

    def feed(self, ts: float, accepted: float, drafted: float, baseline: float | None) -> str | None:
        if drafted > 0:
            self.window.append((ts, accepted, drafted))
            self.accepted += accepted
            self.drafted += drafted
        while self.window and ts - self.window[0][0] >= NAIVE_WINDOW:
            _, a, d = self.window.popleft()
            self.accepted -= a
            self.drafted -= d
        # no drafts in the window: the ratio is NaN and the condition false (Prometheus semantics)
        cond = baseline is not None and self.drafted > 0 and self.accepted / self.drafted <= NAIVE_FACTOR * baseline
        if not cond:
            self.since = None
            if self.firing:
                self.firing = False
                return "resolved"
            return None
        if self.since is None:
            self.since = ts
        if not self.firing and ts - self.since >= NAIVE_FOR:
            self.firing = True
            return "firing"
        return None


@dataclass
class Pages:
    """Firing/resolved times (seconds from the trace start) of one detector on one trace."""

    events: list[tuple[float, str]] = field(default_factory=list)

    def fires(self) -> list[float]:
        return [t for t, s in self.events if s == "firing"]

    def resolve_after(self, t0: float) -> float | None:
        return next((t for t, s in self.events if s == "resolved" and t >= t0), None)


def run_trace(spec: TraceSpec, config: Config) -> tuple[Pages, Pages]:
    """Replay one trace through specwatch and the naive rule."""
    ours, theirs, _ = run_trace_highest(spec, config)
    return ours, theirs


def run_trace_highest(spec: TraceSpec, config: Config) -> tuple[Pages, Pages, float]:
    """`run_trace`, and the highest CUSUM statistic specwatch reached on the trace."""
    replayer, naive = Replayer(config), NaiveRule()
    ours, theirs = Pages(), Pages()
    highest = 0.0
    ev = replayer.evaluator(spec.route)
    prev = None
    for sample in generate(spec):
        t = sample.ts - spec.start
        transition = replayer.feed(sample)
        if transition is not None:
            ours.events.append((t, transition.state))
        highest = max(highest, ev.cusum.statistic)
        if prev is not None and sample.model_name == prev.model_name and sample.drafts >= prev.drafts:
            d_acc, d_tok = sample.accepted_tokens - prev.accepted_tokens, sample.draft_tokens - prev.draft_tokens
        else:
            d_acc, d_tok = 0.0, 0.0  # a restart: Prometheus' increase() would also skip the reset
        state = naive.feed(t, d_acc, d_tok, ev.reference.acceptance_ratio if ev.reference else None)
        if state is not None:
            theirs.events.append((t, state))
        prev = sample
    replayer.close()
    return ours, theirs, highest


def run_trace_horizon(spec: TraceSpec, config: Config, onset: float) -> tuple[Pages, float | None, dict | None]:
    """Replay one trace through specwatch; its pages, and the detection horizon (stats/horizon.py) the evaluator
    exported at the last scrape before `onset` (seconds from the trace's start), with its inputs."""
    replayer, ours, horizon, inputs = Replayer(config), Pages(), None, None
    ev = replayer.evaluator(spec.route)
    for sample in generate(spec):
        t = sample.ts - spec.start
        if t < onset and onset - t < 60.0:
            horizon, inputs = ev.decision.horizon(sample.ts), ev.decision.horizon_inputs(sample.ts)
        transition = replayer.feed(sample)
        if transition is not None:
            ours.events.append((t, transition.state))
    replayer.close()
    return ours, horizon, inputs


def _run_horizon_task(task: tuple[TraceSpec, Config, float]) -> tuple[Pages, float | None, dict | None]:
    return run_trace_horizon(*task)


def _run_task(task: tuple[TraceSpec, Config]) -> tuple[Pages, Pages, float]:
    return run_trace_highest(*task)


def run_all(tasks: list[tuple[TraceSpec, Config]], jobs: int) -> list[tuple[Pages, Pages, float]]:
    """`run_trace_highest` of every task, in `jobs` processes (results in task order)."""
    if jobs <= 1:
        return [_run_task(t) for t in tasks]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(_run_task, tasks, chunksize=1))


@dataclass
class Tally:
    pages_clean: int = 0
    pages_small: int = 0
    true_pages: int = 0
    false_pages_drop: int = 0
    drops: int = 0
    detected: int = 0
    in_target: int = 0
    detection: list[float] = field(default_factory=list)
    reset: list[float] = field(default_factory=list)

    def add_drop(self, pages: Pages, start: float, end: float, grace: float, target: float) -> None:
        self.drops += 1
        fires = pages.fires()
        hits = [t for t in fires if start <= t <= end + grace]
        self.true_pages += len(hits)
        self.false_pages_drop += len(fires) - len(hits)
        inside = [t for t in hits if t <= end]
        if inside:
            self.detected += 1
            delay = inside[0] - start
            self.detection.append(delay)
            self.in_target += delay <= target
            resolved = pages.resolve_after(end)
            if resolved is not None:
                self.reset.append(resolved - end)

    def row(self) -> dict[str, str]:
        pages = self.true_pages + self.false_pages_drop + self.pages_clean + self.pages_small
        return {
            "pages clean / 5%": f"{self.pages_clean} / {self.pages_small}",
            "precision": f"{self.true_pages / pages:.2f}" if pages else "-",
            "recall": f"{self.detected}/{self.drops}",
            "in target": f"{self.in_target}/{self.drops}",
            "detect p50": _minutes(_pct(self.detection, 50)),
            "detect p95": _minutes(_pct(self.detection, 95)),
            "reset p50": _minutes(_pct(self.reset, 50)),
        }


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q / 100 * len(v) + 0.5) - 1))]


def _minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f} min"


def no_drop_specs(
    rate: float, route_days: float, seed: int, kappa: float, mix: bool = True
) -> tuple[list[TraceSpec], list[TraceSpec]]:
    """The benchmark's routes that must never page: `route_days` clean, and as many with a 5% drop from day 1 on
    (inside the indifference zone), in routes of 5 days; all with the daily request-mix swing unless `mix` is off."""
    days_per_route = 5.0 if route_days >= 5 else route_days
    routes = max(1, round(route_days / days_per_route))
    traffic = TRAFFIC_MIX if mix else {}
    clean = [
        TraceSpec(route=f"clean{i}", rate=rate, duration=days_per_route * DAY, kappa=kappa, seed=seed + i, **traffic)
        for i in range(routes)
    ]
    small = [
        TraceSpec(
            route=f"small{i}",
            rate=rate,
            duration=days_per_route * DAY,
            kappa=kappa,
            seed=seed + 1000 + i,
            drops=(Drop(start=min(DAY, days_per_route * DAY / 4), ratio=0.05),),
            **traffic,
        )
        for i in range(routes)
    ]
    return clean, small


def drop_specs(
    rate: float, drops: int, seed: int, kappa: float, mix: bool = True
) -> list[tuple[TraceSpec, float, float]]:
    """(spec, drop start, drop end) of the injected 20% drops, every fifth with a model change."""
    rng = random.Random(seed)
    out = []
    for i in range(drops):
        start = WARM_SECONDS + rng.uniform(0, 4 * 3600.0)
        end = start + DROP_SECONDS
        changes = (ModelChange(at=start, model_name="model-b"),) if i % 5 == 4 else ()
        out.append(
            (
                TraceSpec(
                    route=f"drop{i}",
                    rate=rate,
                    duration=end + RECOVERY_SECONDS,
                    kappa=kappa,
                    seed=seed + 2000 + i,
                    drops=(Drop(start=start, ratio=DROP_RATIO, end=end),),
                    changes=changes,
                    **(TRAFFIC_MIX if mix else {}),
                ),
                start,
                end,
            )
        )
    return out


def bench_tier(
    rate: float,
    target: float,
    route_days: float,
    drops: int,
    seed: int,
    config: Config,
    kappa: float,
    mix: bool = True,
    jobs: int = 1,
) -> tuple[Tally, Tally]:
    ours, naive = Tally(), Tally()
    clean, small = no_drop_specs(rate, route_days, seed, kappa, mix)
    injected = drop_specs(rate, drops, seed, kappa, mix)
    results = run_all([(spec, config) for spec in clean + small + [d[0] for d in injected]], jobs)
    for i, (a, b, _) in enumerate(results[: len(clean) + len(small)]):
        if i < len(clean):
            ours.pages_clean += len(a.fires())
            naive.pages_clean += len(b.fires())
        else:
            ours.pages_small += len(a.fires())
            naive.pages_small += len(b.fires())
    grace = config.detection.confirm_window_seconds + NAIVE_WINDOW
    for (a, b, _), (_, start, end) in zip(results[len(clean) + len(small) :], injected):
        ours.add_drop(a, start, end, grace, target)
        naive.add_drop(b, start, end, grace, target)
    return ours, naive


SET_SEED_STRIDE = 10_000  # seeds of independent sets of routes (bench_tier's routes use seed + i and seed + 1000 + i)


def horizon_cell(
    rate: float, drops: int, seed: int, config: Config, kappa: float, mix: bool = True, jobs: int = 1
) -> list[tuple[float | None, float | None]]:
    """(predicted horizon at onset, measured time to page or None if not paged while the drop lasted) per injected
    20% drop. No model change at the drops: the horizon is the traffic detector's, not the SPRT's."""
    injected = [
        (dataclasses.replace(spec, changes=()), start, end)
        for spec, start, end in drop_specs(rate, drops, seed, kappa, mix)
    ]
    tasks = [(spec, config, start) for spec, start, _ in injected]
    if jobs <= 1:
        results = [_run_horizon_task(t) for t in tasks]
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(_run_horizon_task, tasks, chunksize=1))
    out: list[tuple[float | None, float | None]] = []
    for (pages, horizon, inputs), (_, start, end) in zip(results, injected):
        hits = [t for t in pages.fires() if start <= t <= end]
        out.append((horizon, hits[0] - start if hits else None))
        if inputs is not None:  # the horizon's inputs at the onset, for a look at the formula beside the table
            inputs = {**inputs, "dispersion": [inputs["dispersion"].intercept, inputs["dispersion"].slope]}
            print(json.dumps({"rate": rate, "kappa": kappa, "measured": out[-1][1], "inputs": inputs}), file=sys.stderr)
    return out


def _median(values: list[float]) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def horizon_markdown(
    cells: list[tuple[str, float, list[tuple[float | None, float | None]], list[tuple[int, int, float]] | None]],
    args: argparse.Namespace,
    seconds: float,
) -> str:
    lines = [
        f"Measured with `{_command(args)}` ({seconds:.0f} s wall, {args.jobs} processes, {platform.machine()}, "
        f"Python {platform.python_version()}, seed {args.seed}). Per tier and κ, {args.drops} injected "
        f"{DROP_RATIO:.0%} drops of {DROP_SECONDS / 3600:g} h on the traces of the Detection benchmark (no model "
        'change at the drop). Predicted: `specwatch_route_detection_horizon_seconds{path="traffic"}` at the '
        "last scrape before the drop, median over the drops; measured: median time to page, a drop not paged "
        "within its 4 h counted as longer than any paged one. False pages: the share of independent sets of 30 clean "
        "+ 30 5%-drop route-days without a page (`--false-page-sets`).",
        "",
        "| tier | κ | predicted median | measured median | measured / predicted | paged | false-page sets clean |",
        "|---|---|---|---|---|---|---|",
    ]
    for tier, kappa, rows, sets in cells:
        predicted = [h for h, _ in rows if h is not None]
        measured = [m if m is not None else math.inf for _, m in rows]
        paged = sum(1 for _, m in rows if m is not None)
        p, m = (_median(predicted) if predicted else None), (_median(measured) if measured else None)
        ratio = f"{m / p:.2f}" if p and m is not None and math.isfinite(m) else "-"
        clean = "-"
        if sets:
            ok = sum(1 for _, pages, _ in sets if not pages)
            clean = f"{ok} of {len(sets)} ({ok / len(sets):.0%})"
        lines.append(
            f"| {tier} | {kappa:g} | {_minutes(p)} | {_minutes(m) if m is None or math.isfinite(m) else '> 4 h'} | "
            f"{ratio} | {paged}/{len(rows)} | {clean} |"
        )
    return "\n".join(lines)


def false_page_sets(
    rate: float, sets: int, config: Config, kappa: float, mix: bool = True, jobs: int = 1
) -> list[tuple[int, int, float]]:
    """Per independent set of 30 clean + 30 5%-drop route-days: (seed, pages, the highest CUSUM statistic).

    One set is the benchmark's no-drop part for one seed; the share of sets without a page is the confidence
    that "zero false pages" holds on a fresh sample, and the highest statistic shows the margin to h.
    """
    seeds = [SET_SEED_STRIDE * (n + 1) for n in range(sets)]
    tasks, owner = [], []
    for seed in seeds:
        clean, small = no_drop_specs(rate, 30.0, seed, kappa, mix)
        tasks += [(spec, config) for spec in clean + small]
        owner += [seed] * (len(clean) + len(small))
    pages = dict.fromkeys(seeds, 0)
    highest = dict.fromkeys(seeds, 0.0)
    for seed, (a, _, top) in zip(owner, run_all(tasks, jobs)):
        pages[seed] += len(a.fires())
        highest[seed] = max(highest[seed], top)
    return [(seed, pages[seed], highest[seed]) for seed in seeds]


def markdown(
    results: list[tuple[str, float, float, Tally, Tally]],
    args: argparse.Namespace,
    seconds: float,
    cpu_seconds: float,
    bounds: dict[str, float],
) -> str:
    cols = ["pages clean / 5%", "precision", "recall", "in target", "detect p50", "detect p95", "reset p50"]
    lines = [
        f"Measured with `{_command(args)}` ({seconds:.0f} s wall, {cpu_seconds:.0f} s CPU in the main process, "
        f"{args.jobs} processes, {platform.machine()}, Python {platform.python_version()}, seed {args.seed}). "
        f"SIMULATED traces from `specwatch.offline.tracegen` (EAGLE-3 profile, k=4, request heterogeneity κ as shown, "
        f"300 output tokens per request, ±30% daily traffic swing"
        f"{'' if args.no_mix else ', 30% ± 20% (daily) of requests of a second class at 0.85× α'}, 15 s scrapes, "
        f"20 ms verify steps so that longer requests straddle scrapes, `running` = requests in flight). Per tier and "
        f"κ: {args.route_days:g} route-days without a drop, {args.route_days:g} route-days with a 5% drop, "
        f"{args.drops} injected {DROP_RATIO:.0%} drops of {DROP_SECONDS / 3600:g} h (every fifth with a model change), "
        f'default detection settings, baselines learned from the traces themselves. "bound p95" is the exact '
        f"per-request bound at 90% clean sets (Detection limit, below).",
        "",
        "| tier | κ | target p95 | detector | " + " | ".join(cols) + " | bound p95 | p95 / bound |",
        "|---|---|---|---|" + "---|" * len(cols) + "---|---|",
    ]
    for tier, kappa, target, ours, naive in results:
        bound = bounds.get(f"{tier}|{kappa:g}")
        for name, tally in (("specwatch", ours), ("naive 5m ≤ 0.85× for 10m", naive)):
            row = tally.row()
            p95 = _pct(tally.detection, 95)
            ratio = f"{p95 / 60 / bound:.2f}" if bound and p95 is not None and name == "specwatch" else ""
            lines.append(
                f"| {tier} | {kappa:g} | {target / 60:g} min | {name} | "
                + " | ".join(row[c] for c in cols)
                + f" | {'' if bound is None else f'{bound:.1f} min'} | {ratio} |"
            )
    lines += [
        "",
        '"pages clean / 5%" are all false pages; precision counts every page of the tier; recall is '
        'drops paged while ongoing; "in target" is drops paged within the tier\'s target; reset is drop end '
        "to resolved.",
    ]
    return "\n".join(lines)


def _command(args: argparse.Namespace) -> str:
    parts = [".venv/bin/python bench/bench_detection.py"]
    if args.quick:
        parts.append("--quick")
    parts += [f'--tier "{t}"' for t in args.tier or ()] + [f"--kappa {k:g}" for k in args.kappa or ()]
    if getattr(args, "horizon", False):
        parts.append(f"--horizon --drops {args.drops}")
    elif not args.quick and (args.route_days, args.drops) != (30.0, 50):
        parts.append(f"--route-days {args.route_days:g} --drops {args.drops}")
    if args.false_page_sets:
        parts.append(f"--false-page-sets {args.false_page_sets}")
    if args.no_mix:
        parts.append("--no-mix")
    if args.jobs > 1:
        parts.append(f"--jobs {args.jobs}")
    return " ".join(parts)


def write_section(path: Path, body: str, title: str = "Detection (acceptance drop)") -> None:
    text = path.read_text(encoding="utf-8")
    pattern = re.compile(rf"(## {re.escape(title)}\n)(.*?)(?=\n## )", re.S)
    if not pattern.search(text):
        raise SystemExit(f"{path}: no '## {title}' section")
    path.write_text(pattern.sub(lambda m: m.group(1) + body + "\n", text, count=1), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="3 route-days and 5 drops per tier")
    p.add_argument("--route-days", type=float, default=30.0)
    p.add_argument("--drops", type=int, default=50)
    p.add_argument(
        "--kappa",
        type=float,
        action="append",
        help="request heterogeneity (Beta concentration; repeatable, default 12 and 30)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tier", action="append", choices=list(TIERS), help="only these tiers (repeatable)")
    p.add_argument("--no-mix", action="store_true", help="one request class (no daily mix swing)")
    p.add_argument("--jobs", type=int, default=1, help="processes (traces run in parallel)")
    p.add_argument("--bound", type=Path, help="JSON of bench/bench_detection_bound.py --json: adds its p95")
    p.add_argument("--cusum-threshold", type=float, help="override detection.cusum_threshold (tuning)")
    p.add_argument("--write", type=Path, help="replace the Detection section of this markdown file")
    p.add_argument(
        "--false-page-sets",
        type=int,
        metavar="N",
        help="instead: run N independent sets of 30 clean + 30 5%%-drop route-days per tier and κ and "
        "report the share without a page (the confidence in 'zero false pages')",
    )
    p.add_argument(
        "--horizon",
        action="store_true",
        help="instead: the detection horizon predicted at each drop's onset vs the measured time to page "
        "(and, with --false-page-sets N, the false-page confidence of the same cells)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.route_days, args.drops = 3.0, 5
    kappas = args.kappa or [12.0, 30.0]
    logging.basicConfig(level=logging.ERROR)
    config = Config()
    if args.cusum_threshold is not None:
        config = Config(detection=dataclasses.replace(config.detection, cusum_threshold=args.cusum_threshold))
    bounds = json.loads(args.bound.read_text(encoding="utf-8")) if args.bound else {}
    started, cpu_started = time.perf_counter(), time.process_time()
    if args.horizon:
        cells = []
        for tier in args.tier or list(TIERS):
            for kappa in kappas:
                t0 = time.perf_counter()
                rows = horizon_cell(TIERS[tier][0], args.drops, args.seed, config, kappa, not args.no_mix, args.jobs)
                sets = (
                    false_page_sets(TIERS[tier][0], args.false_page_sets, config, kappa, not args.no_mix, args.jobs)
                    if args.false_page_sets
                    else None
                )
                cells.append((tier, kappa, rows, sets))
                print(f"{tier} κ={kappa:g}: {time.perf_counter() - t0:.0f} s {rows} {sets}", file=sys.stderr)
        body = horizon_markdown(cells, args, time.perf_counter() - started)
        print(body)
        if args.write:
            write_section(args.write, body, "Detection horizon")
        return 0
    if args.false_page_sets:
        lines = [
            f"Measured with `{_command(args)}` (traces as above, default detection settings). Each set is the "
            "no-drop part of the benchmark for one seed: 30 clean and 30 5%-drop route-days; sets use "
            "independent seeds.",
            "",
            "| tier | κ | sets without a false page | highest CUSUM statistic per set (sorted) |",
            "|---|---|---|---|",
        ]
        for tier in args.tier or list(TIERS):
            for kappa in kappas:
                found = false_page_sets(TIERS[tier][0], args.false_page_sets, config, kappa, not args.no_mix, args.jobs)
                clean = sum(1 for _, pages, _ in found if not pages)
                highest = ", ".join(f"{h:.2f}" for h in sorted(h for _, _, h in found))
                lines.append(f"| {tier} | {kappa:g} | {clean} of {len(found)} ({clean / len(found):.0%}) | {highest} |")
                print(lines[-1], file=sys.stderr)
        lines.append(f"\n({time.perf_counter() - started:.0f} s wall.)")
        print("\n".join(lines))
        if args.write:
            write_section(args.write, "\n".join(lines), "Detection reliability")
        return 0
    results = []
    for tier in args.tier or list(TIERS):
        rate, target = TIERS[tier]
        for kappa in kappas:
            t0 = time.perf_counter()
            ours, naive = bench_tier(
                rate, target, args.route_days, args.drops, args.seed, config, kappa, not args.no_mix, args.jobs
            )
            results.append((tier, kappa, target, ours, naive))
            print(
                f"{tier} κ={kappa:g}: {time.perf_counter() - t0:.0f} s  specwatch {ours.row()}  naive {naive.row()}",
                file=sys.stderr,
            )
    body = markdown(results, args, time.perf_counter() - started, time.process_time() - cpu_started, bounds)
    print(body)
    if args.write:
        write_section(args.write, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
