"""Synthetic speculative-decoding traffic and the ground truth a capture fed the engine."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


def draft_accepted(rng: random.Random, k: int, p: float) -> int:
    """Accepted prefix length of one k-token draft when each position is accepted with probability
    p x 0.93^j (later positions are harder, as in real EAGLE traces), stopping at the first rejection."""
    accepted = 0
    while accepted < k and rng.random() < p * (0.93**accepted):
        accepted += 1
    return accepted


@dataclass
class Truth:
    """Cumulative counters exactly as fed to the engine's metric code, per engine."""

    k: int
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    generation_tokens: int = 0

    def observe(self, draft_tokens: int, accepted: int) -> None:
        if not self.accepted_per_pos:
            self.accepted_per_pos = [0] * self.k
        self.drafts += 1
        self.draft_tokens += draft_tokens
        self.accepted_tokens += accepted
        for j in range(accepted):
            self.accepted_per_pos[j] += 1

    def as_dict(self) -> dict:
        return {
            "k": self.k,
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "accepted_per_pos": list(self.accepted_per_pos or [0] * self.k),
            "generation_tokens": self.generation_tokens,
        }
