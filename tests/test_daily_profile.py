"""r0 by time of day (specwatch/stats/daily.py) and its place in the baseline store."""

from __future__ import annotations

import dataclasses
import math
import random
import sqlite3
from pathlib import Path

import pytest

from specwatch.stats.daily import DAY_SECONDS, DailyFit, DailyProfile
from specwatch.stats.overdispersion import ClosedBlock, DispersionEstimator
from specwatch.state.baselines import BaselineKey, BaselineLearner
from specwatch.state.store import StateStore


def _binomial(rng: random.Random, n: int, p: float) -> float:
    """A binomial draw by its normal approximation (n is in the thousands here)."""
    return float(round(n * p + math.sqrt(n * p * (1.0 - p)) * rng.gauss(0.0, 1.0)))


def _feed(
    fit: DailyFit,
    hours: float,
    swing: float,
    seed: int = 1,
    phase: float = 0.7,
    spread: float = 0.0,
    tokens: int = 2000,
) -> None:
    """One-minute blocks of `tokens` drafted tokens whose ratio moves as 0.5 + swing·sin(θ + phase): binomial, or
    each block's ratio first drawn with sd `spread` around it (clustered tokens)."""
    rng = random.Random(seed)
    for minute in range(int(hours * 60)):
        ts = 1_700_000_000.0 + 60.0 * minute
        theta = 2 * math.pi * (ts % DAY_SECONDS) / DAY_SECONDS
        r = min(0.99, max(0.01, 0.5 + swing * math.sin(theta + phase) + rng.gauss(0.0, spread)))
        fit.add(ClosedBlock(ts - 60.0, ts, _binomial(rng, tokens, r), float(tokens)))


def test_a_daily_swing_is_recovered_and_used() -> None:
    fit = DailyFit()
    _feed(fit, 24, 0.03)
    profile = fit.fit()
    assert profile is not None
    assert math.hypot(profile.cos, profile.sin) == pytest.approx(0.03, abs=0.002)
    assert profile.mean == pytest.approx(0.5, abs=0.001)
    assert profile.usable and profile.spread < 2.0  # an even day: about √3


def test_no_swing_keeps_the_flat_baseline() -> None:
    fit = DailyFit()
    _feed(fit, 24, 0.0, seed=2)
    profile = fit.fit()
    assert profile is not None and profile.chi2 < 13.8 and not profile.usable


def test_a_few_hours_do_not_determine_the_day() -> None:
    fit = DailyFit()
    _feed(fit, 4, 0.03, seed=3)
    profile = fit.fit()
    assert profile is not None and profile.spread > 3.0 and not profile.usable


def test_clustered_blocks_widen_the_profile() -> None:
    """Blocks that vary more than a binomial (sd 0.05 of their ratio against 0.011) give a design effect of about
    (0.05² + 0.011²) / 0.011² ≈ 21, and a profile that much less certain."""
    plain_fit, clustered_fit = DailyFit(), DailyFit()
    _feed(plain_fit, 24, 0.03, seed=4)
    _feed(clustered_fit, 24, 0.03, seed=4, spread=0.05)
    plain, clustered = plain_fit.fit(), clustered_fit.fit()
    assert plain is not None and clustered is not None
    assert plain.dispersion.at(2000) == pytest.approx(1.0, abs=0.3)
    assert clustered.dispersion.at(2000) == pytest.approx(21.0, rel=0.2)
    ratio = clustered.stderr / plain.stderr
    assert ratio == pytest.approx(math.sqrt(clustered.dispersion.at(2000) / plain.dispersion.at(2000)), rel=0.2)
    assert clustered.chi2 < plain.chi2 / 10


def test_the_daily_swing_is_not_counted_as_noise() -> None:
    """Binomial blocks around a swinging mean, most of 40,000 tokens and every tenth of 4,000 (a busy route's block
    cut short by an idle scrape). About one mean, the swing looks like noise that grows with the block: the
    dispersion learner's line comes out near 1 + 0.002·D, so a short block weighs far more than it should. About the
    profile, the blocks are binomial: φ(D) ≈ 1 at both sizes."""
    rng = random.Random(6)
    fit, about_mean = DailyFit(), DispersionEstimator(block_seconds=60.0)
    for minute in range(18 * 60):
        ts = 1_700_000_000.0 + 60.0 * minute
        theta = 2 * math.pi * (ts % DAY_SECONDS) / DAY_SECONDS
        d = 4000 if minute % 10 == 0 else 40000
        accepted = _binomial(rng, d, 0.5 + 0.03 * math.sin(theta + 0.7))
        fit.add(ClosedBlock(ts - 60.0, ts, accepted, float(d)))
        about_mean.add(ts, accepted, float(d), idle=True, start=ts - 60.0)
    profile, line = fit.fit(), about_mean.model()
    assert profile is not None and line is not None
    # the swing, seen as dispersion rising with the block's size
    assert line.intercept < 2.0 and line.at(40000) > 5 * line.at(4000)
    assert profile.dispersion.at(4000) == pytest.approx(1.0, abs=0.3)
    assert profile.dispersion.at(40000) == pytest.approx(1.0, abs=0.3)


def test_learner_state_round_trips_and_old_state_starts_the_fit_afresh() -> None:
    learner = BaselineLearner()
    for i in range(100):
        learner.add(1_700_000_000.0 + 15 * i, 500.0, 1000.0, 250.0, (300.0, 200.0), start=1_700_000_000.0 + 15 * i - 15)
    assert learner.daily.blocks == learner.dispersion.blocks > 0  # fitted on the blocks φ is learned on
    raw = learner.to_json()
    assert BaselineLearner.from_json(raw).daily == learner.daily
    raw["daily"] = raw["daily"][:9]  # the interval sums of an earlier form
    assert BaselineLearner.from_json(raw).daily == DailyFit()
    del raw["daily"]  # state saved before the profile existed
    assert BaselineLearner.from_json(raw).daily == DailyFit()


def test_store_without_the_profile_column_gains_it(tmp_path: Path) -> None:
    path = tmp_path / "baselines.db"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE baselines (
            route TEXT NOT NULL, model_name TEXT NOT NULL, engine_version TEXT NOT NULL, k INTEGER NOT NULL,
            acceptance_ratio REAL NOT NULL, position_acceptance TEXT NOT NULL, mean_acceptance_length REAL,
            overdispersion REAL NOT NULL, drafted_tokens REAL NOT NULL, source TEXT NOT NULL, pinned INTEGER NOT NULL,
            created REAL NOT NULL, updated REAL NOT NULL, dispersion_intercept REAL,
            dispersion_slope REAL NOT NULL DEFAULT 0, dispersion_block_seconds REAL,
            PRIMARY KEY (route, model_name, engine_version, k));
        INSERT INTO baselines VALUES ('chat', 'm', '', 4, 0.5, '[]', 3.0, 30.0, 1e6, 'learned', 1, 1.0, 2.0,
            20.0, 0.01, 15.0);
    """)
    conn.commit()
    conn.close()
    store = StateStore(str(path))
    key = BaselineKey("m", "", 4)
    old = store.get("chat", key)
    assert old is not None and old.daily is None and old.dispersion_block_seconds == 15.0
    profile = DailyProfile(0.5, 0.01, -0.02, 0.002, 40.0, 1.8, 60.0, 0.001, final=True)
    store.put(dataclasses.replace(old, daily=profile))
    again = store.get("chat", key)
    assert again is not None and again.daily == profile
    assert store.errors == []
    store.close()


@pytest.mark.slow
def test_evaluator_learns_and_fixes_the_profile_of_a_daily_mix(tmp_path: Path) -> None:
    """A busy route with a daily request mix (tracegen's, a second class at 0.85x α for 30% ± 20% of requests)
    gets a usable profile in its first day, fixed once usable, that follows the mix: lowest where the second class
    peaks. It is persisted with the baseline."""
    from specwatch.config import Config, DetectionConfig, RouteConfig
    from specwatch.evaluators.acceptance_drop import build_evaluator
    from specwatch.evaluators.base import EvaluatorContext
    from specwatch.offline.replay import ObservationBuilder
    from specwatch.offline.tracegen import DAY, TraceSpec, generate

    detection = DetectionConfig()
    ctx = EvaluatorContext(config=Config(state_dir=str(tmp_path), detection=detection), clock=lambda: 0.0)
    ev = build_evaluator(ctx, RouteConfig(name="chat", url="http://127.0.0.1:8000/metrics", detection=detection))
    spec = TraceSpec(rate=2.0, duration=20 * 3600.0, seed=5, mix_share=0.3, mix_swing=0.2, mix_scale=0.85)
    builder = ObservationBuilder("chat")
    for sample in generate(spec):
        fields = ev.evaluate(builder.observe(sample), ())
        assert not fields.get("degraded")
    ref = ev.reference
    assert ref is not None and ref.daily is not None and ref.daily.usable and ref.daily.final
    # the mix's second class peaks at mix_phase: θ + 1 = π/2 from the trace start
    start = spec.start
    low = start + (math.pi / 2 - spec.mix_phase) / (2 * math.pi) * DAY
    high = low + DAY / 2
    assert ref.daily.at(high) - ref.daily.at(low) == pytest.approx(0.05, abs=0.02)
    assert ev.fields()["baseline_ratio"] == pytest.approx(ref.daily.at(ev._last_scrape), rel=1e-9)
    # the test weighs blocks by their design effect about the profile, which holds a short block's weight to a long
    # one's within the spread of request counts (a busy route's blocks hold many requests whatever their length)
    assert ev.decision.hypotheses is not None and ev.decision.hypotheses.dispersion == ref.daily.dispersion
    assert ref.daily.dispersion.at(5000) > 0.5 * ref.daily.dispersion.at(45000)
    stored = ev.store.get("chat", ref.key)
    assert stored is not None and stored.daily == ref.daily
    ev.close()
