"""Reset-safe counter arithmetic, shared by the daemon and offline replay.

An engine restart shows as a value decrease or as a new `_created` timestamp. Either way the increase
since the last sample is the new value itself (the counter started again from 0), never negative, and the
corrected running total continues from where it was, so exported totals never go backwards.

A sample that cannot be true (`check()`: not finite, negative, beyond what a float counts exactly, or grown
faster than any engine works) is rejected: nothing of it is stored, and the next good sample's increase is
taken from the last good one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Why a counter sample was rejected: the `reason` label of specwatch_route_rejected_samples_total, a closed set.
# accepted_over_drafted: an engine's accepted draft tokens above its drafted ones (checked in tracking/routes.py).
REJECT_REASONS = ("non_finite", "negative", "too_large", "too_fast", "accepted_over_drafted")
# 2^53, the largest count a float holds exactly: at a million tokens per second a counter takes 285 years to reach
# it, so a larger value is garbage (a wrapped or uninitialised 64-bit counter reads about 1.8e19).
MAX_COUNTER_VALUE = 2.0**53
# No engine grows a counter (tokens, drafts, steps, seconds of step time) by a billion per second: a whole GPU node
# decodes a few hundred thousand tokens per second. Garbage jumps by many orders of magnitude more.
MAX_INCREASE_PER_SECOND = 1e9
# Intervals shorter than this (two samples in the same second, or a clock set back) are bounded as this long.
MIN_INTERVAL_SECONDS = 1.0


@dataclass
class ResetSafeCounter:
    """Follows one engine counter. `update()` returns the increase since the previous good sample."""

    last_value: float | None = None
    last_created: float | None = None
    last_ts: float | None = None  # when last_value was sampled (None: not known)
    total: float = 0.0  # corrected cumulative value
    resets: int = 0

    def check(
        self, value: float, created: float | None = None, ts: float | None = None, restarted: bool = False
    ) -> str | None:
        """Why `value` cannot be this counter's next sample (one of REJECT_REASONS), or None when it can."""
        if not math.isfinite(value):
            return "non_finite"
        if value < 0:
            return "negative"
        if value > MAX_COUNTER_VALUE:
            return "too_large"
        if self.last_value is not None and ts is not None and self.last_ts is not None:
            seconds = max(MIN_INTERVAL_SECONDS, ts - self.last_ts)
            if self._increase(value, created, restarted)[0] > MAX_INCREASE_PER_SECOND * seconds:
                return "too_fast"
        return None

    def update(
        self, value: float, created: float | None = None, ts: float | None = None, restarted: bool = False
    ) -> float:
        """`restarted`: the caller knows the engine restarted (another of its counters went back), so this
        counter started again from 0 too, even if its new value is above its last."""
        if self.check(value, created, ts, restarted) is not None:
            return 0.0
        if self.last_value is None:
            # First sight: adopt the value as the starting point; its history predates us.
            self.last_value, self.last_created, self.last_ts = value, created, ts
            self.total = value
            return 0.0
        increase, restarted = self._increase(value, created, restarted)
        if restarted:
            self.resets += 1
        self.last_value, self.last_created, self.last_ts = value, created, ts
        self.total += increase
        return increase

    def went_back(self, value: float, created: float | None = None) -> bool:
        """Whether `value` (with `created`) shows a restart since the last sample: lower, or a new `_created`."""
        if self.last_value is None or not math.isfinite(value):
            return False
        return self._increase(value, created)[1]

    def _increase(self, value: float, created: float | None, restarted: bool = False) -> tuple[float, bool]:
        """(increase since the last good sample, whether the counter restarted in between)."""
        assert self.last_value is not None
        restarted = (
            restarted
            or value < self.last_value
            or (created is not None and self.last_created is not None and created != self.last_created)
        )
        return (value if restarted else value - self.last_value), restarted
