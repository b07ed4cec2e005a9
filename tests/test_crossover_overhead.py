"""The engine's own per-step cost, fitted from live step times against the step model (crossover/overhead.py).

The engines here are measured tables (the packed H100 step times) or the calibrated H200 model, plus a known
overhead: per step and per scored token. The fitted overhead must bring B* to the engine's own.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from specwatch.crossover import gpus
from specwatch.crossover.estimate import with_kernel
from specwatch.crossover.inputs import EngineOverhead
from specwatch.crossover.livecal import LiveCalibration
from specwatch.crossover.overhead import fit_overhead
from specwatch.crossover.reference import ReferenceRun
from specwatch.crossover.shapes import load_packed_tables
from specwatch.crossover.speedup import (
    LLAMA3_8B,
    Draft,
    StepModel,
    expected_tokens,
    interpolate_crossover,
    positions_from_alpha,
)

BINS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
# A per-token cost (sampling, rejection) pulls the crossover in; a per-step one (scheduling) pushes it out.
OVERHEADS = [EngineOverhead(0.0, 5e-6), EngineOverhead(3e-3, 10e-6), EngineOverhead(1e-3, 0.0)]


def spec_s(run: ReferenceRun, batch: int, gamma: int) -> float:
    return run.target_s[(batch, gamma + 1)] + gamma * run.draft_s[batch]


def table_crossover(run: ReferenceRun, gamma: int, alpha: float, overhead: EngineOverhead) -> float | None:
    e = expected_tokens(alpha, gamma)
    return interpolate_crossover(
        [
            (
                b,
                e
                * (run.target_s[(b, 1)] + overhead.seconds(b, 1))
                / (spec_s(run, b, gamma) + overhead.seconds(b, gamma + 1)),
            )
            for b in run.batches
        ]
    )


def test_table_plus_overhead_crossover_is_recovered_within_10_percent():
    """Every packed H100 table, gamma 2 and 4, alpha 0.5-0.8: the engine's speculative steps at the live bins are
    the table's plus a known overhead; fitted against the table, the overhead gives B* within 10% of the
    table-plus-overhead one wherever that crosses within the measured batches (and none where it does not).
    Without the fit, B* misses by far more."""
    crossing = 0
    worst_without = 0.0
    for table in load_packed_tables():
        run = table.run
        largest = max(run.batches)
        for gamma in (2, 4):
            bins = [b for b in BINS if (b, gamma + 1) in run.target_s]
            for true in OVERHEADS:
                observed = [(b, gamma + 1, spec_s(run, b, gamma) + true.seconds(b, gamma + 1)) for b in bins]
                fitted = fit_overhead(observed, [spec_s(run, b, gamma) for b in bins])
                for alpha in (0.5, 0.6, 0.7, 0.8):
                    truth = table_crossover(run, gamma, alpha, true)
                    got = table_crossover(run, gamma, alpha, fitted)
                    if truth is None:
                        assert got is None or got > 0.9 * largest, (table.cell, gamma, alpha, true, fitted)
                        continue
                    crossing += 1
                    # Past the grid's end counts as the grid's end: a truth at 246 read as "none up to 256".
                    assert (got if got is not None else largest) == pytest.approx(truth, rel=0.10), (
                        table.cell,
                        gamma,
                        alpha,
                        true,
                        fitted,
                    )
                    without = table_crossover(run, gamma, alpha, EngineOverhead())
                    worst_without = max(worst_without, abs((without or largest) - truth) / truth)
    assert crossing >= 30
    assert worst_without > 0.5


def test_little_evidence_is_shrunk_and_the_terms_are_bounded():
    run = next(t.run for t in load_packed_tables() if t.cell == ("llama3-8b", 1024))
    true = EngineOverhead(2e-3, 5e-6)
    observed = [(b, 5, spec_s(run, b, 4) + true.seconds(b, 5)) for b in BINS]
    predicted = [spec_s(run, b, 4) for b in BINS]
    one = fit_overhead(observed[:1], predicted[:1])
    many = fit_overhead(observed, predicted)
    # One bin explains its residual only in part; ten pin both terms near the truth.
    assert one.seconds(8, 5) < true.seconds(8, 5)
    assert many.step_s == pytest.approx(true.step_s, rel=0.15) and many.token_s == pytest.approx(true.token_s, rel=0.15)
    # The engine faster than the model: no negative overhead. Nothing observed: none.
    faster = [(b, q, 0.8 * t) for b, q, t in observed]
    assert fit_overhead(faster, [t for _, _, t in observed]) == EngineOverhead()
    assert fit_overhead([], []) == EngineOverhead()


def h200_packed() -> StepModel:
    hardware, efficiency = gpus.lookup("H200")
    model = StepModel(LLAMA3_8B, hardware, efficiency, draft=Draft.parse("eagle3", LLAMA3_8B))
    return with_kernel(model, "packed")


@pytest.mark.parametrize("true", OVERHEADS, ids=["per-token", "both", "per-step"])
def test_live_calibration_converges_to_the_engines_crossover(true):
    """On the calibrated H200, live calibration holds the kernel model and fits the engine's overhead: fed an
    engine whose step times are the model's plus a known overhead (k 4, context 1024), its live B* ends within
    10% of the engine's own and settles."""
    prior = h200_packed()
    engine = replace(prior, overhead=true)
    positions = positions_from_alpha(0.6, 4)
    truth = engine.crossover(positions, 1024)
    assert truth is not None
    live = LiveCalibration(prior)
    assert live.fits_overhead
    answer = None
    for i, b in enumerate(BINS[:8]):
        live.add(b, engine.spec_step_s(b, 4, 1024) + true.seconds(b, 5), 500)
        answer = live.answer(positions, 1024, 100.0 * i)
    assert answer is not None and answer.batch_size == pytest.approx(truth, rel=0.10)
    assert answer.settled
    assert live.speedup(positions, 1024, 16) == pytest.approx(engine.speedup(16, positions, 1024), rel=0.05)
