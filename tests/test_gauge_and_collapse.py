"""Pages without token counters (gauge-only routes) and without a baseline (a broken drafter)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from specwatch.config import Config, DetectionConfig, RouteConfig
from specwatch.stats.gauge import GAUGE_MIN_RELATIVE_SD, GaugeLearner, GaugeLlr
from specwatch.evaluators.acceptance_drop import AcceptanceDropEvaluator, build_evaluator
from specwatch.evaluators.drop_decision import COLLAPSE_RATIO
from specwatch.evaluators.base import EvaluatorContext
from specwatch.offline.replay import ObservationBuilder
from specwatch.snapshot import RouteObservation
from specwatch.offline.tracegen import DAY, Drop, ModelChange, TraceSpec, generate

FAST = DetectionConfig(
    warmup_drafted_tokens=20_000, warmup_seconds=1800.0, pin_drafted_tokens=200_000, pin_seconds=4 * 3600.0
)


def _evaluator(tmp_path: Path, detection: DetectionConfig = FAST) -> AcceptanceDropEvaluator:
    ctx = EvaluatorContext(config=Config(state_dir=str(tmp_path), detection=detection), clock=lambda: 0.0)
    return build_evaluator(ctx, RouteConfig(name="chat", url="http://127.0.0.1:8000/metrics", detection=detection))


def _transitions(ev: AcceptanceDropEvaluator, observations: Iterator[RouteObservation], start: float):
    out, last = [], False
    for obs in observations:
        degraded = bool(ev.evaluate(obs, ()).get("degraded"))
        if degraded != last:
            last = degraded
            out.append((obs.ts - start, degraded))
    return out


def _counters(spec: TraceSpec) -> Iterator[RouteObservation]:
    builder = ObservationBuilder("chat")
    for sample in generate(spec):
        yield builder.observe(sample)


def _interval_gauge(spec: TraceSpec) -> Iterator[RouteObservation]:
    """SGLang < 0.5.13 as the tracker hands it over: the interval's ratio as a gauge, read with requests running
    (the trace's own interval ratio stands in for the mean over the last decode steps)."""
    prev = None
    for s in generate(spec):
        d_tok = s.draft_tokens - prev.draft_tokens if prev and s.model_name == prev.model_name else s.draft_tokens
        d_acc = (
            s.accepted_tokens - prev.accepted_tokens if prev and s.model_name == prev.model_name else s.accepted_tokens
        )
        prev = s
        busy = d_tok > 0
        yield RouteObservation(
            route="chat",
            ts=s.ts,
            up=True,
            model_name=s.model_name,
            engine_kind="sglang",
            acceptance_source="gauge",
            k=spec.k,
            gauge_acceptance_ratio=d_acc / d_tok if busy else None,
            running_per_engine={"0": 1.0 if busy else 0.0},
        )


def _lifetime_gauge(spec: TraceSpec) -> Iterator[RouteObservation]:
    """vLLM V0: accepted / drafted since the engine started (a model change restarts it)."""
    for s in generate(spec):
        yield RouteObservation(
            route="chat",
            ts=s.ts,
            up=True,
            model_name=s.model_name,
            engine_kind="vllm",
            acceptance_source="lifetime_gauge",
            k=spec.k,
            gauge_acceptance_ratio=s.accepted_tokens / s.draft_tokens if s.draft_tokens else 0.0,
            running_per_engine={"0": float(s.running or 0) + 1.0},
        )


# --------------------------------------------------------------------------- a broken drafter
@pytest.mark.slow
@pytest.mark.parametrize("rate", [2.0, 0.2])
def test_broken_drafter_pages_within_one_confirmation_window_before_any_baseline(tmp_path: Path, rate: float) -> None:
    ev = _evaluator(tmp_path)
    start = 600.0  # ten minutes in: far from the 30-minute warm-up of a first baseline
    spec = TraceSpec(rate=rate, duration=3600.0, seed=3, drops=(Drop(start=start, ratio=0.97),))
    transitions = _transitions(ev, _counters(spec), spec.start)
    assert ev.reference is None  # nothing learned: the collapsed traffic is not taken for a baseline
    assert transitions and transitions[0][1] is True
    assert start < transitions[0][0] <= start + FAST.confirm_window_seconds + spec.interval
    ev.close()


def test_broken_drafter_clears_when_acceptance_comes_back(tmp_path: Path) -> None:
    ev = _evaluator(tmp_path)
    spec = TraceSpec(rate=0.5, duration=4 * 3600.0, seed=4, drops=(Drop(start=3600.0, ratio=0.97, end=5400.0),))
    transitions = _transitions(ev, _counters(spec), spec.start)
    assert [d for _, d in transitions] == [True, False]
    assert 5400.0 < transitions[1][0] <= 5400.0 + FAST.confirm_window_seconds + spec.interval
    ev.close()


@pytest.mark.slow
@pytest.mark.parametrize("rate,kappa", [(1 / 60, 10.0), (2.0, 10.0)])
def test_working_drafter_never_looks_broken(tmp_path: Path, rate: float, kappa: float) -> None:
    """The most heterogeneous requests of the shared note's range (κ 10), quiet and busy: far from 5%."""
    ev = _evaluator(tmp_path)
    spec = TraceSpec(rate=rate, duration=DAY, kappa=kappa, seed=5)
    assert _transitions(ev, _counters(spec), spec.start) == []
    ev.close()


def test_broken_drafter_on_a_gauge_route(tmp_path: Path) -> None:
    ev = _evaluator(tmp_path)
    spec = TraceSpec(rate=0.5, duration=3600.0, seed=6, drops=(Drop(start=600.0, ratio=0.97),))
    transitions = _transitions(ev, _interval_gauge(spec), spec.start)
    assert transitions and transitions[0][1] is True
    assert 600.0 < transitions[0][0] <= 600.0 + FAST.confirm_window_seconds + spec.interval
    assert COLLAPSE_RATIO < 0.1
    ev.close()


# --------------------------------------------------------------------------- gauge-only routes
def test_gauge_statistics() -> None:
    learner = GaugeLearner()
    for i, x in enumerate([0.5, 0.52, 0.48, 0.5] * 10):
        learner.add(60.0 * i, x)
    assert learner.has(40 * 60.0, 1800.0) and not learner.has(40 * 60.0, 7200.0)
    r0, sd = learner.baseline(lifetime=False)
    assert r0 == pytest.approx(0.5) and sd > 0.0141  # the sample sd, inflated
    r0, sd = learner.baseline(lifetime=True)
    assert r0 == 0.5 and sd == pytest.approx(GAUGE_MIN_RELATIVE_SD * 0.5)  # the latest reading, the floor
    llr = GaugeLlr(0.475, 0.425, 0.02)
    assert llr(0.45) == pytest.approx(0.0, abs=1e-9) and llr(0.40) > 0 > llr(0.475)


@pytest.mark.slow
def test_interval_gauge_route_learns_pages_on_a_drop_and_resolves(tmp_path: Path) -> None:
    ev = _evaluator(tmp_path)
    spec = TraceSpec(
        rate=0.5, duration=14 * 3600.0, seed=7, drops=(Drop(start=8 * 3600.0, ratio=0.25, end=11 * 3600.0),)
    )
    transitions = _transitions(ev, _interval_gauge(spec), spec.start)
    assert [d for _, d in transitions] == [True, False]
    assert 8 * 3600 < transitions[0][0] < 8 * 3600 + 3600  # lower power than counters: within the hour
    assert 11 * 3600 < transitions[1][0] < 11 * 3600 + 1800
    fields = ev.fields()
    assert fields["baseline_ratio"] == pytest.approx(0.49, abs=0.03) and ev.gauge.reference.pinned
    ev.close()


@pytest.mark.slow
@pytest.mark.parametrize("seed", [8, 9])
def test_interval_gauge_route_ignores_a_five_percent_drift(tmp_path: Path, seed: int) -> None:
    ev = _evaluator(tmp_path)
    spec = TraceSpec(rate=0.5, duration=2 * DAY, seed=seed, drops=(Drop(start=6 * 3600.0, ratio=0.05),))
    assert _transitions(ev, _interval_gauge(spec), spec.start) == []
    ev.close()


@pytest.mark.slow
def test_lifetime_gauge_route_pages_on_a_regressed_restart_and_not_on_a_clean_one(tmp_path: Path) -> None:
    """vLLM V0: the model bump restarts the engine, so its lifetime ratio shows the new model alone."""
    detection = FAST
    bad = _evaluator(tmp_path / "bad", detection)
    spec = TraceSpec(
        rate=0.5,
        duration=10 * 3600.0,
        seed=10,
        changes=(ModelChange(at=6 * 3600.0, model_name="m2"),),
        drops=(Drop(start=6 * 3600.0, ratio=0.25),),
    )
    transitions = _transitions(bad, _lifetime_gauge(spec), spec.start)
    assert transitions and transitions[0][1] is True and transitions[0][0] - 6 * 3600 < 3600
    bad.close()
    good = _evaluator(tmp_path / "good", detection)
    spec = TraceSpec(rate=0.5, duration=10 * 3600.0, seed=10, changes=(ModelChange(at=6 * 3600.0, model_name="m2"),))
    assert _transitions(good, _lifetime_gauge(spec), spec.start) == []
    assert good.gauge.reference is not None
    good.close()


def test_gauge_state_survives_a_restart(tmp_path: Path) -> None:
    ev = _evaluator(tmp_path)
    spec = TraceSpec(rate=0.5, duration=3 * 3600.0, seed=11)
    _transitions(ev, _interval_gauge(spec), spec.start)
    before = ev.fields()
    ev.close()
    again = _evaluator(tmp_path)
    assert again.fields()["baseline_ratio"] == before["baseline_ratio"]
    assert again.gauge.reference.sd == ev.gauge.reference.sd
    again.close()
