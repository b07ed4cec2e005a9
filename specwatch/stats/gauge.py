"""Drop detection from acceptance *gauges* (no token counts): SGLang < 0.5.13 and vLLM V0.

A gauge reading is a ratio with no sample size, so the Bernoulli likelihood of `cusum` cannot be used. What is
left is the spread of the readings themselves:

- interval gauges (SGLang < 0.5.13: the mean over the last `--decode-log-interval` decode steps, read at each
  scrape with requests running): readings are merged into 1-minute blocks (weighted by running requests,
  as the tracker weighs them); the baseline is the mean of the block means and their variance σ² is learned
  from the same blocks, inflated by one standard error of a variance estimate and by the blocks' lag-1
  autocorrelation (`long_run_factor`);
- lifetime gauges (vLLM V0: accepted / drafted since the engine started): the reading itself is the best
  estimate of everything since the start, so the baseline is the latest reading and σ is the floor below.
  A drop moves a lifetime ratio only by the share of the traffic since the drop, so it pages late on an
  engine that ran long before the drop, and at once on a restart that brought the regression (a model or
  draft change restarts the engine, which is when regressions arrive).

Evidence is a Gaussian CUSUM between r_ok and r_bad on the block means, ℓ = (r_ok - r_bad)(m - x) / σ² with
m their midpoint: the indifference zone holds as for counters (a reading at r_ok adds -gap²/2σ²). σ never
goes below GAUGE_MIN_RELATIVE_SD · r0, so a gauge that barely moves during the warm-up (a lifetime ratio,
a very busy engine) cannot make the CUSUM jump on a small step. Lower power than counters: consecutive blocks
share requests and nothing says how much traffic a reading holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

GAUGE_BLOCK_SECONDS = 60.0
GAUGE_MIN_BLOCKS = 30  # blocks with traffic before a first baseline (on top of the warm-up time)
GAUGE_MIN_RELATIVE_SD = 0.02  # σ floor, as a fraction of r0 (2% of the baseline per block)


@dataclass
class GaugeBlocks:
    """Readings merged into blocks of at least `seconds`, weighted (by running requests)."""

    seconds: float = GAUGE_BLOCK_SECONDS
    start: float | None = None
    weight: float = 0.0
    weighted: float = 0.0

    def add(self, now: float, reading: float, weight: float) -> tuple[float, float] | None:
        """Add one reading; return (block start, block mean) of the block it closed, if any."""
        if weight <= 0:
            return None
        if self.start is None:
            self.start = now
        self.weight += weight
        self.weighted += weight * reading
        if now - self.start < self.seconds:
            return None
        closed = (self.start, self.weighted / self.weight)
        self.clear()
        return closed

    def clear(self) -> None:
        self.start, self.weight, self.weighted = None, 0.0, 0.0


@dataclass
class GaugeLearner:
    """Mean and variance of block means (Welford), and the latest block mean (for lifetime gauges)."""

    start: float | None = None
    blocks: int = 0
    mean: float = 0.0
    m2: float = 0.0  # Σ (x - mean)²
    latest: float | None = None
    sum_lag: float = 0.0  # Σ x_t x_{t-1}, for the lag-1 autocorrelation

    def add(self, now: float, block_mean: float) -> None:
        if self.start is None:
            self.start = now
        if self.latest is not None:
            self.sum_lag += self.latest * block_mean
        self.blocks += 1
        delta = block_mean - self.mean
        self.mean += delta / self.blocks
        self.m2 += delta * (block_mean - self.mean)
        self.latest = block_mean

    def seconds(self, now: float) -> float:
        return 0.0 if self.start is None else now - self.start

    def has(self, now: float, seconds: float) -> bool:
        return self.blocks >= GAUGE_MIN_BLOCKS and self.seconds(now) >= seconds and 0.0 < self.mean < 1.0

    def baseline(self, lifetime: bool) -> tuple[float, float]:
        """(r0, σ): the mean of the blocks (interval gauges) or the latest reading (lifetime gauges), and the
        spread of one block mean, inflated by one standard error of a variance estimate and floored."""
        r0 = self.latest if lifetime and self.latest is not None else self.mean
        var = self.m2 / (self.blocks - 1) if self.blocks > 1 else 0.0
        var *= 1.0 + math.sqrt(2.0 / max(1, self.blocks - 1))
        var *= self.long_run_factor()
        sd = 0.0 if lifetime else math.sqrt(max(0.0, var))
        return r0, max(sd, GAUGE_MIN_RELATIVE_SD * r0)

    def long_run_factor(self) -> float:
        """(1 + ρ) / (1 - ρ) for the lag-1 autocorrelation ρ of the block means, in [1, 10].

        Consecutive blocks share requests (a reading averages the last decode steps, a request straddles
        scrapes), and a CUSUM sums blocks: what bounds its excursions is the variance of a sum, the block
        variance times this factor for an AR(1)-like series."""
        n = self.blocks
        var = self.m2 / (n - 1) if n > 2 else 0.0
        if var <= 0:
            return 1.0
        rho = (self.sum_lag / (n - 1) - self.mean * self.mean) / var
        rho = min(0.8, max(0.0, rho))
        return (1.0 + rho) / (1.0 - rho)

    def to_json(self) -> list[Any]:
        return [self.start, self.blocks, self.mean, self.m2, self.latest, self.sum_lag]

    @classmethod
    def from_json(cls, raw: list[Any]) -> GaugeLearner:
        start, blocks, mean, m2, latest, sum_lag = raw
        return cls(
            None if start is None else float(start),
            int(blocks),
            float(mean),
            float(m2),
            None if latest is None else float(latest),
            float(sum_lag),
        )


@dataclass(frozen=True)
class GaugeLlr:
    """Gaussian log-likelihood ratio of r_bad vs r_ok for one block mean with sd `sd`."""

    r_ok: float
    r_bad: float
    sd: float

    def __call__(self, block_mean: float) -> float:
        gap, mid = self.r_ok - self.r_bad, (self.r_ok + self.r_bad) / 2.0
        return gap * (mid - block_mean) / (self.sd * self.sd)


@dataclass
class GaugeReference:
    """A learned gauge baseline: r0, the sd of a block mean, and whether it is pinned."""

    r0: float
    sd: float
    pinned: bool = False
    lifetime: bool = False

    def to_json(self) -> list[Any]:
        return [self.r0, self.sd, self.pinned, self.lifetime]

    @classmethod
    def from_json(cls, raw: list[Any]) -> GaugeReference:
        r0, sd, pinned, lifetime = raw
        return cls(float(r0), float(sd), bool(pinned), bool(lifetime))
