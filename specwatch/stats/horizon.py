"""Detection horizon: the expected time for a route's detectors to page a drop of a given size, from its evidence rate.

Pure functions, no clocks, no I/O (docs/detection.md §3a has the derivation):

1. Traffic path (`traffic_horizon`). Under the alternative the route accepts r1 = (1 - effect) x r0. Each drafted
   token adds, on average, the Kullback-Leibler-style drift
   g = r1 ln(r_bad / r_ok) + (1 - r1) ln((1 - r_bad) / (1 - r_ok)) nats to the CUSUM, divided by the design effect
   φ(D) of its block of D tokens; with E = Σ D / φ(D) per second (the route's effective evidence rate), S reaches h
   after T_cusum = h / (g x E) seconds. The page also waits for the excursion's `min_duration` and for the
   confirmation window's Wilson upper bound to fall below r_ok (`confirmation_seconds`). The horizon is the longest
   of the three, plus half a block (the verdict waits for the block that crosses h to close).
2. Probe path (`probe_horizon`): a drop pages at the second low round in a row, so `rounds` x `every`.
"""

from __future__ import annotations

import math

from specwatch.stats.overdispersion import DispersionModel
from specwatch.stats.wilson import Z_95_ONE_SIDED

HORIZON_DROP = 0.20  # the drop the horizon is quoted for
PROBE_ROUNDS_TO_PAGE = 2  # two low rounds in a row page (probe/verdict.py)
# GPU-seconds of one round of the built-in set (32 prompts x 128 tokens) at concurrency 1 on an otherwise idle GPU,
# for an 8B model on an H200 (docs/detection.md §9 "Cost"); a route's own cost scales with its step time.
PROBE_ROUND_GPU_SECONDS = 10.0
NEVER_SECONDS = 365 * 86400.0  # a horizon this long reads as "never" (the exported value's cap)


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
    effective_per_second: float | None = None,
    min_duration_seconds: float = 0.0,
    confirm_window_seconds: float = 0.0,
    window_min_tokens: float = 0.0,
    effect: float = HORIZON_DROP,
) -> float:
    """Expected seconds from a drop of `effect` (acceptance r0 -> (1 - effect) r0) to the traffic detector's page.

    `r0_tested` is the r0' the hypotheses are built on (r0 lowered by its standard errors), `drop` the route's
    `detection.drop`, `threshold` the CUSUM's h now, `drafted_per_second` the route's drafted-token rate and
    `effective_per_second` the same blocks' Σ D / φ(D) per second (the design effect of the blocks the route really
    closes, which end at idle scrapes); without it, blocks of rate x `block_seconds` tokens. Infinite when
    the route drafts nothing or the drop does not reach the indifference zone's far side.
    """
    if drafted_per_second <= 0.0 or not 0.0 < r0 < 1.0:
        return math.inf
    r1 = (1.0 - effect) * r0
    r_ok, r_bad = (1.0 - drop / 3.0) * r0_tested, (1.0 - drop) * r0_tested
    g = drift_per_token(r1, r_ok, r_bad)
    if g <= 0.0 or r1 >= r_ok:
        return math.inf
    if effective_per_second is not None and effective_per_second > 0.0:
        phi = max(1.0, drafted_per_second / effective_per_second)  # the blocks' own mix of sizes
    else:
        phi = dispersion.at(drafted_per_second * block_seconds)
    cusum = threshold * phi / (g * drafted_per_second)
    confirm = confirmation_seconds(
        r0=r0,
        r1=r1,
        r_ok=r_ok,
        phi=phi,
        drafted_per_second=drafted_per_second,
        window_seconds=confirm_window_seconds,
        window_min_tokens=window_min_tokens,
    )
    return max(cusum, min_duration_seconds, confirm) + block_seconds / 2.0


def confirmation_seconds(
    *,
    r0: float,
    r1: float,
    r_ok: float,
    phi: float,
    drafted_per_second: float,
    window_seconds: float,
    window_min_tokens: float,
) -> float:
    """Seconds after the drop until the confirmation window's Wilson upper bound is below r_ok.

    The window spans L = max(`window_seconds`, `window_min_tokens` / rate) and holds n = L x rate / φ effective
    tokens; t seconds into the drop its mean is r0 - (r0 - r1) t / L. It confirms once that mean is z σ below r_ok
    (σ = sqrt(r1 (1 - r1) / n)); a window whose n is too small even when all of it is post-drop needs
    z² r1 (1 - r1) / (r_ok - r1)² effective tokens instead.
    """
    if drafted_per_second <= 0.0 or r_ok <= r1:
        return math.inf
    span = max(window_seconds, window_min_tokens / drafted_per_second)
    n = span * drafted_per_second / phi
    margin = Z_95_ONE_SIDED * math.sqrt(r1 * (1.0 - r1) / n)
    share = (r0 - r_ok + margin) / (r0 - r1)
    if share <= 1.0:
        return max(0.0, share) * span
    needed = Z_95_ONE_SIDED**2 * r1 * (1.0 - r1) / (r_ok - r1) ** 2
    return needed * phi / drafted_per_second


def probe_horizon(every_seconds: float, rounds: int = PROBE_ROUNDS_TO_PAGE) -> float:
    """Expected seconds from a drop to the canary's page: `rounds` low rounds in a row, one every `every_seconds`."""
    return rounds * every_seconds


def human_seconds(seconds: float) -> str:
    """A horizon as an operator reads it: 45s, 3m, 2.5h, 4d, or ∞ (a year or more)."""
    if seconds >= NEVER_SECONDS:
        return "∞"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size:
            value = seconds / size
            return f"{value:.0f}{unit}" if value >= 10 or value == round(value) else f"{value:.1f}{unit}"
    return f"{seconds:.0f}s"
