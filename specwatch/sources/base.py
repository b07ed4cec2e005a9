"""What every source shares: its error types and the protocol the daemon calls.

A source never raises anything but `SourceError` (or `NoData`) out of `sample()`; the daemon's single
`run_source()` wrapper turns those into `specwatch_route_up 0` and `specwatch_source_errors_total{reason}`.
"""

from __future__ import annotations

from typing import Protocol

from specwatch.snapshot import EngineSample

# Reasons exported in specwatch_source_errors_total{reason}; a closed set keeps cardinality bounded.
ERROR_REASONS = (
    "timeout",
    "connection",
    "credentials",  # the route's password or token file cannot be read, or holds what no header can carry
    "http_status",
    "too_large",
    "too_many_series",
    "parse",
    "no_spec_metrics",
    "no_match",
    "not_a_counter",
    "internal",
    "overloaded",  # set by the daemon: the call never started, every scrape thread busy (specwatch/scrape_pool.py)
)


class SourceError(Exception):
    """A scrape failed. `reason` is one of ERROR_REASONS; the message says what and where."""

    def __init__(self, reason: str, message: str) -> None:
        if reason not in ERROR_REASONS:
            reason = "internal"
        self.reason = reason
        super().__init__(message)


class NoData(SourceError):
    """The scrape worked but holds nothing for this route (e.g. no series match its label filter)."""

    def __init__(self, message: str) -> None:
        super().__init__("no_match", message)


class EngineSource(Protocol):
    """One route's engine endpoint."""

    def sample(self, now: float) -> EngineSample:
        """Scrape once. Raises SourceError on any failure."""
        ...

    def close(self) -> None: ...
