"""Detection horizon: the expected time to page a 20% drop, from a route's evidence rate (stats/horizon.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from load_script import load_script

from specwatch.config import Config, DetectionConfig, RouteConfig
from specwatch.cli import main as cli_main
from specwatch.evaluators.acceptance_drop import STORE_KEY, build_evaluator
from specwatch.evaluators.base import EvaluatorContext
from specwatch.offline.replay import ObservationBuilder
from specwatch.offline.tracegen import TraceSpec, generate
from specwatch.stats.horizon import confirmation_seconds, drift_per_token, probe_horizon, traffic_horizon
from specwatch.stats.overdispersion import DispersionModel

QUIET = dict(
    r0=0.49,
    r0_tested=0.48,
    drop=0.15,
    dispersion=DispersionModel(30.0),
    threshold=10.0,
    block_seconds=60.0,
    min_duration_seconds=180.0,
    confirm_window_seconds=300.0,
)


def test_drift_is_positive_under_the_drop_and_negative_at_the_baseline() -> None:
    r_ok, r_bad = 0.95 * 0.49, 0.85 * 0.49
    assert drift_per_token(0.8 * 0.49, r_ok, r_bad) > 0 > drift_per_token(0.49, r_ok, r_bad)
    # the drift at r_bad is KL(r_bad || r_ok) of one Bernoulli token
    kl = r_bad * math.log(r_bad / r_ok) + (1 - r_bad) * math.log((1 - r_bad) / (1 - r_ok))
    assert drift_per_token(r_bad, r_ok, r_bad) == pytest.approx(kl)


def test_cusum_term_is_h_phi_over_drift_times_rate() -> None:
    rate = 10.0  # drafted tokens/s: slow enough that the CUSUM, not min_duration, sets the horizon
    g = drift_per_token(0.8 * 0.49, 0.95 * 0.48, 0.85 * 0.48)
    expected = 10.0 * 30.0 / (g * rate) + 30.0  # plus half a block
    assert traffic_horizon(**QUIET, drafted_per_second=rate) == pytest.approx(expected)
    # ten times the traffic: a tenth of the time
    assert traffic_horizon(**QUIET, drafted_per_second=10 * rate) == pytest.approx((expected - 30) / 10 + 30)
    # the blocks' own design effect, where the route measured it: half the evidence, twice the time
    slow = traffic_horizon(**QUIET, drafted_per_second=rate, effective_per_second=rate / 60.0)
    assert slow == pytest.approx(2 * (expected - 30) + 30)


def test_busy_route_is_bounded_by_min_duration() -> None:
    assert traffic_horizon(**QUIET, drafted_per_second=1e6) == pytest.approx(180.0 + 30.0)


def test_confirmation_waits_for_the_window_to_hold_enough_of_the_drop() -> None:
    kw = dict(r0=0.5, r1=0.4, r_ok=0.475, phi=1.0, window_seconds=300.0, window_min_tokens=0.0)
    # plenty of tokens: the window's mean must fall 0.025 of the 0.1 it will fall: a quarter of the window
    assert confirmation_seconds(**kw, drafted_per_second=1e9) == pytest.approx(75.0, rel=1e-3)
    # few: even a window all past the drop is too noisy; it needs z² r1 (1 - r1) / (r_ok - r1)² tokens
    needed = 1.6449**2 * 0.4 * 0.6 / 0.075**2
    assert confirmation_seconds(**kw, drafted_per_second=0.1) == pytest.approx(needed / 0.1, rel=1e-3)


def test_no_traffic_or_a_drop_inside_the_zone_never_pages() -> None:
    assert traffic_horizon(**QUIET, drafted_per_second=0.0) == math.inf
    wide = {**QUIET, "drop": 0.5}  # r_ok 0.83 r0': a 20% drop does not leave the zone
    assert traffic_horizon(**wide, drafted_per_second=100.0) == math.inf


def test_probe_horizon_is_two_rounds() -> None:
    assert probe_horizon(900.0) == 1800.0


@pytest.mark.slow
def test_evaluator_exports_a_horizon_that_shrinks_with_traffic(tmp_path: Path) -> None:
    detection = DetectionConfig(warmup_drafted_tokens=20_000, warmup_seconds=1800.0)
    horizons = {}
    for rate in (2.0, 0.05):
        config = Config(state_dir=str(tmp_path / str(rate)), detection=detection)
        route = RouteConfig(name="chat", url="http://127.0.0.1:8000/metrics", detection=detection)
        ev = build_evaluator(EvaluatorContext(config=config, clock=lambda: 0.0), route)
        builder, fields = ObservationBuilder("chat"), {}
        for sample in generate(TraceSpec(rate=rate, duration=3 * 3600.0, seed=4)):
            fields = dict(ev.evaluate(builder.observe(sample), ()))
        horizons[rate] = fields["traffic_horizon_seconds"]
        ev.close()
    assert 0 < horizons[2.0] < 15 * 60 < horizons[0.05] < 86400.0


@pytest.mark.slow
def test_check_config_advises_a_probe_for_a_quiet_route_without_one(tmp_path: Path, capsys) -> None:
    state_dir = tmp_path / "state"
    detection = DetectionConfig(warmup_drafted_tokens=20_000, warmup_seconds=1800.0)
    config = Config(state_dir=str(state_dir), detection=detection)
    ctx = EvaluatorContext(config=config, clock=lambda: 0.0)
    for name in ("quiet", "probed"):  # the same quiet traffic on both: a request a minute
        route = RouteConfig(name=name, url="http://127.0.0.1:8000/metrics", detection=detection)
        ev = build_evaluator(ctx, route)
        builder = ObservationBuilder(name)
        for sample in generate(TraceSpec(route=name, rate=1 / 60, duration=3 * 3600.0, seed=4)):
            ev.evaluate(builder.observe(sample), ())
        ev.close()
    ctx.shared[STORE_KEY].close()
    config_file = tmp_path / "specwatch.yml"
    config_file.write_text(
        f"state_dir: {state_dir}\n"
        "routes:\n"
        "  - {name: quiet, url: 'http://127.0.0.1:8000/metrics'}\n"
        "  - {name: probed, url: 'http://127.0.0.1:8001/metrics', probe: {every: 15m}}\n",
        encoding="utf-8",
    )
    before = (state_dir / "baselines.db").stat().st_mtime_ns
    assert cli_main(["check-config", "--config.file", str(config_file)]) == 0
    out = capsys.readouterr().out
    advice = [line for line in out.splitlines() if line.startswith("ADVICE:")]
    assert len(advice) == 1 and "route quiet:" in advice[0] and "probe: {every: 15m}" in advice[0]
    assert (state_dir / "baselines.db").stat().st_mtime_ns == before  # read-only


@pytest.mark.slow
def test_benchmark_horizon_mode_predicts_a_busy_route_within_one_and_a_half() -> None:
    bench = load_script("bench_detection")
    rows = bench.horizon_cell(2.0, drops=2, seed=11, config=Config(), kappa=30.0)
    assert len(rows) == 2 and all(h is not None and m is not None for h, m in rows)
    for predicted, measured in rows:
        assert predicted / 1.5 <= measured <= 1.5 * predicted
