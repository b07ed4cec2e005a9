"""Reset-safe counter arithmetic, shared by the daemon and offline replay.

An engine restart shows as a value decrease or as a new `_created` timestamp. Either way the increase
since the last sample is the new value itself (the counter started again from 0), never negative, and the
corrected running total continues from where it was, so exported totals never go backwards.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ResetSafeCounter:
    """Follows one engine counter. `update()` returns the increase since the previous sample."""

    last_value: float | None = None
    last_created: float | None = None
    total: float = 0.0  # corrected cumulative value
    resets: int = 0

    def update(self, value: float, created: float | None = None, restarted: bool = False) -> float:
        """`restarted`: the caller knows the engine restarted (another of its counters went back), so this
        counter started again from 0 too, even if its new value is above its last."""
        if value != value or value < 0:  # NaN or negative: not a counter value; ignore the sample
            return 0.0
        if self.last_value is None:
            # First sight: adopt the value as the starting point; its history predates us.
            self.last_value, self.last_created = value, created
            self.total = value
            return 0.0
        restarted = restarted or self.went_back(value, created)
        increase = value if restarted else value - self.last_value
        if restarted:
            self.resets += 1
        self.last_value, self.last_created = value, created
        self.total += increase
        return increase

    def went_back(self, value: float, created: float | None = None) -> bool:
        """Whether `value` (with `created`) shows a restart since the last sample: lower, or a new `_created`."""
        if self.last_value is None or value != value:
            return False
        return value < self.last_value or (
            created is not None and self.last_created is not None and created != self.last_created
        )
