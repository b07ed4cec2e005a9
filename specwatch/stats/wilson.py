"""Wilson score bounds for a proportion, with an effective sample size (n / φ for overdispersed counts)."""

from __future__ import annotations

import math

Z_95_ONE_SIDED = 1.6449


def wilson_bounds(successes: float, trials: float, z: float = Z_95_ONE_SIDED) -> tuple[float, float]:
    """(lower, upper) Wilson score bounds; (0, 1) when there are no trials. Fractional counts are fine."""
    if trials <= 0:
        return 0.0, 1.0
    p = min(1.0, max(0.0, successes / trials))
    z2 = z * z
    denom = 1.0 + z2 / trials
    centre = (p + z2 / (2.0 * trials)) / denom
    half = z * math.sqrt(p * (1.0 - p) / trials + z2 / (4.0 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)
