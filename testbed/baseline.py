"""A route's baseline measured from a testbed engine itself: its acceptance rate and design effect.

The rate comes from the requests' own spec-decode metrics (vLLM `--per-request-spec-decode-metrics summary`:
`num_draft_tokens` and `num_accepted_draft_tokens` per response), and so does the design effect: the Pearson
dispersion of each request's accepted count around the pooled rate. For requests of about the same size this
estimates the block design effect the drop detector weighs evidence with (docs/detection.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from specwatch.probe.responses import VLLM_FIELDS
from testbed.load import run_requests


@dataclass(frozen=True)
class MeasuredBaseline:
    acceptance_ratio: float
    overdispersion: float
    requests: int
    draft_tokens: int

    def config(self) -> dict[str, float]:
        """The `baseline:` block of a route in specwatch's config."""
        return {"acceptance_ratio": round(self.acceptance_ratio, 6), "overdispersion": round(self.overdispersion, 4)}


def from_request_metrics(per_request: Iterable[Mapping[str, float]]) -> MeasuredBaseline:
    """Pooled rate and Pearson design effect (>= 1) of requests' `metrics.speculative_decoding` blocks."""
    drafted_field, accepted_field = VLLM_FIELDS["drafted"], VLLM_FIELDS["accepted"]
    pairs = [(float(m[drafted_field]), float(m[accepted_field])) for m in per_request]
    pairs = [(d, a) for d, a in pairs if d > 0]
    if len(pairs) < 2:
        raise ValueError("need at least two requests that drafted tokens")
    drafted = sum(d for d, _ in pairs)
    rate = sum(a for _, a in pairs) / drafted
    if not 0.0 < rate < 1.0:
        return MeasuredBaseline(rate, 1.0, len(pairs), int(drafted))
    chi2 = sum((a - d * rate) ** 2 / (d * rate * (1.0 - rate)) for d, a in pairs)
    return MeasuredBaseline(rate, max(1.0, chi2 / (len(pairs) - 1)), len(pairs), int(drafted))


def measure(
    base_url: str, model: str, requests: int = 24, concurrency: int = 2, max_tokens: int = 32
) -> MeasuredBaseline:
    """Send greedy requests to a server started with per-request spec-decode metrics and measure its baseline."""
    results = run_requests(base_url, model, requests, concurrency=concurrency, max_tokens=max_tokens)
    failed = [r.error for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} of {requests} requests failed: {failed[0]}")
    missing = [r for r in results if not r.spec_metrics]
    if missing:
        raise RuntimeError(
            "responses carry no metrics.speculative_decoding: start the server with "
            "--per-request-spec-decode-metrics summary"
        )
    return from_request_metrics(r.spec_metrics for r in results if r.spec_metrics is not None)
