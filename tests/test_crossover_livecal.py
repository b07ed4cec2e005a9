"""Live calibration of the crossover from the route's own step times, driven by a SIMULATED vLLM engine.

The simulated engine (k 4, iid alpha 0.7) steps offline (`SimEngine.advance`) and records into the simulator's
vLLM metrics; each cycle its /metrics text goes through the real vLLM source, the route tracker and the
crossover evaluator of an `estimate:` route on the H200, as in the daemon, while the load steps through batches
8 ... 128. An engine of the calibrated kernels plus its own overhead must settle near its own crossover; one
on the H200 reference table, which the kernel model prices slow at every batch, must not settle.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from specwatch.config import parse_config
from specwatch.crossover import gpus
from specwatch.crossover.estimate import with_kernel
from specwatch.crossover.inputs import EngineOverhead
from specwatch.crossover.livecal import MIN_BINS, LiveCalibration
from specwatch.crossover.speedup import LLAMA3_8B, Draft, StepModel, positions_from_alpha, tau
from specwatch.crossover.configured import EstimatedCrossover
from specwatch.evaluators.above_crossover import AboveCrossoverEvaluator, build_evaluator
from specwatch.evaluators.base import EvaluatorContext
from specwatch.simulator.clock import SimClock
from specwatch.simulator.engine import EngineSettings, SimEngine
from specwatch.simulator.metrics_vllm import VllmMetrics
from specwatch.simulator.speculation import AcceptanceProfile
from specwatch.simulator.steptime import crossover_batch, load_table, step_seconds
from specwatch.sources.engines import parse_engine_sample
from specwatch.tracking.routes import RouteTracker

K, ALPHA = 4, 0.7
LEVELS = (8, 16, 24, 32, 48, 64, 96, 128)
CYCLE = 20.0  # simulated seconds per evaluation
CYCLES_PER_LEVEL = 4


def h200_model() -> StepModel:
    hardware, efficiency = gpus.lookup("H200")
    return StepModel(LLAMA3_8B, hardware, efficiency, draft=Draft.parse("eagle3", LLAMA3_8B))


def test_band_is_wide_until_batches_separate_the_efficiencies():
    table = load_table()
    positions = positions_from_alpha(ALPHA, K)
    live = LiveCalibration(h200_model())
    assert live.answer(positions, 1024, 0.0).batch_size is None  # nothing observed
    live.add(16, step_seconds(table, 16, K), 500)
    one = live.answer(positions, 1024, 1.0)
    assert one.bins == 1 and not one.settled
    for b in (32, 64, 128):
        live.add(b, step_seconds(table, b, K), 500)
    four = live.answer(positions, 1024, 2.0)
    assert four.bins == 4 and four.lower <= four.batch_size <= four.upper
    live.clear()
    assert live.answer(positions, 1024, 3.0).bins == 0


def run_simulated_engine(step_time, attention_kernel: str) -> dict[int, dict]:
    """The simulated vLLM engine on `step_time` (k 4, iid alpha 0.7) through the real source, tracker and
    evaluator of an `estimate:` route on the H200, the load stepping through LEVELS: the update after each."""
    metrics = VllmMetrics("llama", engines=1, k=K)
    engine = SimEngine(
        0,
        EngineSettings(
            model_name="llama",
            step_time=step_time,
            k=K,
            profile=AcceptanceProfile.iid(ALPHA, K),
            prefill_seconds_per_token=0.0,
        ),
        SimClock(),
        metrics,
        seed=3,
    )
    cfg = parse_config(
        {
            "routes": [
                {
                    "name": "chat",
                    "url": "http://127.0.0.1:8000/metrics",
                    "engine": "vllm",
                    "crossover": {
                        "estimate": {"gpu": "H200", "params": 8.03, "draft": "eagle3", "context": 1024},
                        "hold": "1m",
                        "attention_kernel": attention_kernel,
                    },
                }
            ]
        }
    )
    route = cfg.routes[0]
    evaluator = build_evaluator(EvaluatorContext(config=cfg, clock=lambda: 0.0), route)
    tracker = RouteTracker("chat")
    t = 0.0
    after_level: dict[int, dict] = {}
    for level in LEVELS:
        engine.set_offered_concurrency(level)
        for _ in range(CYCLES_PER_LEVEL):
            t += CYCLE
            engine.advance(t)
            sample = parse_engine_sample("vllm", metrics.render(), route, t)
            obs = tracker.observe(sample)
            update = evaluator.evaluate(obs, [])
        after_level[level] = update
    return after_level


class ModelEngine:
    """An engine whose kernels are the step model's and which adds `overhead` to every step (simulator step
    times: the spec step is one verify forward plus k draft forwards, so the overhead rides on the forward)."""

    def __init__(self, model: StepModel, overhead: EngineOverhead, context: float) -> None:
        self.model, self.overhead, self.context = model, overhead, context

    def target_seconds(self, batch: float, tokens_per_seq: int) -> float:
        return self.model.target_step_s(batch, tokens_per_seq, self.context) + self.overhead.seconds(
            batch, tokens_per_seq
        )

    def draft_seconds(self, batch: float) -> float:
        return self.model.draft_step_s(batch, self.context)


@pytest.mark.slow
def test_live_crossover_converges_on_a_simulated_engine_with_its_own_overhead():
    """The engine runs the calibrated H200 kernels (packed verify, as vLLM on Hopper) plus 2 ms a step and 8 us
    a scored token of its own: live calibration holds the kernel model, fits the overhead from the step-time
    histogram, and its B* settles within 10% of the engine's own (the estimate alone is off by more)."""
    prior = with_kernel(h200_model(), "packed")
    overhead = EngineOverhead(2e-3, 8e-6)
    positions = positions_from_alpha(ALPHA, K)
    true_b_star = replace(prior, overhead=overhead).crossover(positions, 1024)
    estimate = prior.crossover(positions, 1024)
    assert true_b_star is not None and estimate is not None and abs(estimate / true_b_star - 1) > 0.2
    final = run_simulated_engine(ModelEngine(prior, overhead, 1024), "packed")[LEVELS[-1]]
    assert final["live_crossover_attention_kernel"] == "packed"
    assert final["live_crossover_batch_size"] == pytest.approx(true_b_star, rel=0.10)
    assert final["live_crossover_settled"] is True
    assert final["crossover_flag_source"] == "live"


@pytest.mark.slow
def test_live_crossover_on_the_simulated_reference_table_does_not_settle():
    """The simulated engine on the H200 reference table (k 4, alpha 0.7: true B* about 64), a benchmark the
    calibrated model prices about 27% slow at every batch: an overhead cannot explain an engine faster than the
    kernels, so the fitted overhead is zero, the live B* is the estimate's (within 30% of the engine's), and it
    does not settle: the flag stays on the estimate's band."""
    table = load_table()
    true_b_star = crossover_batch(table, K, tau(positions_from_alpha(ALPHA, K)))
    assert 55 < true_b_star < 75
    # The simulated engine's step times are the H200 table's, whose verify is unpacked.
    after_level = run_simulated_engine(table, "unpacked")
    final = after_level[LEVELS[-1]]
    # The engine's step-time histogram reached the evaluator: a live B* with a band around it.
    assert final["live_crossover_batch_size"] is not None
    assert final["live_crossover_lower"] <= final["live_crossover_batch_size"] <= final["live_crossover_upper"]
    assert final["live_crossover_attention_kernel"] == "unpacked"  # the kernel the live refit prices
    assert final["live_crossover_bins"] >= MIN_BINS
    assert final["live_crossover_batch_size"] == pytest.approx(true_b_star, rel=0.3)
    assert final["live_crossover_settled"] is False
    assert final["crossover_flag_source"] == "estimate"


def test_a_burst_after_idle_is_binned_at_its_own_batch():
    """Each cycle's step times go to the batch of the very steps timed (step-time observations per engine
    step), not to the flag's batch window, which still holds the idle minutes before the burst."""
    table = load_table()
    metrics = VllmMetrics("llama", engines=1, k=K)
    engine = SimEngine(
        0,
        EngineSettings(
            model_name="llama",
            step_time=table,
            k=K,
            profile=AcceptanceProfile.iid(ALPHA, K),
            prefill_seconds_per_token=0.0,
        ),
        SimClock(),
        metrics,
        seed=5,
    )
    cfg = parse_config({"routes": [{"name": "chat", "url": "http://127.0.0.1:8000/metrics", "engine": "vllm"}]})
    route = cfg.routes[0]
    evaluator = AboveCrossoverEvaluator(EstimatedCrossover(h200_model(), 1024.0), hold_seconds=60.0)
    tracker = RouteTracker("chat")
    t = 0.0
    for offered in (0, 0, 0, 32):
        engine.set_offered_concurrency(offered)
        before = engine.status()
        t += CYCLE
        engine.advance(t)
        update = evaluator.evaluate(tracker.observe(parse_engine_sample("vllm", metrics.render(), route, t)), [])
    after = engine.status()
    burst_batch = (after.batch_seconds - before.batch_seconds) / (after.busy_seconds - before.busy_seconds)
    assert burst_batch > 28
    assert update["batch_size"] < 0.5 * burst_batch  # the flag's window: mostly idle
    assert evaluator.live is not None
    ((batch, seconds, observations),) = evaluator.live.observed()
    assert batch == pytest.approx(burst_batch, rel=0.05)
    assert seconds == pytest.approx(step_seconds(table, round(batch), K), rel=0.05)
    assert observations > 100


@pytest.mark.slow
@pytest.mark.parametrize(
    "fixed_cost, prior, alpha",
    [
        ({"layer_overhead_s": 0.008}, {}, 0.7),
        pytest.param(
            {"step_overhead_s": 0.025},
            {"step_overhead_s": 0.001},
            0.9,
            marks=pytest.mark.xfail(
                strict=True,
                reason="known defect: from the prior's 1 ms the fit's pattern search settles where verify attention "
                "(efficiency at its floor, per-key cost at its ceiling) stands in for the 25 ms per-forward cost: "
                "B* 9.2 against 4.5 (a second start at half the fastest step lands elsewhere, not better)",
            ),
        ),
    ],
    ids=["per-layer", "per-forward"],
)
def test_a_slow_engine_with_large_fixed_costs_is_fitted_too(fixed_cost, prior, alpha):
    """A CPU engine: no GEMM tile to fill, fp32 weights, a fixed cost of milliseconds per layer or tens per
    forward, past any GPU's, so the search reaches up to the fastest observed step. Spec steps alone cannot
    split the fixed cost between per layer and per forward; the prior's split is kept (a prior with a
    per-forward cost refits that one) and, when it is the engine's, the live B* matches the engine's own."""
    from specwatch.crossover.speedup import Efficiency, Hardware, ModelShape

    cpu = Hardware("CPU", 20e9, 100e9, None, 24e9, sms=2, gemm_padding=(1, 1), flops_fp32=100e9)
    shape = ModelShape(
        layers=4, hidden_size=1024, kv_heads=2, head_dim=128, intermediate_size=2816, vocab_size=795, attention_heads=8
    )
    # An unpacked verify kernel (one read per query head): its verify terms are fitted with the fixed cost. With
    # a packed one the refit has only memory, compute and the fixed cost and lands 13% high on this engine.
    truth = StepModel(
        shape,
        cpu,
        Efficiency(memory=0.5, compute=0.5, verify_attention=0.5, verify_reads_per_query_head=True, **fixed_cost),
        dtype="fp32",
        draft=Draft.parse("eagle", shape),
    )
    positions = positions_from_alpha(alpha, 3)
    true_b_star = truth.crossover(positions, 60.0)
    assert true_b_star is not None and 2 < true_b_star < 64

    live = LiveCalibration(replace(truth, efficiency=Efficiency(verify_reads_per_query_head=True, **prior)))
    for batch in (1, 2, 4, 8, 16):
        live.add(batch, truth.spec_step_s(batch, 3, 60.0), 200)
    answer = live.answer(positions, 60.0, 0.0)
    assert answer.batch_size == pytest.approx(true_b_star, rel=0.1)
    refit = live.fitted_model()
    assert refit is not None
    assert refit.target_step_s(4, 1, 60.0) == pytest.approx(truth.target_step_s(4, 1, 60.0), rel=0.1)


def test_bins_with_few_steps_wait_before_they_are_fitted():
    """A handful of steps caught around a stall would weigh as much as a busy hour: a bin is fitted only once
    it holds MIN_BIN_OBSERVATIONS steps."""
    from specwatch.crossover.livecal import MIN_BIN_OBSERVATIONS

    table = load_table()
    positions = positions_from_alpha(ALPHA, K)
    live = LiveCalibration(h200_model())
    live.add(16, step_seconds(table, 16, K), MIN_BIN_OBSERVATIONS - 1)
    assert live.answer(positions, 1024, 0.0).batch_size is None
    live.add(16, step_seconds(table, 16, K), 1)
    assert live.answer(positions, 1024, 1.0).bins == 1
