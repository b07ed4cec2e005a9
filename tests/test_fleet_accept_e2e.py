"""`specwatch fleet accept` against real `specwatch run` daemons, each watching its own SIMULATED vLLM engine,
with targets from a file and from a real Prometheus's target list.

Node A's engine is bumped to a new model (its engine restarted with drafts accepted less often); node B stays
on the old model; node C is a target with nothing listening. Within the daemons' first minute (before any
flush of their state files) A answers from its live state: "no evidence yet", then "would adopt", while its
old baseline stays. The fleet accept then adopts on A, refuses on B (which keeps its baseline), reports C
unreachable and exits 1; rerun, A answers "already". A flood of admin POSTs adds no row to the command log.

Wall-clock budget: about 60 s here (3 processes' start-up, two warm-ups of a few seconds at 3x simulated time,
Prometheus listing its targets); deadlines are 3-4x that of each step, for a loaded 2-core machine.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from alerting_stack import Processes, answers, binaries, free_ports, wait_until

pytestmark = pytest.mark.e2e

OLD, NEW = "example/old-8b", "example/new-8b"
STEP_DEADLINE = 90.0  # for each wait below


def _sim(procs: Processes, name: str, port: int, model: str, acceptance: float) -> None:
    procs.start(
        name,
        [sys.executable, "-m", "specwatch", "simulate", "--engine", "vllm", "--port", str(port), "--model", model]
        + ["--acceptance", str(acceptance), "--load", "8", "--time-scale", "3", "--seed", "7"],
    )


def _stop(procs: Processes, name: str) -> None:
    for entry in list(procs.running):
        if entry[0] == name:
            entry[1].terminate()
            entry[1].wait(timeout=10)
            procs.running.remove(entry)


def _daemon(procs: Processes, workdir: Path, name: str, port: int, sim_port: int) -> str:
    config = {
        "interval": "1s",
        "state_dir": str(workdir / f"state-{name}"),
        "scrape": {"timeout": "0.8s"},
        "gpu": {"enabled": "false"},
        "detection": {"warmup_drafted_tokens": 2000, "warmup_duration": "5s", "block": "2s"},
        "routes": [{"name": "chat", "url": f"http://127.0.0.1:{sim_port}/metrics"}],
    }
    path = workdir / f"{name}.yml"
    path.write_text(yaml.safe_dump(config))
    procs.start(
        name,
        [sys.executable, "-m", "specwatch", "run", f"--config.file={path}"]
        + [f"--web.listen-address=127.0.0.1:{port}", "--web.enable-admin-api"],
    )
    return f"http://127.0.0.1:{port}"


def _baselines(url: str) -> dict[str, dict]:
    return {b["model"]: b for b in requests.get(url + "/api/v1/baselines", timeout=10).json()["baselines"]}


def _learned(url: str) -> bool:
    try:
        return OLD in _baselines(url)
    except (requests.RequestException, ValueError):
        return False  # still starting


def _model(url: str) -> str:
    try:
        routes = requests.get(url + "/api/v1/routes", timeout=10).json()["routes"]
    except (requests.RequestException, ValueError):
        return ""
    return str(routes[0]["model_name"]) if routes and routes[0]["up"] else ""


def _accept(url: str, **body) -> requests.Response:
    return requests.post(url + "/api/v1/baselines/chat/accept", json={"model": NEW, **body}, timeout=30)


def _active(prometheus: str) -> list:
    return requests.get(prometheus + "/api/v1/targets", timeout=10).json()["data"]["activeTargets"]


def _fleet(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specwatch", "fleet", "accept", "--model", NEW, "--timeout", "20", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _summary(result: subprocess.CompletedProcess) -> str:
    return result.stdout.strip().splitlines()[-1]


def test_a_fleet_accept_adopts_where_the_bump_landed_and_nowhere_else(tmp_path: Path) -> None:
    found = binaries()
    ports = free_ports("sim_a", "sim_b", "a", "b", "c", "prometheus")
    procs = Processes(tmp_path)
    try:
        _sim(procs, "sim_a", ports["sim_a"], OLD, 0.7)
        _sim(procs, "sim_b", ports["sim_b"], OLD, 0.7)
        a = _daemon(procs, tmp_path, "a", ports["a"], ports["sim_a"])
        b = _daemon(procs, tmp_path, "b", ports["b"], ports["sim_b"])
        begin = time.monotonic()
        for url in (a, b):
            wait_until(f"{url} to learn the old model's baseline", lambda u=url: _learned(u), 90, procs)

        # the rolling deploy reaches A: its engine restarts on the new model
        _stop(procs, "sim_a")
        _sim(procs, "sim_a", ports["sim_a"], NEW, 0.55)
        wait_until("A's daemon to see the new model", lambda: _model(a) == NEW, STEP_DEADLINE, procs)
        early = _accept(a, dry_run=True)
        assert early.status_code in (200, 409), early.text
        assert early.json()["outcome"] in ("refused", "would_adopt"), early.text
        if early.status_code == 409:  # decided on live state: the new key, not "no detector state yet"
            assert "no evidence for example/new-8b" in early.json()["reason"], early.text
        wait_until(
            "A to have evidence for the new model",
            lambda: _accept(a, dry_run=True).json()["outcome"] == "would_adopt",
            STEP_DEADLINE,
            procs,
        )
        assert set(_baselines(a)) == {OLD}  # the dry run changed nothing
        within_first_flush = time.monotonic() - begin

        targets = tmp_path / "targets"
        targets.write_text(f"# the fleet\n127.0.0.1:{ports['a']}\n127.0.0.1:{ports['b']}  # not upgraded yet\n")
        targets.write_text(targets.read_text() + f"127.0.0.1:{ports['c']}\n")
        first = _fleet("--targets", str(targets), "--route", "chat")
        assert first.returncode == 1, first.stdout + first.stderr
        assert _summary(first) == "adopted 1, already 0, refused 1, unreachable 1", first.stdout
        assert f"it runs model '{OLD}', not '{NEW}'; its baseline is kept" in first.stdout, first.stdout
        assert "unreachable" in first.stdout and "connection refused" in first.stdout, first.stdout
        assert set(_baselines(a)) == {OLD, NEW}  # the old model's stays for a rollback
        assert set(_baselines(b)) == {OLD} and _baselines(b)[OLD]["source"] == "learned"  # still learning its own

        again = _fleet("--targets", str(targets))  # every route of each node, from its /api/v1/routes
        assert again.returncode == 1 and _summary(again) == "adopted 0, already 1, refused 1, unreachable 1"
        targets.write_text(f"127.0.0.1:{ports['a']}\n")
        only_a = _fleet("--targets", str(targets), "--route", "chat", "--engine-version", "0.0.0")
        assert only_a.returncode == 1 and "engine version" in only_a.stdout, only_a.stdout
        done = _fleet("--targets", str(targets), "--route", "chat")
        assert done.returncode == 0 and _summary(done) == "adopted 0, already 1, refused 0, unreachable 0"

        # the targets from Prometheus's own list: job "specwatch" has all three, job "other" only A
        scrape = [
            {"job_name": "specwatch", "static_configs": [{"targets": [f"127.0.0.1:{ports[n]}" for n in "abc"]}]},
            {"job_name": "other", "static_configs": [{"targets": [f"127.0.0.1:{ports['a']}"]}]},
        ]
        prometheus_yml = tmp_path / "prometheus.yml"
        prometheus_yml.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": scrape}))
        procs.start(
            "prometheus",
            [found["prometheus"], f"--config.file={prometheus_yml}", f"--storage.tsdb.path={tmp_path / 'tsdb'}"]
            + [f"--web.listen-address=127.0.0.1:{ports['prometheus']}"],
        )
        prometheus = f"http://127.0.0.1:{ports['prometheus']}"
        wait_until("Prometheus", lambda: answers(prometheus + "/-/ready"), STEP_DEADLINE, procs)
        wait_until("Prometheus to list its targets", lambda: len(_active(prometheus)) == 4, STEP_DEADLINE, procs)
        from_prometheus = _fleet("--prometheus", prometheus, "--route", "chat", "--dry-run")
        assert from_prometheus.returncode == 1, from_prometheus.stdout + from_prometheus.stderr
        assert _summary(from_prometheus).startswith("adopted 0, already 1, refused 1, unreachable 1")
        other = _fleet("--prometheus", prometheus, "--selector", 'job="other"', "--route", "chat")
        assert other.returncode == 0 and _summary(other) == "adopted 0, already 1, refused 0, unreachable 0"

        # nothing deletes unless the request names the route; a flood of POSTs adds no row to the command log
        unconfirmed = requests.post(b + "/api/v1/baselines/chat/reset", timeout=30)
        assert unconfirmed.status_code == 400 and '{"confirm": "chat"}' in unconfirmed.json()["error"]
        for _ in range(200):
            assert _accept(a).json()["outcome"] == "already"
            assert requests.post(b + "/api/v1/baselines/chat/reset", timeout=30).status_code == 400
        assert set(_baselines(b)) == {OLD}
        for name in "ab":
            conn = sqlite3.connect(tmp_path / f"state-{name}" / "baselines.db")
            try:
                assert conn.execute("SELECT count(*) FROM commands").fetchone()[0] == 0
            finally:
                conn.close()
        print(f"\nA decided on live state {within_first_flush:.0f} s after the daemons started")
    finally:
        procs.stop_all()
