"""An operator's accept after a deliberate model bump, as the acceptance detector decides it on its live state.

1. `Expected`: what the operator says the route now runs (model, optionally engine version and draft length k).
   An accept on a route that runs anything else is refused: in a rolling deploy the nodes not yet upgraded
   keep their baselines.
2. `AcceptOutcome`: "adopted" (the current key's learned traffic is the route's baseline from now on),
   "already" (the reference is the current key's own baseline), "would_adopt" (a dry run's answer), or
   "refused" with the reason; with the route's reference before and after, as JSON documents
   (`baseline_document`).

Nothing here deletes a baseline: forgetting one is the operator's `reset`, named as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specwatch.state.baselines import Baseline, BaselineKey

ADOPTED, ALREADY, WOULD_ADOPT, REFUSED = "adopted", "already", "would_adopt", "refused"
OUTCOMES = (ADOPTED, ALREADY, WOULD_ADOPT, REFUSED)


@dataclass(frozen=True)
class Expected:
    """The key the operator expects the route to run; None fields match any value."""

    model: str
    engine_version: str | None = None
    draft_length: int | None = None
    drafter: str | None = None  # "method:drafter" as the baseline key holds it; "" expects none told

    def mismatch(self, key: BaselineKey) -> str:
        """Why `key` is not what was expected ("" when it is)."""
        wrong = []
        if key.model_name != self.model:
            wrong.append(f"model {key.model_name or '-'!r}, not {self.model!r}")
        if self.engine_version is not None and key.engine_version != self.engine_version:
            wrong.append(f"engine version {key.engine_version or '-'!r}, not {self.engine_version!r}")
        if self.draft_length is not None and key.k != self.draft_length:
            wrong.append(f"draft length k={key.k or '?'}, not {self.draft_length}")
        if self.drafter is not None and key.drafter != self.drafter:
            wrong.append(f"drafter {key.drafter or '-'!r}, not {self.drafter or '-'!r}")
        return "it runs " + " and ".join(wrong) if wrong else ""


@dataclass(frozen=True)
class AcceptOutcome:
    outcome: str  # one of OUTCOMES
    reason: str = ""  # why refused; what was done otherwise
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None

    @property
    def refused(self) -> bool:
        return self.outcome == REFUSED


def baseline_document(b: Baseline | None) -> dict[str, Any] | None:
    """A baseline as the baselines API shows it (None stays None)."""
    if b is None:
        return None
    return {
        "route": b.route,
        "model": b.key.model_name,
        "engine_version": b.key.engine_version,
        "draft_length": b.key.k,
        "drafter": b.key.drafter,
        "acceptance_ratio": b.acceptance_ratio,
        "overdispersion": b.overdispersion,
        "drafted_tokens": b.drafted_tokens,
        "source": b.source,
        "pinned": b.pinned,
        "updated": b.updated,
    }


def gauge_document(route: str, key: BaselineKey | None, r0: float | None, pinned: bool) -> dict[str, Any] | None:
    """A gauge route's baseline (kept in its detector state, with no key of its own: `key` is the current one)."""
    if r0 is None:
        return None
    return {
        "route": route,
        "model": key.model_name if key else None,
        "engine_version": key.engine_version if key else None,
        "draft_length": key.k if key else None,
        "drafter": key.drafter if key else None,
        "acceptance_ratio": r0,
        "source": "gauge",
        "pinned": pinned,
    }
