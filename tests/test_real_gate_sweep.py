"""`specwatch gate --plain URL`: the two-point throughput sweep against two real vLLM servers (the CPU build of
testbed), the same tiny model with speculation (the candidate) and without.

CPU physics, not a GPU's: a tiny model on two loaded CPU cores is bound by Python overheads, so the speedup
measured here says nothing about a GPU's low-batch speedup, and this test does not claim one. What it tests is
the tool path on real engines: the sweep drives both real servers at concurrency 1 and 2 (the fewest requests
a verdict takes at 1), the JSON and JUnit carry the measured speedups and their intervals, a `--min-speedup`
far below what any server measures passes and one far above fails, with `--require-speedup` exit 1 (over
the acceptance verdict's inconclusive: the probe rounds are kept too short to judge, to spare the CPU). The
throughput verdict against a speedup known in advance, and a fail that is only reported, are in
test_gate_fleet_and_sweep.py (simulated engines).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwatch.cli import main as cli_main
from specwatch.probe.gate import MIN_SWEEP_REQUESTS
from testbed.load import PROMPTS
from testbed.models import GOOD_DRAFTER_NOISE
from testbed.vllm_server import VllmServer, VllmServerSpec

pytestmark = [pytest.mark.real_engine, pytest.mark.e2e]

K = 3


@pytest.fixture(scope="module")
def pair(engine_env, tiny_models, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("gate-sweep")
    plain = VllmServer(engine_env, VllmServerSpec(model=tiny_models.target), workdir / "plain")
    spec = VllmServer(
        engine_env,
        VllmServerSpec(
            model=tiny_models.target,
            per_request_spec_metrics="summary",
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
