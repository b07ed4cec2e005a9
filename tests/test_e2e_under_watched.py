"""End to end: a route too quiet for its detection budget opens a SpecwatchRouteUnderWatched ticket through real
Prometheus and Alertmanager; the same route with canary probes does not.

Two SIMULATED vLLM routes with the same light load (one request in flight) and pinned baselines; `probed` has
`probe: {every: 10s}` (it pages a drop within two rounds: 20 s), `quiet` has none. What is not the production
path, and why:
- `detection.horizon_budget` is 1m, so that a simulated route whose traffic horizon is a few minutes (its
  `min_duration` alone is 3 minutes) counts as under-watched; a real quiet route's horizon is hours against 1h.
- Alert `for:` durations are 5 s, Prometheus scrapes and evaluates every second, Alertmanager groups within a
  second, the daemon evaluates every second, and the simulators run 3x faster than real time (as in
  test_e2e_alerting.py). The horizon, the rule and the example Alertmanager config are the production ones.

A run takes well under a minute; every wait is bounded.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import yaml

from alerting_stack import (
    DAEMON_WITH_FAKE_NVML,
    Processes,
    Webhook,
    answers,
    free_ports,
    query,
    start_alerting,
    wait_until,
)

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
PINNED_BASELINE = {"acceptance_ratio": 0.443, "overdispersion": 2.45}  # k=4, 0.7 per position (test_e2e_alerting)
TICKET_DEADLINE_SECONDS = 90.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("e2e-watch")
    ports = free_ports("quiet", "probed", "daemon", "prometheus", "alertmanager")
    webhook, procs = Webhook(), Processes(workdir)
    try:
        scenario = workdir / "light.yaml"
        scenario.write_text(yaml.safe_dump({"speculation": {"k": 4, "acceptance": 0.7}, "load": 1}))
        for seed, route in enumerate(("quiet", "probed"), start=1):
            procs.start(
                f"sim-{route}",
                [
                    *(sys.executable, "-m", "specwatch", "simulate", "--engine", "vllm", "--time-scale", "3"),
                    *("--seed", str(seed), "--port", str(ports[route]), "--scenario", str(scenario)),
                    *("--per-request-spec-decode-metrics", "summary", "--repeatable-greedy"),
                ],
            )
            url = f"http://127.0.0.1:{ports[route]}/metrics"
            wait_until(f"the {route} simulator", lambda url=url: answers(url), 60, procs)
        route_keys = {"gpus": [0], "baseline": PINNED_BASELINE}
        config = {
            "interval": "1s",
            "state_dir": str(workdir / "state"),
            "gpu": {"enabled": "true"},
            "detection": {"horizon_budget": "1m"},
            "routes": [
                {"name": "quiet", "url": f"http://127.0.0.1:{ports['quiet']}/metrics", **route_keys},
                {
                    "name": "probed",
                    "url": f"http://127.0.0.1:{ports['probed']}/metrics",
                    **route_keys,
                    "probe": {"every": "10s", "max_tokens": 16},
                },
            ],
        }
        config_file = workdir / "specwatch.yml"
        config_file.write_text(yaml.safe_dump(config))
        procs.start(
            "specwatch",
            [
                *(sys.executable, "-c", DAEMON_WITH_FAKE_NVML, str(REPO), "run"),
                *("--config.file", str(config_file), "--web.listen-address", f"127.0.0.1:{ports['daemon']}"),
            ],
        )
        prometheus, _ = start_alerting(procs, workdir, webhook, ports)
        yield {"prometheus": prometheus, "webhook": webhook, "procs": procs}
    finally:
        procs.stop_all()
        webhook.close()


def _tickets(webhook: Webhook, route: str) -> list[dict]:
    return [
        a
        for _, a, _ in webhook.alerts("/ticket")
        if a["labels"].get("route") == route and a["labels"]["alertname"] == "SpecwatchRouteUnderWatched"
    ]


def test_quiet_route_without_probes_is_ticketed_and_the_probed_one_is_not(stack):
    webhook, procs, prometheus = stack["webhook"], stack["procs"], stack["prometheus"]
    tickets = wait_until(
        "SpecwatchRouteUnderWatched for route quiet",
        lambda: [a for a in _tickets(webhook, "quiet") if a["status"] == "firing"],
        TICKET_DEADLINE_SECONDS,
        procs,
    )
    alert = tickets[0]
    assert alert["labels"]["severity"] == "warning"  # a ticket, never a page
    assert alert["annotations"]["runbook_url"].endswith("#specwatchrouteunderwatched")
    assert "route quiet" in alert["annotations"]["description"]
    # The probed route has the same traffic horizon, over the same budget, and its probe horizon within it.
    traffic = query(prometheus, 'specwatch_route_detection_horizon_seconds{route="probed",path="traffic"} > 60')
    assert traffic, "the probed route's traffic horizon is not over the budget: the comparison proves nothing"
    probe = query(prometheus, 'specwatch_route_detection_horizon_seconds{route="probed",path="probe"}')
    assert probe and float(probe[0]["value"][1]) == 20.0
    time.sleep(6)  # longer than `for:` and a group interval: a ticket for it would have been sent by now
    assert _tickets(webhook, "probed") == []
    assert not query(prometheus, 'ALERTS{alertname="SpecwatchRouteUnderWatched",route="probed"}')
