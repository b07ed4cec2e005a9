"""Detection horizon: the expected time for a route's detectors to page a drop of a given size, from its evidence rate.

Pure functions, no clocks, no I/O (docs/detection.md §3a has the derivation):

1. Traffic path (`traffic_horizon`). Under the alternative the route accepts r1 = (1 - effect) x r0. Each drafted
   token adds, on average, the Kullback-Leibler-style drift
   g = r1 ln(r_bad / r_ok) + (1 - r1) ln((1 - r_bad) / (1 - r_ok)) nats to the CUSUM, divided by the design effect
   φ(D) of its block of D = rate x block tokens; S reaches h after h / (D g / φ(D)) blocks, i.e.
   T_cusum = h φ(D) / (g x rate) seconds. The page also waits for the excursion's `min_duration` and for the
   confirmation window to hold enough post-drop evidence that its Wilson upper bound falls below r_ok:
   n = z² r1 (1 - r1) / (r_ok - r1)² effective tokens, n φ(D) / rate seconds (at least `confirm_window`). The
   horizon is the longest of the three, plus one block (the verdict waits for the block that crosses to close).
2. Probe path (`probe_horizon`): a drop pages at the second low round in a row, so `rounds` x `every`.
"""

from __future__ import annotations

import math

from specwatch.stats.overdispersion import DispersionModel
from specwatch.stats.wilson import Z_95_ONE_SIDED

HORIZON_DROP = 0.20  # the drop the horizon is quoted for
PROBE_ROUNDS_TO_PAGE = 2  # two low rounds in a row page (probe/verdict.py)


def drift_per_token(r1: float, r_ok: float, r_bad: float) -> float:
    """E[log-likelihood ratio of one drafted token] when the true rate is r1 (before the design effect)."""
    if not 0.0 < r_bad < r_ok < 1.0 or not 0.0 <= r1 <= 1.0:
        return 0.0
    return r1 * math.log(r_bad / r_ok) + (1.0 - r1) * math.log((1.0 - r_bad) / (1.0 - r_ok))


def traffic_horizon(
    *,
    r0: float,
    r0_tested: float,
    drop: float,
    dispersion: DispersionModel,
    threshold: float,
    drafted_per_second: float,
    block_seconds: float,
    min_duration_seconds: float = 0.0,
    confirm_window_seconds: float = 0.0,
    effect: float = HORIZON_DROP,
) -> float:
    """Expected seconds from a drop of `effect` (acceptance r0 -> (1 - effect) r0) to the traffic detector's page.

    `r0_tested` is the r0' the hypotheses are built on (r0 lowered by its standard errors), `drop` the route's
    `detection.drop`, `threshold` the CUSUM's h now, `drafted_per_second` the route's evidence rate. Infinite when
    the route drafts nothing or the drop does not reach the indifference zone's far side.
    """
    if drafted_per_second <= 0.0 or not 0.0 < r0 < 1.0:
        return math.inf
    r1 = (1.0 - effect) * r0
    r_ok, r_bad = (1.0 - drop / 3.0) * r0_tested, (1.0 - drop) * r0_tested
    g = drift_per_token(r1, r_ok, r_bad)
    if g <= 0.0 or r1 >= r_ok:
        return math.inf
    phi = dispersion.at(drafted_per_second * block_seconds)
    cusum = threshold * phi / (g * drafted_per_second)
    confirm_tokens = Z_95_ONE_SIDED**2 * r1 * (1.0 - r1) / (r_ok - r1) ** 2 * phi
    confirm = max(confirm_window_seconds, confirm_tokens / drafted_per_second)
    return max(cusum, min_duration_seconds, confirm) + block_seconds


def probe_horizon(every_seconds: float, rounds: int = PROBE_ROUNDS_TO_PAGE) -> float:
    """Expected seconds from a drop to the canary's page: `rounds` low rounds in a row, one every `every_seconds`."""
    return rounds * every_seconds
