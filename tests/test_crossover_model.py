"""The crossover model against the H200 reference table and the closed forms of docs/crossover.md."""

from __future__ import annotations

import json

import pytest

from specwatch.cli import main as cli_main
from specwatch.crossover import gpus, shapes
from specwatch.crossover.calibrate import fit_efficiency, reference_points
from specwatch.crossover.hfconfig import shape_from_hf_config
from specwatch.crossover.speedup import (
    LLAMA3_8B,
    Draft,
    Efficiency,
    StepModel,
    closed_form_crossover,
    crossover_batch,
    expected_tokens,
    interpolate_crossover,
    positions_from_alpha,
    tau,
)
from specwatch.crossover.reference import default_path, load_reference

GAMMAS = (2, 4, 7)
ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)


@pytest.fixture(scope="module")
def table():
    return load_reference()


def h200_model(efficiency: Efficiency | None = None) -> StepModel:
    hardware, calibrated = gpus.lookup("NVIDIA H200")
    return StepModel(LLAMA3_8B, hardware, efficiency or calibrated, draft=Draft.parse("eagle3", LLAMA3_8B))


def test_expected_tokens_matches_positions():
    for alpha in ALPHAS:
        for gamma in GAMMAS:
            assert expected_tokens(alpha, gamma) == pytest.approx(tau(positions_from_alpha(alpha, gamma)))
    assert expected_tokens(1.0, 4) == 5.0


@pytest.mark.parametrize("context", [1024, 8192])
def test_recomputed_speedups_match_stored_derived(table, context):
    run = table.run(context)
    assert len(run.derived) == len(GAMMAS) * len(ALPHAS)
    for (gamma, alpha), stored in run.derived.items():
        recomputed = run.speedup(gamma, alpha)
        for batch, value in stored.items():
            assert round(recomputed[batch], 3) == pytest.approx(value, abs=1e-9), (gamma, alpha, batch)


@pytest.mark.parametrize("context", [1024, 8192])
def test_interpolated_crossover_lies_in_the_reference_tables_bracket(table, context):
    """The 8B reference table's curves cross 1 once, so its stored first batch below 1 brackets B*."""
    raw = json.loads(default_path().read_text())
    derived = next(r for r in raw["runs"] if r["context"] == context)["derived"]
    run = table.run(context)
    for gamma in GAMMAS:
        for alpha in ALPHAS:
            first = derived[f"gamma={gamma},alpha={alpha}"]["first_batch_below_1"]
            bstar = run.measured_crossover(gamma, alpha)
            if first is None:
                assert bstar is None
                continue
            grid = run.batches
            previous = grid[grid.index(first) - 1] if grid.index(first) else first
            assert previous <= bstar <= first, (gamma, alpha, bstar, first)


def test_interpolate_crossover_edges():
    assert interpolate_crossover([]) is None
    assert interpolate_crossover([(1, 2.0), (8, 1.5)]) is None
    assert interpolate_crossover([(1, 0.9), (8, 0.5)]) == 1
    assert interpolate_crossover([(8, 0.5), (4, 1.5)]) == pytest.approx(6.0)
    assert interpolate_crossover([(4, 1.5), (16, 0.5)], log_x=True) == pytest.approx(8.0)


def test_crossover_is_the_last_downward_crossing():
    """Below 1 at batch 1, paying at 2-4, losing from 8: B* is where it stops paying for good (between 4 and
    8), not 1; a curve that pays again at its last point has no crossover."""
    dip_then_pay = [(1, 0.97), (2, 1.05), (4, 1.2), (8, 0.8), (16, 0.6)]
    assert interpolate_crossover(dip_then_pay) == pytest.approx(6.0)
    assert interpolate_crossover([(8, 0.8), (16, 1.1), (24, 0.9), (32, 0.7)]) == pytest.approx(20.0)
    assert interpolate_crossover([(1, 0.9), (8, 1.1)]) is None
    assert crossover_batch(lambda b: 0.97 if b < 1.5 else 1.4 - 0.05 * b) == pytest.approx(8.0, rel=1e-3)


def test_measured_crossover_of_a_table_that_dips_at_batch_one(all_tables):
    """Llama-3-8B at 8192, gamma 2, alpha 0.6 measures 0.995 at batch 1 and 1.05-1.12 at batch 2-4."""
    run = next(t.run for t in all_tables if t.name == "llama3-8b" and t.context == 8192)
    speedup = run.speedup(2, 0.6)
    assert speedup[1] < 1 < min(speedup[2], speedup[4]) and speedup[8] < 1
    assert 4 < run.measured_crossover(2, 0.6) < 8


@pytest.fixture(scope="module")
def all_tables():
    return shapes.load_tables()


@pytest.fixture(scope="module")
def shape_tables(all_tables):
    """The ten shapes at context 1024."""
    return {t.name: t for t in all_tables if t.context == 1024}


HELD_SHAPES = (
    "llama3.2-1b",
    "qwen2.5-1.5b",
    "qwen1.5-1.8b",
    "llama2-7b",
    "llama3-8b",
    "llama2-13b",
    "qwen2.5-14b",
    "qwen3-30b-a3b",
    "codellama-34b",
)
# OLMoE-1B-7B (the second MoE, MHA) has its own test below: its one measured crossover at 1024 sits on a flat curve.
SHAPES_1024 = HELD_SHAPES + ("olmoe-1b-7b",)


def test_shape_tables_load(shape_tables, all_tables):
    assert sorted(shape_tables) == sorted(SHAPES_1024)
    contexts = {}
    for t in all_tables:
        contexts.setdefault(t.name, []).append(t.context)
    long = ("llama3-8b", "qwen2.5-14b", "llama2-7b", "qwen2.5-1.5b")
    assert {n: sorted(c) for n, c in contexts.items() if n in long} == {
        n: [1024, 2048, 4096, 8192, 16384] for n in long
    }
    assert {n: sorted(contexts[n]) for n in ("qwen3-30b-a3b", "olmoe-1b-7b")} == {
        "qwen3-30b-a3b": [1024, 2048],
        "olmoe-1b-7b": [1024, 2048],
    }
    assert len(all_tables) == 28
    moe = shape_tables["qwen3-30b-a3b"].shape
    assert moe.experts == 128 and moe.experts_per_token == 8
    assert moe.params / 1e9 == pytest.approx(30.5, abs=0.3)
    assert moe.active_params / 1e9 == pytest.approx(3.03, abs=0.01)  # 3.3 B with the embedding
    olmoe = shape_tables["olmoe-1b-7b"].shape
    assert (olmoe.experts, olmoe.experts_per_token, olmoe.intermediate_size) == (64, 8, 1024)
    assert olmoe.params / 1e9 == pytest.approx(6.92, abs=0.02)
    assert [n for n, t in shape_tables.items() if t.shape.gqa_ratio == 1] == [
        "qwen1.5-1.8b",
        "llama2-7b",
        "olmoe-1b-7b",
        "llama2-13b",
    ]
    assert shape_tables["llama2-13b"].shape.params / 1e9 == pytest.approx(13.0, abs=0.1)
    assert shape_tables["codellama-34b"].shape.params / 1e9 == pytest.approx(33.7, abs=0.2)


def close_enough(table, cell, limit: float) -> bool:
    """Within `limit` in B*, or off in B* only where the measured speedup is within 3% of 1 at the predicted
    B* (`shapes.within_near_one`): Llama-3-8B at 16384 measures 0.98 at batch 4 where the model says 1.00,
    and B* is 1 against 4."""
    return (cell.error is not None and abs(cell.error) <= limit) or shapes.within_near_one(table.run, cell)


@pytest.mark.parametrize("name", HELD_SHAPES)
def test_calibrated_estimate_within_25_percent_of_shape_tables(shape_tables, name):
    table = shape_tables[name]
    for cell in shapes.score(table, gpus.CALIBRATED["H200"]):
        assert cell.error is not None and abs(cell.error) <= 0.25, cell


def test_calibrated_olmoe_crossing_on_a_flat_curve():
    """OLMoE-1B-7B (MHA, 64 experts): speculation still pays at batch 512 in five of its six scored cells at 1024,
    and the model agrees (no B* up to 512). Its gamma 4, alpha 0.6 curve falls slowly through 1 (1.046 at 384,
    0.950 at 512: B* 445); the model's speedup is within 7% of the measured one at every batch from 16 but 5-7%
    high at 384-512, as on Llama-2-7B and -13B (MHA verify at large batch), so its B* comes out about 30% high:
    a known miss, which the MoE warning and the band cover (test_every_cell_outside_20_percent_...)."""
    from specwatch.crossover.speedup import positions_from_alpha

    table = next(t for t in shapes.load_tables() if t.cell == ("olmoe-1b-7b", 1024))
    eff = gpus.CALIBRATED["H200"]
    cells = {(c.gamma, c.alpha): c for c in shapes.score(table, eff)}
    flat = cells.pop((4, 0.6))
    assert flat.measured == pytest.approx(445, abs=2)
    assert flat.error is not None and 0.20 < flat.error < 0.40, flat
    assert all(c.measured is None and c.error == 0.0 for c in cells.values()), cells
    model = shapes.table_model(table, eff)
    for gamma, alpha in ((2, 0.6), (4, 0.6), (4, 0.8)):
        positions = positions_from_alpha(alpha, gamma)
        for batch, measured in table.run.speedup(gamma, alpha).items():
            if batch >= 16:
                assert model.speedup(float(batch), positions, 1024) / measured - 1 == pytest.approx(0, abs=0.07)


@pytest.mark.parametrize("context", [2048, 4096, 8192, 16384])
def test_calibrated_estimate_across_contexts(all_tables, context):
    """The shipped calibration on the long-context tables: every cell within 20%, or both sides agree that
    speculation loses from the first batches (B* < 2), or the speedup at the predicted B* is within 3% of 1."""
    for table in (t for t in all_tables if t.context == context):
        for cell in shapes.score(table, gpus.CALIBRATED["H200"]):
            assert close_enough(table, cell, 0.20), cell


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama3.2-1b", "llama2-7b", "llama2-13b", "qwen3-30b-a3b", "codellama-34b"])
def test_held_out_shape_predicted_within_25_percent(shape_tables, all_tables, name):
    """Fit without the only head-dim-64 shape, an MHA shape, an MoE or the largest shape (and without
    their own head layout in the attention probe; every other shape at every context); predict its B*."""
    held = shape_tables[name]
    others = [t for t in all_tables if t.name != name]
    eff, _ = shapes.fit(others, exclude_heads=[shapes.heads_of(held.shape)], exclude_shapes=[held.name])
    for cell in shapes.score(held, eff):
        assert cell.error is not None and abs(cell.error) <= 0.25, cell


@pytest.mark.slow
def test_held_out_mha_shape_crosses(shape_tables, all_tables):
    """Fitted on GQA shapes and the other MHA shapes, Llama-2-7B's crossovers are predicted within 25%; the
    old model, fitted on GQA only, predicted none. Its gamma 2, alpha 0.6 curve stays within 3% of 1 over more
    than a hundred batch units, which is why its table is the median of three runs measured to batch 384."""
    held = shape_tables["llama2-7b"]
    assert max(held.run.batches) == 384
    others = [t for t in all_tables if t.name != "llama2-7b"]
    eff, _ = shapes.fit(others, exclude_heads=[shapes.heads_of(held.shape)], exclude_shapes=[held.name])
    cells = {(c.gamma, c.alpha): c for c in shapes.score(held, eff)}
    assert cells[(4, 0.6)].measured == pytest.approx(160, abs=2)
    assert cells[(2, 0.6)].measured == pytest.approx(253, abs=3)
    for key in ((2, 0.6), (4, 0.6)):
        assert cells[key].error is not None and abs(cells[key].error) <= 0.25, cells[key]


@pytest.mark.slow
def test_refit_reproduces_shipped_h200_efficiency(all_tables):
    fitted, rms = shapes.fit(all_tables)
    shipped = gpus.CALIBRATED["H200"]
    assert rms < 0.06
    for name in ("memory", "compute", "verify_attention", "decode_attention", "elementwise"):
        assert getattr(fitted, name) == pytest.approx(getattr(shipped, name), abs=0.01), name
    for name in ("layer_overhead_s", "step_overhead_s", "elementwise_layer_s"):
        assert getattr(fitted, name) == pytest.approx(getattr(shipped, name), abs=1e-6), name
    for name in ("verify_key_s", "attention_slice_key_s", "expert_group_s", "verify_block_s"):
        assert getattr(fitted, name) == pytest.approx(getattr(shipped, name), rel=0.02), name
    assert fitted.decode_attention_flop_s == pytest.approx(shipped.decode_attention_flop_s, abs=1e-16)


def test_attention_probe_loads_every_layout():
    probe = {a.heads: a for a in shapes.load_attention_probe()}
    assert len(probe) == 11
    assert (32, 32, 128) in probe and (32, 8, 64) in probe
    for layout in probe.values():
        assert sorted({p.q for p in layout.points}) == [1, 3, 5]
        assert sorted({p.batch for p in layout.points}) == [16, 64, 128, 256]
        assert all(p.kind == "attention" and p.seconds > 0 for p in layout.points)


def test_calibrated_attention_matches_the_probe_kernels():
    """The shipped attention terms reproduce every probed verify kernel within 15% (head dim 64 and 128, MHA and
    GQA 2-8) and plain decode within 20% from batch 128 with GQA up to 4. Plain decode of few (sequence, KV head)
    blocks at context 1024 runs up to 72% longer than its bytes (GQA 6 at batch 16: 32 blocks): a per-call cost
    that the tables' context deltas (split-KV: no growth with the context) do not carry."""
    from specwatch.crossover.calibrate import predict

    eff = gpus.CALIBRATED["H200"]
    for layout in shapes.load_attention_probe():
        model = layout.model(eff)
        for p in layout.points:
            error = predict(model, p) / p.seconds - 1
            if p.q > 1:
                assert abs(error) <= 0.15, (layout.heads, p, error)
            elif p.batch >= 128 and layout.heads[0] <= 4 * layout.heads[1]:
                assert abs(error) <= 0.20, (layout.heads, p, error)
            else:
                assert -0.75 <= error <= 0.05, (layout.heads, p, error)


def test_held_out_fit_leaves_out_the_held_shapes_probe_layout(shape_tables):
    """A held-out shape's own head layout is not fitted on: with only that layout in the probe there is
    nothing left to fit the attention terms to."""
    others = [t for n, t in shape_tables.items() if n != "llama2-7b"]
    own = [a for a in shapes.load_attention_probe() if a.heads == (32, 32, 128)]
    assert shapes.heads_of(shape_tables["llama2-7b"].shape) == (32, 32, 128)
    with pytest.raises(ValueError, match="at least one measured"):
        shapes.fit(others, probe=own, exclude_heads=[(32, 32, 128)])


def test_held_out_fit_leaves_out_the_held_shapes_profile(shape_tables):
    """A held-out shape's own profiled forwards are not fitted on either: with only its points in the profile
    the elementwise rate has nothing left to fit."""
    own = [p for p in shapes.load_forward_profile(list(shape_tables.values())) if p.shape == "llama2-7b"]
    others = [t for n, t in shape_tables.items() if n != "llama2-7b"]
    with pytest.raises(ValueError, match="at least two profiled"):
        shapes.fit(others, profile=own, exclude_shapes=["llama2-7b"])


def test_elementwise_rate_fits_the_profiled_kernels(shape_tables):
    """The elementwise kernels of the profiled forwards (six shapes, MHA and GQA, q 1-5, batch 64-256) lie on
    one rate over the bytes `activation_bytes_per_token` counts: every point within 12%, RMS under 6%; the
    rate and the fixed time per layer are what gpus.py ships, the rate well below the weight-streaming rate."""
    points = shapes.load_forward_profile(list(shape_tables.values()))
    assert {"llama2-7b", "llama2-13b", "qwen1.5-1.8b", "llama3-8b", "qwen2.5-14b"} <= {p.shape for p in points}
    hardware, shipped = gpus.lookup("H200")
    rate, fixed, rms = shapes.fit_elementwise(points, hardware.bandwidth)
    assert rms < 0.06
    assert rate == pytest.approx(shipped.elementwise, abs=0.005)
    assert fixed == pytest.approx(shipped.elementwise_layer_s, rel=0.01)
    assert rate < shipped.memory / 2
    for p in points:
        predicted = p.layers * (p.tokens * p.bytes_per_token / (rate * hardware.bandwidth) + fixed)
        assert predicted / p.seconds == pytest.approx(1.0, abs=0.12), p


def test_elementwise_bytes_grow_with_the_kv_heads():
    """RoPE on k (10 passes) and the KV-cache write (4) scale with the KV heads: an MHA layer of Llama-3-8B's
    width moves 14 x 2 bytes more per token for each extra KV-head element than its GQA original."""
    from dataclasses import replace

    from specwatch.crossover.stepcost import activation_bytes_per_token

    mha = replace(LLAMA3_8B, kv_heads=32)
    extra = (32 - 8) * 128
    assert activation_bytes_per_token(mha) - activation_bytes_per_token(LLAMA3_8B) == 2.0 * 14 * extra


def test_reference_table_single_fit_still_works(table):
    """`crossover calibrate --reference` fits the 8B table alone with the per-kernel model."""
    fitted, rms = fit_efficiency(
        h200_model(Efficiency(verify_reads_per_query_head=True)), reference_points(table.run(1024)), "test"
    )
    assert rms < 0.10
    measured = table.run(1024).measured_crossover(4, 0.7)
    assert h200_model(fitted).crossover(positions_from_alpha(0.7, 4), 1024) == pytest.approx(measured, rel=0.25)


def test_moe_touches_experts_as_batch_grows():
    from specwatch.crossover.stepcost import experts_touched

    assert experts_touched(1, 128, 8) == pytest.approx(8)
    assert experts_touched(16, 128, 8) == pytest.approx(128 * (1 - (1 - 8 / 128) ** 16))
    assert experts_touched(2048, 128, 8) == pytest.approx(128, rel=1e-6)


def test_params_raw_count_is_converted(capsys):
    rc = cli_main(["crossover", "estimate", "--gpu", "H200", "--params", "70e9", "--json"])
    out = capsys.readouterr()
    assert rc == 0
    assert "raw parameter count: 70 billion" in out.err
    doc = json.loads(out.out)
    assert any("70B" in line for line in doc["assumptions"])
    assert any("outside the validated" in w for w in doc["warnings"])
    rc = cli_main(["crossover", "estimate", "--gpu", "H200", "--params", "70", "--json"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["crossover_batch_size"] == doc["crossover_batch_size"]


def test_params_ambiguous_exits_2(capsys):
    assert cli_main(["crossover", "estimate", "--gpu", "H200", "--params", "20000"]) == 2
    assert "neither billions" in capsys.readouterr().err


def test_estimate_prints_assumptions_and_no_warning_inside_validated_range(capsys):
    rc = cli_main(
        [
            "crossover",
            "estimate",
            "--gpu",
            "H200",
            "--layers",
            "48",
            "--hidden-size",
            "5120",
            "--kv-heads",
            "8",
            "--head-dim",
            "128",
            "--params",
            "14.7",
            "--context",
            "1024",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "Assumptions:" in out and "GQA 5" in out and "context 1024" in out
    assert "warning:" not in out
    rc = cli_main(["crossover", "estimate", "--gpu", "L40S", "--params", "8", "--context", "32768", "--dtype", "fp8"])
    out = capsys.readouterr().out
    assert "warning: L40S has no measured efficiencies" in out
    assert "warning: context 32768 is outside" in out
    assert "warning: fp8 weights" in out


def test_uncalibrated_model_has_no_crossover_below_ridge_at_gamma_1():
    model = h200_model(Efficiency())
    # At batch 1 a step is memory-bound: speculation wins for any decent acceptance.
    assert model.speedup(1, positions_from_alpha(0.7, 4), 1024) > 1.5


def test_closed_form_worked_example():
    # docs/design/crossover-research.md §3:
    # Llama-3-8B bf16, c = 0.1, gamma 4, alpha 0.7, short context, H200 at peak: ~98.
    hardware, _ = gpus.lookup("H200")
    peak = Efficiency(memory=1.0, compute=1.0, verify_attention=1.0)
    shape = LLAMA3_8B
    bstar = closed_form_crossover(shape, hardware, peak, positions_from_alpha(0.7, 4), 0.1, context=0.0)
    assert bstar == pytest.approx(98, rel=0.03)
    # Long enough context: KV reads dominate and no crossover exists.
    assert closed_form_crossover(shape, hardware, peak, positions_from_alpha(0.7, 4), 0.1, context=5000) is None


def test_crossover_batch_search():
    assert crossover_batch(lambda b: 2.0 - b / 100) == pytest.approx(100, rel=1e-3)
    assert crossover_batch(lambda b: 0.5) == 1.0
    assert crossover_batch(lambda b: 1.5) is None
    assert crossover_batch(lambda b: 0.9 if b < 50 else 1.2) is None


def test_gpu_lookup_by_nvml_name():
    assert gpus.lookup("NVIDIA H100 80GB HBM3")[0].name == "H100-SXM"
    assert gpus.lookup("NVIDIA H100 PCIe")[0].name == "H100-PCIE"
    assert gpus.lookup("NVIDIA A100-SXM4-80GB")[0].name == "A100-80GB"
    assert gpus.lookup("NVIDIA H200")[1] is gpus.CALIBRATED["H200"]
    with pytest.raises(ValueError, match="unknown GPU"):
        gpus.lookup("Voodoo 3")


def test_hf_config_llama3():
    shape = shape_from_hf_config(
        {
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "num_hidden_layers": 32,
            "intermediate_size": 14336,
            "vocab_size": 128256,
        }
    )
    assert shape == LLAMA3_8B
    assert shape.params / 1e9 == pytest.approx(8.03, abs=0.01)
    assert shape.kv_bytes_per_token == 131072
    with pytest.raises(ValueError, match="vocab_size"):
        shape_from_hf_config(
            {"hidden_size": 8, "num_attention_heads": 1, "num_hidden_layers": 1, "intermediate_size": 8}
        )


def test_draft_parse():
    assert Draft.parse("ngram", LLAMA3_8B).params == 0
    assert Draft.parse("eagle3", LLAMA3_8B).params / 1e9 == pytest.approx(0.349, abs=0.01)
    assert Draft.parse("model:0.5", LLAMA3_8B).params == 0.5e9
    with pytest.raises(ValueError):
        Draft.parse("model:big", LLAMA3_8B)
    with pytest.raises(ValueError):
        Draft.parse("medusa", LLAMA3_8B)


def test_cli_estimate_json(capsys):
    rc = cli_main(
        [
            "crossover",
            "estimate",
            "--gpu",
            "H200",
            "--params",
            "8",
            "--draft.length",
            "4",
            "--alpha",
            "0.7",
            "--draft",
            "eagle3",
            "--attention-kernel",
            "unpacked",  # the H200 tables' verify kernel, whose B* the bounds below are about
            "--json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {
        "crossover_batch_size",
        "band",
        "speedup",
        "assumptions",
        "warnings",
        "attention_kernel",
        "kv_capacity_batch",
        "model_crossover_beyond_capacity",
    }
    assert out["attention_kernel"] == "unpacked" and out["kv_capacity_batch"] > 256
    assert 50 < out["crossover_batch_size"] < 100
    # --params alone guesses the shape: outside the validated range, a widened band and a warning.
    assert out["band"]["validated"] is False and out["warnings"]
    assert out["band"]["lower"] < out["crossover_batch_size"]
    assert out["band"]["basis"].startswith("outside the validated range")
    assert out["speedup"]["1"] > 1 > out["speedup"]["256"]


def test_cli_estimate_positions_and_errors(capsys):
    assert cli_main(["crossover", "estimate", "--gpu", "H200", "--params", "8", "--positions", "0.8,0.6,0.4"]) == 0
    assert "gamma 3" in capsys.readouterr().out
    assert cli_main(["crossover", "estimate", "--gpu", "H200", "--layers", "32"]) == 2
    assert "--hidden-size" in capsys.readouterr().err
    assert cli_main(["crossover", "estimate", "--gpu", "TPU", "--params", "8"]) == 2


def test_verify_attention_costs_a_head_dim_64_shape_more_per_kv_byte():
    """The verify kernel's per-key cost does not shrink with the head: half the bytes, more than half the time."""
    from dataclasses import replace

    from specwatch.crossover.stepcost import attention_s

    hardware, eff = gpus.lookup("H200")
    wide = LLAMA3_8B
    narrow = replace(LLAMA3_8B, head_dim=64)
    for q in (3, 5, 8):
        t_wide = attention_s(128, q, 1024, wide, hardware, eff, hardware.sms)
        t_narrow = attention_s(128, q, 1024, narrow, hardware, eff, hardware.sms)
        assert 0.5 * t_wide < t_narrow < t_wide


def test_decode_attention_per_kv_byte_grows_with_gqa_ratio_only_through_scoring():
    from dataclasses import replace

    from specwatch.crossover.stepcost import attention_s

    hardware, _ = gpus.lookup("H200")
    mha = replace(LLAMA3_8B, kv_heads=32)
    gqa8 = replace(LLAMA3_8B, kv_heads=4)

    def per_kv_head(eff):
        return [attention_s(64, 1, 1024, s, hardware, eff, hardware.sms) / s.kv_heads for s in (mha, LLAMA3_8B, gqa8)]

    scoring = per_kv_head(Efficiency(decode_attention_flop_s=1e-14))
    assert scoring[0] < scoring[1] < scoring[2]
    bytes_only = per_kv_head(Efficiency())
    assert bytes_only[0] == pytest.approx(bytes_only[1]) == pytest.approx(bytes_only[2])


def test_decode_attention_splits_a_small_call_over_the_sms():
    """Plain decode's slice term: one block's loop over its keys, split so the blocks fill the SMs (split-KV).
    A call of 8 blocks on 132 SMs splits each slice 16 ways; one of more blocks than SMs does not split."""
    from dataclasses import replace

    from specwatch.crossover.stepcost import attention_s

    hardware, _ = gpus.lookup("H200")
    eff = Efficiency(attention_slice_key_s=1e-8)
    no_slice = replace(eff, attention_slice_key_s=0.0)

    def floor(batch, context):
        return attention_s(batch, 1, context, LLAMA3_8B, hardware, eff, hardware.sms) - attention_s(
            batch, 1, context, LLAMA3_8B, hardware, no_slice, hardware.sms
        )

    assert floor(1, 8192) == pytest.approx(8193 / 16 * 1e-8)
    assert floor(32, 8192) == pytest.approx(8193 * 1e-8)


def test_verify_attention_runs_whole_waves_of_blocks_on_the_tables_kernel():
    """The tables' verify kernel: one block per (sequence, query head) over the whole slice. Up to one wave it
    costs one block's loop whatever the batch (measured: Llama-3-8B at batch 1 and 4, 32 and 128 blocks, add
    the same 20 us per 1024 keys and layer); 192 blocks on 132 SMs cost two waves (Qwen2.5-1.5B at batch 16).
    A GQA-packed kernel balances its last wave."""
    from dataclasses import replace

    from specwatch.crossover.stepcost import attention_s

    hardware, _ = gpus.lookup("H200")
    eff = Efficiency(verify_reads_per_query_head=True, verify_block_s=5e-6)

    def t(batch, context=4096, e=eff):
        return attention_s(batch, 5, context, LLAMA3_8B, hardware, e, hardware.sms)

    assert t(1) == pytest.approx(t(4))
    assert t(5) == pytest.approx(2 * t(4))  # 160 blocks: two waves
    assert t(8) == pytest.approx(2 * t(4))  # 256 blocks: still two
    assert t(4, 8192) - t(4, 4096) == pytest.approx(
        4096 * hardware.sms * 256 * 2 / (eff.verify_attention * hardware.bandwidth)
    )
    packed = replace(eff, verify_reads_per_query_head=False)  # 8 KV heads: 40 and 264 blocks
    assert t(33, e=packed) / t(66, e=packed) == pytest.approx(264 / 528)


def test_library_gemm_has_no_wave_step_but_grouped_launch_does():
    """Past one wave a library GEMM balances its last partial wave (stream-K): 1.1 waves cost 1.1, not 2.
    A grouped MoE launch has no such balancing and pays the whole last wave."""
    from specwatch.crossover.stepcost import gemm_s, waves

    hardware, _ = gpus.lookup("H200")
    eff = Efficiency()
    assert waves(145.2, 132) == 2.0
    assert waves(66, 132) == pytest.approx(0.5)
    # Compute-bound GEMMs of 33 row tiles (4224 rows) by 4 and 5 column tiles: 132 and 165 tiles.
    one_wave = gemm_s(4224, 512, 16384, 2.0, hardware, eff, hardware.flops_bf16)
    more = gemm_s(4224, 640, 16384, 2.0, hardware, eff, hardware.flops_bf16)
    assert more / one_wave == pytest.approx(1.25, rel=0.01)


def test_grouped_launch_streams_weights_in_whole_waves():
    """A memory-bound grouped launch: 11 one-row experts of 12 column tiles fill one wave of 132 SMs and stream
    at the full rate; 16 experts (192 tiles) run two waves, the second 45% full, so they stream at 192/264 of
    it: 16/11 x 264/192 = 2.0 times the time."""
    from specwatch.crossover.stepcost import grouped_gemm_s

    hardware, _ = gpus.lookup("H200")
    eff = Efficiency()
    one_wave = grouped_gemm_s(11, 11, 1536, 2048, 2.0, hardware, eff, hardware.flops_bf16, hardware.sms)
    two_waves = grouped_gemm_s(16, 16, 1536, 2048, 2.0, hardware, eff, hardware.flops_bf16, hardware.sms)
    assert two_waves / one_wave == pytest.approx(2.0, rel=0.01)


def test_grouped_gemm_pays_a_fixed_cost_per_touched_expert():
    from specwatch.crossover.stepcost import grouped_gemm_s

    hardware, _ = gpus.lookup("H200")
    plain = Efficiency()
    with_groups = Efficiency(expert_group_s=5e-7)
    args = (1536, 2048, 2.0, hardware)  # n, k, bytes per weight
    for touched in (8, 64, 128):
        base = grouped_gemm_s(2048, touched, *args, plain, hardware.flops_bf16, hardware.sms)
        grouped = grouped_gemm_s(2048, touched, *args, with_groups, hardware.flops_bf16, hardware.sms)
        assert grouped - base == pytest.approx(touched * 5e-7)


def test_near_one_range_brackets_the_measured_crossover(shape_tables):
    run = shape_tables["llama2-7b"].run
    high, low = shapes.near_one_range(run, 4, 0.6)
    assert high is not None and low is not None
    assert high < run.measured_crossover(4, 0.6) < low
    assert shapes.near_one_range(run, 2, 0.8) == (None, None)  # speedup above 1.03 at every measured batch


@pytest.mark.slow
@pytest.mark.parametrize("held_context", [8192, 16384])
def test_band_outside_the_validated_contexts_warns_and_covers_the_measured_crossover(all_tables, held_context):
    """Hold out every table at and beyond a context: fit on the rest and read the band from the validation cells
    below that context only. At the held-out context the estimate is outside the validated range (it warns)
    and its widened band covers every measured B* (both sides below 2 count as agreeing)."""
    from specwatch.crossover import band as bands

    kept = [t for t in all_tables if t.context < held_context]
    eff, _ = shapes.fit(kept)
    cells = [c for c in bands.load_validation() if c.context < held_context]
    lo, hi = shapes.validated_range(kept)["context"]
    assert not lo <= held_context <= hi
    checked = 0
    for table in (t for t in all_tables if t.context == held_context):
        for cell in shapes.score(table, eff):
            model = shapes.table_model(table, eff)
            at_one = model.speedup(1.0, positions_from_alpha(cell.alpha, cell.gamma), held_context)
            band = bands.error_band(
                cell.predicted, table.shape, held_context, validated=False, cells=cells, speedup_at_one=at_one
            )
            assert not band.validated
            if cell.measured is None:
                assert band.upper is None or cell.predicted is None, cell
            elif cell.measured < bands.SMALLEST_BANDED and cell.predicted is not None and cell.predicted < 2:
                continue
            else:
                assert cell.predicted is not None and band.covers(cell.measured), (cell, band)
                checked += 1
    assert checked >= 4


def test_every_cell_outside_20_percent_is_covered_by_its_band_and_outside_the_range_warns(all_tables):
    """Each validated (shape, context, gamma, alpha) cell whose held-out B* misses by more than 20%: the
    estimate's band around the shape-held-out prediction covers the measured B*; where the cell is outside the
    validated range (an MoE) the estimate warns, and the band still covers it when built without that shape's
    own cells, as a new shape of its class would get it."""
    import json as _json

    from specwatch.crossover import band as bands
    from specwatch.crossover.estimate import EstimateInputs, validation_warnings

    raw = _json.loads(bands.VALIDATION_FILE.read_text(encoding="utf-8"))["cells"]
    cells = bands.load_validation()
    tables = {t.cell: t for t in all_tables}
    failing = [
        c
        for c in raw
        if c["measured"] is not None and any(e is None or abs(e) > 0.20 for e in (c["error"], c["error_shape_out"]))
    ]
    assert {(c["shape"], c["context"]) for c in failing} >= {("llama2-7b", 1024), ("olmoe-1b-7b", 1024)}
    # With a second MoE (OLMoE-1B-7B, also at 2048) a fit without Qwen3-30B-A3B still sets the per-expert cost.
    assert not [c for c in failing if c["shape"] == "qwen3-30b-a3b"]
    outside = 0
    for c in failing:
        table = tables[(c["shape"], c["context"])]
        model = shapes.table_model(table, gpus.CALIBRATED["H200"])
        warned = bool(validation_warnings(model, EstimateInputs(), c["context"]))
        at_one = model.speedup(1.0, positions_from_alpha(c["alpha"], c["gamma"]), c["context"])
        views = [cells] + ([[x for x in cells if x.shape != c["shape"]]] if warned else [])
        predicted = c["predicted_shape_out"]  # at a measured context the band is the shape-held-out errors'
        for pool in views:
            band = bands.error_band(predicted, table.shape, c["context"], not warned, pool, at_one)
            assert band.validated is not warned
            assert predicted is not None and band.covers(c["measured"]), (c, band)
        outside += warned
    assert outside >= 1  # OLMoE's gamma 4, alpha 0.6 cell at 1024


def test_packed_verify_reads_the_kv_cache_once_per_kv_head():
    """A packed verify kernel (FlashAttention-3 pack_gqa, FlashInfer) reads each sequence's KV cache once per KV
    head, as decode does: at 8k context its attention costs decode's plus q times the score FLOPs, where the
    unpacked kernel pays the GQA ratio (5 for a Qwen2.5-14B layer) times the bytes. Measured on an H100, one such
    layer at batch 64 (docs/reference/h100-verify-kernels-qwen2.5-14b-layer.json): plain 0.70 ms, packed q = 3
    0.71 ms, unpacked (SDPA enable_gqa) 2.34 ms."""
    from dataclasses import replace

    from specwatch.crossover.inputs import ModelShape
    from specwatch.crossover.stepcost import attention_s

    qwen14b = ModelShape(
        layers=48,
        hidden_size=5120,
        kv_heads=8,
        head_dim=128,
        intermediate_size=13824,
        vocab_size=152064,
        attention_heads=40,
    )
    hardware, calibrated = gpus.lookup("H200")
    packed = replace(calibrated, verify_reads_per_query_head=False)
    unpacked = replace(calibrated, verify_reads_per_query_head=True)

    def t(q, e):
        return attention_s(64, q, 8192, qwen14b, hardware, e, hardware.sms)

    assert t(3, packed) == pytest.approx(t(1, packed), rel=0.02)
    assert t(3, unpacked) > 4 * t(3, packed)


def test_packed_tables_are_priced_within_their_fit():
    """The packed H100 tables, all 18 fitted at once: the model's step times stay within 10% RMS of them."""
    from specwatch.crossover import shapes

    tables = shapes.load_packed_tables()
    assert len(tables) == 18 and all(t.packed and t.gpu == "H100-SXM" for t in tables)
    _, rms = shapes.fit(tables, source="test")
    assert rms < 0.10
