"""`specwatch sweep` against two engines that demand a bearer token (as vLLM with `--api-key`): the streamed
requests, the model listing and the spec server's /metrics reads all carry the `authorization` of
`--http.config.file`, as a route's requests do; without it the sweep stops at once with the engine's 401."""

from __future__ import annotations

import pytest

from guarded import GuardedEngine
from specwatch.cli import main as cli_main
from specwatch.crossover.sweepfile import load_sweep

pytestmark = pytest.mark.slow  # loopback servers (guarded engines, the daemon's own server)

TOKEN = "sk-sweep-token"


@pytest.fixture
def guarded_pair():
    from specwatch.simulator.server import RunningSimulator
    from specwatch.simulator.simulation import Simulation, SimulationSpec

    sims = [
        RunningSimulator(Simulation(SimulationSpec(k=k, acceptance=0.7, time_scale=50, seed=1 + k))).start()
        for k in (0, 3)
    ]
    engines = [GuardedEngine(sim.url, authorization=f"Bearer {TOKEN}") for sim in sims]
    yield engines
    for engine in engines:
        engine.close()
    for sim in sims:
        sim.stop()


def _sweep(plain: str, spec: str, out, *extra: str) -> int:
    return cli_main(
        ["sweep", "--plain", plain, "--spec", spec, "--concurrency", "1", "--max-tokens", "8"]
        + ["--requests-per-client", "2", "--output", str(out), "--quiet", "--timeout", "30", *extra]
    )


def test_a_sweep_carries_the_bearer_token_of_its_http_config_file(guarded_pair, tmp_path, capsys):
    plain, spec = guarded_pair
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    config = tmp_path / "http.yml"
    config.write_text(f"authorization: {{credentials_file: {token}}}\n")
    out = tmp_path / "crossover.json"
    assert _sweep(plain.url, spec.url, out, "--http.config.file", str(config)) == 0, capsys.readouterr()
    doc = load_sweep(out)
    assert doc["complete"] and doc["failure"] is None
    level = doc["levels"][0]
    assert level["plain"]["failed"] == level["spec"]["failed"] == 0
    assert level["spec"]["acceptance_ratio"] > 0  # read from the guarded /metrics before and after the level
    assert {(m, p, s) for m, p, s in spec.seen if s != 200} == set()


def test_without_the_token_the_sweep_stops_with_the_engines_401(guarded_pair, tmp_path, capsys):
    plain, spec = guarded_pair
    out = tmp_path / "crossover.json"
    assert _sweep(plain.url, spec.url, out) == 1
    assert "cannot list models: 401" in capsys.readouterr().err
    assert load_sweep(out)["levels"] == []


def test_credentials_in_a_sweep_url_are_refused(tmp_path, capsys):
    assert _sweep("http://u:hunter2@127.0.0.1:9", "http://127.0.0.1:9", tmp_path / "c.json") == 2
    err = capsys.readouterr().err
    assert "--plain: credentials in the URL are refused" in err and "hunter2" not in err
