"""Tracking: reset-safe sums over engines, windows, and the verify-step, interval-gauge and lifetime acceptance
modes (fake clock)."""

from __future__ import annotations

import random

import pytest

from specwatch.snapshot import EngineCounters, EngineSample, RouteState
from specwatch.tracking.routes import RouteTracker
from specwatch.tracking.windows import MAX_POINTS, Sums, WindowRing

K = 3


def vllm_engine(
    engine: str, drafts: float, accepted_per_pos: list[float], created: float, running: float = 8.0
) -> EngineCounters:
    return EngineCounters(
        engine=engine,
        drafts=drafts,
        draft_tokens=drafts * K,
        accepted_tokens=sum(accepted_per_pos),
        accepted_per_pos=tuple(accepted_per_pos),
        created=created,
        running=running,
        waiting=1.0,
        kv_usage=0.5,
    )


def vllm_sample(ts: float, *engines: EngineCounters) -> EngineSample:
    return EngineSample(
        ts=ts,
        engine_kind="vllm",
        acceptance_source="counter",
        model_name="llama",
        engine_version="0.33.0",
        num_speculative_tokens=K,
        engines=engines,
    )


class FakeVllmEngine:
    """Cumulative counters of one simulated engine with a known per-position acceptance."""

    def __init__(self, name: str, p: tuple[float, ...], rng: random.Random) -> None:
        self.name, self.p, self.rng = name, p, rng
        self.created = 1000.0
        self.drafts = 0.0
        self.per_pos = [0.0] * K

    def step(self, n_drafts: int) -> None:
        for _ in range(n_drafts):
            self.drafts += 1
            for j in range(K):  # prefix acceptance: position j accepted only if all before it were
                if self.rng.random() >= self.p[j]:
                    break
                self.per_pos[j] += 1

    def restart(self, created: float) -> None:
        self.created, self.drafts, self.per_pos = created, 0.0, [0.0] * K

    def counters(self) -> EngineCounters:
        return vllm_engine(self.name, self.drafts, list(self.per_pos), self.created)


def test_two_engine_vllm_sequence_with_restart_sums_exactly_and_never_goes_backwards():
    rng = random.Random(7)
    e0 = FakeVllmEngine("0", (0.8, 0.7, 0.6), rng)
    e1 = FakeVllmEngine("1", (0.6, 0.5, 0.4), rng)
    e0.step(500)  # history before specwatch started: adopted, not windowed
    tracker = RouteTracker("chat")
    expected = {"drafts": 0.0, "accepted": 0.0, "draft_tokens": 0.0}
    previous = (0.0, 0.0, 0.0)
    window_log: list[tuple[float, float, float]] = []  # (ts, Δaccepted, Δdraft_tokens) per cycle
    for step in range(60):
        ts = 1000.0 + 5 * step
        if step == 30:
            before = (e1.drafts, sum(e1.per_pos))
            e1.restart(created=ts)  # counters back to 0 and a new _created
            expected["drafts"] += before[0]
            expected["accepted"] += before[1]
            expected["draft_tokens"] += before[0] * K
        e0.step(200)
        e1.step(100 if step != 30 else 0)  # the restarted engine reports 0 in its first scrape
        obs = tracker.observe(vllm_sample(ts, e0.counters(), e1.counters()))
        state = tracker.state()
        # route totals = engine sums, corrected for the restart (the restarted engine's old total carried)
        assert state.drafts_total == expected["drafts"] + e0.drafts + e1.drafts
        assert state.accepted_tokens_total == expected["accepted"] + sum(e0.per_pos) + sum(e1.per_pos)
        assert state.draft_tokens_total == expected["draft_tokens"] + (e0.drafts + e1.drafts) * K
        totals = (state.drafts_total, state.draft_tokens_total, state.accepted_tokens_total)
        assert all(now >= before for now, before in zip(totals, previous))
        previous = totals
        assert obs.reset == (step == 30)
        assert obs.d_drafts >= 0 and obs.d_accepted >= 0
        if step > 0:
            window_log.append((ts, obs.d_accepted, obs.d_draft_tokens))

    # 1m ratio over the last 60 s = Δaccepted / Δdraft_tokens of the cycles after the window base (ts-60)
    end = window_log[-1][0]
    in_window = [(a, d) for ts, a, d in window_log if ts > end - 60]
    want = sum(a for a, _ in in_window) / sum(d for _, d in in_window)
    assert state.acceptance_ratio["1m"] == pytest.approx(want, abs=0.01)
    assert set(state.acceptance_ratio) == {"1m", "5m", "1h"}
    # per-position ratios are non-increasing, mean length = 1 + Σ positions, effective k = 3
    p = state.position_acceptance_ratio
    assert len(p) == K and p[0] >= p[1] >= p[2]
    assert state.mean_acceptance_length["5m"] == pytest.approx(1 + sum(p))
    assert state.draft_length == pytest.approx(K)
    assert state.running_requests == 16.0 and state.waiting_requests == 2.0 and state.kv_usage_ratio == 0.5


def test_counter_decrease_without_created_is_a_reset_and_first_sight_is_not_windowed():
    tracker = RouteTracker("r")
    eng = lambda d, a: EngineCounters(engine="0", drafts=d, draft_tokens=d * 2, accepted_tokens=a)
    obs = tracker.observe(vllm_sample(0.0, eng(1000, 900)))
    assert obs.d_drafts == 0 and tracker.state().drafts_total == 1000
    assert tracker.state().acceptance_ratio == {}  # one point: no window yet
    tracker.observe(vllm_sample(5.0, eng(1100, 950)))
    obs = tracker.observe(vllm_sample(10.0, eng(40, 10)))  # restart without _created (multiprocess mode)
    assert obs.reset and obs.d_drafts == 40 and obs.d_accepted == 10
    state = tracker.state()
    assert state.drafts_total == 1140 and state.accepted_tokens_total == 960
    # window: (50 + 10) accepted over (100 + 40) x 2 draft tokens; the 900 adopted at first sight is not in it
    assert state.acceptance_ratio["1m"] == pytest.approx(60 / 280)


def test_new_engine_mid_way_raises_totals_but_not_the_window():
    tracker = RouteTracker("r")
    a = lambda d, acc: EngineCounters(engine="0", drafts=d, draft_tokens=d, accepted_tokens=acc)
    b = EngineCounters(engine="1", drafts=10_000, draft_tokens=10_000, accepted_tokens=100)
    tracker.observe(vllm_sample(0.0, a(0, 0)))
    tracker.observe(vllm_sample(5.0, a(100, 80), b))
    state = tracker.state()
    assert state.drafts_total == 10_100
    assert state.acceptance_ratio["1m"] == pytest.approx(0.8)


def test_vanished_engine_keeps_its_total():
    tracker = RouteTracker("r")
    e = lambda name, d: EngineCounters(engine=name, drafts=d, draft_tokens=d, accepted_tokens=d / 2)
    tracker.observe(vllm_sample(0.0, e("0", 100), e("1", 50)))
    tracker.observe(vllm_sample(5.0, e("0", 120)))
    assert tracker.state().drafts_total == 170


def test_no_drafts_in_window_means_absent_not_zero():
    tracker = RouteTracker("r")
    e = EngineCounters(engine="0", drafts=10, draft_tokens=30, accepted_tokens=20, accepted_per_pos=(10, 6, 4))
    for ts in (0.0, 5.0, 10.0):
        tracker.observe(vllm_sample(ts, e))
    state = tracker.state()
    assert state.acceptance_ratio == {} and state.mean_acceptance_length == {}
    assert state.position_acceptance_ratio == () and state.draft_length is None


def test_down_keeps_counters_and_clears_present_values():
    tracker = RouteTracker("r")
    e = lambda d: EngineCounters(engine="0", drafts=d, draft_tokens=d, accepted_tokens=d / 2, running=3.0)
    tracker.observe(vllm_sample(0.0, e(100)))
    tracker.observe(vllm_sample(5.0, e(200)))
    obs = tracker.observe_down(10.0)
    state = tracker.state(error_reason="timeout")
    assert not obs.up and obs.model_name == "llama" and obs.d_drafts == 0
    assert not state.up and state.error_reason == "timeout"
    assert state.drafts_total == 200 and state.model_name == "llama" and state.acceptance_source == "counter"
    assert state.acceptance_ratio == {} and state.running_requests is None
    tracker.observe(vllm_sample(15.0, e(300)))  # back: the increase across the outage is kept
    assert tracker.state().drafts_total == 300 and tracker.state().up


def test_windows_use_the_point_at_or_before_the_window_start():
    ring = WindowRing(horizon_seconds=3600)
    for i in range(0, 200):
        ring.append(float(i * 5), Sums(drafts=float(i * 10)))
    d, span = ring.delta(60.0)
    assert span == 60.0 and d.drafts == 120.0
    ring.append(997.0, Sums(drafts=1995.0))  # irregular: base is the newest point at or before 937
    d, span = ring.delta(60.0)
    assert span == 62.0 and d.drafts == 1995.0 - 1870.0


def test_window_ring_memory_is_bounded():
    ring = WindowRing(horizon_seconds=300)
    for i in range(10_000):
        ring.append(i * 1.0, Sums(drafts=float(i)))
    assert len(ring) <= 302
    fast = WindowRing(horizon_seconds=3600)
    for i in range(20_000):  # 0.1 s interval: 36 000 points would be needed; the ring thins itself
        fast.append(i * 0.1, Sums(drafts=float(i)))
    assert len(fast) <= MAX_POINTS
    d, span = fast.delta(60.0)
    assert d.drafts / span == pytest.approx(10.0, rel=0.01)


# ---------------------------------------------------------------------------------------------- SGLang
def sglang_sample(ts: float, version: str, source: str, *engines: EngineCounters, k: int | None = None) -> EngineSample:
    return EngineSample(
        ts=ts,
        engine_kind="sglang",
        acceptance_source=source,
        model_name="qwen",
        engine_version=version,
        num_speculative_tokens=k,
        engines=engines,
    )


def test_sglang_counter_mode_derives_drafts_accepted_and_draft_tokens():
    tracker = RouteTracker("s")
    e = lambda verify, gen: EngineCounters(
        engine="0", drafts=verify, generation_tokens=gen, verify_counts=True, draft_length=3.0, running=10.0
    )
    tracker.observe(sglang_sample(0.0, "0.5.13", "counter", e(1000, 3000), k=3))
    obs = tracker.observe(sglang_sample(5.0, "0.5.13", "counter", e(1100, 3250), k=3))
    assert obs.d_drafts == 100 and obs.d_accepted == 150 and obs.d_draft_tokens == 300 and obs.k == 3
    state = tracker.state()
    assert state.acceptance_ratio["1m"] == pytest.approx(0.5)
    assert state.mean_acceptance_length["1m"] == pytest.approx(2.5)  # = Δgeneration / Δverify
    assert state.drafts_total == 1100 and state.accepted_tokens_total == 2150 and state.draft_tokens_total == 3300


def test_sglang_gauge_mode_weights_engines_by_running_requests():
    tracker = RouteTracker("s")
    e = lambda name, rate, tau, running: EngineCounters(
        engine=name, interval_acceptance_ratio=rate, interval_acceptance_length=tau, running=running
    )
    tracker.observe(sglang_sample(0.0, "0.5.23", "gauge", e("0", 0.9, 3.7, 30), e("1", 0.3, 1.9, 10)))
    obs = tracker.observe(sglang_sample(5.0, "0.5.23", "gauge", e("0", 0.9, 3.7, 30), e("1", 0.3, 1.9, 10)))
    assert obs.gauge_acceptance_ratio == pytest.approx(0.75) and obs.d_drafts == 0
    state = tracker.state()
    assert state.acceptance_source == "gauge"
    # two cycles in the window, both (0.9 x 30 + 0.3 x 10) / 40
    assert state.acceptance_ratio["1m"] == pytest.approx(0.75)
    assert state.mean_acceptance_length["1m"] == pytest.approx((3.7 * 30 + 1.9 * 10) / 40)
    # an idle engine (gauges keep their last value) and one whose gauges say nothing (the source's adaptive
    # step 0, tests/test_sources_sglang.py) carry no weight
    idle = EngineCounters(engine="0", interval_acceptance_ratio=0.1, running=0.0)
    step0 = EngineCounters(engine="1", running=9)
    obs = tracker.observe(sglang_sample(10.0, "0.5.23", "gauge", idle, step0))
    assert obs.gauge_acceptance_ratio is None
    assert tracker.state().acceptance_ratio["1m"] == pytest.approx(0.75)


def test_vllm_v0_lifetime_gauge_is_every_window():
    tracker = RouteTracker("v0")
    e = EngineCounters(engine="", lifetime_acceptance_ratio=0.42, drafts=1e9, draft_tokens=1e9, accepted_tokens=5e8)
    sample = EngineSample(ts=0.0, engine_kind="vllm-v0", acceptance_source="lifetime_gauge", engines=(e,))
    obs = tracker.observe(sample)
    state = tracker.state()
    assert state.acceptance_ratio == {"1m": 0.42, "5m": 0.42, "1h": 0.42}
    assert state.acceptance_source == "lifetime_gauge" and obs.gauge_acceptance_ratio == 0.42
    assert state.drafts_total == 0  # V0 counters are known-wrong and never read


def test_nan_and_infinite_values_never_poison_the_sums():
    nan, inf = float("nan"), float("inf")
    tracker = RouteTracker("r")
    good = lambda d: EngineCounters(engine="0", drafts=d, draft_tokens=2 * d, accepted_tokens=d, running=2.0)
    bad = EngineCounters(engine="0", drafts=nan, draft_tokens=inf, accepted_tokens=-1.0, running=nan, kv_usage=inf)
    tracker.observe(vllm_sample(0.0, good(100)))
    tracker.observe(vllm_sample(5.0, bad))
    tracker.observe(vllm_sample(10.0, good(200)))
    state = tracker.state()
    assert state.drafts_total == 200 and state.acceptance_ratio["1m"] == pytest.approx(0.5)
    gauge = RouteTracker("g")
    e = lambda rate, running: EngineCounters(engine="0", interval_acceptance_ratio=rate, running=running)
    for ts, engine in ((0.0, e(0.6, 10)), (5.0, e(nan, 10)), (10.0, e(0.9, inf)), (15.0, e(0.6, 10))):
        gauge.observe(sglang_sample(ts, "0.5.23", "gauge", engine))
    assert gauge.state().acceptance_ratio["1m"] == pytest.approx(0.6)


def test_state_fields_are_the_state_as_keyword_arguments():
    # The daemon builds each RouteState once from state_fields() plus the evaluators' fields.
    tracker = RouteTracker("r")
    assert RouteState(**tracker.state_fields(error_reason="timeout")) == tracker.state(error_reason="timeout")
    engine = FakeVllmEngine("0", (0.8, 0.6, 0.4, 0.2)[:K], random.Random(3))
    for step in range(5):
        engine.step(100)
        tracker.observe(vllm_sample(1000.0 + 5 * step, engine.counters()))
        assert RouteState(**tracker.state_fields()) == tracker.state()
    assert tracker.state().acceptance_ratio, "windows filled: the up path was compared"


# --------------------------------------------------------------------------- speculation active
def _vllm(ts: float, drafts: float, generation: float, k: int = 4) -> EngineSample:
    e = EngineCounters(
        engine="0",
        drafts=drafts,
        draft_tokens=k * drafts,
        accepted_tokens=2 * drafts,
        accepted_per_pos=(drafts,) * k,
        generation_tokens=generation,
        running=8.0,
    )
    return EngineSample(
        ts=ts, engine_kind="vllm", acceptance_source="counter", model_name="m", num_speculative_tokens=k, engines=(e,)
    )


def test_speculation_active_follows_drafts_against_generated_tokens():
    """vLLM steps with K=0 (a schedule band) leave the spec counters still while generation goes on."""
    tracker = RouteTracker("r")
    tracker.observe(_vllm(0.0, 100.0, 300.0))
    tracker.observe(_vllm(10.0, 150.0, 450.0))
    assert tracker.state().speculation_active is True
    # K=0 band: tokens generated, no drafts for longer than the 5m window
    for i in range(1, 40):
        tracker.observe(_vllm(10.0 + 10 * i, 150.0, 450.0 + 50 * i))
    assert tracker.state().speculation_active is False
    assert tracker.state().draft_length is None
    # idle: nothing generated either
    for i in range(40, 80):
        tracker.observe(_vllm(10.0 + 10 * i, 150.0, 450.0 + 50 * 39))
    assert tracker.state().speculation_active is None


def test_speculation_active_is_absent_without_speculation_or_counters():
    tracker = RouteTracker("r")
    off = EngineSample(
        ts=0.0,
        engine_kind="vllm",
        acceptance_source="none",
        speculation_enabled=False,
        engines=(EngineCounters(engine="0", generation_tokens=10.0),),
    )
    tracker.observe(off)
    tracker.observe(
        EngineSample(
            ts=10.0,
            engine_kind="vllm",
            acceptance_source="none",
            speculation_enabled=False,
            engines=(EngineCounters(engine="0", generation_tokens=90.0),),
        )
    )
    assert tracker.state().speculation_active is None


def test_sglang_adaptive_step_zero_is_speculation_inactive():
    """At adaptive step 0 SGLang still counts 1-token verify calls: no draft tokens, so inactive. The source gives
    that step a draft length of 0 (tests/test_sources_sglang.py)."""

    def sample(ts, verify, gen, steps, draft_tokens):
        e = EngineCounters(
            engine="0",
            drafts=verify,
            generation_tokens=gen,
            verify_counts=True,
            draft_length=0.0 if steps == 0 else draft_tokens - 1,
            running=70.0,
        )
        return EngineSample(
            ts=ts,
            engine_kind="sglang",
            acceptance_source="counter",
            model_name="m",
            num_speculative_tokens=None,
            engines=(e,),
        )

    tracker = RouteTracker("r")
    tracker.observe(sample(0.0, 100.0, 250.0, 3, 4))
    obs = tracker.observe(sample(10.0, 200.0, 500.0, 3, 4))
    assert obs.d_draft_tokens == 300.0 and tracker.state().speculation_active is True
    for i in range(1, 40):
        obs = tracker.observe(sample(10.0 + 10 * i, 200.0 + 64 * i, 500.0 + 64 * i, 0, 1))
        assert obs.d_draft_tokens == 0.0
    assert tracker.state().speculation_active is False


def test_stray_drafts_under_one_per_hundred_generated_tokens_read_inactive():
    """A K=0 schedule band still drafts when the batch dips for a step: 3 tokens in 1000 is speculation off."""
    tracker = RouteTracker("r")
    tracker.observe(_vllm(0.0, 100.0, 300.0, k=3))
    tracker.observe(_vllm(400.0, 101.0, 1300.0, k=3))  # 3 draft tokens, 1000 generated
    assert tracker.state().speculation_active is False
    tracker.observe(_vllm(800.0, 105.0, 2300.0, k=3))  # 12 draft tokens, 1000 generated
    assert tracker.state().speculation_active is True


def test_the_crossover_batch_prefers_the_engines_decode_batch():
    def sample(ts, **fields):
        e = EngineCounters(engine="0", running=7.0, **fields)
        return EngineSample(ts=ts, engine_kind="x", acceptance_source="none", engines=(e,))

    tracker = RouteTracker("r")
    assert tracker.observe(sample(0.0)).running_per_engine == {"0": 7.0}
    assert tracker.observe(sample(5.0, decode_batch=5.0)).running_per_engine == {"0": 5.0}
    # counted steps: the mean over the cycle's steps; none yet, or none this cycle, or counts that went back
    # (a restart): the gauges
    assert tracker.observe(sample(10.0, decode_steps=100.0, decode_step_requests=300.0)).running_per_engine == {
        "0": 7.0
    }
    assert tracker.observe(sample(15.0, decode_steps=150.0, decode_step_requests=400.0)).running_per_engine == {
        "0": 2.0
    }
    assert tracker.observe(sample(20.0, decode_steps=150.0, decode_step_requests=400.0)).running_per_engine == {
        "0": 7.0
    }
    assert tracker.observe(sample(25.0, decode_steps=10.0, decode_step_requests=30.0)).running_per_engine == {"0": 7.0}
    assert tracker.state().running_requests == 7.0
