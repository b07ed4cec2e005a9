"""GPU time lost/saved by speculation, against the demo's SIMULATED engines.

The demo's `code` route ramps its load from 8 to 160 concurrent requests, past its crossover (~64), and back
to 16. Two simulated engines with the route's step-time table and acceptance, one speculating (k = 4) and
one not, are stepped through that ramp offline (`SimEngine.advance`) in the demo's evaluation cycles. The
crossover evaluator gets the speculating engine's batch and acceptance each cycle and the sweep the demo
configures its daemon with (the engines' steady-state throughput per batch). Its
counters must grow lost while the route is above the crossover, saved while below, and agree with what the
two engines actually produced: sum over cycles of dt x (1 - spec tokens / plain tokens).
"""

from __future__ import annotations

import pytest

from specwatch.crossover.configured import SweptCrossover
from specwatch.evaluators.above_crossover import AboveCrossoverEvaluator, GpuTimeLedger
from specwatch.simulator.clock import SimClock
from specwatch.simulator.demo_plan import engine_sweep, load_demo_plan, route_crossover, simulation_spec
from specwatch.simulator.engine import EngineSettings, SimEngine, StepRecord
from specwatch.simulator.speculation import parse_profile
from specwatch.snapshot import RouteObservation


class _Steps:
    def __init__(self) -> None:
        self.steps: list[StepRecord] = []

    def on_step(self, engine: int, step: StepRecord) -> None:
        self.steps.append(step)

    def on_finish(self, engine, request, now) -> None:
        pass


def test_ledger_arithmetic():
    ledger = GpuTimeLedger()
    ledger.add(0.0, 0.8, 2)  # first cycle: no interval yet
    ledger.add(10.0, 0.8, 2)
    assert ledger.lost_seconds == pytest.approx(2 * 10 * 0.2) and ledger.saved_seconds == 0
    ledger.add(20.0, 1.5, 2)
    assert ledger.saved_seconds == pytest.approx(2 * 10 * 0.5)
    ledger.add(20.0 + GpuTimeLedger.MAX_ACCOUNTED_GAP_SECONDS + 1, 0.5, 2)  # a gap is not accounted
    ledger.gap()
    ledger.add(200.0, 0.5, 2)
    assert ledger.lost_seconds == pytest.approx(4.0)


@pytest.mark.slow
def test_demo_ramp_lost_above_saved_below_matches_the_engines():
    plan = load_demo_plan()
    route = next(r for r in plan.routes if r.name == "code")
    spec = simulation_spec(route, plan.time_scale)
    profile = parse_profile(spec.acceptance, spec.k)
    b_star = route_crossover(spec)
    assert b_star is not None and 40 < b_star < 100

    def engine(k: int) -> tuple[SimEngine, _Steps]:
        settings = EngineSettings(
            model_name="code",
            step_time=spec.step_time,
            k=k,
            profile=profile if k else None,
            prefill_seconds_per_token=0.0,
        )  # decode only, like the sweep
        steps = _Steps()
        return SimEngine(0, settings, SimClock(), steps, seed=5), steps

    spec_engine, spec_steps = engine(spec.k)
    plain_engine, plain_steps = engine(0)
    source = SweptCrossover(engine_sweep(spec))  # what the demo's daemon is configured with
    evaluator = AboveCrossoverEvaluator(source, hold_seconds=60.0)

    cycle = plan.interval_seconds * plan.time_scale  # the demo's evaluation interval, in simulated seconds
    end = 13 * 60.0
    rows = []  # (t, engine batch, lost delta, saved delta, engines' realised spec/plain)
    lost = saved = 0.0
    t = 0.0
    while t < end:
        concurrency = route.scenario.concurrency_at(t)
        spec_engine.set_offered_concurrency(concurrency)
        plain_engine.set_offered_concurrency(concurrency)
        n_spec, n_plain = len(spec_steps.steps), len(plain_steps.steps)
        spec_engine.advance(t + cycle)
        plain_engine.advance(t + cycle)
        t += cycle
        window = spec_steps.steps[n_spec:]
        plain_tokens = sum(s.emitted_tokens for s in plain_steps.steps[n_plain:])
        spec_tokens = sum(s.emitted_tokens for s in window)
        drafts = sum(s.drafts for s in window)
        per_pos = [sum(s.accepted_per_pos[j] for s in window if len(s.accepted_per_pos) > j) for j in range(spec.k)]
        busy = sum(s.duration for s in window)
        batch = sum(s.running * s.duration for s in window) / busy if busy else 0.0
        obs = RouteObservation(
            route="code",
            ts=t,
            up=True,
            k=spec.k,
            acceptance_source="counter",
            d_drafts=float(drafts),
            d_accepted_per_pos=tuple(float(a) for a in per_pos),
            running_per_engine={"0": batch},
        )
        update = evaluator.evaluate(obs, [])
        d_lost = update["speculation_gpu_seconds_lost_total"] - lost
        d_saved = update["speculation_gpu_seconds_saved_total"] - saved
        lost, saved = update["speculation_gpu_seconds_lost_total"], update["speculation_gpu_seconds_saved_total"]
        rows.append((t, batch, d_lost, d_saved, spec_tokens / plain_tokens if plain_tokens else None))

    # The ramp went past the crossover and came back.
    assert max(b for _, b, *_ in rows) > 1.5 * b_star
    assert rows[-1][1] < 0.5 * b_star
    # Cycles where the engine (and the minute before it) is clearly on one side of the crossover.
    settled = [
        (b, dl, ds)
        for i, (_, b, dl, ds, _) in enumerate(rows)
        if i >= 3 and all(abs(rows[j][1] - b) < 0.1 * b for j in range(i - 3, i))
    ]
    above = [(dl, ds) for b, dl, ds in settled if b > 1.3 * b_star]
    below = [(dl, ds) for b, dl, ds in settled if b < 0.7 * b_star]
    assert len(above) >= 5 and len(below) >= 5
    assert all(dl > 0 and ds == 0 for dl, ds in above)
    assert all(ds > 0 and dl == 0 for dl, ds in below)
    # The totals agree with what the two engines produced (one GPU, simulated seconds).
    engines_lost = sum(cycle * max(0.0, 1 - r) for *_, r in rows[1:] if r is not None)
    engines_saved = sum(cycle * max(0.0, r - 1) for *_, r in rows[1:] if r is not None)
    assert lost == pytest.approx(engines_lost, rel=0.2)
    assert saved == pytest.approx(engines_saved, rel=0.2)
