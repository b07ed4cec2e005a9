"""Counter samples that cannot be true are rejected and counted, never stored; tracking resumes from the last
good sample. A learner state holding such values is not loaded."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from specwatch.config import Config, DetectionConfig, RouteConfig
from specwatch.evaluators.acceptance_drop import build_evaluator
from specwatch.evaluators.base import EvaluatorContext
from specwatch.snapshot import EngineCounters, EngineSample
from specwatch.state.baselines import BaselineLearner
from specwatch.state.store import StateStore
from specwatch.tracking.counters import ResetSafeCounter
from specwatch.tracking.routes import RouteTracker

K = 4
RATIO = 0.6
DETECTION = DetectionConfig(
    warmup_drafted_tokens=10_000, warmup_seconds=600.0, pin_drafted_tokens=200_000, pin_seconds=4 * 3600.0
)


class _Engine:
    """Cumulative vLLM counters growing at RATIO acceptance, with a little noise so that φ can be learned."""

    def __init__(self) -> None:
        self.rng = random.Random(7)
        self.drafts = self.draft_tokens = self.accepted = 0.0

    def step(self) -> None:
        drafts = 100 + self.rng.randrange(40)
        self.drafts += drafts
        self.draft_tokens += drafts * K
        self.accepted += round(drafts * K * (RATIO + self.rng.uniform(-0.05, 0.05)))

    def sample(self, ts: float, **override: float) -> EngineSample:
        values = dict(drafts=self.drafts, draft_tokens=self.draft_tokens, accepted_tokens=self.accepted) | override
        engine = EngineCounters(engine="0", created=1000.0, running=4.0, waiting=0.0, **values)
        return EngineSample(
            ts=ts,
            engine_kind="vllm",
            acceptance_source="counter",
            model_name="llama",
            engine_version="0.11.0",
            num_speculative_tokens=K,
            engines=(engine,),
        )


def _run(tmp_path: Path, bogus: dict[int, dict[str, float]], cycles: int = 80):
    """Feed `cycles` 15 s scrapes through the tracker and the acceptance-drop evaluator; `bogus` replaces some
    counter values of the given cycles."""
    tracker, engine = RouteTracker("chat"), _Engine()
    ctx = EvaluatorContext(config=Config(state_dir=str(tmp_path), detection=DETECTION), clock=lambda: 0.0)
    ev = build_evaluator(ctx, RouteConfig(name="chat", url="http://127.0.0.1:8000/metrics", detection=DETECTION))
    for i in range(cycles):
        engine.step()
        ts = 1_700_000_000.0 + 15.0 * i
        ev.evaluate(tracker.observe(engine.sample(ts, **bogus.get(i, {}))), ())
    return tracker, engine, ev


@pytest.mark.parametrize(
    "bogus, reason",
    [
        ({"accepted_tokens": 2.0**64}, "too_large"),  # a wrapped or uninitialised 64-bit counter
        ({"accepted_tokens": float("inf")}, "non_finite"),
        ({"drafts": -5.0}, "negative"),
        ({"accepted_tokens": 5e13, "draft_tokens": 1e14}, "too_fast"),  # consistent, but no engine is that fast
        ({"accepted_tokens": 1e9}, "accepted_over_drafted"),
    ],
)
def test_one_bogus_counter_sample_is_rejected_and_tracking_resumes(
    tmp_path: Path, bogus: dict[str, float], reason: str
) -> None:
    tracker, engine, ev = _run(tmp_path, {20: bogus})
    state = tracker.state()
    # the exported totals are the engine's own, the bogus sample never added to them
    assert state.accepted_tokens_total == engine.accepted and state.draft_tokens_total == engine.draft_tokens
    assert state.acceptance_ratio["1m"] == pytest.approx(RATIO, abs=0.05)
    assert state.acceptance_ratio["1h"] == pytest.approx(RATIO, abs=0.01)
    assert ev.reference is not None and ev.reference.acceptance_ratio == pytest.approx(RATIO, abs=0.01)
    assert ev.learner.accepted < ev.learner.drafted
    assert state.rejected_samples_total[reason] == 1.0
    assert sum(state.rejected_samples_total.values()) == 1.0
    ev.close()


def test_a_bogus_sample_at_first_sight_is_not_adopted(tmp_path: Path) -> None:
    tracker, engine, ev = _run(tmp_path, {0: {"accepted_tokens": 2.0**64}})
    state = tracker.state()
    assert state.accepted_tokens_total == engine.accepted
    assert ev.reference is not None and ev.reference.acceptance_ratio == pytest.approx(RATIO, abs=0.01)
    assert state.rejected_samples_total["too_large"] == 1.0
    ev.close()


def test_a_counter_restart_is_not_a_rejection() -> None:
    counter = ResetSafeCounter()
    counter.update(1e6, 1.0, ts=0.0)
    assert counter.check(10.0, 2.0, 15.0) is None and counter.update(10.0, 2.0, ts=15.0) == 10.0
    assert counter.resets == 1 and counter.total == 1e6 + 10.0


@pytest.mark.parametrize(
    "field, value",
    [("accepted", 2.0**64), ("accepted", float("nan")), ("drafted", -1.0), ("accepted", 2e6), ("drafts", float("inf"))],
)
def test_a_learner_state_that_cannot_be_true_is_not_loaded(field: str, value: float) -> None:
    learner = BaselineLearner()
    learner.add(0.0, 600.0, 1000.0, 250.0, (200.0, 150.0), start=None)
    raw = learner.to_json() | {field: value}
    with pytest.raises(ValueError):
        BaselineLearner.from_json(raw)
    assert BaselineLearner.from_json(learner.to_json()).accepted == 600.0


def test_a_bogus_persisted_learner_starts_afresh_on_restart(tmp_path: Path) -> None:
    _, _, ev = _run(tmp_path, {}, cycles=20)
    ev.close()
    store = StateStore.in_state_dir(str(tmp_path))
    state = store.route_state("chat")
    assert state is not None and state["learner"]["drafted"] > 0
    state["learner"]["accepted"] = 2.0**64  # what a store written before samples were checked may hold
    store.register("chat", lambda: state)
    store.unregister("chat")
    ctx = EvaluatorContext(config=Config(state_dir=str(tmp_path), detection=DETECTION), clock=lambda: 0.0)
    again = build_evaluator(ctx, RouteConfig(name="chat", url="http://127.0.0.1:8000/metrics", detection=DETECTION))
    assert again.learner.accepted == 0.0 and again.key is None  # afresh, and the error counted
    assert any("unreadable detector state" in e for e in ctx.state_errors)
    again.close()
