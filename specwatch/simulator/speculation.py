"""Draft acceptance: how many of k drafted tokens one verify step accepts.

A profile is the conditional acceptance per position, alpha_j = P(token j accepted | tokens 0..j-1 were),
as in EAGLE's per-position tables (`detection.md` §8). The accepted length X of one request in one step is
the number of consecutive successes, capped at k; the step emits X + 1 tokens (the bonus token).

Drawing X costs one `random()` and one bisect over the precomputed survival curve P(X >= j), so a step of
batch B costs O(B) however long the draft.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class AcceptanceProfile:
    alphas: tuple[float, ...]  # conditional acceptance per position, len == k

    def __post_init__(self) -> None:
        if not self.alphas:
            raise ValueError("an acceptance profile needs at least one position")
        for a in self.alphas:
            if not 0.0 <= a <= 1.0:
                raise ValueError(f"acceptance per position must be within 0-1, got {a!r}")

    @classmethod
    def iid(cls, alpha: float, k: int) -> "AcceptanceProfile":
        return cls(tuple([alpha] * k))

    @property
    def k(self) -> int:
        return len(self.alphas)

    def survival(self) -> tuple[float, ...]:
        """P(X >= j) for j = 1..k, i.e. the unconditional per-position acceptance p_j (non-increasing)."""
        out, p = [], 1.0
        for a in self.alphas:
            p *= a
            out.append(p)
        return tuple(out)

    def acceptance_rate(self) -> float:
        """Expected accepted / drafted tokens, E[X] / k."""
        return sum(self.survival()) / self.k

    def mean_tokens_per_step(self) -> float:
        """Expected tokens emitted per verify step, 1 + E[X]."""
        return 1.0 + sum(self.survival())

    def scaled(self, factor: float) -> "AcceptanceProfile":
        """Every conditional alpha multiplied by `factor` (clipped to 0-1)."""
        return AcceptanceProfile(tuple(min(1.0, max(0.0, a * factor)) for a in self.alphas))

    def with_rate(self, rate: float) -> "AcceptanceProfile":
        """The same shape scaled so that `acceptance_rate()` equals `rate` (found by bisection)."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"acceptance rate must be within 0-1, got {rate!r}")
        lo, hi = 0.0, 1.0 / max(min(self.alphas), 1e-9)
        for _ in range(60):
            mid = (lo + hi) / 2
            if self.scaled(mid).acceptance_rate() < rate:
                lo = mid
            else:
                hi = mid
        return self.scaled((lo + hi) / 2)


class AcceptanceSampler:
    """Draws accepted lengths for one profile from its own random stream (seeded for reproducible runs)."""

    def __init__(self, profile: AcceptanceProfile, rng: random.Random) -> None:
        self.profile = profile
        self._rng = rng
        # Negated survival is non-decreasing, so bisect counts the positions j with u < P(X >= j).
        self._neg_survival = [-p for p in profile.survival()]

    def draw(self) -> int:
        return bisect.bisect_left(self._neg_survival, -self._rng.random())


def parse_profile(raw: float | Sequence[float], k: int | None) -> AcceptanceProfile:
    """A scalar alpha (iid over k positions) or an explicit per-position list."""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        if k is None or k < 1:
            raise ValueError("a scalar acceptance needs k >= 1")
        return AcceptanceProfile.iid(float(raw), k)
    if isinstance(raw, (int, float)):  # a bool
        raise ValueError(f"acceptance must be a number or a list of numbers, got {raw!r}")
    alphas = tuple(float(a) for a in raw)
    if k is not None and len(alphas) != k:
        raise ValueError(f"acceptance lists {len(alphas)} positions but k is {k}")
    return AcceptanceProfile(alphas)
