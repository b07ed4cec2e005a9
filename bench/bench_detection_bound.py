#!/usr/bin/env python3
"""The detection bound: an exact per-request likelihood-ratio CUSUM on SIMULATED requests (needs numpy).

bench/bench_detection.py asks for no false page in 30 clean + 30 5%-drift route-days and a detection p95 per
tier. This script measures how fast *any* detector fed the same model of traffic could be, with an oracle
better placed than specwatch in every way:

- it sees every request on its own, with its per-step acceptance histogram (how many verify steps accepted
  0, 1, ..., k draft tokens), where /metrics shows only sums over scrapes;
- it knows the model exactly: the profile's α_j, the Beta(κm, κ(1-m)) spread of the per-request scale (integrated
  out on an even 64-point grid), the daily share of the two request classes, the length distribution, and
  what a 5% and a 20% drop do to α (`tracegen.drop_scale`): its log-likelihood ratio per request is that of the
  request's step histogram and step count (a request's length in steps also says how well it was accepted);
- it has no duration, token or confirmation gate, and its h is calibrated on --sets independent sets of 60
  route-days (6 clean + 6 5%-drift routes of 5 days, as bench_detection.py builds them): h(q) is the q-quantile
  of the sets' highest statistic, so "zero false pages in q of the sets" is what h(q) keeps.

The requests follow `specwatch.offline.tracegen.request_stream`'s model (vectorised here, same distributions: Poisson
arrivals with the ±30% daily swing, log-normal lengths, prefix acceptance, the request mix). A CUSUM is
S_n = C_n - min(0, min_{m<=n} C_m) for the cumulative log-likelihood ratio C, so whole routes run as arrays.
Drops are placed as in bench_detection.py (20 h + U(0, 4 h) into the trace, 20%, 4 h long).

    .venv/bin/python bench/bench_detection_bound.py --tier "1 req/min" --kappa 12 --sets 1000 --jobs 16
    .venv/bin/python bench/bench_detection_bound.py --quick            # a small version (tests use it)
    python3 bench/bench_detection_bound.py --device cuda --sets 1000     # on a GPU (needs torch): minutes, not hours
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from specwatch.offline.tracegen import (
    BETA_MEAN,
    DAY,
    LENGTH_SIGMA,
    MAX_ALPHA,
    Drop,
    TraceSpec,
    conditional_alphas,
    drop_scale,
)

TIERS: dict[str, tuple[float, float]] = {
    "2 req/s": (2.0, 300.0),
    "0.2 req/s": (0.2, 900.0),
    "1 req/min": (1 / 60, 5400.0),
}
WARM_SECONDS, DROP_SECONDS = 20 * 3600.0, 4 * 3600.0  # as bench_detection.py
ROUTE_DAYS, ROUTES = 5.0, 6  # 6 x 5 = 30 route-days clean and 30 with a 5% drift
DRIFT, DROP = 0.05, 0.20
QUANTILES = (0.5, 0.8, 0.9)
GRID = 64  # points of the integral over the Beta spread (192 gives the same set maxima to 3 decimals)
# The benchmark's traffic (bench_detection.TRAFFIC): a second request class at 0.85 x α, 30% ± 20% of requests.
MIX = {"mix_share": 0.3, "mix_swing": 0.2, "mix_scale": 0.85}


@dataclass(frozen=True)
class Model:
    spec: TraceSpec  # rate, κ, profile, k, mix
    bad: float  # the drop the test is tuned to detect (r_bad = (1 - bad) r0); the zone's edge is DRIFT
    share_known: bool = True  # the oracle knows the hour's class share; False: only the day's mean share
    # sd of ln(true acceptance scale / the scale the oracle tests against), one draw per route: a baseline learned
    # from the route's own traffic is off by about this much (0: the oracle knows r0 exactly)
    baseline_error: float = 0.0
    # the oracle does not know the request classes either: it reads every request with one Beta spread of the
    # scale, fitted by moments to the mixture (what a detector that learns one spread beside r0 could know)
    one_class: bool = False

    def one_class_fit(self) -> tuple[float, float]:
        """(κ̂, c̄): the Beta concentration and mean factor of one class with the mixture's first two moments of
        the per-request scale (the day's mean share)."""
        s, m, kappa = self.spec.mix_share, BETA_MEAN, self.spec.kappa
        c_mean = 1 - s + s * self.spec.mix_scale
        c_sq = 1 - s + s * self.spec.mix_scale**2
        second = (m * (1 - m) / (kappa + 1) + m * m) * c_sq  # E[(u c)²]
        variance = second / c_mean**2 - m * m  # of u c / c̄, whose mean is m
        return m * (1 - m) / variance - 1, c_mean

    def route_scale(self, rng: np.random.Generator) -> float:
        """The factor on α of one route whose baseline is known only to `baseline_error` (1.0 when exact)."""
        return float(np.exp(rng.normal(0.0, self.baseline_error))) if self.baseline_error > 0 else 1.0

    def beta_grid(self) -> tuple[np.ndarray, np.ndarray]:
        """(GRID points, their ln weights) for integrating over u ~ Beta(κm, κ(1-m)): evenly spaced between the
        1e-7 and 1 - 1e-7 quantiles, weighted by the density. Even spacing covers the tails, where one request's
        likelihood under one hypothesis can sit while the other's is in the bulk (a quantile grid leaves them out
        and makes single requests look like strong evidence)."""
        a, b = self.spec.kappa * BETA_MEAN, self.spec.kappa * (1 - BETA_MEAN)
        fine = np.linspace(1e-9, 1 - 1e-9, 400_001)
        log_pdf = (a - 1) * np.log(fine) + (b - 1) * np.log1p(-fine)
        cdf = np.cumsum(np.exp(log_pdf - log_pdf.max()))
        cdf /= cdf[-1]
        lo, hi = np.interp([1e-7, 1 - 1e-7], cdf, fine)
        u = np.linspace(lo, hi, GRID)
        log_w = (a - 1) * np.log(u) + (b - 1) * np.log1p(-u)
        log_w -= np.log(np.exp(log_w - log_w.max()).sum()) + log_w.max()
        return u, log_w

    def log_step_probs(self, factor: float) -> tuple[np.ndarray, np.ndarray]:
        """([GRID, k+1] ln P(a verify step accepts x draft tokens), [GRID] ln(1 + Σ p_j) tokens per step) at each
        grid scale, α_j times `factor`."""
        alphas = np.array(conditional_alphas(self.spec.profile, self.spec.k))
        scale = self.beta_grid()[0][:, None] / BETA_MEAN
        reach = np.cumprod(np.clip(alphas[None, :] * scale * factor, 0.0, MAX_ALPHA), axis=1)  # p_j
        p = np.concatenate([np.ones((GRID, 1)), reach, np.zeros((GRID, 1))], axis=1)
        return np.log(np.maximum(p[:, :-1] - p[:, 1:], 1e-300)), np.log1p(reach.sum(axis=1))


def draw_requests(
    spec: TraceSpec, rng: np.random.Generator, route_scale: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival seconds, class share at arrival, [n, k+1] step histograms) of one route, as request_stream; every
    request's α also times `route_scale` (a route whose acceptance is not what the oracle's baseline says)."""
    peak = spec.rate * (1 + abs(spec.diurnal))
    t = np.sort(rng.uniform(0, spec.duration, rng.poisson(peak * spec.duration)))
    t = t[rng.uniform(0, peak, t.size) <= spec.rate * (1 + spec.diurnal * np.sin(2 * np.pi * t / DAY))]
    share = (
        spec.mix_share + spec.mix_swing * np.sin(2 * np.pi * t / DAY + spec.mix_phase)
        if spec.mix_share
        else np.zeros(t.size)
    )
    factor = np.full(t.size, route_scale)
    for d in spec.drops:
        inside = (t >= d.start) & (t < (d.end if d.end is not None else np.inf))
        factor[inside] *= drop_scale(spec.profile, spec.k, spec.kappa, d.ratio)
    factor[rng.uniform(size=t.size) < share] *= spec.mix_scale
    u = rng.beta(spec.kappa * BETA_MEAN, spec.kappa * (1 - BETA_MEAN), t.size)
    alphas = np.array(conditional_alphas(spec.profile, spec.k))
    cond = np.clip(alphas[None, :] * (u / BETA_MEAN * factor)[:, None], 0.0, MAX_ALPHA)
    p = np.cumprod(cond, axis=1)
    mu = math.log(spec.mean_tokens) - LENGTH_SIGMA**2 / 2
    tokens = np.clip(np.exp(rng.normal(mu, LENGTH_SIGMA, t.size)), 8, 8192)
    steps = np.maximum(1, np.rint(tokens / (1 + p.sum(axis=1)))).astype(np.int64)
    reach = [steps]
    for j in range(spec.k):  # prefix acceptance: position j is tried only where j - 1 was accepted
        reach.append(rng.binomial(reach[-1], cond[:, j]))
    r = np.stack(reach, axis=1)
    hist = np.concatenate([r[:, :-1] - r[:, 1:], r[:, -1:]], axis=1)  # steps that accepted exactly x
    return t, share, hist


class Llr:
    """ln L(20% drop) - ln L(5% drift) of each request, the Beta spread and the class integrated out."""

    def __init__(self, model: Model) -> None:
        s = model.spec
        # None: the hour's share is weighed as drawn; else this one share for every request (the day's mean)
        self.fixed_share = None if model.share_known else s.mix_share
        self.mu = math.log(s.mean_tokens) - LENGTH_SIGMA**2 / 2
        classes = (1.0, s.mix_scale)  # factor on α of each request class
        if model.one_class:  # read as one class: the mixture's spread about its mean factor, no share
            kappa, c_mean = model.one_class_fit()
            model = replace(model, spec=replace(s, kappa=kappa, mix_share=0.0, mix_swing=0.0), one_class=False)
            s = model.spec
            self.fixed_share, classes = 0.0, (c_mean, c_mean)
        self.log_w = model.beta_grid()[1][None, :]
        self.tables = {}
        for name, ratio in (("ok", DRIFT), ("bad", model.bad)):
            c = drop_scale(s.profile, s.k, s.kappa, ratio)
            self.tables[name] = tuple(model.log_step_probs(c * f) for f in classes)

    def __call__(self, share: np.ndarray, hist: np.ndarray) -> np.ndarray:
        if self.fixed_share is not None and share.any():
            share = np.full_like(share, self.fixed_share)
        out = np.zeros(hist.shape[0])
        h = hist.astype(np.float64)
        log_steps = np.log(h.sum(axis=1))[:, None]
        for name, sign in (("bad", 1.0), ("ok", -1.0)):
            first, second = self.tables[name]
            lik = []
            for table, log_per_step in (first, second):
                # the histogram given the step count, times the step count given the scale: a request of T
                # log-normal tokens runs T / (1 + Σp) steps, so ln P(n steps) = ln pdf_T(n (1 + Σp)) + ln(1 + Σp)
                # (terms that are the same for every scale dropped)
                ll = h @ table.T - (log_steps + log_per_step[None, :] - self.mu) ** 2 / (2 * LENGTH_SIGMA**2)
                ll += self.log_w
                top = ll.max(axis=1, keepdims=True)
                lik.append(top[:, 0] + np.log(np.exp(ll - top).sum(axis=1)))
            with np.errstate(divide="ignore"):
                mixed = np.logaddexp(np.log1p(-share) + lik[0], np.log(share) + lik[1]) if share.any() else lik[0]
            out += sign * mixed
        return out


def cusum(llr: np.ndarray) -> np.ndarray:
    """S_n = max(0, S_{n-1} + ℓ_n) for all n at once: C_n - min(0, min_{m<=n} C_m)."""
    c = np.cumsum(llr)
    return c - np.minimum(0.0, np.minimum.accumulate(c))


def _route_spec(model: Model, **kw) -> TraceSpec:
    return replace(model.spec, **kw)


def set_maximum(args: tuple[Model, int]) -> float:
    """The highest statistic over one set of 30 clean + 30 5%-drift route-days (seeded by the set number)."""
    model, n = args
    rng = np.random.default_rng([n, 7])
    llr = Llr(model)
    highest = 0.0
    for _route in range(ROUTES):
        for drops in ((), ((DAY, DRIFT),)):
            spec = _route_spec(model, duration=ROUTE_DAYS * DAY, drops=tuple(Drop(start=s, ratio=r) for s, r in drops))
            t, share, hist = draw_requests(spec, rng, model.route_scale(rng))
            if t.size:
                highest = max(highest, float(cusum(llr(share, hist)).max()))
    return highest


def detection_minutes(args: tuple[Model, int, list[float]]) -> list[float]:
    """Minutes from the start of one injected 20% drop to the first S >= h, per h (inf: missed)."""
    model, n, thresholds = args
    rng = np.random.default_rng([n, 11])
    start = WARM_SECONDS + rng.uniform(0, 4 * 3600.0)
    spec = _route_spec(
        model, duration=start + DROP_SECONDS, drops=(Drop(start=start, ratio=DROP, end=start + DROP_SECONDS),)
    )
    t, share, hist = draw_requests(spec, rng, model.route_scale(rng))
    s = cusum(Llr(model)(share, hist))
    after = t >= start
    out = []
    for h in thresholds:
        hit = np.nonzero(after & (s >= h))[0]
        out.append((t[hit[0]] - start) / 60 if hit.size else math.inf)
    return out


def quantile(values: list[float], q: float) -> float:
    """The nearest-rank quantile (bench_detection.py's percentile)."""
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q * len(v) + 0.5) - 1))]


def bound(
    tier: str,
    kappa: float,
    bad: float,
    sets: int,
    drops: int,
    jobs: int,
    mix: bool,
    device: str | None = None,
    share_known: bool = True,
    baseline_error: float = 0.0,
    one_class: bool = False,
) -> tuple[list[float], dict[float, tuple[float, float]]]:
    """(sorted set maxima, {q: (h, detection p95 minutes)}); on torch's `device` when given (bench/bound_torch.py)."""
    rate = TIERS[tier][0]
    spec = TraceSpec(rate=rate, kappa=kappa, **(MIX if mix else {}))
    model = Model(spec, bad, share_known, baseline_error, one_class)
    if device is not None:
        return _bound_torch(model, sets, drops, device)
    pool = ProcessPoolExecutor(max_workers=jobs) if jobs > 1 else None
    run = pool.map if pool is not None else map
    try:
        maxima = sorted(run(set_maximum, [(model, n) for n in range(sets)]))
        picked = [quantile(maxima, q) for q in QUANTILES]
        minutes = list(run(detection_minutes, [(model, 100_000 + n, picked) for n in range(drops)]))
    finally:
        if pool is not None:
            pool.shutdown()
    return maxima, {
        q: (h, quantile([m[i] for m in minutes], 0.5), quantile([m[i] for m in minutes], 0.95))
        for i, (q, h) in enumerate(zip(QUANTILES, picked))
    }


def _bound_torch(model: Model, sets: int, drops: int, device: str) -> tuple[list[float], dict]:
    import torch

    import bound_torch

    dev = torch.device(device)
    # about 12 x 5 days of requests per set: keep a batch near 20 million requests (a few GB per [n, 64] array)
    per_set = ROUTES * 2 * ROUTE_DAYS * DAY * model.spec.rate * 1.3
    per_batch = max(1, min(sets, int(20e6 // per_set)))
    gap = bound_torch.check(sys.modules[__name__], model, dev)
    print(
        f"  torch {torch.__version__} on {dev}: |ℓ numpy - ℓ torch| <= {gap:.2e}; {per_batch} sets a batch",
        file=sys.stderr,
    )
    maxima = sorted(bound_torch.set_maxima(sys.modules[__name__], model, 0, sets, dev, per_batch))
    picked = [quantile(maxima, q) for q in QUANTILES]
    minutes = bound_torch.detection_minutes(sys.modules[__name__], model, drops, picked, dev)
    return maxima, {
        q: (h, quantile([m[i] for m in minutes], 0.5), quantile([m[i] for m in minutes], 0.95))
        for i, (q, h) in enumerate(zip(QUANTILES, picked))
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tier", action="append", choices=list(TIERS), help="tiers (repeatable; default the two quiet)")
    p.add_argument("--kappa", type=float, action="append", help="Beta concentrations (repeatable; default 12, 30)")
    p.add_argument("--sets", type=int, default=1000, help="independent sets of 60 route-days to calibrate h on")
    p.add_argument("--drops", type=int, default=200, help="injected 20%% drops")
    p.add_argument("--bad", type=float, default=DROP, help="the drop the likelihood ratio is tuned to (0.2)")
    p.add_argument("--no-mix", action="store_true", help="one request class (no daily mix swing)")
    p.add_argument(
        "--mix-unknown",
        action="store_true",
        help="the oracle weighs every request at the day's mean class share, not the hour's (as a detector "
        "that has not learned the daily mix)",
    )
    p.add_argument(
        "--baseline-error",
        type=float,
        default=0.0,
        help="sd of each route's acceptance scale about the baseline the oracle tests against (0.009: 0.9%%), one "
        "draw per route: the bound of a detector that learns r0 from the route's traffic and so knows it only "
        "this well (0: r0 exact)",
    )
    p.add_argument(
        "--one-class",
        action="store_true",
        help="the oracle reads every request with one Beta spread fitted to the mixture's moments, not the two "
        "classes (as a detector that learns one spread beside r0)",
    )
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--device", help="run on torch's device (cuda, cpu) instead of numpy: bench/bound_torch.py")
    p.add_argument("--quick", action="store_true", help="20 sets, 20 drops, 1 req/min at κ 30")
    p.add_argument("--write", type=Path, help="replace the 'Detection limit (oracle)' section of this markdown file")
    p.add_argument(
        "--json",
        type=Path,
        help="also write {'tier|κ': p95 minutes at 90%% clean sets} here (for "
        "bench_detection.py --bound); merged into an existing file",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.sets, args.drops, args.tier, args.kappa = 20, 20, args.tier or ["1 req/min"], args.kappa or [30.0]
    tiers, kappas = args.tier or ["0.2 req/s", "1 req/min"], args.kappa or [12.0, 30.0]
    started = time.perf_counter()
    rows = []
    for tier in tiers:
        for kappa in kappas:
            t0 = time.perf_counter()
            mix, known = not args.no_mix, not args.mix_unknown
            maxima, by_q = bound(
                tier,
                kappa,
                args.bad,
                args.sets,
                args.drops,
                args.jobs,
                mix,
                args.device,
                known,
                args.baseline_error,
                args.one_class,
            )
            rows.append((tier, kappa, by_q))
            print(
                f"{tier} κ={kappa:g}: {time.perf_counter() - t0:.0f} s; set maxima p50/p90/p99 "
                f"{quantile(maxima, 0.5):.2f}/{quantile(maxima, 0.9):.2f}/{quantile(maxima, 0.99):.2f}; "
                + "; ".join(f"q{q:g}: h {h:.2f} p50 {a:.1f} p95 {b:.1f} min" for q, (h, a, b) in by_q.items()),
                file=sys.stderr,
            )
    if args.json:
        known = json.loads(args.json.read_text(encoding="utf-8")) if args.json.exists() else {}
        known.update({f"{tier}|{kappa:g}": by_q[0.9][2] for tier, kappa, by_q in rows if 0.9 in by_q})
        args.json.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    body = markdown(rows, args, time.perf_counter() - started)
    print(body)
    if args.write:
        write_section(args.write, body)
    return 0


def markdown(rows: list, args: argparse.Namespace, seconds: float) -> str:
    cmd = " ".join(["--quick"] if args.quick else [f"--sets {args.sets}", f"--drops {args.drops}"])
    mix_text = "" if args.no_mix else ", 30% ± 20% of requests of a second class at 0.85× α"
    if args.mix_unknown and not args.no_mix:
        mix_text += ", weighed at the day's mean share (--mix-unknown)"
    if args.one_class and not args.no_mix:
        mix_text += ", read as one class with the mixture's spread (--one-class)"
    if args.baseline_error:
        mix_text += f"; each route's α off the oracle's baseline by a factor e^N(0, {args.baseline_error:g})"
    lines = [
        f"Measured with `.venv/bin/python bench/bench_detection_bound.py {cmd}"
        + "".join(f' --tier "{t}"' for t in (args.tier or []))
        + "".join(f" --kappa {k:g}" for k in (args.kappa or []))
        + (f" --device {args.device}" if args.device else "")
        + (" --mix-unknown" if args.mix_unknown else "")
        + (f" --baseline-error {args.baseline_error:g}" if args.baseline_error else "")
        + (" --one-class" if args.one_class else "")
        + f"` ({seconds:.0f} s wall, {args.jobs} processes, {platform.machine()}, Python {platform.python_version()}, "
        f"numpy {np.__version__}{_torch_text(args.device)}). SIMULATED requests of the benchmark's model "
        f"(EAGLE-3 profile, k=4, 300 output tokens, ±30% daily traffic swing{mix_text}). "
        f"An exact per-request likelihood-ratio CUSUM ({1 - args.bad:g}·r0 against the 0.95·r0 edge of the zone, "
        f"the Beta spread integrated out), no gates. h(q) is the q-quantile of the highest statistic over "
        f"{args.sets} sets of 30 clean + 30 5%-drift route-days, so q of the sets have no false page; detection over "
        f"{args.drops} injected 20% drops placed as in bench_detection.py.",
        "",
        "| tier | κ | zero false pages in | h | detect p50 | detect p95 |",
        "|---|---|---|---|---|---|",
    ]
    for tier, kappa, by_q in rows:
        for q, (h, p50, p95) in by_q.items():
            lines.append(f"| {tier} | {kappa:g} | {q:.0%} of the sets | {h:.2f} | {p50:.1f} min | {p95:.1f} min |")
    return "\n".join(lines)


def _torch_text(device: str | None) -> str:
    if device is None:
        return ""
    import torch

    name = torch.cuda.get_device_name() if device.startswith("cuda") else "CPU"
    return f", torch {torch.__version__} on {device} ({name})"


def write_section(path: Path, body: str) -> None:
    text = path.read_text(encoding="utf-8")
    pattern = re.compile(r"(## Detection limit \(oracle\)\n)(.*?)(?=\n## )", re.S)
    if not pattern.search(text):
        raise SystemExit(f"{path}: no '## Detection limit (oracle)' section")
    path.write_text(pattern.sub(lambda m: m.group(1) + body + "\n", text, count=1), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
