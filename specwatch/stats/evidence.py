"""How a route's traffic becomes evidence for the acceptance-drop test: pure statistics, no routes, no config.

- `OpenBlock`: scrape intervals merged into blocks that end at an idle scrape or after the block length, so that
  a block holds about whole requests (the units the dispersion model and the CUSUM weigh);
- `ShortWindow`: the recent accepted/drafted sums the confirmation and resolution bounds are computed on;
- `TrafficRate` and `adapted_threshold`: the CUSUM threshold lowered on quiet routes, so false alarms per hour
  (not per token) stay those of a busy route; `misfit_threshold`: the floor of a route tested against a flat r0.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from specwatch.stats.overdispersion import BLOCK_SECONDS

MAX_WINDOW_SECONDS = 6 * 3600.0  # the short window never reaches further back, however quiet the route
# h bounds false alarms per effective (drafted / φ) token, so per hour they grow with traffic
# (docs/design/detection-research.md §4).
# The configured `cusum_threshold` is h for a route with this many effective tokens per second or more (about
# 350 drafted tokens/s at φ 35); a quieter route uses h - ln(BUSY_EFFECTIVE_TOKENS_PER_SECOND / rate), which
# keeps its expected false alarms per hour those of the busy route, but never less than MIN_ADAPTED_THRESHOLD:
# below it, 5% drifts page at 1 req/min in a quarter of 60-route-day samples (docs/detection.md §5).
BUSY_EFFECTIVE_TOKENS_PER_SECOND = 10.0
MIN_ADAPTED_THRESHOLD = 7.0
TRAFFIC_TIME_CONSTANT = 86400.0  # the drafted-token rate is averaged over about a day (a whole daily cycle)
# The lowering above assumes an in-control route at or above r_ok, where the CUSUM drifts down and an excursion
# reaches h with probability about e^-h. A route tested against a flat r0 (no usable daily profile) whose mix moves
# through the day can sit near the zone's middle for hours (a 5% drift at the hours its low-acceptance requests
# peak): there the CUSUM has no drift and wanders like a random walk, reaching MISFIT_SIGMAS x its spread over
# MISFIT_SECONDS, i.e. MISFIT_SIGMAS x σ_ℓ x sqrt(rate x MISFIT_SECONDS) with σ_ℓ the ratio's standard deviation
# per effective token. Such a route's h is never below that (nor above the configured h), so the floor grows with
# the evidence a misfit stretch holds: at 1 req/min about 7 at κ 12 and the configured 10 at κ 30 (docs/detection.md
# §2.4). 4 h is the part of a day a daily swing holds a route near its low peak (on the benchmark's mix, the low
# class within 2 points of its peak share for about 3.5 h).
MISFIT_SECONDS = 4 * 3600.0
MISFIT_SIGMAS = 2.0


def misfit_threshold(spread: float, effective_tokens_per_second: float | None) -> float:
    """MISFIT_SIGMAS standard deviations of a driftless CUSUM over MISFIT_SECONDS at this evidence rate; `spread`
    is the ratio's standard deviation per effective token (`LogLikelihoodRatio.neutral_spread`). 0 when not known."""
    rate = effective_tokens_per_second
    if rate is None or rate <= 0.0 or spread <= 0.0:
        return 0.0
    return MISFIT_SIGMAS * spread * math.sqrt(rate * MISFIT_SECONDS)


def adapted_threshold(
    h: float, effective_tokens_per_second: float | None, floor: float = MIN_ADAPTED_THRESHOLD
) -> float:
    """h for a route with this many effective tokens per second (None: not known yet, so the busy route's h), never
    below `floor` (MIN_ADAPTED_THRESHOLD, or a flat reference's `misfit_threshold` where that is higher) nor above h."""
    rate = effective_tokens_per_second
    if rate is None or rate >= BUSY_EFFECTIVE_TOKENS_PER_SECOND:
        return h
    lowered = h - math.log(BUSY_EFFECTIVE_TOKENS_PER_SECOND / max(rate, 1e-9))
    return min(h, max(MIN_ADAPTED_THRESHOLD, floor, lowered))


class TrafficRate:
    """Drafted tokens per second, exponentially averaged over `time_constant` seconds."""

    def __init__(self, time_constant: float = TRAFFIC_TIME_CONSTANT) -> None:
        self.time_constant = time_constant
        self.start: float | None = None
        self.last: float | None = None
        self.decayed_tokens = 0.0  # Σ D_i e^{-(last - t_i) / τ}

    def add(self, now: float, drafted: float) -> None:
        if self.start is None or self.last is None:
            self.start = self.last = now
        if now > self.last:
            self.decayed_tokens *= math.exp(-(now - self.last) / self.time_constant)
            self.last = now
        self.decayed_tokens += max(0.0, drafted)

    def per_second(self, now: float, min_seconds: float) -> float | None:
        """The average rate, or None before `min_seconds` of history."""
        if self.start is None or self.last is None or now - self.start < max(min_seconds, 1.0):
            return None
        span = self.time_constant * (1.0 - math.exp(-(now - self.start) / self.time_constant))
        return self.decayed_tokens * math.exp(-(now - self.last) / self.time_constant) / span

    def to_json(self) -> list[float | None]:
        return [self.start, self.last, self.decayed_tokens]

    def restore(self, raw: list[Any]) -> None:
        start, last, tokens = raw
        self.start = None if start is None else float(start)
        self.last = None if last is None else float(last)
        self.decayed_tokens = float(tokens)


class OpenBlock:
    """Intervals merged into blocks that end at an idle scrape or after `seconds` (the same blocks the dispersion
    model is fitted on, stats/overdispersion.py)."""

    def __init__(self, seconds: float = BLOCK_SECONDS) -> None:
        self.seconds = seconds
        self.start: float | None = None
        self.accepted = self.drafted = 0.0

    def add(
        self, now: float, accepted: float, drafted: float, idle: bool = False, start: float | None = None
    ) -> tuple[float, float, float] | None:
        """Add the interval (start, now], `start` being the previous scrape (None: unknown, taken as `now`); return
        (start, accepted, drafted) of the block it closed, if any. A block spans `seconds` from its first interval's
        start: 60 s of 15 s scrapes is four intervals."""
        if drafted > 0:
            if self.start is None:
                self.start = now if start is None else start
            self.accepted += accepted
            self.drafted += drafted
        if self.start is None or self.drafted <= 0 or (not idle and now - self.start < self.seconds):
            return None
        closed = (self.start, self.accepted, self.drafted)
        self.clear()
        return closed

    def clear(self) -> None:
        self.start = None
        self.accepted = self.drafted = 0.0


class ShortWindow:
    """Accepted/drafted sums over the last `seconds`, stretched back to hold at least `min_tokens`."""

    def __init__(self, seconds: float, min_tokens: float) -> None:
        self.seconds, self.min_tokens = seconds, min_tokens
        self._items: deque[tuple[float, float, float]] = deque()
        self.accepted = 0.0
        self.drafted = 0.0
        self.drafted_sq = 0.0  # Σ D_t² of the intervals, for the window's effective size

    def add(self, now: float, accepted: float, drafted: float) -> None:
        if drafted > 0:
            self._items.append((now, accepted, drafted))
            self.accepted += accepted
            self.drafted += drafted
            self.drafted_sq += drafted * drafted
        items = self._items
        while len(items) > 1:
            ts, a, d = items[0]
            age = now - ts
            if age > MAX_WINDOW_SECONDS or (age > self.seconds and self.drafted - d >= self.min_tokens):
                items.popleft()
                self.accepted -= a
                self.drafted -= d
                self.drafted_sq = max(0.0, self.drafted_sq - d * d)
            else:
                break

    def clear(self) -> None:
        self._items.clear()
        self.accepted = self.drafted = self.drafted_sq = 0.0

    def ratio(self) -> float | None:
        return self.accepted / self.drafted if self.drafted > 0 else None
