"""Seeding a fresh node's baseline from the fleet, against a real Prometheus scraping three specwatch exports.

The three "nodes" are specwatch's own HTTP server and exporter serving Snapshots with a learned baseline for
(route chat, model m, engine 0.9.1, k 4), so the series, labels and the join are the ones a fleet exports.
A fresh evaluator with `seed_from` takes their median and pages a drafter degraded from its first scrape
within one confirmation window; with too few nodes, or Prometheus down, it learns and says so.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from alerting_stack import Processes, binaries, free_port, query, wait_until

from specwatch.config import Config, DetectionConfig, RouteConfig, SeedFrom
from specwatch.evaluators.acceptance_drop import AcceptanceDropEvaluator, build_evaluator
from specwatch.evaluators.base import EvaluatorContext
from specwatch.export.http import serve
from specwatch.snapshot import RouteObservation, RouteState, Snapshot

pytestmark = pytest.mark.e2e

FLEET = [(0.58, 30.0), (0.60, 35.0), (0.63, 40.0)]  # (r0, φ) learned by three nodes


def _node_snapshot(ratio: float, phi: float, model: str = "m", drafter: str = "") -> Snapshot:
    route = RouteState(
        name="chat",
        up=True,
        model_name=model,
        engine_version="0.9.1",
        baseline_ratio=ratio,
        baseline_model=model,
        baseline_engine_version="0.9.1",
        baseline_draft_length=4,
        baseline_drafter=drafter,
        baseline_source="learned",
        baseline_overdispersion=phi,
    )
    return Snapshot(timestamp=1.0, routes=(route,))


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory) -> Iterator[str]:
    """A real Prometheus scraping three specwatch nodes (and a fourth with a baseline for another model, a fifth
    for the same model, version and k with another drafter)."""
    workdir = tmp_path_factory.mktemp("fleet")
    found = binaries()
    snapshots = [_node_snapshot(r, phi) for r, phi in FLEET] + [
        _node_snapshot(0.3, 50.0, model="other"),
        _node_snapshot(0.3, 50.0, drafter="eagle3:org/other-head"),
    ]
    servers = [serve("127.0.0.1:0", lambda s=s: s) for s in snapshots]
    procs = Processes(workdir)
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
        "scrape_configs": [
            {
                "job_name": "specwatch",
                "static_configs": [{"targets": [f"127.0.0.1:{s.port}" for s in servers]}],
            }
        ],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    procs.start(
        "prometheus",
        [
            found["prometheus"],
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            "Prometheus to scrape the five nodes",
            lambda: len(query(url, "specwatch_route_acceptance_baseline_info")) == 5,
            90,
            procs,
        )
        yield url
    finally:
        procs.stop_all()
        for s in servers:
            s.shutdown()


def _evaluator(tmp_path: Path, seed: SeedFrom) -> AcceptanceDropEvaluator:
    detection = DetectionConfig(block_seconds=60.0, confirm_window_seconds=300.0, seed_from=seed)
    route = RouteConfig(name="chat", url="http://127.0.0.1:8000/metrics", detection=detection)
    ctx = EvaluatorContext(config=Config(state_dir=str(tmp_path), detection=detection), clock=lambda: 0.0)
    return build_evaluator(ctx, route)


def _first_page(ev: AcceptanceDropEvaluator, ratio: float, seconds: float) -> float:
    for ts in range(0, int(seconds) + 1, 15):
        obs = RouteObservation(
            route="chat",
            ts=float(ts),
            up=True,
            model_name="m",
            engine_version="0.9.1",
            k=4,
            d_drafts=750.0,
            d_draft_tokens=3000.0,
            d_accepted=3000.0 * ratio,
            running_per_engine={"0": 8.0},
        )
        degraded = ev.evaluate(obs, ()).get("degraded")
        if ev.selection.seed_attempt is not None:  # the fleet is asked on a thread of its own
            assert ev.selection.seed_attempt.wait(30.0)
        if degraded:
            return float(ts)
    return float("inf")


def test_a_fresh_node_seeded_from_the_fleet_pages_a_degraded_drafter_within_one_window(
    tmp_path: Path, prometheus: str
) -> None:
    ev = _evaluator(tmp_path, SeedFrom(prometheus=prometheus, query_selector='job="specwatch"', min_nodes=3))
    paged = _first_page(ev, 0.36, 3600.0)
    ref = ev.reference
    assert ref is not None and ref.source == "fleet"
    # the medians of the three nodes with its key: not the one with another drafter
    assert ref.acceptance_ratio == pytest.approx(0.60) and ref.overdispersion == pytest.approx(35.0)
    assert paged <= 60.0 + 300.0, paged
    assert ev.store.get("chat", ref.key) is not None  # kept across restarts, as a learned one is
    ev.close()


def test_too_few_nodes_fall_back_to_learning_and_say_so(
    tmp_path: Path, prometheus: str, caplog: pytest.LogCaptureFixture
) -> None:
    ev = _evaluator(tmp_path, SeedFrom(prometheus=prometheus, min_nodes=4))  # only three have (m, 0.9.1, 4, "")
    with caplog.at_level(logging.WARNING, logger="specwatch.evaluators.baseline_selection"):
        assert _first_page(ev, 0.36, 3600.0) == float("inf")
    assert ev.reference is not None and ev.reference.source == "learned"
    said = [r.getMessage() for r in caplog.records if "no fleet baseline" in r.getMessage()]
    assert len(said) == 1 and "fewer than min_nodes 4" in said[0], said
    ev.close()
