"""The design effect φ of drafted tokens: how much more a ratio varies than a binomial of the same size.

φ̂ = Σ_t D_t (r_t - r̄)² / ((n - 1) r̄ (1 - r̄)), over n blocks t of D_t drafted tokens and ratio r_t
(detection.md §3). Intervals are merged into blocks of at least `block_seconds` so that one request spread
over two scrapes does not hide its own correlation. Kept as running sums: O(1) per interval, a few floats
to persist.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BLOCK_SECONDS = 60.0
PHI_MIN, PHI_MAX = 1.0, 1000.0


@dataclass
class DispersionEstimator:
    blocks: int = 0
    sum_drafted: float = 0.0
    sum_accepted: float = 0.0
    sum_sq_over_drafted: float = 0.0  # Σ A_t² / D_t
    # the block being filled
    open_start: float | None = None
    open_drafted: float = 0.0
    open_accepted: float = 0.0
    block_seconds: float = BLOCK_SECONDS

    def add(self, now: float, accepted: float, drafted: float) -> None:
        if drafted <= 0:
            return
        if self.open_start is None:
            self.open_start = now
        self.open_drafted += drafted
        self.open_accepted += accepted
        if now - self.open_start >= self.block_seconds:
            self.blocks += 1
            self.sum_drafted += self.open_drafted
            self.sum_accepted += self.open_accepted
            self.sum_sq_over_drafted += self.open_accepted ** 2 / self.open_drafted
            self.open_start, self.open_drafted, self.open_accepted = None, 0.0, 0.0

    def estimate(self) -> float | None:
        """φ̂ clamped to [1, 1000], or None with fewer than 3 closed blocks or a degenerate ratio."""
        if self.blocks < 3 or self.sum_drafted <= 0:
            return None
        r = self.sum_accepted / self.sum_drafted
        if not 0.0 < r < 1.0:
            return None
        spread = self.sum_sq_over_drafted - r * self.sum_accepted  # Σ D_t (r_t - r̄)²
        return min(PHI_MAX, max(PHI_MIN, spread / ((self.blocks - 1) * r * (1.0 - r))))

    def conservative_estimate(self) -> float | None:
        """φ̂ inflated by one standard error of a variance estimate (√(2/(n-1))): few blocks err high."""
        phi = self.estimate()
        if phi is None:
            return None
        return min(PHI_MAX, phi * (1.0 + math.sqrt(2.0 / (self.blocks - 1))))
