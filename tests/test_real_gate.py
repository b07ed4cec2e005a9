"""`specwatch gate` against a real vLLM (the CPU build of testbed) serving the successor models, whose acceptance
is known by design (testbed/successor.py): greedy verification accepts a draft token iff it is the successor of
the last one, so a drafter's acceptance over a token-id prompt set is fixed in advance.

Two server starts (one to several minutes of CPU each on the 2-core box): the base drafter (`SUCCESSOR_BASE`),
then the same port restarted with `SUCCESSOR_DROP_20`, which accepts exactly 0.80x as much over
`successor.prompts(795, 32)` x 32 tokens. A reference is recorded from the base server with `gate record`; the
gate passes the same drafter in each of five runs, fails the DROP_20 drafter in each of five runs, and calls a
round too short to judge (2 tokens a prompt) inconclusive. Each run is the real CLI, JSON and JUnit written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwatch.cli import main as cli_main
from testbed import successor
from testbed.models import SUCCESSOR_BASE, SUCCESSOR_DROP_20
from testbed.vllm_server import VllmServer, VllmServerSpec

pytestmark = [pytest.mark.real_engine, pytest.mark.e2e]

VOCAB, K = 795, 3
PROMPTS, TOKENS = successor.prompts(VOCAB, 32), 32
RUNS = 5


@pytest.fixture(scope="module")
def server(engine_env, tiny_models, tmp_path_factory):
    spec = VllmServerSpec(
        model=tiny_models.successor_target,
        per_request_spec_metrics="summary",
        speculative={
            "method": "draft_model",
            "num_speculative_tokens": K,
            "model": str(tiny_models.successor_drafter(SUCCESSOR_BASE)),
        },
    )
    with VllmServer(engine_env, spec, tmp_path_factory.mktemp("gate-vllm")) as srv:
        yield srv


def prompt_file(directory: Path) -> str:
    path = directory / "successor-prompts.json"
    entries = [{"id": f"from-{p[0]}", "kind": "successor", "prompt": p} for p in PROMPTS]
    path.write_text(json.dumps({"prompts": entries}))
    return str(path)


def gate(server: VllmServer, directory: Path, *extra: str, max_tokens: int = TOKENS) -> tuple[int, dict]:
    out = directory / f"gate-{len(list(directory.glob('gate-*.json')))}.json"
    argv = ["gate", "--url", server.base_url, "--engine", "vllm", "--prompts", prompt_file(directory)]
    argv += ["--max-tokens", str(max_tokens), "--timeout", "120", "--json", str(out), *extra]
    rc = cli_main(argv)
    return rc, json.loads(out.read_text()) if out.exists() else {}


def test_the_gate_passes_the_same_drafter_and_fails_one_accepted_20_percent_less(server, tiny_models, tmp_path):
    reference = tmp_path / "reference.json"
    assert cli_main(["gate", "record", "--url", server.base_url, "--engine", "vllm", "--prompts",
                     prompt_file(tmp_path), "--max-tokens", str(TOKENS), "--timeout", "120", "--out",
                     str(reference)]) == 0  # fmt: skip
    recorded = json.loads(reference.read_text())
    assert recorded["draft_length"] == K and len(recorded["prompts"]) == len(PROMPTS)

    same = [gate(server, tmp_path, "--reference", str(reference)) for _ in range(RUNS)]
    assert [rc for rc, _ in same] == [0] * RUNS, [doc.get("reason") for _, doc in same]
    assert all(doc["verdict"] == "pass" and doc["method"] == "vllm_response" for _, doc in same)

    short_rc, short = gate(server, tmp_path, "--reference", str(reference), max_tokens=2)
    assert short_rc == 2 and short["verdict"] == "inconclusive", short.get("reason")

    server.restart(server.spec.with_speculative(model=str(tiny_models.successor_drafter(SUCCESSOR_DROP_20))))
    worse = [
        gate(server, tmp_path, "--reference", str(reference), "--junit", str(tmp_path / "j.xml")) for _ in range(RUNS)
    ]
    assert [rc for rc, _ in worse] == [1] * RUNS, [doc.get("reason") for _, doc in worse]
    for _, doc in worse:
        assert doc["drop"] == pytest.approx(0.20, abs=0.02) and doc["drop_interval"][0] > 0
    assert "AcceptanceDrop" in (tmp_path / "j.xml").read_text()
