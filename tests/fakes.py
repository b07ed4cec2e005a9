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


OLD, NEW = "llama-3.1-8b", "llama-3.3-8b"  # the model before and after a bump
VERSION = "0.33.0"


class SwitchableEngine:
    """A vLLM route whose model the test swaps (a rolling deploy restarts the engine: counters start over)."""

    def __init__(self, model: str = OLD, ratio: float = 0.6, k: int = 4) -> None:
        self.model, self.ratio, self.k = model, ratio, k
        self.drafts = 0.0
        self.accepted = 0.0
        self.created = 1.0

    def bump(self, model: str, ratio: float) -> None:
        self.model, self.ratio = model, ratio
        self.drafts, self.accepted, self.created = 0.0, 0.0, self.created + 1.0

    def sample(self, now: float) -> EngineSample:
        self.drafts += 1000.0  # 4000 drafted tokens a cycle
        self.accepted += 4000.0 * self.ratio
        engine = EngineCounters(
            engine="0",
            drafts=self.drafts,
            draft_tokens=self.k * self.drafts,
            accepted_tokens=self.accepted,
            created=self.created,
            running=8.0,
        )
        return EngineSample(
            ts=now,
            engine_kind="vllm",
            acceptance_source="counter",
            model_name=self.model,
            engine_version=VERSION,
            num_speculative_tokens=self.k,
            engines=(engine,),
        )

    def close(self) -> None:
        pass
