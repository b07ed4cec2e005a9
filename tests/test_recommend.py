"""Draft-length recommendation and the schedules it writes for vLLM and SGLang."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specwatch.cli import main as cli_main
from specwatch.crossover import gpus
from specwatch.crossover.speedup import LLAMA3_8B, Draft, StepModel, positions_from_alpha
from specwatch.crossover.recommend import ModelStepTimes, SweepStepTimes, best_k, goodput, recommend
from specwatch.crossover.sweepfile import FORMAT


def check_vllm_schedule(schedule: object) -> None:
    """The checks vLLM applies to 3-item `num_speculative_tokens_per_batch_size` entries
    (vllm/v1/spec_decode/dynamic/utils.py, validate_and_normalize_dynamic_sd_schedule)."""
    assert isinstance(schedule, list) and schedule, "must be a non-empty list"
    previous_end = 0
    for entry in sorted(schedule):
        assert isinstance(entry, list) and len(entry) == 3, "3-item entries"
        lo, hi, k = (int(x) for x in entry)
        assert lo > 0 and hi > 0, "batch-size range must be positive"
        assert lo <= hi, "range start must be <= end"
        assert k >= 0, "K values must be >= 0"
        assert lo > previous_end, "ranges must be non-overlapping and sorted"
        previous_end = hi
    assert sorted(schedule)[0][0] == 1, "the first range must start at 1"


def check_sglang_config(cfg: object) -> None:
    """SGLang's _load_adaptive_config: integer-string batch keys, each a non-empty candidate_steps list of ints >= 0."""
    assert isinstance(cfg, dict)
    slots = {k: v for k, v in cfg.items() if k.isdigit()}
    assert slots
    for entry in slots.values():
        steps = entry["candidate_steps"]
        assert isinstance(steps, list) and steps and all(isinstance(s, int) and s >= 0 for s in steps)


class MemoryBound:
    """Leviathan's memory-bound step: T(k) = 1 + k c, independent of batch."""

    def __init__(self, c: float) -> None:
        self.c = c

    def step_s(self, batch: float, k: int) -> float:
        return 1.0 + k * self.c


@pytest.mark.parametrize(
    "alpha,c,k,speedup", [(0.7, 0.10, 4, 1.98), (0.6, 0.05, 4, 1.92), (0.8, 0.20, 4, 1.87), (0.8, 0.05, 8, 3.09)]
)
def test_best_k_reproduces_doc_grid(alpha, c, k, speedup):
    # docs/design/crossover-research.md §7 grid (iid, memory-bound): gamma* and its speedup.
    positions = positions_from_alpha(alpha, 12)
    times = MemoryBound(c)
    assert best_k(positions, times, 1) == k
    assert goodput(positions, times, 1, k) / goodput(positions, times, 1, 0) == pytest.approx(speedup, abs=0.01)


def h200_times() -> ModelStepTimes:
    hardware, efficiency = gpus.lookup("H200")
    return ModelStepTimes(StepModel(LLAMA3_8B, hardware, efficiency, draft=Draft.parse("eagle3", LLAMA3_8B)), 1024)


def test_schedule_from_roofline_is_valid_and_stops_drafting():
    rec = recommend(positions_from_alpha(0.8, 4), h200_times(), batch_now=16, max_batch=256)
    ranges = [list(r) for r in rec.ranges]
    check_vllm_schedule(ranges)
    check_sglang_config(rec.sglang)
    assert ranges[0][0] == 1 and ranges[-1][1] == 256
    assert ranges[0][2] == 4 and ranges[-1][2] == 0  # full drafts at batch 1, none at 256
    assert [r[2] for r in ranges] == sorted((r[2] for r in ranges), reverse=True)  # k never rises with batch
    assert rec.sglang[str(ranges[-1][0])]["candidate_steps"][0] == 0
    assert 1 <= rec.k_now <= 4 and rec.speedup_now > 1
    assert "drafting stops from batch" in rec.vllm_reason


def sweep_doc() -> dict:
    # Plain TPOT grows slowly, a k=3 spec step quickly: spec (tau 2.5) wins at 1, loses by 64.
    levels = []
    for c, plain, spec_step in ((1, 0.005, 0.006), (8, 0.0055, 0.008), (32, 0.007, 0.016), (64, 0.009, 0.030)):
        levels.append(
            {
                "concurrency": c,
                "plain": {"tpot_p50_s": plain, "output_tokens_per_s": c / plain},
                "spec": {
                    "tpot_p50_s": spec_step / 2.5,
                    "mean_acceptance_length": 2.5,
                    "output_tokens_per_s": c * 2.5 / spec_step,
                },
            }
        )
    return {
        "format": FORMAT,
        "levels": levels,
        "num_speculative_tokens": 3,
        "mean_acceptance_length": 2.5,
        "position_acceptance": [0.7, 0.5, 0.3],
    }


def test_sweep_step_times():
    times = SweepStepTimes(sweep_doc())
    assert times.step_s(1, 0) == pytest.approx(0.005)
    assert times.step_s(1, 3) == pytest.approx(0.006)
    assert times.step_s(8, 0) < times.step_s(8, 1) < times.step_s(8, 3)
    assert times.step_s(128, 3) > times.step_s(64, 3)  # extrapolated, still growing
    with pytest.raises(ValueError, match="acceptance"):
        SweepStepTimes({**sweep_doc(), "num_speculative_tokens": None})


def test_cli_from_sweep_file(tmp_path, capsys):
    path = tmp_path / "crossover.json"
    path.write_text(json.dumps(sweep_doc()))
    assert cli_main(["recommend", "chat", "--sweep", str(path), "--json", "--max-batch", "128"]) == 0
    out = json.loads(capsys.readouterr().out)
    check_vllm_schedule(out["vllm"]["num_speculative_tokens_per_batch_size"])
    check_sglang_config(out["sglang_adaptive_config"])
    assert out["vllm"]["num_speculative_tokens"] == 3
    assert out["vllm"]["num_speculative_tokens_per_batch_size"][-1][1:] == [128, 0]
    assert cli_main(["recommend", "chat", "--sweep", str(path)]) == 0
    text = capsys.readouterr().out
    assert "num_speculative_tokens_per_batch_size" in text and text.count("why:") == 2


@pytest.fixture
def daemon():
    routes = {
        "routes": [
            {
                "name": "chat",
                "position_acceptance_ratio": [0.8, 0.64, 0.51, 0.41],
                "draft_length": 4.0,
                "batch_size": 24.0,
                "crossover_batch_size": 80.0,
            },
            {"name": "code", "position_acceptance_ratio": []},
        ]
    }

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            body = json.dumps(routes).encode()
            self.send_response(200 if self.path == "/api/v1/routes" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.slow
def test_cli_from_daemon_with_roofline(daemon, capsys):
    rc = cli_main(
        ["recommend", "chat", "--url", daemon, "--gpu", "H200", "--params", "8.03", "--draft", "eagle3", "--json"]
    )
    assert rc == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    assert out["batch"] == 24.0 and 1 <= out["k"] <= 4
    check_vllm_schedule(out["vllm"]["num_speculative_tokens_per_batch_size"])


@pytest.mark.slow
def test_cli_errors(daemon, capsys):
    assert cli_main(["recommend", "nope", "--url", daemon, "--gpu", "H200", "--params", "8"]) == 2
    assert "no route 'nope'" in capsys.readouterr().err
    assert cli_main(["recommend", "code", "--url", daemon, "--gpu", "H200", "--params", "8"]) == 2
    assert "no per-position acceptance" in capsys.readouterr().err
    assert cli_main(["recommend", "chat", "--url", daemon]) == 2
    assert "step times needed" in capsys.readouterr().err
    assert cli_main(["recommend", "chat", "--url", "http://127.0.0.1:9", "--gpu", "H200", "--params", "8"]) == 2
    assert "cannot reach specwatch" in capsys.readouterr().err


def test_sweep_of_the_h200_table_stops_drafting_at_its_crossover():
    from specwatch.crossover.speedup import expected_tokens
    from specwatch.crossover.reference import load_reference

    run = load_reference().run(1024)
    tau = expected_tokens(0.7, 4)
    levels = [
        {
            "concurrency": b,
            "plain": {"tpot_p50_s": run.target_s[(b, 1)]},
            "spec": {"tpot_p50_s": (run.target_s[(b, 5)] + 4 * run.draft_s[b]) / tau, "mean_acceptance_length": tau},
        }
        for b in run.batches
    ]
    doc = {"format": FORMAT, "levels": levels, "num_speculative_tokens": 4}
    rec = recommend(positions_from_alpha(0.7, 4), SweepStepTimes(doc), batch_now=1, max_batch=256)
    check_vllm_schedule([list(r) for r in rec.ranges])
    stop = next(start for start, _, k in rec.ranges if k == 0)
    # The table's own gamma 2 and gamma 4 crossovers (alpha 0.7) lie at 60 and 65: drafting must stop near there,
    # not linger at k = 1 far beyond (what a cost linear in k would predict).
    assert 48 <= stop <= 96, rec.ranges
