"""End to end, on a fresh node: a drafter degraded from the first request pages through real Prometheus and
Alertmanager, judged against a baseline pinned in config for its (model, engine version, k) on one route and
against one seeded from the fleet's baselines in Prometheus on the other.

One SIMULATED vLLM engine (k 4, conditional acceptance 0.55: an acceptance rate of 0.28, 37% under the
fleet's 0.443) is watched as two routes by `specwatch run` with an empty state directory:
- `pinned`: `baseline: {acceptance_ratio: 0.443, overdispersion: 2.45, model, engine_version, draft_length: 4}`;
- `seeded`: no baseline; `detection.seed_from` points at the test's Prometheus, which also scrapes three
  specwatch exports (specwatch's own HTTP server and exporter, job "fleet") with baselines for that key.
Neither learns the degraded drafter as its baseline; both page. Shortened guards, `for:` and intervals as in
test_e2e_alerting.py, whose harness (alerting_stack.py) this uses.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from alerting_stack import (
    DAEMON_WITH_FAKE_NVML,
    Processes,
    Webhook,
    answers,
    free_port,
    query,
    start_alerting,
    wait_until,
)
from specwatch.export.http import serve
from specwatch.snapshot import RouteState, Snapshot

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # the simulator's default
FLEET = [(0.43, 2.3), (0.443, 2.45), (0.45, 2.6)]  # (r0, φ) of three nodes that learned the healthy drafter
# From the daemon's start: a first block (1 minute), the confirmation guards, `for:` and Alertmanager, with the
# slack test_e2e_alerting.py allows a loaded machine.
PAGE_DEADLINE_SECONDS = 140.0


def _fleet_node(version: str, ratio: float, phi: float) -> Snapshot:
    route = RouteState(
        name="seeded",
        up=True,
        model_name=MODEL,
        engine_version=version,
        baseline_ratio=ratio,
        baseline_model=MODEL,
        baseline_engine_version=version,
        baseline_draft_length=4,
        baseline_source="learned",
        baseline_overdispersion=phi,
    )
    return Snapshot(timestamp=1.0, routes=(route,))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("fleet-e2e")
    ports = {name: free_port() for name in ("sim", "daemon", "prometheus", "alertmanager")}
    webhook, procs, servers = Webhook(), Processes(workdir), []
    try:
        scenario = workdir / "degraded.yaml"
        scenario.write_text(yaml.safe_dump({"speculation": {"k": 4, "acceptance": 0.55}, "load": 16}))
        procs.start(
            "sim",
            [sys.executable, "-m", "specwatch", "simulate", "--engine", "vllm", "--time-scale", "3", "--seed", "5"]
            + ["--port", str(ports["sim"]), "--scenario", str(scenario)],
        )
        sim = f"http://127.0.0.1:{ports['sim']}"
        wait_until("the simulator", lambda: answers(sim + "/metrics"), 60, procs)
        with urllib.request.urlopen(sim + "/version", timeout=10) as response:
            version = json.load(response)["version"]
        nodes = [_fleet_node(version, r, phi) for r, phi in FLEET]
        servers = [serve("127.0.0.1:0", lambda s=s: s) for s in nodes]
        prometheus, _ = start_alerting(
            procs,
            workdir,
            webhook,
            ports,
            fleet_targets=tuple(f"127.0.0.1:{s.port}" for s in servers),
            wait_for_daemon=False,
        )
        wait_until(
            "Prometheus to scrape the fleet",
            lambda: len(query(prometheus, 'specwatch_route_acceptance_baseline_info{job="fleet"}')) == 3,
            60,
            procs,
        )
        detection = {"min_drafted_tokens": 1000, "min_duration": "5s", "confirm_window": "10s"}
        config = {
            "interval": "1s",
            "state_dir": str(workdir / "state"),  # empty: a fresh node
            "scrape": {"timeout": "0.8s"},
            "gpu": {"enabled": "true"},
            "detection": detection,
            "routes": [
                {
                    "name": "pinned",
                    "url": sim + "/metrics",
                    "gpus": [0],
                    "baseline": {
                        "acceptance_ratio": 0.443,
                        "overdispersion": 2.45,
                        "model": MODEL,
                        "engine_version": version,
                        "draft_length": 4,
                    },
                },
                {
                    "name": "seeded",
                    "url": sim + "/metrics",
                    "gpus": [0],
                    "detection": {
                        "seed_from": {"prometheus": prometheus, "query_selector": 'job="fleet"', "min_nodes": 3}
                    },
                },
            ],
        }
        (workdir / "specwatch.yml").write_text(yaml.safe_dump(config))
        started = time.monotonic()
        procs.start(
            "specwatch",
            [sys.executable, "-c", DAEMON_WITH_FAKE_NVML, str(REPO), "run"]
            + ["--config.file", str(workdir / "specwatch.yml"), "--web.listen-address", f"127.0.0.1:{ports['daemon']}"],
        )
        yield {"prometheus": prometheus, "webhook": webhook, "procs": procs, "started": started}
    finally:
        procs.stop_all()
        webhook.close()
        for s in servers:
            s.shutdown()


def _page(stack, route: str) -> dict:
    pages = wait_until(
        f"the degraded drafter on route {route} to be paged",
        lambda: [
            a
            for _, a, _ in stack["webhook"].alerts("/page")
            if a["labels"].get("route") == route
            and a["labels"]["alertname"] == "SpecwatchAcceptanceDegraded"
            and a["status"] == "firing"
        ],
        stack["started"] + PAGE_DEADLINE_SECONDS - time.monotonic(),
        stack["procs"],
    )
    return pages[0]


@pytest.mark.parametrize("route, source", [("pinned", "config"), ("seeded", "fleet")])
def test_a_fresh_node_pages_a_drafter_degraded_from_the_start(stack, route: str, source: str) -> None:
    _page(stack, route)
    info = query(stack["prometheus"], f'specwatch_route_acceptance_baseline_info{{job="specwatch",route="{route}"}}')
    assert [s["metric"]["source"] for s in info] == [source], info
    (ratio,) = query(
        stack["prometheus"], f'specwatch_route_acceptance_baseline_ratio{{job="specwatch",route="{route}"}}'
    )
    assert float(ratio["value"][1]) == pytest.approx(0.443, abs=1e-6)  # the pin, or the fleet's median
