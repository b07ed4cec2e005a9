"""r0 by time of day (specwatch/stats/daily.py) and its place in the baseline store."""

from __future__ import annotations

import dataclasses
import math
import random
import sqlite3
from pathlib import Path

import pytest

from specwatch.stats.daily import DAY_SECONDS, DailyFit, DailyProfile
from specwatch.tracking.baselines import BaselineKey, BaselineLearner, BaselineStore


def _feed(fit: DailyFit, hours: float, swing: float, seed: int = 1, phase: float = 0.7) -> None:
    """Binomial minutes of 2,000 drafted tokens whose ratio moves as 0.5 + swing·sin(θ + phase)."""
    rng = random.Random(seed)
    for minute in range(int(hours * 60)):
        ts = 1_700_000_000.0 + 60.0 * minute
        theta = 2 * math.pi * (ts % DAY_SECONDS) / DAY_SECONDS
        r = 0.5 + swing * math.sin(theta + phase)
        fit.add(ts, sum(rng.random() < r for _ in range(2000)), 2000.0)


def test_a_daily_swing_is_recovered_and_used() -> None:
    fit = DailyFit()
    _feed(fit, 24, 0.03)
    profile = fit.fit(phi=1.0)
    assert profile is not None
    assert math.hypot(profile.cos, profile.sin) == pytest.approx(0.03, abs=0.002)
    assert profile.mean == pytest.approx(0.5, abs=0.001)
    assert profile.usable and profile.spread < 2.0  # an even day: about √3


def test_no_swing_keeps_the_flat_baseline() -> None:
    fit = DailyFit()
    _feed(fit, 24, 0.0, seed=2)
    profile = fit.fit(phi=1.0)
    assert profile is not None and profile.chi2 < 13.8 and not profile.usable


def test_a_few_hours_do_not_determine_the_day() -> None:
    fit = DailyFit()
    _feed(fit, 4, 0.03, seed=3)
    profile = fit.fit(phi=1.0)
    assert profile is not None and profile.spread > 3.0 and not profile.usable


def test_overdispersion_widens_the_profile() -> None:
    fit = DailyFit()
    _feed(fit, 24, 0.03, seed=4)
    plain, clustered = fit.fit(phi=1.0), fit.fit(phi=100.0)
    assert plain is not None and clustered is not None
    assert clustered.stderr == pytest.approx(10 * plain.stderr, rel=1e-9)
    assert clustered.chi2 == pytest.approx(plain.chi2 / 100, rel=1e-9)


def test_learner_state_round_trips_and_old_state_starts_the_fit_afresh() -> None:
    learner = BaselineLearner()
    for i in range(100):
        learner.add(1_700_000_000.0 + 15 * i, 500.0, 1000.0, 250.0, (300.0, 200.0), start=1_700_000_000.0 + 15 * i - 15)
    raw = learner.to_json()
    assert BaselineLearner.from_json(raw).daily == learner.daily
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
    store = BaselineStore(str(path))
    key = BaselineKey("m", "", 4)
    old = store.get("chat", key)
    assert old is not None and old.daily is None and old.dispersion_block_seconds == 15.0
    profile = DailyProfile(0.5, 0.01, -0.02, 0.002, 40.0, 1.8, final=True)
    store.put(dataclasses.replace(old, daily=profile))
    again = store.get("chat", key)
    assert again is not None and again.daily == profile
    assert store.errors == []
    store.close()


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
    stored = ev.store.get("chat", ref.key)
    assert stored is not None and stored.daily == ref.daily
    ev.close()
