"""Test doubles shared by several test modules."""

from __future__ import annotations


class FakeClock:
    """A wall clock that only moves when told to; pass it where the daemon takes `clock=`."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now
