"""The crossover model against the H200 reference table and the closed forms of docs/crossover.md."""

from __future__ import annotations

import json

import pytest

from specwatch.cli import main as cli_main
from specwatch.crossover import gpus
from specwatch.crossover.calibrate import fit_efficiency, reference_points
from specwatch.crossover.hfconfig import shape_from_hf_config
from specwatch.crossover.model import (LLAMA3_8B, Draft, Efficiency, StepModel, closed_form_crossover,
                                       crossover_batch, expected_tokens, interpolate_crossover,
                                       positions_from_alpha, tau)
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
def test_interpolated_crossover_lies_in_first_below_one_bracket(table, context):
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


@pytest.mark.parametrize("gamma", [2, 4])
@pytest.mark.parametrize("alpha", [0.6, 0.7, 0.8])
def test_calibrated_estimate_within_25_percent_of_h200(table, gamma, alpha):
    measured = table.run(1024).measured_crossover(gamma, alpha)
    estimated = h200_model().crossover(positions_from_alpha(alpha, gamma), 1024)
    assert estimated == pytest.approx(measured, rel=0.25)


def test_refit_reproduces_shipped_h200_efficiency(table):
    fitted, rms = fit_efficiency(h200_model(Efficiency()), reference_points(table.run(1024)), "test")
    shipped = gpus.CALIBRATED["H200"]
    assert rms < 0.05
    assert fitted.memory == pytest.approx(shipped.memory, abs=0.01)
    assert fitted.compute == pytest.approx(shipped.compute, abs=0.02)
    assert fitted.verify_attention == pytest.approx(shipped.verify_attention, abs=0.01)
    assert fitted.step_overhead_s == pytest.approx(shipped.step_overhead_s, abs=5e-5)


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


def test_gpu_lookup_by_nvml_name():
    assert gpus.lookup("NVIDIA H100 80GB HBM3")[0].name == "H100-SXM"
    assert gpus.lookup("NVIDIA H100 PCIe")[0].name == "H100-PCIE"
    assert gpus.lookup("NVIDIA A100-SXM4-80GB")[0].name == "A100-80GB"
    assert gpus.lookup("NVIDIA H200")[1] is gpus.CALIBRATED["H200"]
    with pytest.raises(ValueError, match="unknown GPU"):
        gpus.lookup("Voodoo 3")


def test_hf_config_llama3():
    shape = shape_from_hf_config({"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
                                  "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 128256})
    assert shape == LLAMA3_8B
    assert shape.params / 1e9 == pytest.approx(8.03, abs=0.01)
    assert shape.kv_bytes_per_token == 131072
    with pytest.raises(ValueError, match="vocab_size"):
        shape_from_hf_config({"hidden_size": 8, "num_attention_heads": 1, "num_hidden_layers": 1,
                              "intermediate_size": 8})


def test_draft_parse():
    assert Draft.parse("ngram", LLAMA3_8B).params == 0
    assert Draft.parse("eagle3", LLAMA3_8B).params / 1e9 == pytest.approx(0.349, abs=0.01)
    assert Draft.parse("model:0.5", LLAMA3_8B).params == 0.5e9
    with pytest.raises(ValueError):
        Draft.parse("model:big", LLAMA3_8B)
    with pytest.raises(ValueError):
        Draft.parse("medusa", LLAMA3_8B)


def test_cli_estimate_json(capsys):
    rc = cli_main(["crossover", "estimate", "--gpu", "H200", "--params", "8", "--gamma", "4", "--alpha", "0.7",
                   "--draft", "eagle3", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"crossover_batch_size", "speedup"}
    assert 50 < out["crossover_batch_size"] < 100
    assert out["speedup"]["1"] > 1 > out["speedup"]["256"]


def test_cli_estimate_positions_and_errors(capsys):
    assert cli_main(["crossover", "estimate", "--gpu", "H200", "--params", "8", "--positions", "0.8,0.6,0.4"]) == 0
    assert "gamma 3" in capsys.readouterr().out
    assert cli_main(["crossover", "estimate", "--gpu", "H200", "--layers", "32"]) == 2
    assert "--hidden-size" in capsys.readouterr().err
    assert cli_main(["crossover", "estimate", "--gpu", "TPU", "--params", "8"]) == 2
