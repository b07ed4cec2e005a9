"""The daemon's baselines API over loopback: POST accept/reset/adopt need an admin (or --web.enable-admin-api), queue
the CLI's own commands, and the detector applies them on its next cycle."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterator

import bcrypt
import pytest
import requests

from specwatch.config import Config, DetectionConfig, ProbeConfig, RouteConfig
from specwatch.evaluators.acceptance_drop import AcceptanceDropEvaluator, build_evaluator
from specwatch.evaluators.base import EvaluatorContext
from specwatch.commands._admin import BaselineAdmin
from specwatch.export.http import MetricsServer, serve
from specwatch.export.webconfig import WebConfig, parse_web_config
from specwatch.snapshot import RouteObservation, Snapshot
from specwatch.state.store import COMMAND_POLL_SECONDS

pytestmark = pytest.mark.slow

PASSWORD = "fleet-operator"
USER_HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
DETECTION = DetectionConfig(warmup_drafted_tokens=20_000, warmup_seconds=600.0, block_seconds=60.0)


def _config(tmp_path: Path) -> Config:
    route = RouteConfig(name="chat", url="http://127.0.0.1:8000/metrics", detection=DETECTION)
    return Config(state_dir=str(tmp_path), detection=DETECTION, routes=(route,))


def _auth_config(tmp_path: Path) -> WebConfig:
    return parse_web_config({"admin_users": {"ops": USER_HASH}}, str(tmp_path / "web.yml"))


def _serve(config: Config, web_config: WebConfig | None, enabled: bool = False) -> MetricsServer:
    return serve(
        "127.0.0.1:0", lambda: Snapshot(timestamp=1.0), web_config, admin=BaselineAdmin(lambda: config, enabled)
    )


@pytest.fixture
def learned(tmp_path: Path) -> Iterator[AcceptanceDropEvaluator]:
    """A detector on route chat that has learned a baseline, its state written to the file as the daemon does."""
    config = _config(tmp_path)
    ev = build_evaluator(EvaluatorContext(config=config, clock=lambda: 0.0), config.routes[0])
    ts = 0.0
    while ev.reference is None:
        ev.evaluate(_busy(ts), ())
        ts += 15.0
    ev.store.flush()
    ev.ts = ts  # type: ignore[attr-defined]
    yield ev
    ev.close()


def _busy(ts: float) -> RouteObservation:
    return RouteObservation(
        route="chat",
        ts=ts,
        up=True,
        model_name="m",
        engine_version="1",
        k=4,
        d_drafts=750.0,
        d_draft_tokens=3000.0,
        d_accepted=1500.0,
        running_per_engine={"0": 8.0},
    )


def test_accept_needs_basic_auth_and_applies_on_the_next_cycle(tmp_path: Path, learned) -> None:
    server = _serve(_config(tmp_path), _auth_config(tmp_path))
    url = server.url + "/api/v1/baselines/chat/accept"
    try:
        assert requests.post(url, timeout=30).status_code == 401
        assert requests.post(url, auth=("ops", "wrong"), timeout=30).status_code == 401
        assert learned.reference is not None
        answer = requests.post(url, json={}, auth=("ops", PASSWORD), timeout=30)
        assert answer.status_code == 202, answer.text
        body = answer.json()
        assert body["route"] == "chat" and body["action"] == "accept" and body["status"] == "queued"
        assert "relearn" in body["message"]
    finally:
        server.shutdown()
    # the daemon's next cycle after its command poll: the current model relearns from now on
    learned.evaluate(_busy(learned.ts + COMMAND_POLL_SECONDS), ())
    assert learned.reference is None and learned.store.get("chat", learned.key) is None


def test_reset_over_http_is_the_clis_reset(tmp_path: Path, learned) -> None:
    server = _serve(_config(tmp_path), _auth_config(tmp_path))
    try:
        answer = requests.post(server.url + "/api/v1/baselines/chat/reset", json={}, auth=("ops", PASSWORD), timeout=30)
        assert answer.status_code == 202 and "relearns from scratch" in answer.json()["message"]
    finally:
        server.shutdown()
    learned.evaluate(_busy(learned.ts + COMMAND_POLL_SECONDS), ())
    assert learned.reference is None and learned.store.baselines("chat") == []


def test_without_auth_the_write_endpoints_are_off_unless_enabled(tmp_path: Path, learned) -> None:
    config = _config(tmp_path)
    server = _serve(config, None)
    try:
        answer = requests.post(server.url + "/api/v1/baselines/chat/reset", json={}, timeout=30)
        assert answer.status_code == 403 and "--web.enable-admin-api" in answer.text
        listing = requests.get(server.url + "/api/v1/baselines", timeout=30)  # reading stays open, as /api/v1/routes
        assert listing.status_code == 200 and listing.json()["baselines"][0]["route"] == "chat"
    finally:
        server.shutdown()
    server = _serve(config, None, enabled=True)
    try:
        assert requests.post(server.url + "/api/v1/baselines/chat/reset", json={}, timeout=30).status_code == 202
    finally:
        server.shutdown()


def test_unknown_routes_methods_and_actions(tmp_path: Path) -> None:
    config = _config(tmp_path)
    server = _serve(config, _auth_config(tmp_path))
    auth = ("ops", PASSWORD)
    base = server.url + "/api/v1/baselines"
    try:
        assert requests.post(base + "/nope/accept", json={}, auth=auth, timeout=30).status_code == 404
        assert requests.post(base + "/chat/forget", json={}, auth=auth, timeout=30).status_code == 404
        got = requests.get(base + "/chat/accept", auth=auth, timeout=30)
        assert got.status_code == 405 and got.headers["Allow"] == "POST"
        assert requests.post(base, auth=auth, timeout=30).status_code == 405
        assert requests.post(server.url + "/metrics", auth=auth, timeout=30).status_code == 405
        # no detector state yet: accept has nothing to adopt, as the CLI says
        assert requests.post(base + "/chat/accept", json={}, auth=auth, timeout=30).status_code == 409
        # adopt is for canary fingerprints: a route without probes has none
        assert requests.post(base + "/chat/adopt", json={}, auth=auth, timeout=30).status_code == 409
    finally:
        server.shutdown()
    probed = dataclasses.replace(config.routes[0], probe=ProbeConfig())
    config = dataclasses.replace(config, routes=(probed,))
    server = _serve(config, _auth_config(tmp_path))
    try:
        answer = requests.post(server.url + "/api/v1/baselines/chat/adopt", json={}, auth=auth, timeout=30)
        assert answer.status_code == 202 and answer.json()["action"] == "adopt"
    finally:
        server.shutdown()
