"""The simulator's model, without HTTP or threads: step times, acceptance draws, scenarios, the engine."""

from __future__ import annotations

import random

import pytest

from specwatch.simulator.clock import SimClock
from specwatch.simulator.engine import EngineSettings, SimEngine, SimRequest, StepRecord
from specwatch.simulator.scenario import ScenarioError, parse_scenario
from specwatch.simulator.speculation import AcceptanceProfile, AcceptanceSampler, parse_profile
from specwatch.simulator.steptime import (
    AnalyticStepTime,
    TableStepTime,
    crossover_batch,
    load_reference,
    load_table,
    step_seconds,
)


# ----------------------------------------------------------------------------------------- step times
def test_packaged_table_is_the_reference_and_reproduces_its_derived_speedups():
    ref = load_reference()
    assert ref["gpu"] == "NVIDIA H200"
    run = next(r for r in ref["runs"] if r["context"] == 1024)
    table = load_table(context=1024)
    for key, entry in run["derived"].items():
        gamma = int(key.split(",")[0].split("=")[1])
        alpha = float(key.split(",")[1].split("=")[1])
        e_tokens = (1 - alpha ** (gamma + 1)) / (1 - alpha)
        for b, stored in entry["speedup"].items():
            b = int(b)
            speedup = e_tokens * table.target_seconds(b, 1) / step_seconds(table, b, gamma)
            assert speedup == pytest.approx(stored, abs=0.0006), (key, b)


def test_table_interpolates_between_grid_points_and_extrapolates_past_the_last():
    table = load_table()
    t64, t96 = table.target_seconds(64, 1), table.target_seconds(96, 1)
    assert table.target_seconds(80, 1) == pytest.approx((t64 + t96) / 2)
    t192, t256 = table.target_seconds(192, 5), table.target_seconds(256, 5)
    assert table.target_seconds(320, 5) == pytest.approx(t256 + (t256 - t192))
    assert table.target_seconds(0.5, 1) == table.target_seconds(1, 1)
    # q between measured values (1, 3, 5, 8) interpolates too
    assert table.target_seconds(32, 1) < table.target_seconds(32, 2) < table.target_seconds(32, 3)


def test_table_nearest_context_and_grid_validation():
    assert load_table(context=6000).context == 8192
    assert load_table(context=100).context == 1024
    with pytest.raises(ValueError, match="incomplete grid"):
        TableStepTime({(1, 1): 1.0, (2, 1): 1.0, (1, 3): 1.0}, {1: 0.1, 2: 0.1}, context=1)
    with pytest.raises(ValueError, match="cannot load"):
        load_table("/nonexistent/table.json")


def test_analytic_model_has_a_memory_floor_then_a_compute_slope():
    m = AnalyticStepTime(kv_seconds_per_seq=0.0)
    assert m.target_seconds(1, 1) == m.target_seconds(8, 1) == m.floor_seconds
    big = m.target_seconds(200, 5)
    assert big == pytest.approx(m.compute_seconds_per_token * 1000)
    assert AnalyticStepTime().target_seconds(64, 1) > m.target_seconds(64, 1)  # the KV term
    assert crossover_batch(AnalyticStepTime(), 4, 2.77) is not None


def test_crossover_of_the_table_matches_the_references_bracket():
    b_star = crossover_batch(load_table(), 4, AcceptanceProfile.iid(0.7, 4).mean_tokens_per_step())
    assert 64 < b_star < 96
    assert crossover_batch(load_table(), 0, 1.0) is None
    assert crossover_batch(load_table(), 4, 1.0) == 1.0  # nothing accepted: speculation never pays


class DipsAtBatchOne:
    """Verify costs 2.1 plain steps at batch 1, 1.5 at 2-8, then grows with the batch."""

    def target_seconds(self, batch: float, q: int) -> float:
        if q == 1:
            return 1.0
        return 2.1 if batch < 1.5 else max(1.5, batch / 5)

    def draft_seconds(self, batch: float) -> float:
        return 0.0


def test_crossover_is_where_speculation_stops_paying_for_good():
    assert crossover_batch(DipsAtBatchOne(), 4, 2.0) == pytest.approx(10.0, rel=1e-3)


# ----------------------------------------------------------------------------------------- acceptance
def test_profile_math():
    p = AcceptanceProfile((0.8, 0.5))
    assert p.survival() == pytest.approx((0.8, 0.4))
    assert p.acceptance_rate() == pytest.approx(0.6)
    assert p.mean_tokens_per_step() == pytest.approx(2.2)
    assert p.with_rate(0.48).acceptance_rate() == pytest.approx(0.48, abs=1e-9)
    assert parse_profile(0.7, 3) == AcceptanceProfile((0.7, 0.7, 0.7))
    with pytest.raises(ValueError):
        parse_profile([0.7, 0.6], 3)
    with pytest.raises(ValueError):
        AcceptanceProfile((1.2,))


def test_sampler_draws_the_profiles_distribution():
    profile = AcceptanceProfile((0.79, 0.74, 0.72, 0.73))
    sampler = AcceptanceSampler(profile, random.Random(3))
    n = 40_000
    draws = [sampler.draw() for _ in range(n)]
    assert max(draws) <= 4 and min(draws) >= 0
    for j, p_j in enumerate(profile.survival()):
        assert sum(1 for x in draws if x > j) / n == pytest.approx(p_j, abs=0.01)


# ----------------------------------------------------------------------------------------- scenarios
def test_scenario_parses_and_ramps_load():
    sc = parse_scenario(
        {
            "model_name": "m",
            "speculation": {"k": 3, "acceptance": [0.8, 0.7, 0.6]},
            "load": 10,
            "events": [
                {"at": "5m", "type": "model_bump", "model_name": "m2", "acceptance_factor": 0.8},
                {"at": "1m", "type": "load", "concurrency": 110, "over": "100s"},
                {"at": 30, "type": "acceptance", "factor": 0.9},
                {"at": "10m", "type": "outage", "duration": "30s"},
            ],
        }
    )
    assert [e.type for e in sc.events] == ["acceptance", "load", "model_bump", "outage"]
    assert sc.k == 3 and sc.acceptance == (0.8, 0.7, 0.6)
    assert sc.concurrency_at(0) == 10
    assert sc.concurrency_at(60) == 10
    assert sc.concurrency_at(110) == pytest.approx(60)
    assert sc.concurrency_at(1000) == 110
    assert sc.end == 630


def test_scenario_reports_every_problem_at_once():
    with pytest.raises(ScenarioError) as err:
        parse_scenario(
            {
                "lod": 3,
                "speculation": {"k": 2, "acceptance": [0.5]},
                "events": [
                    {"at": "soon", "type": "restart"},
                    {"at": "1m", "type": "explode"},
                    {"at": "1m", "type": "acceptance"},
                    {"at": "2m", "type": "load", "concurrency": -1, "ramp": "1m"},
                ],
            },
            "s.yaml",
        )
    text = str(err.value)
    for needle in (
        "lod: unknown key",
        "lists 1 positions but k is 2",
        "events[0].at",
        "events[1].type",
        "events[2]: give exactly one of factor, rate",
        "events[3].ramp: unknown key",
        "events[3].concurrency",
    ):
        assert needle in text
    assert text.startswith("s.yaml: ")


# ----------------------------------------------------------------------------------------- the engine
class _Recorder:
    def __init__(self) -> None:
        self.steps: list[StepRecord] = []
        self.finished: list[SimRequest] = []

    def on_step(self, engine: int, step: StepRecord) -> None:
        self.steps.append(step)

    def on_finish(self, engine: int, request: SimRequest, now: float) -> None:
        self.finished.append(request)


def _engine(k: int = 4, alpha: float = 0.7, **kw) -> tuple[SimEngine, _Recorder]:
    rec = _Recorder()
    settings = EngineSettings(
        model_name="m", step_time=load_table(), k=k, profile=AcceptanceProfile.iid(alpha, k) if k else None, **kw
    )
    return SimEngine(0, settings, SimClock(), rec, seed=11), rec


def test_plain_engine_emits_one_token_per_step_and_charges_the_table():
    engine, rec = _engine(k=0, prefill_seconds_per_token=0.0)
    req = SimRequest(prompt_tokens=10, max_tokens=100)
    engine.submit(req)
    engine.advance(until=1e9)
    assert req.generated == 100 and req.finish_reason == "length"
    assert len(rec.steps) == 100 and all(s.drafts == 0 for s in rec.steps)
    assert engine.status().busy_seconds == pytest.approx(100 * load_table().target_seconds(1, 1))
    assert rec.finished == [req]


def test_spec_engine_counts_like_vllm():
    engine, rec = _engine(k=4, alpha=0.7)
    engine.set_offered_concurrency(32)
    engine.advance(until=20.0)
    drafts = sum(s.drafts for s in rec.steps)
    draft_tokens = sum(s.draft_tokens for s in rec.steps)
    accepted = sum(s.accepted_tokens for s in rec.steps)
    per_pos = [sum(s.accepted_per_pos[j] for s in rec.steps) for j in range(4)]
    assert draft_tokens == 4 * drafts
    assert sum(per_pos) == accepted
    assert per_pos == sorted(per_pos, reverse=True)
    assert accepted / draft_tokens == pytest.approx(AcceptanceProfile.iid(0.7, 4).acceptance_rate(), abs=0.01)
    emitted = sum(s.emitted_tokens for s in rec.steps)
    assert emitted <= accepted + drafts + sum(s.prompt_tokens > 0 for s in rec.steps) * 32  # + prefill tokens
    assert {s.running for s in rec.steps[5:]} == {32}  # closed loop: the batch stays at the offered load
    assert engine.status().generated_tokens == emitted


def test_engine_queues_beyond_max_num_seqs_and_restart_aborts_everything():
    engine, rec = _engine(max_num_seqs=4)
    requests = [SimRequest(1, 1000) for _ in range(6)]
    for r in requests:
        engine.submit(r)
    engine.advance(until=0.5)
    status = engine.status()
    assert (status.running, status.waiting) == (4, 2)
    engine.restart()
    assert all(r.finish_reason == "abort" for r in requests)
    assert engine.status().generated_tokens == 0 and engine.load == 0


def test_cancel_frees_the_slot():
    engine, _ = _engine()
    req = SimRequest(1, 1000)
    engine.submit(req)
    engine.advance(until=0.1)
    engine.cancel(req)
    assert req.finish_reason == "abort" and engine.load == 0
    engine.cancel(req)  # twice is harmless


def test_acceptance_change_takes_effect():
    engine, rec = _engine(k=4, alpha=0.7)
    engine.set_offered_concurrency(16)
    engine.advance(until=5.0)
    engine.set_profile(AcceptanceProfile.iid(0.7, 4).with_rate(0.3))
    n = len(rec.steps)
    engine.advance(until=15.0)
    later = rec.steps[n:]
    rate = sum(s.accepted_tokens for s in later) / sum(s.draft_tokens for s in later)
    assert rate == pytest.approx(0.3, abs=0.015)
    with pytest.raises(ValueError):
        engine.set_profile(AcceptanceProfile.iid(0.7, 3))


def test_the_documented_scenario_example_parses():
    import yaml

    from specwatch.simulator import scenario

    doc = scenario.__doc__
    example = doc[doc.index("```yaml") + len("```yaml") : doc.index("```", doc.index("```yaml") + 3)]
    sc = parse_scenario(yaml.safe_load(example))
    assert {e.type for e in sc.events} == set(scenario.EVENT_TYPES)
