"""The daemon's above-crossover flag: batch weighting, hysteresis, sources, compute-bound; fake clock throughout."""

from __future__ import annotations

import json
import random

import pytest

from specwatch.config import parse_config
from specwatch.crossover.configured import LiveInputs, SweptCrossover, positions_from_rate
from specwatch.crossover.sweepfile import FORMAT
from specwatch.evaluators.above_crossover import Hysteresis, TimeWeightedMean, build_evaluator, compute_bound
from specwatch.evaluators.base import EvaluatorContext
from specwatch.snapshot import GpuSample, RouteObservation

from fakes import vllm_sample


def route(crossover: dict, name: str = "chat"):
    cfg = parse_config({"routes": [{"name": name, "url": "http://127.0.0.1:8000", "crossover": crossover}]})
    return cfg, cfg.routes[0]


def evaluator(crossover: dict):
    cfg, r = route(crossover)
    return build_evaluator(EvaluatorContext(config=cfg, clock=lambda: 0.0), r)


def obs(ts: float, running: dict[str, float], k: int = 3, accepted=(80.0, 60.0, 40.0), drafts=100.0, **kw):
    return RouteObservation(
        route="chat",
        ts=ts,
        up=True,
        k=k,
        d_drafts=drafts,
        d_accepted_per_pos=accepted,
        running_per_engine=running,
        **kw,
    )


def drive(ev, start: float, end: float, running: float, step: float = 5.0, engines=("0",)):
    last = None
    t = start
    while t < end:
        last = ev.evaluate(obs(t, {e: running for e in engines}), ())
        t += step
    return last


def test_no_crossover_section_gives_no_evaluator():
    cfg, r = route({"batch_size": 1})
    r = r.__class__(**{**r.__dict__, "crossover": None})
    assert build_evaluator(EvaluatorContext(config=cfg, clock=lambda: 0.0), r) is None


def test_time_weighted_mean_weighs_intervals():
    m = TimeWeightedMean(60)
    m.add(0, 10)
    assert m.mean(0) == 10
    m.add(10, 20)  # 20 held over (0, 10]
    m.add(40, 50)  # 50 held over (10, 40]
    assert m.mean(40) == pytest.approx((10 * 20 + 30 * 50) / 40)
    m.add(100, 0)  # window (40, 100]: only the last interval counts
    assert m.mean(100) == pytest.approx(0)


def _mean_by_definition(samples: list[tuple[float, float]], now: float, window: float) -> float | None:
    if not samples:
        return None
    if len(samples) == 1:
        return samples[0][1]
    total = weight = 0.0
    for (t0, _), (t1, value) in zip(samples, samples[1:]):
        w = t1 - max(t0, now - window)
        if w > 0:
            total, weight = total + w * value, weight + w
    return total / weight if weight > 0 else samples[-1][1]


@pytest.mark.parametrize("seed", range(20))
def test_time_weighted_mean_kept_summed_agrees_with_the_definition(seed):
    """The running sums give what a pass over the samples gives, at the newest sample and at any other time,
    through irregular intervals, gaps longer than the window and clock steps backwards."""
    rng = random.Random(seed)
    window = rng.choice([15.0, 60.0, 600.0])
    m, ts = TimeWeightedMean(window), 1e9
    for _ in range(400):
        ts += rng.choice([rng.uniform(0.1, 10.0), 5.0, window * 1.5, -rng.uniform(0, 20)])
        m.add(ts, float(rng.randint(0, 256)))
        for now in (ts, ts - rng.uniform(0, window), ts + rng.uniform(0, window * 2)):
            expected = _mean_by_definition(list(m.samples), now, window)
            assert m.mean(now) == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_hysteresis_enter_exit_and_hold():
    h = Hysteresis(hold_seconds=600)
    assert h.update(0, 50, 64) is False
    assert h.update(5, 70, 64) is True  # first entry is immediate
    assert h.update(100, 10, 64) is True  # far below, but held for 10 minutes
    assert h.update(610, 60, 64) is True  # 60 > 0.9 x 64: still above
    assert h.update(620, 57, 64) is False  # below 57.6 after the hold: leaves
    assert h.update(700, 100, 64) is False  # held low for 10 minutes too
    assert h.update(1220, 100, 64) is True


def test_fixed_source_ramp_up_and_down():
    ev = evaluator({"batch_size": 64, "hold": "10m"})
    out = drive(ev, 0, 120, running=20)
    assert out["crossover_batch_size"] == 64 and out["crossover_source"] == "batch_size"
    assert out["above_crossover"] is False and out["batch_size"] == pytest.approx(20)
    out = drive(ev, 120, 300, running=100)
    assert out["above_crossover"] is True
    out = drive(ev, 300, 600, running=10)  # load gone, but the flag holds 10 minutes from its entry
    assert out["above_crossover"] is True
    out = drive(ev, 600, 900, running=10)
    assert out["above_crossover"] is False
    assert out["predicted_speedup_ratio"] is None


def test_batch_is_per_engine():
    ev = evaluator({"batch_size": 64})
    out = drive(ev, 0, 60, running=40, engines=("0", "1", "2", "3"))  # 160 running on the route, 40 per engine
    assert out["batch_size"] == pytest.approx(40)
    assert out["above_crossover"] is False


def test_engines_that_disappear_leave_the_batch():
    ev = evaluator({"batch_size": 64})
    drive(ev, 0, 60, running=40, engines=("0", "1"))
    out = ev.evaluate(obs(60, {"0": 40}), ())
    assert out["batch_size"] == pytest.approx(40) and set(ev.batches) == {"0"}


# The estimates below assert numbers of the H200 tables' verify kernel (unpacked); an undetected engine would
# assume the engines' packed kernel, which at these contexts puts B* far higher (tests of that further down).
UNPACKED = {"attention_kernel": "unpacked"}


def test_estimate_follows_live_acceptance():
    ev = evaluator({"estimate": {"gpu": "H200", "params": 8.03, "draft": "eagle3", "context": 1024}, **UNPACKED})
    good = ev.evaluate(obs(0, {"0": 32}, k=4, accepted=(90, 81, 73, 66), drafts=100), ())
    assert good["crossover_source"] == "estimate"
    assert 60 < good["crossover_batch_size"] < 200
    assert good["predicted_speedup_ratio"] > 1.2
    assert good["above_crossover"] is False
    ev2 = evaluator({"estimate": {"gpu": "H200", "params": 8.03, "draft": "eagle3", "context": 1024}, **UNPACKED})
    poor = ev2.evaluate(obs(0, {"0": 32}, k=4, accepted=(50, 25, 12, 6), drafts=100), ())
    assert poor["crossover_batch_size"] < good["crossover_batch_size"]
    assert poor["predicted_speedup_ratio"] < good["predicted_speedup_ratio"]


def test_estimate_without_acceptance_is_unknown_not_false():
    ev = evaluator({"estimate": {"gpu": "H200", "params": 8.03}})
    out = ev.evaluate(obs(0, {"0": 300}, drafts=0.0, accepted=()), ())
    assert out["crossover_batch_size"] is None and out["above_crossover"] is None


def test_estimate_falls_back_to_window_rate_for_gauge_sources():
    ev = evaluator({"estimate": {"gpu": "H200", "params": 8.03, "draft": "eagle3"}, **UNPACKED})
    out = ev.evaluate(obs(0, {"0": 300}, k=4, drafts=0.0, accepted=(), window_acceptance={"5m": 0.6}), ())
    assert out["crossover_batch_size"] is not None and out["above_crossover"] is True


def test_positions_from_rate_mean_matches():
    p = positions_from_rate(0.55, 4)
    assert len(p) == 4 and sum(p) / 4 == pytest.approx(0.55, abs=1e-6)
    assert p[0] > p[1] > p[2] > p[3]
    assert positions_from_rate(0.5, 0) == ()


def sweep_doc(speedups, tau=2.5, k=3):
    levels = [
        {"concurrency": c, "plain": {"output_tokens_per_s": 100.0 * c}, "spec": {"output_tokens_per_s": 100.0 * c * s}}
        for c, s in speedups
    ]
    return {"format": FORMAT, "levels": levels, "mean_acceptance_length": tau, "num_speculative_tokens": k}


def test_sweep_source_rescales_by_live_tau(tmp_path):
    doc = sweep_doc([(1, 2.0), (16, 1.5), (32, 1.1), (64, 0.9), (128, 0.7)])
    swept = SweptCrossover(doc)
    as_measured = swept.answer(LiveInputs(positions=(), batch=16))
    assert as_measured.batch_size == pytest.approx(32 * 2**0.5)  # halfway in log batch
    assert as_measured.speedup == pytest.approx(1.5)
    worse = swept.answer(LiveInputs(positions=(0.5, 0.25, 0.0), batch=16))  # tau 1.75 vs 2.5 swept
    assert worse.speedup == pytest.approx(1.5 * 1.75 / 2.5)
    assert worse.batch_size < as_measured.batch_size
    path = tmp_path / "crossover.json"
    path.write_text(json.dumps(doc))
    ev = evaluator({"sweep": str(path)})
    out = ev.evaluate(obs(0, {"0": 100}), ())
    assert out["crossover_source"] == "sweep" and out["above_crossover"] is True


def test_unusable_source_keeps_daemon_running(tmp_path, caplog):
    bad = tmp_path / "nope.json"
    bad.write_text("{not json")
    ev = evaluator({"sweep": str(bad)})
    assert ev is not None and "unusable" in caplog.text
    out = ev.evaluate(obs(0, {"0": 100}), ())
    assert out["batch_size"] == 100 and out["above_crossover"] is None and out["crossover_batch_size"] is None


def test_route_down_clears_live_values():
    ev = evaluator({"batch_size": 8})
    out = ev.evaluate(RouteObservation(route="chat", ts=0, up=False), ())
    assert out["above_crossover"] is None and out["batch_size"] is None


def gpu(index, tensor=None, dram=None, up=True):
    fields = {}
    if tensor is not None:
        fields["gpu_tensor_active_ratio"] = tensor
    if dram is not None:
        fields["gpu_dram_bandwidth_utilization_ratio"] = dram
    return GpuSample(index=index, up=up, fields=fields)


def test_compute_bound_thresholds_and_gpu_selection():
    decode_h200 = [gpu(0, 0.372, 0.658)]  # plain decode, B=256, 1024 context (reference §10.4)
    matmul_h200 = [gpu(0, 0.765, 0.139)]  # bf16 8192^2 matmul loop
    assert compute_bound(decode_h200, (0,)) is False
    assert compute_bound(matmul_h200, (0,)) is True
    # 8B-shaped GEMMs on the H200 either side of the ridge (docs/crossover.md): 192 and 256 tokens per forward
    assert compute_bound([gpu(0, 0.630, 0.536)], (0,)) is False
    assert compute_bound([gpu(0, 0.710, 0.466)], (0,)) is True
    assert compute_bound([gpu(0)], (0,)) is None  # CPU host / no GPM
    mixed = [gpu(0, 0.8, 0.1), gpu(1, 0.02, 0.65)]
    assert compute_bound(mixed, (0,)) is True
    assert compute_bound(mixed, (1,)) is False
    assert compute_bound([gpu(0, 0.8, 0.1, up=False)], (0,)) is None
    ev = evaluator({"batch_size": 8})
    out = ev.evaluate(obs(0, {"0": 1}, gpus=(1,)), mixed)
    assert out["compute_bound"] is False


def test_short_hold_shortens_the_batch_window():
    ev = evaluator({"batch_size": 64, "hold": "5s"})
    drive(ev, 0, 60, running=10, step=1.0)
    out = drive(ev, 60, 70, running=100, step=1.0)  # a 60 s average would still read ~25
    assert out["batch_size"] == pytest.approx(100) and out["above_crossover"] is True
    out = drive(ev, 70, 80, running=10, step=1.0)
    assert out["above_crossover"] is False


class RampSource:
    """A vLLM route whose running requests follow `load` (per engine, 2 DP engines); p = 0.8, 0.6, 0.45, 0.35."""

    def __init__(self) -> None:
        self.drafts = 0.0
        self.load = 10.0

    def sample(self, now: float):
        from specwatch.snapshot import EngineCounters

        self.drafts += 500
        engines = tuple(
            EngineCounters(
                engine=str(i),
                drafts=self.drafts,
                draft_tokens=4 * self.drafts,
                accepted_tokens=2.2 * self.drafts,
                accepted_per_pos=tuple(p * self.drafts for p in (0.8, 0.6, 0.45, 0.35)),
                running=self.load,
            )
            for i in range(2)
        )
        return vllm_sample(now, engines, 4)

    def close(self) -> None:
        pass


def test_daemon_load_ramp_drives_the_exported_flag_up_and_down():
    from prometheus_client.registry import CollectorRegistry

    from specwatch.daemon import Daemon
    from specwatch.export.prometheus import SnapshotCollector

    cfg = parse_config(
        {
            "interval": "5s",
            "gpu": {"enabled": "false"},
            "routes": [
                {
                    "name": "chat",
                    "url": "http://127.0.0.1:9/metrics",
                    "crossover": {
                        "estimate": {
                            "gpu": "H200",
                            "layers": 32,
                            "hidden_size": 4096,
                            "kv_heads": 8,
                            "head_dim": 128,
                            "params": 8.03,
                            "draft": "eagle3",
                            "context": 1024,
                        },
                        **UNPACKED,
                        "hold": "2m",
                    },
                }
            ],
        }
    )
    source = RampSource()
    now = [1_700_000_000.0]
    daemon = Daemon(cfg, source_factory=lambda r, c: source, clock=lambda: now[0])
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: daemon.snapshot))

    def run(seconds: float, load: float) -> dict[str, float | None]:
        source.load = load
        for _ in range(int(seconds / 5)):
            now[0] += 5
            daemon.tick(now[0])
        get = registry.get_sample_value
        return {
            "above": get("specwatch_route_above_crossover", {"route": "chat"}),
            "batch": get("specwatch_route_batch_size", {"route": "chat"}),
            "bstar": get("specwatch_route_crossover_batch_size", {"route": "chat", "source": "estimate"}),
            "speedup": get("specwatch_route_predicted_speedup_ratio", {"route": "chat"}),
            "upper": get(
                "specwatch_route_crossover_band_batch_size",
                {"route": "chat", "source": "estimate", "bound": "upper", "kernel": "unpacked"},
            ),
        }

    try:
        low = run(120, 10)
        assert low["above"] == 0 and low["batch"] == pytest.approx(10) and 60 < low["bstar"] < 150
        assert low["speedup"] > 1.5
        high = run(120, 200)  # 400 running on the route, 200 per engine
        assert high["above"] == 1 and high["batch"] == pytest.approx(200) and high["speedup"] < 1
        assert low["bstar"] < low["upper"] < 200  # the flag's threshold: the band's upper side
        hover = run(60, low["upper"] * 0.95)  # between 0.9 and 1 x the threshold: stays above
        assert hover["above"] == 1
        back = run(180, 10)
        assert back["above"] == 0
    finally:
        daemon.close()


def test_estimate_flags_only_past_its_bands_upper_side():
    """An estimate's B* carries its validated error band; the flag waits for the batch to pass the band's
    upper side, never advising speculation off while the estimate could still be below the truth."""
    spec = {"gpu": "H200", "layers": 32, "hidden_size": 4096, "kv_heads": 8, "head_dim": 128, "params": 8.03}
    ev = evaluator({"estimate": {**spec, "draft": "eagle3", "context": 4096}, "hold": "1m", **UNPACKED})
    first = ev.evaluate(obs(0, {"0": 1}), ())
    bstar, upper = first["crossover_batch_size"], first["crossover_upper"]
    assert bstar is not None and upper is not None and first["crossover_lower"] < bstar < upper
    assert first["crossover_flag_source"] == "estimate" and first["crossover_flag_batch_size"] == upper
    from specwatch.commands.status import _flag

    lower = first["crossover_lower"]
    assert _flag({**first, "batch_size": 30.0}) == f" estimate/unpacked {lower:.1f}-{upper:.1f} flag>{upper:.1f}"
    assert _flag({"crossover_flag_source": "live", "crossover_flag_batch_size": 41.0, "live_crossover_bins": 5}) == (
        " live flag>41.0 (5 bins)"
    )
    between = drive(ev, 5, 300, running=(bstar + upper) / 2)
    assert between["above_crossover"] is False
    above = drive(ev, 300, 600, running=upper * 1.1)
    assert above["above_crossover"] is True


# Qwen2.5-14B (Hugging Face config.json: 48 layers, hidden 5120, 40 / 8 heads, head dim 128, 14.8B parameters) at
# 8k context: the packed H100 tables measure no crossover up to batch 256 at gamma 4, alpha 0.5-0.8
# (specwatch/data/h100-steptimes-qwen2.5-14b-ctx8192-packed.json); the unpacked kernel's estimate puts B* at 3-7.
QWEN14B_8K = {
    "gpu": "H100",
    "layers": 48,
    "hidden_size": 5120,
    "kv_heads": 8,
    "head_dim": 128,
    "params": 14.8,
    "draft": "eagle3",
    "context": 8192,
}
ALPHA_06 = (60.0, 36.0, 21.6, 13.0)  # p_j = 0.6^j per 100 drafts, k = 4


def test_flag_stays_off_for_long_context_gqa_route_below_its_packed_crossover():
    """A vLLM route serving a 14B GQA model at 8k context on an H200, batch 16: the engine packs GQA on Hopper,
    so speculation pays there and the flag must stay off. The unpacked kernel's estimate (the H200 tables')
    puts B* below 16 and flags it."""
    spec = {**QWEN14B_8K, "gpu": "H200"}
    ev = evaluator({"estimate": spec, "hold": "1m"})
    out = None
    for t in range(0, 600, 5):
        out = ev.evaluate(obs(float(t), {"0": 16.0}, k=4, accepted=ALPHA_06, engine_kind="vllm"), ())
    assert out["above_crossover"] is False
    assert out["crossover_batch_size"] is None or out["crossover_batch_size"] > 16
    assert out["predicted_speedup_ratio"] > 1.2
    assert out["crossover_attention_kernel"] == "packed"
    unpacked = evaluator({"estimate": spec, "hold": "1m", "attention_kernel": "unpacked"})
    for t in range(0, 600, 5):
        out = unpacked.evaluate(obs(float(t), {"0": 16.0}, k=4, accepted=ALPHA_06, engine_kind="vllm"), ())
    assert out["crossover_attention_kernel"] == "unpacked"
    assert out["crossover_batch_size"] is not None and out["crossover_batch_size"] < 16
    assert out["above_crossover"] is True


def test_no_crossover_below_the_largest_batch_that_fits():
    """On an 80 GB H100 the 14B model at 8k context fits (0.92 x 80 GB - 29.6 GB of weights) / (196,608 B x 8192
    tokens) = 27 sequences: whatever B* the model solves beyond that, the estimate says no crossover."""
    ev = evaluator({"estimate": QWEN14B_8K})
    out = ev.evaluate(obs(0.0, {"0": 16.0}, k=4, accepted=ALPHA_06, engine_kind="vllm"), ())
    assert out["crossover_kv_capacity_batch"] == 27
    assert out["crossover_batch_size"] is None and out["above_crossover"] is False
    short = evaluator({"estimate": {**QWEN14B_8K, "context": 1024}, "attention_kernel": "unpacked"})
    out = short.evaluate(obs(0.0, {"0": 16.0}, k=4, accepted=ALPHA_06, engine_kind="vllm"), ())
    assert out["crossover_kv_capacity_batch"] == 27 * 8 + 3  # 219 sequences of 1024 tokens
    assert out["crossover_batch_size"] is not None and out["crossover_beyond_capacity"] is False


def test_unknown_engine_band_covers_both_kernels():
    """Before the engine is detected (or for an engine whose kernel is not known) the estimate assumes neither
    kernel: its band reaches down to the unpacked kernel's lower side and up to the packed kernel's upper side."""
    spec = {**QWEN14B_8K, "gpu": "H200", "context": 1024, "params": 14.8}
    answers = {}
    for kernel in ("packed", "unpacked", "auto"):
        ev = evaluator({"estimate": spec, "attention_kernel": kernel})
        answers[kernel] = ev.evaluate(obs(0.0, {"0": 16.0}, k=4, accepted=ALPHA_06, engine_kind="trtllm"), ())
    auto, packed, unpacked = answers["auto"], answers["packed"], answers["unpacked"]
    assert auto["crossover_attention_kernel"] == "unknown"
    assert unpacked["crossover_batch_size"] < packed["crossover_batch_size"]
    assert auto["crossover_lower"] == pytest.approx(min(packed["crossover_lower"], unpacked["crossover_lower"]))
    assert auto["crossover_upper"] is None or auto["crossover_upper"] >= packed["crossover_batch_size"]
    assert auto["crossover_batch_size"] == pytest.approx(packed["crossover_batch_size"])


def test_vllm_and_sglang_on_hopper_assume_packed_kernel():
    from specwatch.crossover.kernel import resolve

    for engine in ("vllm", "sglang"):
        for gpu in ("H100-SXM", "H200"):
            assert resolve("auto", engine, gpu).kernel == "packed"
    assert resolve("auto", "vllm", "A100-80GB").kernel == "unknown"
    assert resolve("auto", "trtllm", "H200").kernel == "unknown"
    assert resolve("auto", "", "H200").kernel == "unknown"
    assert resolve("unpacked", "vllm", "H200").kernel == "unpacked"
    with pytest.raises(ValueError, match="attention_kernel"):
        resolve("fused", "vllm", "H200")


def test_attention_kernel_setting_is_checked():
    with pytest.raises(Exception, match="attention_kernel"):
        route({"estimate": QWEN14B_8K, "attention_kernel": "fused"})
