"""`specwatch gate` against a real vLLM (the CPU build of testbed) serving the successor models, whose acceptance
is known by design (testbed/successor.py): greedy verification accepts a draft token iff it is the successor of
the last one, so a drafter's acceptance over a token-id prompt set is fixed in advance.

On the shared successor server (tests/real_vllm_servers.py): a reference is recorded from the base drafter
(`SUCCESSOR_BASE`) with `gate record`; the gate passes the same drafter in each of five runs and calls a round too
short to judge (2 tokens a prompt) inconclusive; on the `SUCCESSOR_DROP_20` drafter, which accepts exactly 0.80x
as much over `successor.prompts(795, 32)` x 32 tokens, it fails in each of five runs. Each run is the real CLI,
JSON and JUnit written. The DROP_20 test runs after the probe tests' swap to that drafter, so the server starts
twice for both modules together.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwatch.cli import main as cli_main
from testbed import successor
from real_vllm_servers import K, successor_spec
from testbed.models import SUCCESSOR_BASE, SUCCESSOR_DROP_20
from testbed.vllm_server import VllmServer

pytestmark = [pytest.mark.real_engine, pytest.mark.e2e]

VOCAB = 795
PROMPTS, TOKENS = successor.prompts(VOCAB, 32), 32
RUNS = 5
# Prompts in flight, for the reference and every run alike: each prompt's acceptance is its own (per-request
# metrics), and the probe tests read exact designed counts at this concurrency too.
CONCURRENCY = 8


def prompt_file(directory: Path) -> str:
    path = directory / "successor-prompts.json"
    entries = [{"id": f"from-{p[0]}", "kind": "successor", "prompt": p} for p in PROMPTS]
    path.write_text(json.dumps({"prompts": entries}))
    return str(path)


def gate(server: VllmServer, directory: Path, *extra: str, max_tokens: int = TOKENS) -> tuple[int, dict]:
    out = directory / f"gate-{len(list(directory.glob('gate-*.json')))}.json"
    argv = ["gate", "--url", server.base_url, "--engine", "vllm", "--prompts", prompt_file(directory)]
    argv += ["--max-tokens", str(max_tokens), "--timeout", "120", "--concurrency", str(CONCURRENCY)]
    argv += ["--json", str(out), *extra]
    rc = cli_main(argv)
    return rc, json.loads(out.read_text()) if out.exists() else {}


@pytest.fixture(scope="session")
def reference(successor_vllm, tiny_models, tmp_path_factory) -> Path:
    """`gate record` from the base drafter (session-scoped: the DROP_20 test runs after other modules' tests)."""
    server = successor_vllm.serve(successor_spec(tiny_models, SUCCESSOR_BASE))
    directory = tmp_path_factory.mktemp("gate-reference")
    path = directory / "reference.json"
    assert cli_main(["gate", "record", "--url", server.base_url, "--engine", "vllm", "--prompts",
                     prompt_file(directory), "--max-tokens", str(TOKENS), "--timeout", "120", "--concurrency",
                     str(CONCURRENCY), "--out", str(path)]) == 0  # fmt: skip
    recorded = json.loads(path.read_text())
    assert recorded["draft_length"] == K and len(recorded["prompts"]) == len(PROMPTS)
    return path


@pytest.mark.successor_vllm("base")
def test_the_gate_passes_the_same_drafter_and_calls_a_short_round_inconclusive(
    successor_vllm, tiny_models, reference, tmp_path
):
    server = successor_vllm.serve(successor_spec(tiny_models, SUCCESSOR_BASE))
    same = [gate(server, tmp_path, "--reference", str(reference)) for _ in range(RUNS)]
    assert [rc for rc, _ in same] == [0] * RUNS, [doc.get("reason") for _, doc in same]
    assert all(doc["verdict"] == "pass" and doc["method"] == "vllm_response" for _, doc in same)

    short_rc, short = gate(server, tmp_path, "--reference", str(reference), max_tokens=2)
    assert short_rc == 2 and short["verdict"] == "inconclusive", short.get("reason")


@pytest.mark.successor_vllm("worse")
def test_the_gate_fails_a_drafter_accepted_20_percent_less(successor_vllm, tiny_models, reference, tmp_path):
    server = successor_vllm.serve(successor_spec(tiny_models, SUCCESSOR_DROP_20))
    worse = [
        gate(server, tmp_path, "--reference", str(reference), "--junit", str(tmp_path / "j.xml")) for _ in range(RUNS)
    ]
    assert [rc for rc, _ in worse] == [1] * RUNS, [doc.get("reason") for _, doc in worse]
    for _, doc in worse:
        assert doc["drop"] == pytest.approx(0.20, abs=0.02) and doc["drop_interval"][0] > 0
    assert "AcceptanceDrop" in (tmp_path / "j.xml").read_text()
