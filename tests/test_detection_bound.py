"""The oracle of scripts/bench_detection_bound.py: its variance model and its CUSUM."""

from __future__ import annotations

from pathlib import Path

import pytest
from load_script import load_script

from specwatch.tracegen import DAY, Drop, TraceSpec, request_stream


def _bound():
    return load_script("bench_detection_bound")


def test_fitted_variance_predicts_short_and_long_requests() -> None:
    bound = _bound()
    draws = list(request_stream(TraceSpec(rate=0.2, duration=2 * DAY, seed=21)))
    model = bound.RequestModel.fit(draws)
    assert model.a > 0 and model.b > 0  # heterogeneity and within-request noise are both there
    for low, high in ((0, 300), (600, 10**6)):
        group = [d for d in draws if low <= d.drafted < high]
        observed = sum((d.accepted / d.drafted - model.r0) ** 2 for d in group) / len(group)
        predicted = sum(model.variance(d.drafted) for d in group) / len(group)
        assert observed == pytest.approx(predicted, rel=0.25)


def test_oracle_cusum_climbs_only_during_a_drop() -> None:
    bound = _bound()
    model = bound.RequestModel.fit(list(request_stream(TraceSpec(rate=0.2, duration=DAY, seed=22))))
    spec = TraceSpec(rate=0.2, duration=4 * 3600.0, seed=23, drops=(Drop(start=2 * 3600.0, ratio=0.20),))
    path = list(bound.cusum_path(request_stream(spec), model, (0.95, 0.85)))
    before = max(s for t, s in path if t < 2 * 3600.0)
    during = max(s for t, s in path if t >= 2 * 3600.0)
    assert before < 8 < during  # ~1,400 requests of a 20% drop are overwhelming evidence


def test_quick_run_writes_its_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# B\n\n## Detection limit (oracle)\nold\n\n## Next\nkept\n", encoding="utf-8")
    bound = _bound()
    bound.QUANTILES = (0.5,)
    assert bound.main(["--samples", "1", "--drops", "4", "--fit-days", "10", "--write", str(doc)]) == 0
    text = doc.read_text(encoding="utf-8")
    assert "old" not in text and "## Next\nkept" in text
    assert text.count("| 0.95, 0.85 | 50% of the sets |") == 1 and "| 0.95, 0.8 | 50% of the sets |" in text
