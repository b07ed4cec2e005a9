"""SIMULATED acceptance traces: cumulative counters of one route, one scrape per `interval`
(docs/design/detection-research.md §8).

The model, per request: a scale s = u / m with u ~ Beta(κm, κ(1-m)) (request heterogeneity) multiplies the
profile's conditional acceptance α_j; each verify step accepts a prefix (step j is tried only if j-1 was
accepted), so the number of steps reaching position j is Binomial(steps reaching j-1, α_j). Output length
is log-normal; the number of steps is tokens / (1 + accepted per step). A request runs for steps x
`step_seconds` from a uniform arrival time, so a long one spans several scrapes (`straddle`), as on a real engine.

One latent scale per request drives all of its positions, so per-position acceptance is correlated within a
request (a good request is good at every position) and each step accepts a prefix.

Request mix: with `mix_share` > 0 a request is of a second class (its α_j scaled by `mix_scale`, e.g. code
edits beside chat) with probability mix_share + mix_swing·sin(2πt/day + phase): the route's mean acceptance
swings daily by a few percent with no regression (a confounder that must not page).

`running` at a scrape is the number of requests in flight at that instant (0 when idle): the requests drawn
one by one whose run crosses the scrape, plus, for busy intervals, a Poisson draw of those in flight.

Speed: an interval with few requests of a class draws each request exactly. A busy interval (more than
EXACT_MAX requests of a class) draws the interval's mean scale from its normal approximation and applies a
linearised, Monte Carlo calibrated p_j(s) (mean and slope over the Beta), so 30 days at 2 req/s take a
second or two.

Traffic is Poisson with an optional daily swing; drops scale every α_j so that the mean acceptance ratio
falls by the requested fraction; a model change renames the model and restarts the counters from zero.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterator

from specwatch.offline.replay import TraceSample

# Unconditional per-position acceptance p_j (share of drafts whose j-th token is accepted).
PROFILES: dict[str, tuple[float, ...]] = {
    "eagle": (0.68, 0.39, 0.20, 0.10, 0.06, 0.03, 0.02),  # vLLM dynamic SD example, EAGLE-1
    "eagle3": (0.76, 0.54, 0.39, 0.28, 0.21, 0.15, 0.12),  # vLLM dynamic SD example, EAGLE-3
    "mtp": (0.92, 0.68, 0.38),  # arXiv 2601.11580
    "ngram": (0.543, 0.357, 0.264),  # vllm-project/vllm#19254
}
BETA_MEAN = 0.7  # m: the mean of u; s = u / m has mean 1
MAX_ALPHA = 0.98
LENGTH_SIGMA = 0.5  # log-normal sigma of output lengths
EXACT_MAX = 8  # intervals with at most this many requests (of a class) are drawn request by request
_MC_DRAWS = 2048
DAY = 86400.0


@dataclass(frozen=True)
class Drop:
    start: float  # seconds from the trace start
    ratio: float  # relative fall of the mean acceptance ratio, e.g. 0.20
    end: float | None = None  # None: until the end of the trace


@dataclass(frozen=True)
class ModelChange:
    at: float  # seconds from the trace start
    model_name: str


@dataclass(frozen=True)
class TraceSpec:
    route: str = "chat"
    model_name: str = "model-a"
    profile: str = "eagle3"
    k: int = 4
    rate: float = 2.0  # requests per second, daily mean
    start: float = 1_700_000_000.0  # unix seconds of the first scrape
    duration: float = DAY
    interval: float = 15.0  # scrape interval
    kappa: float = 30.0  # Beta concentration: lower = more request heterogeneity
    mean_tokens: float = 300.0  # mean output tokens per request
    diurnal: float = 0.3  # relative amplitude of the daily traffic swing
    step_seconds: float = 0.02  # one verify step: a request runs steps x this long (and the running gauge)
    straddle: bool = True  # a request's steps fall into every scrape interval its run overlaps
    mix_share: float = 0.0  # daily mean share of the second request class (0: one class)
    mix_swing: float = 0.0  # amplitude of its daily swing
    mix_scale: float = 0.85  # the second class's α_j relative to the first's
    mix_phase: float = 1.0  # radians: the mix peaks at another time of day than the traffic
    drops: tuple[Drop, ...] = ()
    changes: tuple[ModelChange, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if self.k < 1 or self.rate < 0 or self.interval <= 0 or self.duration <= 0 or self.kappa <= 0:
            raise ValueError("need k >= 1, rate >= 0, interval > 0, duration > 0 and kappa > 0")
        conditional_alphas(self.profile, self.k)  # raises on an unknown profile
        if not 0.0 <= self.mix_share - abs(self.mix_swing) <= self.mix_share + abs(self.mix_swing) <= 1.0:
            raise ValueError("need 0 <= mix_share ± mix_swing <= 1")

    def mix_at(self, t: float) -> float:
        """Share of the second request class at t seconds from the start."""
        return self.mix_share + self.mix_swing * math.sin(2 * math.pi * t / DAY + self.mix_phase)

    def drop_factor(self, t: float) -> float:
        """The factor on every α_j at t (the product of the drops ongoing then)."""
        scale = 1.0
        for d in self.drops:
            if d.start <= t and (d.end is None or t < d.end):
                scale *= drop_scale(self.profile, self.k, self.kappa, d.ratio)
        return scale


@dataclass(frozen=True)
class _Acceptance:
    """p_j(s) for one profile, k, κ and drop scale: exact per request, or linearised around s = 1."""

    alphas: tuple[float, ...]  # conditional α_j before the request scale
    mean_p: tuple[float, ...]  # E[p_j] over s, weighted by steps per token (as drafted tokens weigh them)
    slope_p: tuple[float, ...]  # weighted Cov(p_j, s) / Var(s)
    scale_sd: float  # sd of s
    steps_per_token: float = 1.0  # E[1 / (1 + Σ p_j(s))]

    def positions(self, s: float) -> list[float]:
        out, p = [], 1.0
        for a in self.alphas:
            p *= min(MAX_ALPHA, max(0.0, a * s))
            out.append(p)
        return out


def conditional_alphas(profile: str, k: int) -> tuple[float, ...]:
    """The profile's conditional α_j for j = 1..k (the last one repeats when k exceeds the profile)."""
    try:
        p = PROFILES[profile]
    except KeyError:
        raise ValueError(f"unknown profile {profile!r} (known: {', '.join(PROFILES)})") from None
    alphas = [p[0]] + [p[j] / p[j - 1] for j in range(1, len(p))]
    return tuple((alphas + [alphas[-1]] * k)[:k])


@lru_cache(maxsize=64)
def _acceptance(profile: str, k: int, kappa: float, scale: float) -> _Acceptance:
    rng = random.Random(12345)  # fixed: the table is a property of the model, not of the trace
    a, b = kappa * BETA_MEAN, kappa * (1.0 - BETA_MEAN)
    draws = [rng.betavariate(a, b) / BETA_MEAN for _ in range(_MC_DRAWS)]
    alphas = tuple(x * scale for x in conditional_alphas(profile, k))
    acc = _Acceptance(alphas, (), (), 0.0)
    rows = [acc.positions(s) for s in draws]
    # A request of T tokens runs T / (1 + Σp) steps: low-acceptance requests draft more tokens.
    weights = [1.0 / (1.0 + sum(r)) for r in rows]
    total = sum(weights)
    mean_s = sum(w * s for w, s in zip(weights, draws)) / total
    var_s = sum(w * (s - mean_s) ** 2 for w, s in zip(weights, draws)) / total
    mean_p = tuple(sum(w * r[j] for w, r in zip(weights, rows)) / total for j in range(k))
    slope = tuple(
        sum(w * (s - mean_s) * (r[j] - mean_p[j]) for w, s, r in zip(weights, draws, rows)) / total / var_s
        for j in range(k)
    )
    return _Acceptance(alphas, mean_p, slope, math.sqrt(var_s), total / len(draws))


def mean_acceptance_ratio(profile: str, k: int, kappa: float, scale: float = 1.0) -> float:
    """Long-run accepted / drafted tokens of the model."""
    return sum(_acceptance(profile, k, kappa, scale).mean_p) / k


@lru_cache(maxsize=256)
def drop_scale(profile: str, k: int, kappa: float, ratio: float) -> float:
    """The factor on every α_j that lowers the mean acceptance ratio by `ratio` (bisection)."""
    target = (1.0 - ratio) * mean_acceptance_ratio(profile, k, kappa)
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if mean_acceptance_ratio(profile, k, kappa, mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


class _Sampler:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def poisson(self, mean: float) -> int:
        if mean <= 0:
            return 0
        if mean > 30:
            return max(0, round(self.rng.gauss(mean, math.sqrt(mean))))
        limit, n, p = math.exp(-mean), 0, self.rng.random()
        while p > limit:
            n += 1
            p *= self.rng.random()
        return n

    def binomial(self, n: int, p: float) -> int:
        if n <= 0 or p <= 0.0:
            return 0
        if p >= 1.0:
            return n
        mean, var = n * p, n * p * (1.0 - p)
        if var > 9.0:
            return min(n, max(0, round(self.rng.gauss(mean, math.sqrt(var)))))
        if p > 0.5:
            return n - self.binomial(n, 1.0 - p)
        # waiting times between successes are geometric: about n·p draws
        log_q, count, i = math.log(1.0 - p), 0, 0
        rnd = self.rng.random
        while True:
            i += int(math.log(1.0 - rnd()) / log_q) + 1
            if i > n:
                return count
            count += 1


@dataclass
class _Counters:
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: list[int] = field(default_factory=list)


def generate(spec: TraceSpec) -> Iterator[TraceSample]:
    """Yield one cumulative sample per scrape interval."""
    rng = _Sampler(spec.seed)
    gauss = rng.rng.gauss
    k, model = spec.k, spec.model_name
    counters = _Counters(per_pos=[0] * k)
    sigma = LENGTH_SIGMA
    mu = math.log(spec.mean_tokens) - sigma * sigma / 2
    len_sd = spec.mean_tokens * math.sqrt(math.exp(sigma * sigma) - 1.0)
    changes = sorted(spec.changes, key=lambda c: c.at)
    pending: deque[list[tuple[int, list[float]]]] = deque()  # steps of running requests, per coming interval
    n_intervals = int(spec.duration // spec.interval)
    for i in range(1, n_intervals + 1):
        t = i * spec.interval
        while changes and changes[0].at <= t:
            model = changes.pop(0).model_name
            counters = _Counters(per_pos=[0] * k)  # the engine restarted with the new model
            pending.clear()  # and its running requests died with it
        scale = spec.drop_factor(t)
        rate = spec.rate * (1.0 + spec.diurnal * math.sin(2 * math.pi * t / DAY))
        n = rng.poisson(rate * spec.interval)
        second = rng.binomial(n, spec.mix_at(t)) if spec.mix_share > 0 else 0
        steps_total, reach, in_flight = 0, [0] * k, 0
        for steps, p in pending.popleft() if pending else ():
            _chain(rng, steps, p, reach)
            steps_total += steps
        for count, class_scale in ((n - second, 1.0), (second, spec.mix_scale)):
            if count <= 0:
                continue
            acc = _acceptance(spec.profile, k, spec.kappa, round(scale * class_scale, 6))
            if count <= EXACT_MAX:
                for _ in range(count):
                    p, steps = _draw_request(rng, acc, spec.kappa, mu, sigma)
                    if spec.straddle:
                        steps = _spread(rng, steps, p, spec, pending)
                    _chain(rng, steps, p, reach)
                    steps_total += steps
            else:
                # token-weighted mean of the scales: lengths are unequal, so its variance is e^σ² / n, not 1 / n
                s_bar = 1.0 + acc.scale_sd * math.sqrt(math.exp(sigma * sigma) / count) * gauss(0.0, 1.0)
                p = [min(1.0, max(0.0, m + g * (s_bar - 1.0))) for m, g in zip(acc.mean_p, acc.slope_p)]
                for j in range(1, k):
                    p[j] = min(p[j], p[j - 1])
                tokens = max(8.0 * count, count * spec.mean_tokens + math.sqrt(count) * len_sd * gauss(0.0, 1.0))
                steps = max(count, round(tokens * acc.steps_per_token))
                _chain(rng, steps, p, reach)
                steps_total += steps
                # these requests are not followed one by one: those in flight at the scrape, by Little's law
                in_flight += rng.poisson(
                    count / spec.interval * spec.mean_tokens * acc.steps_per_token * spec.step_seconds
                )
        counters.drafts += steps_total
        counters.draft_tokens += steps_total * k
        counters.accepted += sum(reach)
        for j in range(k):
            counters.per_pos[j] += reach[j]
        running = in_flight + (len(pending[0]) if pending else 0)  # requests with steps after this scrape
        yield TraceSample(
            ts=spec.start + t,
            route=spec.route,
            model_name=model,
            drafts=counters.drafts,
            draft_tokens=counters.draft_tokens,
            accepted_tokens=counters.accepted,
            accepted_per_pos=tuple(counters.per_pos),
            running=running,
        )


@dataclass(frozen=True)
class RequestDraw:
    """One SIMULATED request of `request_stream`: its arrival and its own draft counts."""

    t: float  # seconds from the stream start
    accepted: int  # accepted draft tokens
    drafted: int  # drafted tokens (steps x k)


def request_stream(spec: TraceSpec) -> Iterator[RequestDraw]:
    """The requests behind `generate(spec)`, one by one: the same model (heterogeneity, lengths, prefix
    acceptance, daily swing, drops), with Poisson arrivals in continuous time instead of per interval.

    For bounds that need what a scrape never shows, e.g. the detection limit of a detector that could see
    every request on its own (bench/bench_detection_bound.py). Model changes are ignored.
    """
    rng = _Sampler(spec.seed)
    sigma = LENGTH_SIGMA
    mu = math.log(spec.mean_tokens) - sigma * sigma / 2
    peak = spec.rate * (1.0 + abs(spec.diurnal))
    t = 0.0
    while peak > 0:
        t += rng.rng.expovariate(peak)  # thinning: a Poisson process at the peak rate, kept at rate(t) / peak
        if t >= spec.duration:
            return
        if rng.rng.random() * peak > spec.rate * (1.0 + spec.diurnal * math.sin(2 * math.pi * t / DAY)):
            continue
        scale = spec.drop_factor(t)
        if spec.mix_share > 0 and rng.rng.random() < spec.mix_at(t):
            scale *= spec.mix_scale
        acc = _acceptance(spec.profile, spec.k, spec.kappa, round(scale, 6))
        reach = [0] * spec.k
        p, steps = _draw_request(rng, acc, spec.kappa, mu, sigma)
        _chain(rng, steps, p, reach)
        yield RequestDraw(t, sum(reach), steps * spec.k)


def _draw_request(rng: _Sampler, acc: _Acceptance, kappa: float, mu: float, sigma: float) -> tuple[list[float], int]:
    """One request's p_j (from its own scale) and its number of verify steps (from its log-normal length)."""
    p = acc.positions(rng.rng.betavariate(kappa * BETA_MEAN, kappa * (1.0 - BETA_MEAN)) / BETA_MEAN)
    tokens = min(8192.0, max(8.0, math.exp(rng.rng.gauss(mu, sigma))))
    return p, max(1, round(tokens / (1.0 + sum(p))))


def _spread(
    rng: _Sampler, steps: int, p: list[float], spec: TraceSpec, pending: deque[list[tuple[int, list[float]]]]
) -> int:
    """Split a request that arrived at a uniform time in this interval over the scrapes its run overlaps.

    Queues the steps that fall into later intervals in `pending` and returns those of this one. Two scrapes of
    one request are then correlated, as on a real engine: what detectors that weigh scrapes must cope with.
    """
    until_scrape = rng.rng.random() * spec.interval
    duration = steps * spec.step_seconds
    if duration <= until_scrape:
        return steps
    now = round(steps * until_scrape / duration)
    left, per_interval = steps - now, max(1, round(steps * spec.interval / duration))
    j = 0
    while left > 0:
        if j == len(pending):
            pending.append([])
        part = min(left, per_interval)
        pending[j].append((part, p))
        left -= part
        j += 1
    return now


def _chain(rng: _Sampler, steps: int, p: list[float], reach: list[int]) -> None:
    """Add to `reach[j]` the steps whose first j+1 tokens were accepted (prefix acceptance)."""
    prev_count, prev_p = steps, 1.0
    for j, pj in enumerate(p):
        if prev_count <= 0 or prev_p <= 0:
            break
        count = rng.binomial(prev_count, min(1.0, pj / prev_p))
        reach[j] += count
        prev_count, prev_p = count, pj
