"""`specwatch gate` with the fleet's traffic baseline in a real Prometheus as its reference, and its two-point
throughput sweep; the CLI end to end, JSON and JUnit written.

The candidates are SIMULATED engines (specwatch/simulator: vLLM's /metrics and per-request spec-decode fields,
greedy requests accepted the same way each time; step times from the packaged H200 table), not real ones: the
speedups below are the table's physics through a simulator, which is what lets a test know them in advance.
The sweep on real vLLM servers is in test_real_vllm_sweep.py.

- Fleet: three "nodes" are specwatch's own exporter (export/http.py) serving Snapshots with a baseline for the
  candidate's key on route chat, and a fourth for another model; a real Prometheus scrapes them. The gate asks
  it as a seeding node would (evaluators/fleet_seed.py). The nodes' baseline is set from the candidate's own
  probe acceptance: equal to it, the gate is inconclusive (a traffic baseline never passes); with the
  candidate at 0.6x of the fleet's, it fails.
- Sweep: a speculative candidate against the same simulated model without speculation, at concurrency 1 and 8:
  a drafter accepted 70% of the time speeds low-batch traffic up (1.65-1.83x at 1 on this box, intervals from
  1.4x), one accepted 5% of the time slows it down (0.79-0.84x, intervals under 0.92x); the second exits 1 with
  `--require-speedup` though its acceptance matches its own reference, and 0 without (reported only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from alerting_stack import Processes, binaries, free_port, query, wait_until

from specwatch.cli import main as cli_main
from specwatch.export.http import serve
from specwatch.simulator.server import RunningSimulator
from specwatch.simulator.simulation import DEFAULT_MODEL, Simulation, SimulationSpec
from specwatch.snapshot import RouteState, Snapshot

pytestmark = pytest.mark.e2e

K = 4
PROBE = ("--max-tokens", "32")  # the built-in set, 32 tokens a prompt: thousands of draft tokens, a short round


def simulator(acceptance: float, k: int = K) -> RunningSimulator:
    spec = SimulationSpec(
        k=k,
        acceptance=acceptance,
        time_scale=0.25,  # steps 4x longer than the table's: the HTTP path's own cost stays small beside them
        seed=2,
        per_request_spec_decode_metrics="summary",
        repeatable_greedy=True,
    )
    return RunningSimulator(Simulation(spec), flush_interval=0.1).start()


def node(ratio: float, model: str = DEFAULT_MODEL, version: str = "") -> Snapshot:
    route = RouteState(
        name="chat",
        up=True,
        model_name=model,
        engine_version=version,
        baseline_ratio=ratio,
        baseline_model=model,
        baseline_engine_version=version,
        baseline_draft_length=K,
        baseline_source="learned",
        baseline_overdispersion=35.0,
    )
    return Snapshot(timestamp=1.0, routes=(route,))


def record(url: str, out: Path) -> tuple[float, str]:
    """`gate record` against `url`; the pooled acceptance it recorded, and the engine version it read."""
    assert cli_main(["gate", "record", "--url", url, "--engine", "vllm", *PROBE, "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    prompts = doc["prompts"].values()
    return sum(p["accepted"] for p in prompts) / sum(p["drafted"] for p in prompts), doc["engine_version"]


def gate(url: str, out: Path, *extra: str) -> tuple[int, dict]:
    rc = cli_main(["gate", "--url", url, "--engine", "vllm", *PROBE, "--json", str(out), *extra])
    return rc, json.loads(out.read_text()) if out.exists() else {}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Iterator[tuple[str, list[Snapshot], Processes]]:
    """A real Prometheus scraping three nodes whose snapshots the test sets, and a fourth for another model."""
    workdir = tmp_path_factory.mktemp("gate-fleet")
    current = [node(0.5), node(0.5), node(0.5), node(0.3, model="other", version="any")]
    servers = [serve("127.0.0.1:0", lambda i=i: current[i]) for i in range(len(current))]
    procs = Processes(workdir)
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
        "scrape_configs": [
            {"job_name": "gpu", "static_configs": [{"targets": [f"127.0.0.1:{s.port}" for s in servers]}]}
        ],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    procs.start(
        "prometheus",
        [
            binaries()["prometheus"],
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
    )
    url = f"http://127.0.0.1:{port}"
    try:
        scraped = lambda: len(query(url, "specwatch_route_acceptance_baseline_info")) == 4  # noqa: E731
        wait_until("Prometheus to scrape the four nodes", scraped, 90, procs)
        yield url, current, procs
    finally:
        procs.stop_all()
        for s in servers:
            s.shutdown()


def set_fleet(fleet: tuple[str, list[Snapshot], Processes], ratios: list[float], version: str) -> None:
    """The three nodes' baselines for (chat, the simulator's model, `version`, K); once Prometheus has them."""
    prometheus, current, procs = fleet
    for i, ratio in enumerate(ratios):
        current[i] = node(ratio, version=version)
    expected = sorted(round(r, 6) for r in [*ratios, 0.3])

    def scraped() -> bool:
        rows = query(prometheus, "specwatch_route_acceptance_baseline_ratio")
        return sorted(round(float(r["value"][1]), 6) for r in rows) == expected

    wait_until("Prometheus to scrape the nodes' new baselines", scraped, 60, procs)


def test_the_fleet_baseline_fails_a_clear_drop_and_never_passes(fleet, tmp_path, capsys):
    prometheus = fleet[0]
    candidate = simulator(0.5)
    try:
        own, version = record(candidate.url, tmp_path / "own.json")
        args = ("--reference-prometheus", prometheus, "--route", "chat", "--selector", 'job="gpu"')

        set_fleet(fleet, [own * 0.98, own, own * 1.02], version)
        rc, doc = gate(candidate.url, tmp_path / "same.json", *args)
        assert rc == 2 and doc["verdict"] == "inconclusive", doc.get("reason")
        assert "cannot pass" in doc["reason"] and doc["drop"] == pytest.approx(0.0, abs=1e-6)
        assert doc["drop_interval"][1] < 0.15  # would have passed against a fingerprint
        ref = doc["reference"]
        assert ref["kind"] == "fleet_traffic_baseline" and ref["nodes"] == 3 and ref["ratio"] == pytest.approx(own)
        assert (ref["model"], ref["draft_length"]) == (DEFAULT_MODEL, K)
        assert "traffic mix" in capsys.readouterr().out

        set_fleet(fleet, [own / 0.62, own / 0.6, own / 0.58], version)
        rc, doc = gate(candidate.url, tmp_path / "drop.json", *args, "--junit", str(tmp_path / "gate.xml"))
        assert rc == 1 and doc["verdict"] == "fail", doc.get("reason")
        assert doc["drop"] == pytest.approx(0.4, abs=0.01) and doc["drop_interval"][0] >= 0.15
        assert "AcceptanceDrop" in (tmp_path / "gate.xml").read_text()

        # a model bump: the fleet's key is production's, named; one node has it
        rc, doc = gate(
            candidate.url,
            tmp_path / "bump.json",
            *args,
            "--reference-model",
            "other",
            "--reference-engine-version",
            "any",
            "--min-nodes",
            "1",
        )
        assert doc["reference"]["model"] == "other" and doc["reference_ratio"] == pytest.approx(0.3)
        capsys.readouterr()
        rc, doc = gate(candidate.url, tmp_path / "few.json", *args, "--min-nodes", "4")
        assert rc == 2 and doc == {}
        assert "too_few_nodes" in capsys.readouterr().err
    finally:
        candidate.stop()


@pytest.mark.parametrize("acceptance, required, expected", [(0.7, True, 0), (0.05, True, 1), (0.05, False, 0)])
def test_the_sweep_says_whether_the_candidate_still_speeds_up_low_batch_traffic(
    tmp_path, acceptance, required, expected
):
    candidate, plain = simulator(acceptance), simulator(0.0, k=0)
    try:
        reference = tmp_path / "reference.json"
        record(candidate.url, reference)  # acceptance unchanged: the exit code is the throughput verdict's
        sweep = ("--plain", plain.url, "--sweep-max-tokens", "32", "--sweep-output", str(tmp_path / "sweep.json"))
        junit = tmp_path / "gate.xml"
        extra = ("--reference", str(reference), "--junit", str(junit)) + (("--require-speedup",) if required else ())
        rc, doc = gate(candidate.url, tmp_path / "gate.json", *sweep, *extra)
    finally:
        candidate.stop()
        plain.stop()
    throughput = doc["throughput"]
    assert doc["verdict"] == "pass" and rc == expected == doc["exit_code"], throughput
    assert [lv["concurrency"] for lv in throughput["levels"]] == [1, 8] and throughput["required"] is required
    low, high = throughput["levels"][0]["speedup_interval"]
    if acceptance == 0.7:
        assert throughput["verdict"] == "pass" and low >= 1.0, throughput
    else:  # the whole interval under 1: a fail, gating only when required
        assert throughput["verdict"] == "fail" and high < 1.0, throughput
        assert ("NoSpeedup" in junit.read_text()) is required
    assert json.loads((tmp_path / "sweep.json").read_text())["format"] == "specwatch-crossover/1"
