"""The design effect φ of drafted tokens: how much more a ratio varies than a binomial of the same size.

Mean design effect: φ̂ = Σ_t D_t (r_t - r̄)² / ((n - 1) r̄ (1 - r̄)), over n blocks t of D_t drafted tokens and
ratio r_t (docs/design/detection-research.md §3). Intervals are merged into blocks that end at an idle scrape
(nothing running or waiting: every request in the block has finished, none is split between two blocks) or, on a
route that is never idle, once it spans `block_seconds` from the start of its first interval (the scrape before
it), so that one request spread over two scrapes does not hide its own correlation. On a quiet route a block is
then one request or a few whole ones: the beta-binomial unit. The route's `detection.block` sets `block_seconds`,
so φ is fitted on the blocks the CUSUM weighs.

Dispersion model: φ is not one number. A block of many requests varies like a binomial scaled by φ, but a
block of one request varies by that request's own acceptance however long it is, so on a quiet route a
block's design effect grows with its size: E[D_t (r_t - r̄)² / (r̄ (1 - r̄))] = φ0 + β·D_t. The line is
fitted over the blocks (least squares, φ0 >= 1, β >= 0); on a busy route β comes out near 0 and φ0 near φ̂.
Weighting each block by 1 / (φ0 + β·D_t) instead of 1 / φ̂ stops one long request from carrying the
evidence of many (a heavy tail that pages on noise) and gives short ones their due.

Kept as running sums: O(1) per interval, a few floats to persist.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BLOCK_SECONDS = 60.0  # the default block length (`detection.block`); baselines stored without one used it
PHI_MIN, PHI_MAX = 1.0, 1000.0


@dataclass(frozen=True)
class DispersionModel:
    """Design effect of a block of `drafted` tokens: intercept + slope x drafted (slope 0: a plain φ)."""

    intercept: float
    slope: float = 0.0

    def at(self, drafted: float) -> float:
        return min(PHI_MAX, max(PHI_MIN, self.intercept + self.slope * max(0.0, drafted)))


@dataclass(frozen=True)
class ClosedBlock:
    """A block as the estimator closed it: (start, end], its accepted and drafted tokens."""

    start: float
    end: float
    accepted: float
    drafted: float


@dataclass
class DispersionEstimator:
    blocks: int = 0
    sum_drafted: float = 0.0
    sum_accepted: float = 0.0
    sum_sq_over_drafted: float = 0.0  # Σ A_t² / D_t
    # for the dispersion model (a line in D_t); 0 in state saved before it existed
    sum_drafted_sq: float = 0.0  # Σ D_t²
    sum_accepted_sq: float = 0.0  # Σ A_t²
    sum_cross: float = 0.0  # Σ A_t D_t
    # the block being filled
    open_start: float | None = None
    open_drafted: float = 0.0
    open_accepted: float = 0.0
    block_seconds: float = BLOCK_SECONDS

    def add(
        self, now: float, accepted: float, drafted: float, idle: bool = False, start: float | None = None
    ) -> ClosedBlock | None:
        """Add the interval (start, now]; `start` is the previous scrape (None: unknown, taken as `now`).
        `idle`: nothing ran or waited at its end, so the open block holds whole requests. Returns the block this
        interval closed, if any."""
        if drafted > 0:
            if self.open_start is None:
                self.open_start = now if start is None else start
            self.open_drafted += drafted
            self.open_accepted += accepted
        if (
            self.open_start is not None
            and self.open_drafted > 0
            and (idle or now - self.open_start >= self.block_seconds)
        ):
            a, d = self.open_accepted, self.open_drafted
            self.blocks += 1
            self.sum_drafted += d
            self.sum_accepted += a
            self.sum_sq_over_drafted += a * a / d
            self.sum_drafted_sq += d * d
            self.sum_accepted_sq += a * a
            self.sum_cross += a * d
            closed = ClosedBlock(self.open_start, now, a, d)
            self.open_start, self.open_drafted, self.open_accepted = None, 0.0, 0.0
            return closed
        return None

    def _ratio(self) -> float | None:
        if self.blocks < 3 or self.sum_drafted <= 0:
            return None
        r = self.sum_accepted / self.sum_drafted
        return r if 0.0 < r < 1.0 else None

    def estimate(self) -> float | None:
        """φ̂ clamped to [1, 1000], or None with fewer than 3 closed blocks or a degenerate ratio."""
        r = self._ratio()
        if r is None:
            return None
        spread = self.sum_sq_over_drafted - r * self.sum_accepted  # Σ D_t (r_t - r̄)²
        return min(PHI_MAX, max(PHI_MIN, spread / ((self.blocks - 1) * r * (1.0 - r))))

    def _inflation(self) -> float:
        return variance_inflation(self.blocks)

    def conservative_estimate(self) -> float | None:
        """φ̂ inflated by one standard error of a variance estimate: few blocks err high."""
        phi = self.estimate()
        return None if phi is None else min(PHI_MAX, phi * self._inflation())

    def model(self) -> DispersionModel | None:
        """The fitted line φ0 + β·D, inflated like `conservative_estimate`; a plain φ̂ when no line fits."""
        phi = self.estimate()
        r = self._ratio()
        if phi is None or r is None:
            return None
        n = self.blocks
        var = r * (1.0 - r)
        s_d, s_dd = self.sum_drafted, self.sum_drafted_sq
        # y_t = D_t (r_t - r̄)² / var = (A²/D - 2 r A + r² D) / var, and y_t D_t likewise, from the sums
        s_y = (self.sum_sq_over_drafted - 2 * r * self.sum_accepted + r * r * s_d) / var
        s_yd = (self.sum_accepted_sq - 2 * r * self.sum_cross + r * r * s_dd) / var
        return dispersion_line(n, s_d, s_dd, s_y, s_yd, phi, self._inflation(), n / (n - 1))  # r̄ from the same blocks


def variance_inflation(blocks: int) -> float:
    """One standard error of a variance estimate from `blocks` blocks (√(2/(n-1))): few blocks err high."""
    return 1.0 + math.sqrt(2.0 / (blocks - 1))


def dispersion_line(
    n: int, s_d: float, s_dd: float, s_y: float, s_yd: float, phi: float, inflate: float, dof: float
) -> DispersionModel:
    """The line φ0 + β·D fitted by least squares to y_t = D_t (r_t - r̂_t)² / (r̄ (1 - r̄)) over n blocks (sums Σ D,
    Σ D², Σ y, Σ y·D), φ0 >= 1 and β >= 0, scaled by `dof` (the reference r̂ was fitted on the same blocks) and
    `inflate`; the plain `phi` (inflated) when the blocks do not determine a rising line."""
    spread_d = n * s_dd - s_d * s_d
    if s_dd <= 0 or spread_d <= 1e-9 * n * s_dd:
        return DispersionModel(phi * inflate)
    slope = (n * s_yd - s_d * s_y) / spread_d
    intercept = (s_y - slope * s_d) / n
    if slope <= 0:
        return DispersionModel(phi * inflate)
    if intercept < PHI_MIN:  # the line through (0, 1): no block is less dispersed than a binomial
        intercept, slope = PHI_MIN, max(0.0, (s_yd * dof - PHI_MIN * s_d) / s_dd)
    else:
        intercept, slope = intercept * dof, slope * dof
    return DispersionModel(min(PHI_MAX, intercept * inflate), slope * inflate)
