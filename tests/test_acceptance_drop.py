"""Acceptance-drop detection: the statistics, the evaluator's life cycle, and a small benchmark run."""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from load_script import load_script

from specwatch.config import Config, DetectionConfig, PinnedBaseline, RouteConfig
from specwatch.stats.cusum import SPRT_LOWER, SPRT_UPPER, Cusum, LogLikelihoodRatio, Sprt
from specwatch.stats.overdispersion import DispersionEstimator, DispersionModel
from specwatch.stats.wilson import wilson_bounds
from specwatch.evaluators.acceptance_drop import STORE_KEY, AcceptanceDropEvaluator, build_evaluator
from specwatch.stats.evidence import (
    BUSY_EFFECTIVE_TOKENS_PER_SECOND,
    MIN_ADAPTED_THRESHOLD,
    MISFIT_SECONDS,
    TrafficRate,
    adapted_threshold,
    misfit_threshold,
)
from specwatch.evaluators.drop_decision import DropDecision
from specwatch.stats.daily import DailyProfile
from specwatch.evaluators.base import EvaluatorContext
from specwatch.offline.replay import ObservationBuilder
from specwatch.snapshot import RouteObservation, RouteState
from specwatch.offline.tracegen import DAY, Drop, ModelChange, TraceSpec, generate
from specwatch.state.baselines import Baseline, BaselineKey
from specwatch.state.store import StateStore


# --------------------------------------------------------------------------- statistics
def test_wilson_bounds_match_reference_values() -> None:
    lo, hi = wilson_bounds(50, 100, z=1.96)
    assert lo == pytest.approx(0.4038, abs=1e-3) and hi == pytest.approx(0.5962, abs=1e-3)
    assert wilson_bounds(0, 0) == (0.0, 1.0)
    lo, hi = wilson_bounds(0, 10)
    assert lo == 0.0 and 0 < hi < 0.3


def test_sprt_thresholds_are_walds() -> None:
    assert SPRT_UPPER == pytest.approx(6.86, abs=0.01) and SPRT_LOWER == pytest.approx(-2.99, abs=0.01)
    s = Sprt()
    assert s.update(7.0, 100.0) == "regressed" and s.update(-100.0, 1.0) == "regressed"  # sticky


def test_llr_sign_and_overdispersion_scaling() -> None:
    llr = LogLikelihoodRatio.between(0.475, 0.425, 1.0)
    assert llr(47.5, 100) < 0 < llr(40, 100)
    assert LogLikelihoodRatio.between(0.475, 0.425, 10.0)(40, 100) == pytest.approx(llr(40, 100) / 10)
    # a design effect that grows with the interval: a long interval weighs less per token than a short one
    line = LogLikelihoodRatio.between(0.475, 0.425, DispersionModel(10.0, 0.04))
    assert line(400, 1000) == pytest.approx(llr(400, 1000) / 50) and line(40, 100) == pytest.approx(llr(40, 100) / 14)
    with pytest.raises(ValueError):
        LogLikelihoodRatio.between(0.4, 0.5, 1.0)


def test_cusum_tracks_its_excursion() -> None:
    c = Cusum(cap=10.0)
    c.update(-1.0, 100, now=0.0)
    assert c.statistic == 0.0 and c.excursion_start is None
    c.update(2.0, 100, now=15.0)
    c.update(20.0, 100, now=30.0)
    assert c.statistic == 10.0 and c.excursion_seconds(45.0) == 30.0 and c.excursion_tokens == 200
    c.update(-11.0, 100, now=60.0)
    assert c.statistic == 0.0 and c.excursion_start is None


def test_dispersion_is_one_for_binomial_and_large_for_clustered_traffic() -> None:
    rng = random.Random(3)
    binomial, clustered = DispersionEstimator(block_seconds=0), DispersionEstimator(block_seconds=0)
    for t in range(400):
        binomial.add(t, sum(rng.random() < 0.5 for _ in range(400)), 400)
        # 4 requests of 100 tokens, each with its own acceptance rate
        rates = [min(0.95, max(0.05, rng.gauss(0.5, 0.15))) for _ in range(4)]
        clustered.add(t, sum(sum(rng.random() < r for _ in range(100)) for r in rates), 400)
    assert binomial.estimate() == pytest.approx(1.0, abs=0.3)
    assert clustered.estimate() > 5  # 1 + (100 - 1) x ICC (≈ 0.09): about 10


def test_dispersion_model_separates_request_heterogeneity_from_block_size() -> None:
    """Blocks of one request each: its own rate varies (sd 0.1) however long it is, so φ grows with D."""
    rng = random.Random(5)
    est = DispersionEstimator(block_seconds=0)
    for t in range(3000):
        drafted = rng.choice((100, 300, 1000, 3000))
        rate = min(0.95, max(0.05, rng.gauss(0.5, 0.1)))
        est.add(t, sum(rng.random() < rate for _ in range(drafted)), drafted)
    model = est.model()
    # E[D (r_t - r)² / (r (1 - r))] = 1 + D x 0.01 / 0.25: intercept ≈ 1, slope ≈ 0.04 per token
    assert model.slope == pytest.approx(0.04, rel=0.25) and model.intercept < 4
    assert model.at(3000) > 3 * model.at(300)
    # many small independent draws per block: no slope, the plain φ̂
    binomial = DispersionEstimator(block_seconds=0)
    for t in range(400):
        n = rng.choice((200, 400, 800))
        binomial.add(t, sum(rng.random() < 0.5 for _ in range(n)), n)
    flat = binomial.model()
    assert flat.at(200) == pytest.approx(1.0, abs=0.5) and flat.at(800) == pytest.approx(1.0, abs=0.5)


def test_threshold_holds_false_alarms_per_hour_not_per_token() -> None:
    assert adapted_threshold(10.0, None) == 10.0  # traffic not known yet: the busy route's h
    assert adapted_threshold(10.0, 5 * BUSY_EFFECTIVE_TOKENS_PER_SECOND) == 10.0  # never above the configured h
    # ten times less traffic: one tenth of the tokens per hour, so e^h may be ten times smaller
    assert adapted_threshold(10.0, BUSY_EFFECTIVE_TOKENS_PER_SECOND / 10) == pytest.approx(10.0 - math.log(10))
    assert adapted_threshold(10.0, 0.001) == MIN_ADAPTED_THRESHOLD
    assert adapted_threshold(5.0, 0.01) == 5.0  # a configured h below the floor is kept, not raised


def test_misfit_floor_is_two_sigmas_of_a_driftless_cusum_over_four_hours() -> None:
    llr = LogLikelihoodRatio.between(0.95 * 0.44, 0.85 * 0.44, 1.0)
    r = llr.neutral_rate()
    assert r * llr.accepted_weight + (1 - r) * llr.rejected_weight == pytest.approx(0.0, abs=1e-12)
    assert 0.85 * 0.44 < r < 0.95 * 0.44
    sigma = llr.neutral_spread()
    assert sigma == pytest.approx((llr.rejected_weight - llr.accepted_weight) * math.sqrt(r * (1 - r)))
    assert misfit_threshold(sigma, 0.25) == pytest.approx(2 * sigma * math.sqrt(0.25 * MISFIT_SECONDS))
    assert misfit_threshold(sigma, 1.0) == pytest.approx(2 * misfit_threshold(sigma, 0.25))  # grows as sqrt(E)
    assert misfit_threshold(sigma, None) == 0.0
    # the floor lifts the lowered h, but never above the configured h nor a configured h below the old floor
    assert adapted_threshold(10.0, 0.2, floor=8.5) == 8.5
    assert adapted_threshold(10.0, 0.2, floor=14.0) == 10.0
    assert adapted_threshold(5.0, 0.01, floor=8.5) == 5.0
    assert adapted_threshold(10.0, 0.2, floor=3.0) == MIN_ADAPTED_THRESHOLD


def _quiet_decision(daily: DailyProfile | None, overdispersion: float) -> tuple[DropDecision, float]:
    """A route at 7 drafted tokens/s (1 req/min of 300-token requests) for two days, on a pinned baseline."""
    decision = DropDecision("chat", DetectionConfig())
    key = BaselineKey("m", "v", 4)
    decision.use(Baseline("chat", key, 0.44, overdispersion=overdispersion, daily=daily))
    end = 2 * 86400.0
    for t in range(0, int(end), 15):
        decision.add(float(t), 0.44 * 105.0, 105.0)
    return decision, end


def test_a_quiet_route_on_a_flat_baseline_keeps_h_above_a_driftless_cusums_reach() -> None:
    # φ̂ 40 at 7 drafted tokens/s: 0.175 effective tokens/s, so h - ln(10 / rate) = 5.96 and the old floor gave 7
    flat, now = _quiet_decision(None, 40.0)
    effective = 7.0 / 40.0
    assert adapted_threshold(10.0, effective) == MIN_ADAPTED_THRESHOLD
    assert flat.hypotheses is not None
    sigma = flat.hypotheses.llr_flat.neutral_spread()
    expected = misfit_threshold(sigma, flat.traffic.per_second(now, 0.0) / 40.0)
    assert 8.0 < expected < 10.0
    assert flat.threshold(now) == pytest.approx(expected)
    assert flat.horizon_inputs(now)["threshold"] == pytest.approx(expected)  # the horizon reads the same h
    # more evidence per hour (less heterogeneous traffic): a misfit stretch reaches further, up to the configured h
    assert _quiet_decision(None, 12.0)[0].threshold(now) == 10.0
    # a usable daily profile follows the mix, so the route keeps the lowered h and its floor of 7
    profile = DailyProfile(0.44, 0.01, -0.02, 0.002, 40.0, 1.8, 40.0, 0.0, final=True)
    assert profile.usable
    assert _quiet_decision(profile, 40.0)[0].threshold(now) == MIN_ADAPTED_THRESHOLD


def test_quiet_route_uses_a_lower_threshold_busy_one_the_configured(tmp_path: Path) -> None:
    h = FAST.cusum_threshold
    # κ 12 at 1 req/min: heterogeneous enough that the flat baseline's misfit floor stays below h
    for rate, quiet in ((2.0, False), (1 / 60, True)):
        ev = build_evaluator(_ctx(tmp_path / str(rate)), _route())
        spec = TraceSpec(rate=rate, duration=5 * 3600.0, seed=8, kappa=12.0)
        _run(ev, spec)
        now = spec.start + spec.duration
        effective = ev.traffic.per_second(now, 0.0) / ev.reference.overdispersion
        test = ev.decision.hypotheses
        assert test is not None and test.daily is None  # five hours: no daily profile yet
        floor = max(MIN_ADAPTED_THRESHOLD, misfit_threshold(test.llr_flat.neutral_spread(), effective))
        threshold = ev.threshold(now)
        assert threshold == adapted_threshold(h, effective, floor)
        assert (threshold < h) is quiet
        ev.close()


def test_traffic_rate_averages_over_the_time_constant() -> None:
    rate = TrafficRate(time_constant=3600.0)
    assert rate.per_second(0.0, 60.0) is None
    for t in range(0, 7200, 15):
        rate.add(float(t), 150.0)  # 10 tokens/s
    assert rate.per_second(7185.0, 60.0) == pytest.approx(10.0, rel=0.02)
    assert rate.per_second(7185.0, 9000.0) is None  # not enough history for that
    for t in range(7200, 7200 + 4 * 3600, 15):
        rate.add(float(t), 15.0)  # then 1 token/s for four time constants
    assert rate.per_second(7200.0 + 4 * 3600 - 15, 60.0) == pytest.approx(1.0, rel=0.3)
    restored = TrafficRate(3600.0)
    restored.restore(rate.to_json())
    assert restored.per_second(20000.0, 60.0) == rate.per_second(20000.0, 60.0)


# --------------------------------------------------------------------------- the evaluator
FAST = DetectionConfig(
    warmup_drafted_tokens=20_000, warmup_seconds=1800.0, pin_drafted_tokens=200_000, pin_seconds=4 * 3600.0
)


def _ctx(tmp_path: Path, detection: DetectionConfig = FAST) -> EvaluatorContext:
    return EvaluatorContext(config=Config(state_dir=str(tmp_path), detection=detection), clock=lambda: 0.0)


def _route(detection: DetectionConfig = FAST, **kw) -> RouteConfig:
    return RouteConfig(name="chat", url="http://127.0.0.1:8000/metrics", detection=detection, **kw)


def _run(ev: AcceptanceDropEvaluator, spec: TraceSpec, builder: ObservationBuilder | None = None):
    """Feed a generated trace; return [(seconds from start, degraded)] transitions and the builder."""
    builder = builder or ObservationBuilder("chat")
    transitions, last = [], False
    for sample in generate(spec):
        fields = ev.evaluate(builder.observe(sample), ())
        if bool(fields.get("degraded")) != last:
            last = bool(fields.get("degraded"))
            transitions.append((sample.ts - spec.start, last))
    return transitions, builder


@pytest.mark.slow
def test_learns_then_pages_on_a_drop_and_resolves(tmp_path: Path) -> None:
    ev = build_evaluator(_ctx(tmp_path), _route())
    assert (
        ev.evaluate(RouteObservation(route="chat", ts=0.0, up=True, model_name="m", k=4), ()).get("baseline_ratio")
        is None
    )  # nothing learned yet
    spec = TraceSpec(
        rate=0.5, duration=14 * 3600.0, seed=5, drops=(Drop(start=8 * 3600.0, ratio=0.25, end=11 * 3600.0),)
    )
    transitions, _ = _run(ev, spec)
    assert [d for _, d in transitions] == [True, False]
    fired, resolved = transitions[0][0], transitions[1][0]
    assert 8 * 3600 < fired < 8 * 3600 + 900  # within 15 minutes at 0.5 req/s
    assert 11 * 3600 < resolved < 11 * 3600 + 1800
    fields = ev.fields()
    assert fields["baseline_ratio"] == pytest.approx(0.487, abs=0.02)
    assert fields["degraded"] is False and abs(fields["drop_ratio"]) < 0.1
    assert ev.reference is not None and ev.reference.pinned  # pinned after pin_duration
    ev.close()


@pytest.mark.slow
def test_small_drop_inside_the_zone_does_not_page(tmp_path: Path) -> None:
    ev = build_evaluator(_ctx(tmp_path), _route())
    spec = TraceSpec(rate=2.0, duration=2 * DAY, seed=9, drops=(Drop(start=6 * 3600.0, ratio=0.05),))
    transitions, _ = _run(ev, spec)
    assert transitions == []
    assert 0.02 < ev.fields()["drop_ratio"] < 0.09
    ev.close()


@pytest.mark.slow
def test_model_change_counts_keeps_old_baseline_and_adopts_after_clean_period(tmp_path: Path) -> None:
    detection = dataclasses.replace(FAST, adopt_after_seconds=1800.0)
    ev = build_evaluator(_ctx(tmp_path, detection), _route(detection))
    spec = TraceSpec(rate=1.0, duration=10 * 3600.0, seed=2, changes=(ModelChange(at=5 * 3600.0, model_name="m2"),))
    transitions, _ = _run(ev, spec)
    assert transitions == []
    fields = ev.fields()
    assert fields["model_changes_total"] == 1.0
    assert fields["last_model_change_timestamp"] == spec.start + 5 * 3600.0
    assert ev.reference is not None and ev.reference.key.model_name == "m2" and ev.reference.source == "adopted"
    ev.close()


@pytest.mark.slow
def test_model_change_with_a_regression_pages_through_the_sprt(tmp_path: Path) -> None:
    ev = build_evaluator(_ctx(tmp_path), _route())
    spec = TraceSpec(
        rate=1.0,
        duration=8 * 3600.0,
        seed=4,
        changes=(ModelChange(at=5 * 3600.0, model_name="m2"),),
        drops=(Drop(start=5 * 3600.0, ratio=0.25),),
    )
    transitions, _ = _run(ev, spec)
    assert transitions and transitions[0][1] is True and transitions[0][0] - 5 * 3600.0 < 600
    assert ev.sprt_verdict == "regressed"
    assert ev.reference.key.model_name == "model-a"  # the old baseline is still the reference
    ev.close()


def test_state_survives_a_restart(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    ev = build_evaluator(ctx, _route())
    spec = TraceSpec(
        rate=1.0,
        duration=3.5 * 3600.0,
        seed=6,  # ends before adopt_after (1 h)
        changes=(ModelChange(at=3 * 3600.0, model_name="m2"),),
    )
    _, builder = _run(ev, spec)
    end = spec.start + spec.duration
    before, threshold, rate_before = ev.fields(), ev.threshold(end), ev.traffic.per_second(end, 0.0)
    ev.close()  # flushes the state and closes the shared store
    ev2 = build_evaluator(_ctx(tmp_path), _route())
    assert ev2.key == BaselineKey("m2", "", 4) and ev2.reference.key.model_name == "model-a"
    assert ev2.fields()["model_changes_total"] == before["model_changes_total"] == 1.0
    assert ev2.fields()["baseline_ratio"] == before["baseline_ratio"]
    now = spec.start + spec.duration
    assert ev2.traffic.per_second(now, 0.0) == pytest.approx(rate_before) and ev2.threshold(now) == threshold
    ev2.close()


def test_operator_reset_and_accept_reach_the_evaluator(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    ev = build_evaluator(ctx, _route())
    _run(ev, TraceSpec(rate=1.0, duration=3 * 3600.0, seed=7))
    assert ev.reference is not None
    cli = StateStore.in_state_dir(str(tmp_path))
    cli.delete_route("chat")
    cli.append_command("chat", "reset")
    cli.close()
    t = TraceSpec().start + 3 * 3600.0 + 60
    fields = ev.evaluate(RouteObservation(route="chat", ts=t, up=True, model_name="model-a", k=4), ())
    assert ev.reference is None and "baseline_ratio" not in fields
    ev.close()


def test_configured_baseline_is_used_with_a_learned_overdispersion(tmp_path: Path) -> None:
    route = _route(baseline=PinnedBaseline(acceptance_ratio=0.60))  # well above the trace's ~0.49
    ev = build_evaluator(_ctx(tmp_path), route)
    transitions, _ = _run(ev, TraceSpec(rate=1.0, duration=3 * 3600.0, seed=8))
    assert ev.reference.source == "config" and ev.reference.acceptance_ratio == 0.60
    assert ev.reference.overdispersion > 5  # learned from the warm-up
    assert transitions and transitions[0][1] is True  # 0.49 is an 18% drop from 0.60
    ev.close()


def test_unreadable_detector_state_is_counted_not_fatal(tmp_path: Path) -> None:
    store = StateStore.in_state_dir(str(tmp_path))
    store.register("chat", lambda: {"version": 1, "key": "garbage"})
    store.unregister("chat")
    ctx = _ctx(tmp_path)
    ev = build_evaluator(ctx, _route())
    assert len(ctx.state_errors) == 1 and "unreadable detector state" in ctx.state_errors[0]
    assert ev.evaluate(RouteObservation(route="chat", ts=1.0, up=True, model_name="m", k=4), ()) is not None
    ev.close()


def test_one_store_is_shared_per_daemon(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    a = build_evaluator(ctx, _route())
    b = build_evaluator(ctx, dataclasses.replace(_route(), name="code"))
    assert a.store is b.store is ctx.shared[STORE_KEY]
    a.close()
    b.close()


def test_down_and_empty_cycles_change_nothing(tmp_path: Path) -> None:
    ev = build_evaluator(_ctx(tmp_path), _route())
    fields = ev.evaluate(RouteObservation(route="chat", ts=1.0, up=False), ())
    assert fields == {"model_changes_total": 0.0, "last_model_change_timestamp": None}
    assert math.isfinite(ev.cusum.statistic)
    ev.close()


# --------------------------------------------------------------------------- the benchmark, small
def _bench():
    return load_script("bench_detection")


@pytest.mark.slow
@pytest.mark.parametrize("tier", ["2 req/s", "0.2 req/s"])
def test_small_benchmark_meets_the_acceptance_checks(tier: str) -> None:
    bench = _bench()
    rate, target = bench.TIERS[tier]
    ours, naive = bench.bench_tier(rate, target, route_days=2.0, drops=3, seed=11, config=Config(), kappa=30.0)
    assert ours.pages_clean == 0 and ours.pages_small == 0
    assert ours.detected == ours.drops == 3
    # 2 req/s: within the tier's 5 minutes. 0.2 req/s: its 15-minute target is missed on the traces with the daily
    # request mix (docs/benchmarks.md); three drops check that detection stays under twice that.
    assert ours.in_target == 3 if rate >= 1.0 else max(ours.detection) < 2 * target
    assert ours.false_pages_drop == 0
    assert naive.drops == 3  # the naive rule ran on the same traces


@pytest.mark.slow
def test_small_benchmark_at_one_request_per_minute() -> None:
    """The quiet tier: no false page and every drop paged while it lasts. Its p95 target (90 min) is missed in
    the full benchmark (docs/benchmarks.md); three drops check only that detection stays under twice that."""
    bench = _bench()
    rate, target = bench.TIERS["1 req/min"]
    ours, _ = bench.bench_tier(rate, target, route_days=5.0, drops=3, seed=11, config=Config(), kappa=30.0)
    assert ours.pages_clean == 0 and ours.pages_small == 0 and ours.false_pages_drop == 0
    assert ours.detected == ours.drops == 3
    assert max(ours.detection) < 2 * target


def test_version_one_store_gains_the_dispersion_columns(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "baselines.db"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE baselines (
            route TEXT NOT NULL, model_name TEXT NOT NULL, engine_version TEXT NOT NULL, k INTEGER NOT NULL,
            acceptance_ratio REAL NOT NULL, position_acceptance TEXT NOT NULL, mean_acceptance_length REAL,
            overdispersion REAL NOT NULL, drafted_tokens REAL NOT NULL, source TEXT NOT NULL, pinned INTEGER NOT NULL,
            created REAL NOT NULL, updated REAL NOT NULL, PRIMARY KEY (route, model_name, engine_version, k));
        INSERT INTO baselines VALUES ('chat', 'm', '', 4, 0.5, '[]', 3.0, 30.0, 1e6, 'learned', 1, 1.0, 2.0);
    """)
    conn.commit()
    conn.close()
    store = StateStore(str(path))
    old = store.get("chat", BaselineKey("m", "", 4))
    assert old is not None and old.dispersion_model() == DispersionModel(30.0, 0.0)  # a plain φ, as before
    assert old.dispersion_block_seconds == 60.0  # learned on the 1-minute blocks of its time
    store.put(dataclasses.replace(old, dispersion_intercept=9.0, dispersion_slope=0.04, dispersion_block_seconds=15.0))
    again = store.get("chat", BaselineKey("m", "", 4))
    assert again.dispersion_model() == DispersionModel(9.0, 0.04) and again.dispersion_block_seconds == 15.0
    assert store.errors == []
    store.close()


def test_a_reload_reopens_the_store_after_every_evaluator_closed(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    first = build_evaluator(ctx, _route())
    first.close()
    again = build_evaluator(ctx, _route())
    assert not again.store.closed and again.store is not first.store
    again.close()


_values = st.floats(min_value=0, max_value=1e7, allow_nan=False) | st.just(0.0)
# RouteState's text fields (the baseline's model, engine version and source): every other field an evaluator
# sets is a number, a bool or None.
_TEXT_FIELDS = frozenset(f.name for f in dataclasses.fields(RouteState) if f.type == "str")


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
# Two clean cycles after a model change learn a baseline, whose key and source are text fields.
@example(
    [
        (False, "a", None, False, 0, 0, 0),
        (True, "a", None, False, 0, 0, 0),
        (True, "b", None, False, 0, 1, 1),
        (True, "b", None, False, 0, 10, 1),
        (True, "b", None, False, 0, 10, 1),
    ]
)
@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.sampled_from(["a", "b", ""]),
            st.sampled_from([None, 0, 3, 4]),
            st.booleans(),
            _values,
            _values,
            _values,
        ),
        min_size=1,
        max_size=60,
    )
)
def test_odd_observations_never_raise(tmp_path_factory, cycles) -> None:
    detection = DetectionConfig(
        warmup_drafted_tokens=10, warmup_seconds=0.0, min_drafted_tokens=0, min_duration_seconds=0.0
    )
    ctx = _ctx(tmp_path_factory.mktemp("state"), detection)
    ev = build_evaluator(ctx, _route(detection))
    for i, (up, model, k, reset, drafts, tokens, accepted) in enumerate(cycles):
        fields = ev.evaluate(
            RouteObservation(
                route="chat",
                ts=i * 61.0,
                up=up,
                model_name=model,
                k=k,
                reset=reset,
                d_drafts=drafts,
                d_draft_tokens=tokens,
                d_accepted=accepted,
                d_accepted_per_pos=(accepted / 2, accepted / 4),
            ),
            (),
        )
        for name, value in fields.items():
            if name in _TEXT_FIELDS:
                assert isinstance(value, str), (name, value)
            else:
                assert value is None or isinstance(value, bool) or math.isfinite(value), (name, value)
    ev.close()


def test_a_draft_length_that_follows_load_is_not_a_model_change(tmp_path: Path) -> None:
    """SGLang's adaptive tiers and a batch-size schedule move k without a restart: the baseline stays."""
    ev = build_evaluator(_ctx(tmp_path), _route())
    for i, k in enumerate([4, 4, 2, 1, 0, 3, 4]):
        fields = ev.evaluate(
            RouteObservation(
                route="chat",
                ts=float(i),
                up=True,
                model_name="m",
                engine_version="1",
                k=k,
                d_drafts=10.0 * k,
                d_draft_tokens=10.0 * k * k,
                d_accepted=5.0 * k * k,
            ),
            (),
        )
    assert fields["model_changes_total"] == 0.0
    assert ev.key == BaselineKey("m", "1", 4)
    # the same k change together with an engine restart is a redeployment
    fields = ev.evaluate(
        RouteObservation(route="chat", ts=10.0, up=True, model_name="m", engine_version="1", k=2, reset=True), ()
    )
    assert fields["model_changes_total"] == 1.0 and ev.key == BaselineKey("m", "1", 2)
    # and a new model name is one whatever k does
    fields = ev.evaluate(RouteObservation(route="chat", ts=11.0, up=True, model_name="m2", engine_version="1", k=3), ())
    assert fields["model_changes_total"] == 2.0
    ev.close()


def _busy(ts: float, drafted: float, accepted: float) -> RouteObservation:
    """One scrape of a busy route (k 4, requests running): `drafted` tokens in 4-token drafts, `accepted` of them."""
    return RouteObservation(
        route="chat",
        ts=ts,
        up=True,
        model_name="m",
        k=4,
        d_drafts=drafted / 4,
        d_draft_tokens=drafted,
        d_accepted=accepted,
        running_per_engine={"0": 8.0},
    )


def test_shorter_evidence_blocks_give_a_faster_verdict_on_a_busy_route(tmp_path: Path) -> None:
    """A pinned baseline and a clear drop from the first second: the verdict waits for the first block to close."""
    flagged = {}
    for block in (60.0, 15.0):
        detection = dataclasses.replace(
            FAST, block_seconds=block, min_duration_seconds=5.0, confirm_window_seconds=10.0, min_drafted_tokens=300
        )
        route = _route(detection, baseline=PinnedBaseline(acceptance_ratio=0.6, overdispersion=2.0))
        ev = build_evaluator(_ctx(tmp_path / str(block), detection), route)
        for second in range(1, 121):  # 200 draft tokens a second accepted at 0.36: a 40% drop
            fields = ev.evaluate(_busy(float(second), 200.0, 72.0), ())
            if fields.get("degraded"):
                flagged[block] = second
                break
        ev.close()
    assert 60 <= flagged[60.0] <= 65 and 15 <= flagged[15.0] <= 20, flagged


@pytest.mark.parametrize("block", [60.0, 15.0])
def test_blocks_span_the_configured_seconds_for_the_cusum_and_the_dispersion_learner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: float
) -> None:
    """15 s scrapes on a never-idle route: a block holds block/15 intervals, timed from the scrape before its
    first one, and the dispersion learner fits φ on the same blocks the CUSUM weighs."""
    detection = dataclasses.replace(FAST, block_seconds=block)
    route = _route(detection, baseline=PinnedBaseline(acceptance_ratio=0.6, overdispersion=2.0))
    ev = build_evaluator(_ctx(tmp_path, detection), route)
    weighed: list[tuple[float, float]] = []
    weigh = ev._weigh

    def record(closed: tuple[float, float, float] | None, now: float) -> None:
        if closed is not None:
            weighed.append((closed[0], now))
        weigh(closed, now)

    monkeypatch.setattr(ev, "_weigh", record)
    for ts in range(0, 616, 15):  # the scrape at 0 only starts the first interval; the next sets the baseline
        drafted = 0.0 if ts == 0 else 400.0
        ev.evaluate(_busy(float(ts), drafted, 0.6 * drafted), ())
    assert ev.learner.dispersion.blocks == 615 // block  # from the scrape at 0
    assert weighed == [(15.0 + block * (i - 1), 15.0 + block * i) for i in range(1, round(600 / block) + 1)]
    ev.close()


def test_a_stored_baseline_learned_on_other_blocks_keeps_r0_and_relearns_phi(tmp_path: Path) -> None:
    key = BaselineKey("m", "", 4)
    store = StateStore.in_state_dir(str(tmp_path))
    store.put(
        Baseline(
            route="chat",
            key=key,
            acceptance_ratio=0.6,
            overdispersion=30.0,
            drafted_tokens=1e6,
            dispersion_block_seconds=60.0,
            source="learned",
            pinned=True,
            created=1.0,
            updated=1.0,
        )
    )
    store.close()
    detection = dataclasses.replace(FAST, block_seconds=15.0)
    ev = build_evaluator(_ctx(tmp_path, detection), _route(detection))
    rng = random.Random(5)
    for ts in range(0, 3601, 15):  # 400 drafted tokens per 15 s, acceptance 0.6 with a little spread
        drafted = 0.0 if ts == 0 else 400.0
        ev.evaluate(_busy(float(ts), drafted, round(drafted * rng.uniform(0.55, 0.65))), ())
        if ts == 900:  # before the warm-up: the stored baseline as it is
            assert ev.reference.overdispersion == 30.0 and ev.reference.dispersion_block_seconds == 60.0
    ref = ev.reference
    assert ref.acceptance_ratio == 0.6 and ref.drafted_tokens == 1e6 and ref.pinned  # r0 is kept
    assert ref.dispersion_block_seconds == 15.0 and ref.overdispersion != 30.0  # φ of the route's own blocks
    assert ev.store.get("chat", key) == ref
    ev.close()
