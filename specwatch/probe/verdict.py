"""Comparing a canary round with a fingerprint, prompt by prompt (paired).

At temperature 0 a prompt's acceptance under one (target, drafter) pair repeats from round to round, so the
noise of a round is the spread of the per-prompt differences d_i = round_i - fingerprint_i, not the spread
between prompts. A round is `low` when both hold:

- the pooled relative drop, 1 - (Σ accepted / Σ drafted of the round) / (the same of the fingerprint) over the
  prompts read in both, is at least 2/3 of the route's `drop` (so a drop of `drop` is low with margin, while
  an unchanged engine's drop stays near 0);
- the mean paired difference is below zero by at least `MIN_Z` of its standard error (a drop carried by one
  odd prompt is not low).

The evaluator (evaluators/canary.py) pages on two low rounds in a row and resolves on a round whose drop is
under drop/3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from specwatch.probe.responses import Acceptance

MIN_PAIRED_PROMPTS = 4
MIN_Z = 3.0
LOW_SHARE_OF_DROP = 2.0 / 3.0
CLEAN_SHARE_OF_DROP = 1.0 / 3.0


@dataclass(frozen=True)
class Comparison:
    paired: int  # prompts read in the round and in the fingerprint, both with draft tokens
    round_ratio: float
    reference_ratio: float
    drop: float  # 1 - round_ratio / reference_ratio (negative: the round accepted more)
    z: float  # mean paired difference / its standard error (-inf: every prompt fell, none rose)
    low: bool
    clean: bool  # drop under a third of the route's drop: resolves a page
    per_prompt: Mapping[str, tuple[float, float]]  # prompt id -> (round ratio, fingerprint ratio)


def compare(
    round_read: Mapping[str, Acceptance], reference: Mapping[str, Acceptance], drop: float
) -> Comparison | None:
    """None when fewer than MIN_PAIRED_PROMPTS prompts can be paired (no verdict from this round)."""
    pairs = {
        pid: (a, reference[pid])
        for pid, a in round_read.items()
        if pid in reference and a.drafted > 0 and reference[pid].drafted > 0
    }
    if len(pairs) < MIN_PAIRED_PROMPTS:
        return None
    round_ratio = sum(a.accepted for a, _ in pairs.values()) / sum(a.drafted for a, _ in pairs.values())
    reference_ratio = sum(r.accepted for _, r in pairs.values()) / sum(r.drafted for _, r in pairs.values())
    relative_drop = 1.0 - round_ratio / reference_ratio if reference_ratio > 0 else 0.0
    diffs = [a.accepted / a.drafted - r.accepted / r.drafted for a, r in pairs.values()]
    n = len(diffs)
    mean = sum(diffs) / n
    variance = sum((d - mean) ** 2 for d in diffs) / (n - 1)
    stderr = math.sqrt(variance / n)
    if stderr > 0:
        z = mean / stderr
    else:  # every prompt moved by exactly the same amount (or not at all)
        z = -math.inf if mean < 0 else (math.inf if mean > 0 else 0.0)
    low = relative_drop >= LOW_SHARE_OF_DROP * drop and z <= -MIN_Z
    per_prompt = {pid: (a.accepted / a.drafted, r.accepted / r.drafted) for pid, (a, r) in pairs.items()}
    return Comparison(
        len(pairs),
        round_ratio,
        reference_ratio,
        relative_drop,
        z,
        low,
        relative_drop < CLEAN_SHARE_OF_DROP * drop,
        per_prompt,
    )
