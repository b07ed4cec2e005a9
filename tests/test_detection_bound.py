"""The exact per-request bound of bench/bench_detection_bound.py: its requests, its likelihood ratio, its CUSUM."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
from load_script import load_script

from specwatch.offline.tracegen import DAY, Drop, TraceSpec, request_stream

np = pytest.importorskip("numpy")  # the bound needs numpy (the `bench` extra; matplotlib brings it too)


def _bound():
    return load_script("bench_detection_bound")


@pytest.mark.slow
def test_vectorised_requests_follow_the_request_stream_model() -> None:
    bound = _bound()
    spec = TraceSpec(rate=0.2, duration=2 * DAY, seed=21, **bound.MIX)
    t, share, hist = bound.draw_requests(spec, np.random.default_rng(1))
    k = spec.k
    ours = (hist * np.arange(k + 1)).sum() / (hist.sum() * k)
    theirs = list(request_stream(spec))
    reference = sum(d.accepted for d in theirs) / sum(d.drafted for d in theirs)
    assert ours == pytest.approx(reference, rel=0.02)
    assert len(t) == pytest.approx(len(theirs), rel=0.03)  # the same arrivals with the daily swing
    assert 0.1 - 1e-9 <= share.min() and share.max() <= 0.5 + 1e-9


@pytest.mark.slow
def test_likelihood_ratio_is_exact_under_the_zone_edge() -> None:
    """Under the hypothesis it is the ratio against (a 5% drift), E[e^ℓ] = 1: Wald's identity, which a wrong
    integral over the Beta spread breaks (one request then looks like strong evidence)."""
    bound = _bound()
    model = bound.Model(TraceSpec(rate=1 / 60, kappa=12.0, **bound.MIX), 0.2)
    llr = bound.Llr(model)
    rng = np.random.default_rng(3)
    means = {}
    for drop in (0.0, 0.05, 0.2):
        spec = bound._route_spec(model, duration=20 * DAY, drops=((Drop(start=0.0, ratio=drop),) if drop else ()))
        _, share, hist = bound.draw_requests(spec, rng)
        values = llr(share, hist)
        means[drop] = values.mean()
        if drop == 0.05:
            assert np.exp(values).mean() == pytest.approx(1.0, abs=0.05)
    assert means[0.0] < means[0.05] < 0 < means[0.2]


def test_with_the_mix_unknown_every_request_is_weighed_at_the_days_mean_share() -> None:
    bound = _bound()
    spec = TraceSpec(rate=1 / 60, kappa=12.0, **bound.MIX)
    _, share, hist = bound.draw_requests(replace(spec, duration=2 * DAY), np.random.default_rng(6))
    known, unknown = bound.Llr(bound.Model(spec, 0.2)), bound.Llr(bound.Model(spec, 0.2, share_known=False))
    at_mean = np.full_like(share, bound.MIX["mix_share"])
    assert unknown(share, hist) == pytest.approx(known(at_mean, hist))
    assert not np.allclose(known(share, hist), known(at_mean, hist))  # the hour's share does change ℓ


def test_a_baseline_error_moves_each_routes_acceptance_and_nothing_else() -> None:
    """--baseline-error: one factor on α per route, drawn from its own rng; an exact baseline draws nothing."""
    bound = _bound()
    spec = TraceSpec(rate=0.2, duration=DAY, **bound.MIX)
    exact, learned = bound.Model(spec, 0.2), bound.Model(spec, 0.2, baseline_error=0.01)
    rng = np.random.default_rng(8)
    assert exact.route_scale(rng) == 1.0
    assert rng.bit_generator.state == np.random.default_rng(8).bit_generator.state  # an exact baseline draws nothing
    scales = [learned.route_scale(np.random.default_rng(n)) for n in range(400)]
    assert np.std(np.log(scales)) == pytest.approx(0.01, rel=0.15)

    def ratio(route_scale: float) -> float:
        _, _, hist = bound.draw_requests(spec, np.random.default_rng(9), route_scale)
        return float((hist * np.arange(spec.k + 1)).sum() / (hist.sum() * spec.k))

    assert ratio(0.9) < 0.95 * ratio(1.0)  # the route really accepts less than the baseline says


@pytest.mark.slow
def test_one_class_reading_has_the_mixtures_spread() -> None:
    """--one-class: one Beta with the mixture's mean and variance of the per-request scale, every request read alike."""
    bound = _bound()
    spec = TraceSpec(rate=1 / 60, kappa=12.0, **bound.MIX)
    model = bound.Model(spec, 0.2, one_class=True)
    kappa, c_mean = model.one_class_fit()
    rng = np.random.default_rng(12)
    u = rng.beta(12.0 * bound.BETA_MEAN, 12.0 * (1 - bound.BETA_MEAN), 400_000)
    scale = u * np.where(rng.uniform(size=u.size) < bound.MIX["mix_share"], bound.MIX["mix_scale"], 1.0) / c_mean
    m = bound.BETA_MEAN
    assert scale.mean() == pytest.approx(m, rel=0.01)
    assert scale.var() == pytest.approx(m * (1 - m) / (kappa + 1), rel=0.02)
    assert kappa < 12.0  # the classes widen the spread
    _, share, hist = bound.draw_requests(replace(spec, duration=DAY), np.random.default_rng(13))
    llr = bound.Llr(model)
    assert llr(share, hist) == pytest.approx(llr(np.zeros_like(share), hist))  # the hour's share is not read


def test_vectorised_cusum_is_the_recursion() -> None:
    bound = _bound()
    rng = random.Random(4)
    values = [rng.gauss(-0.1, 1.0) for _ in range(2000)]
    s, loop = 0.0, []
    for v in values:
        s = max(0.0, s + v)
        loop.append(s)
    assert bound.cusum(np.array(values)) == pytest.approx(loop, abs=1e-9)


@pytest.mark.slow
def test_quick_run_writes_its_section_and_json(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# B\n\n## Detection limit (oracle)\nold\n\n## Next\nkept\n", encoding="utf-8")
    out = tmp_path / "bound.json"
    bound = _bound()
    assert (
        bound.main(
            [
                "--tier",
                "1 req/min",
                "--kappa",
                "30",
                "--sets",
                "1",
                "--drops",
                "2",
                "--write",
                str(doc),
                "--json",
                str(out),
            ]
        )
        == 0
    )
    text = doc.read_text(encoding="utf-8")
    assert "old" not in text and "## Next\nkept" in text and "| 1 req/min | 30 | 90% of the sets |" in text
    assert set(json.loads(out.read_text())) == {"1 req/min|30"}
