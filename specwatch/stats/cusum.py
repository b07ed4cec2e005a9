"""Sequential evidence that a Bernoulli rate fell from `r_ok` to `r_bad`, corrected for overdispersion.

Drafted tokens are not independent trials (a rejection ends its step; requests differ), so each interval's
log-likelihood ratio is divided by the design effect φ of an interval of its size (`DispersionModel`):
n tokens carry the evidence of n / φ(n) independent ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specwatch.stats.overdispersion import DispersionModel

# Wald's thresholds for a bounded-error verdict after a model change (docs/design/detection-research.md §6):
# α = 1e-3 (false "regressed"), β = 0.05 (missed regression).
SPRT_ALPHA = 1e-3
SPRT_BETA = 0.05
SPRT_UPPER = math.log((1 - SPRT_BETA) / SPRT_ALPHA)  # ≈ +6.9: accept "regressed"
SPRT_LOWER = math.log(SPRT_BETA / (1 - SPRT_ALPHA))  # ≈ -3.0: accept "no regression"


@dataclass(frozen=True)
class LogLikelihoodRatio:
    """ln P(data | r_bad) / P(data | r_ok) of one interval, divided by the interval's design effect."""

    accepted_weight: float  # per accepted token, before the design effect
    rejected_weight: float
    dispersion: DispersionModel

    @classmethod
    def between(cls, r_ok: float, r_bad: float, dispersion: DispersionModel | float) -> "LogLikelihoodRatio":
        if not 0.0 < r_bad < r_ok < 1.0:
            raise ValueError(f"need 0 < r_bad < r_ok < 1, got r_bad={r_bad!r}, r_ok={r_ok!r}")
        if not isinstance(dispersion, DispersionModel):
            dispersion = DispersionModel(max(1.0, dispersion))
        return cls(math.log(r_bad / r_ok), math.log((1.0 - r_bad) / (1.0 - r_ok)), dispersion)

    def __call__(self, accepted: float, drafted: float) -> float:
        rejected = max(0.0, drafted - accepted)
        return (accepted * self.accepted_weight + rejected * self.rejected_weight) / self.dispersion.at(drafted)

    def neutral_rate(self) -> float:
        """The acceptance rate at which the ratio has no drift, r a + (1 - r) b = 0: inside the zone, mid-way."""
        a, b = self.accepted_weight, self.rejected_weight
        return b / (b - a)

    def neutral_spread(self) -> float:
        """Standard deviation of the ratio per effective (drafted / φ) token at `neutral_rate`: a block of D tokens
        has Var(accepted) = φ(D) D r (1 - r), so Σ ℓ over E effective tokens spreads by this x sqrt(E)."""
        r = self.neutral_rate()
        return (self.rejected_weight - self.accepted_weight) * math.sqrt(r * (1.0 - r))


@dataclass
class Cusum:
    """One-sided CUSUM: S = max(0, S + ℓ). Tracks the current excursion (since S last left 0)."""

    statistic: float = 0.0
    excursion_start: float | None = None  # time S left 0
    excursion_tokens: float = 0.0  # drafted tokens seen during the excursion
    cap: float = math.inf  # S never exceeds this, so it drains in bounded time after a recovery

    def update(self, llr: float, drafted: float, now: float) -> float:
        s = self.statistic + llr
        if s <= 0.0:
            self.reset()
            return 0.0
        if self.excursion_start is None:
            self.excursion_start = now
            self.excursion_tokens = 0.0
        self.excursion_tokens += drafted
        self.statistic = min(s, self.cap)
        return self.statistic

    def reset(self) -> None:
        self.statistic = 0.0
        self.excursion_start = None
        self.excursion_tokens = 0.0

    def excursion_seconds(self, now: float) -> float:
        return 0.0 if self.excursion_start is None else now - self.excursion_start


@dataclass
class Sprt:
    """Wald's sequential probability ratio test; `verdict` is "pending", "regressed" or "no_regression"."""

    llr: float = 0.0
    tokens: float = 0.0
    verdict: str = "pending"

    def update(self, llr: float, drafted: float) -> str:
        if self.verdict != "pending":
            return self.verdict
        self.llr += llr
        self.tokens += drafted
        if self.llr >= SPRT_UPPER:
            self.verdict = "regressed"
        elif self.llr <= SPRT_LOWER:
            self.verdict = "no_regression"
        return self.verdict
