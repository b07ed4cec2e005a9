"""Test doubles shared by several test modules."""

from __future__ import annotations

from collections.abc import Iterable

from specwatch.snapshot import EngineCounters, EngineSample


class FakeClock:
    """A wall clock that only moves when told to; pass it where the daemon takes `clock=`."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def vllm_sample(
    ts: float, engines: Iterable[EngineCounters], num_speculative_tokens: int, model_name: str = "m"
) -> EngineSample:
    """One scrape of a vLLM V1 endpoint (counter acceptance) with these engines' counters."""
    return EngineSample(
        ts=ts,
        engine_kind="vllm",
        acceptance_source="counter",
        model_name=model_name,
        engine_version="0.33.0",
        num_speculative_tokens=num_speculative_tokens,
        engines=tuple(engines),
    )
