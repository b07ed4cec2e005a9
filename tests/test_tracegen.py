"""Trace generator: determinism, counter shape, calibrated drops, overdispersion, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwatch.cli import main as cli_main
from specwatch.stats.overdispersion import DispersionEstimator
from specwatch.offline.tracegen import (
    DAY,
    Drop,
    ModelChange,
    TraceSpec,
    conditional_alphas,
    drop_scale,
    generate,
    mean_acceptance_ratio,
    request_stream,
)


def _ratio(samples, start: float, end: float) -> float:
    inside = [s for s in samples if start <= s.ts - samples[0].ts + 15 <= end]
    return (inside[-1].accepted_tokens - inside[0].accepted_tokens) / (inside[-1].draft_tokens - inside[0].draft_tokens)


def test_same_seed_same_trace() -> None:
    spec = TraceSpec(rate=0.2, duration=3600.0, seed=4)
    assert list(generate(spec)) == list(generate(spec))
    assert list(generate(spec)) != list(generate(TraceSpec(rate=0.2, duration=3600.0, seed=5)))


def test_counters_are_cumulative_and_consistent() -> None:
    samples = list(generate(TraceSpec(rate=2.0, duration=3600.0, seed=1)))
    assert len(samples) == 240 and samples[1].ts - samples[0].ts == 15.0
    for prev, cur in zip(samples, samples[1:]):
        assert cur.drafts >= prev.drafts and cur.accepted_tokens >= prev.accepted_tokens
    last = samples[-1]
    assert last.draft_tokens == 4 * last.drafts
    assert last.accepted_tokens == sum(last.accepted_per_pos)
    assert list(last.accepted_per_pos) == sorted(last.accepted_per_pos, reverse=True)  # prefix acceptance


@pytest.mark.slow
@pytest.mark.parametrize("rate", [2.0, 0.2, 1 / 60])
def test_mean_ratio_matches_the_model_at_every_tier(rate: float) -> None:
    samples = list(generate(TraceSpec(rate=rate, duration=2 * DAY, seed=2)))
    last = samples[-1]
    assert last.accepted_tokens / last.draft_tokens == pytest.approx(mean_acceptance_ratio("eagle3", 4, 30.0), rel=0.04)


def test_injected_drop_lowers_the_ratio_by_the_requested_fraction() -> None:
    samples = list(
        generate(TraceSpec(rate=2.0, duration=8 * 3600.0, seed=3, drops=(Drop(start=4 * 3600.0, ratio=0.20),)))
    )
    before, after = _ratio(samples, 0, 4 * 3600.0), _ratio(samples, 4 * 3600.0 + 60, 8 * 3600.0)
    assert 1 - after / before == pytest.approx(0.20, abs=0.02)
    # ~7-9% per position (docs/design/detection-research.md §1)
    assert 0.85 < drop_scale("eagle3", 4, 30.0, 0.20) < 0.97


def test_model_change_restarts_counters() -> None:
    samples = list(
        generate(TraceSpec(rate=2.0, duration=2 * 3600.0, seed=3, changes=(ModelChange(at=3600.0, model_name="m2"),)))
    )
    i = next(i for i, s in enumerate(samples) if s.model_name == "m2")
    assert samples[i].drafts < samples[i - 1].drafts  # the engine restarted
    assert all(s.model_name == "m2" for s in samples[i:])


def test_traces_are_overdispersed_like_real_traffic() -> None:
    est = DispersionEstimator()
    prev = None
    for s in generate(TraceSpec(rate=2.0, duration=6 * 3600.0, seed=1)):
        if prev is not None:
            est.add(s.ts, s.accepted_tokens - prev.accepted_tokens, s.draft_tokens - prev.draft_tokens)
        prev = s
    assert est.estimate() > 10  # request heterogeneity, far from a binomial's 1


@pytest.mark.slow
def test_request_stream_is_the_model_of_the_traces() -> None:
    spec = TraceSpec(rate=0.2, duration=DAY, seed=6)
    draws = list(request_stream(spec))
    assert len(draws) == pytest.approx(0.2 * DAY, rel=0.03)  # Poisson arrivals at the daily mean rate
    assert all(0 <= a.t < b.t < DAY for a, b in zip(draws, draws[1:]))
    assert all(0 <= d.accepted <= d.drafted and d.drafted % 4 == 0 for d in draws)
    ratio = sum(d.accepted for d in draws) / sum(d.drafted for d in draws)
    assert ratio == pytest.approx(mean_acceptance_ratio("eagle3", 4, 30.0), rel=0.03)
    trace = list(generate(spec))[-1]  # the interval traces of the same model agree
    assert ratio == pytest.approx(trace.accepted_tokens / trace.draft_tokens, rel=0.04)
    # the daily swing: the first half day (sin > 0) is busier than the second
    assert sum(d.t < DAY / 2 for d in draws) > 1.25 * sum(d.t >= DAY / 2 for d in draws)


@pytest.mark.slow
def test_request_stream_applies_drops() -> None:
    draws = list(
        request_stream(TraceSpec(rate=2.0, duration=4 * 3600.0, seed=8, drops=(Drop(start=2 * 3600.0, ratio=0.20),)))
    )

    def ratio(ds):
        return sum(d.accepted for d in ds) / sum(d.drafted for d in ds)

    before, after = ratio([d for d in draws if d.t < 7200]), ratio([d for d in draws if d.t >= 7200])
    assert 1 - after / before == pytest.approx(0.20, abs=0.02)
    # requests differ far more than binomial noise would allow: the heterogeneity the detectors face
    long = [d.accepted / d.drafted for d in draws if d.t < 7200 and d.drafted >= 400]
    mean = sum(long) / len(long)
    assert sum((x - mean) ** 2 for x in long) / len(long) > 5 * mean * (1 - mean) / 400


def test_conditional_alphas_extend_the_profile() -> None:
    assert conditional_alphas("mtp", 5)[:3] == pytest.approx((0.92, 0.68 / 0.92, 0.38 / 0.68))
    assert conditional_alphas("mtp", 5)[3] == conditional_alphas("mtp", 5)[2]
    with pytest.raises(ValueError, match="unknown profile"):
        conditional_alphas("medusa", 3)


def test_cli_writes_jsonl(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    assert (
        cli_main(
            [
                "simulate-trace",
                "--rate",
                "0.2",
                "--duration",
                "1h",
                "--drop",
                "30m:0.2",
                "--model-change",
                "45m:m2",
                "--seed",
                "1",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 240
    assert set(lines[0]) == {
        "ts",
        "route",
        "model_name",
        "drafts",
        "draft_tokens",
        "accepted_tokens",
        "accepted_per_pos",
        "running",
    }
    assert lines[-1]["model_name"] == "m2"


def test_cli_rejects_a_bad_drop(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["simulate-trace", "--drop", "soon:big"])
    assert "AT:RATIO" in capsys.readouterr().err
