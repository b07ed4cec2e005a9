"""The daemon's baselines API over loopback: POST accept/reset/adopt need auth (or --web.enable-admin-api), take
a JSON body, and answer with the outcome the daemon's loop decided (tests/test_fleet_accept.py has the
decisions themselves)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Iterator

import bcrypt
import pytest
import requests

from specwatch.commands._admin import BaselineAdmin
from specwatch.config import Config, ProbeConfig, parse_config
from specwatch.daemon import Daemon
from specwatch.export.http import MetricsServer, serve
from specwatch.export.webconfig import WebConfig, parse_web_config

from fakes import NEW, OLD, FakeClock, SwitchableEngine

pytestmark = pytest.mark.slow

PASSWORD = "fleet-operator"
USER_HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
AUTH = ("ops", PASSWORD)


def _config(tmp_path: Path) -> Config:
    return parse_config(
        {
            "interval": "5s",
            "state_dir": str(tmp_path),
            "gpu": {"enabled": "false"},
            "detection": {"warmup_drafted_tokens": 20_000, "warmup_duration": "60s", "block": "10s"},
            "routes": [{"name": "chat", "url": "http://127.0.0.1:9/metrics"}],
        }
    )


def _auth_config(tmp_path: Path) -> WebConfig:
    return parse_web_config({"basic_auth_users": {"ops": USER_HASH}}, str(tmp_path / "web.yml"))


@dataclasses.dataclass
class Running:
    daemon: Daemon
    engine: SwitchableEngine
    clock: FakeClock

    def run(self, seconds: float) -> None:
        for _ in range(int(seconds / 5.0)):
            self.daemon.tick(self.clock.advance(5.0))


@pytest.fixture
def learned(tmp_path: Path) -> Iterator[Running]:
    """A daemon on route chat that has learned the old model's baseline."""
    engine, clock = SwitchableEngine(), FakeClock()
    daemon = Daemon(_config(tmp_path), source_factory=lambda r, c: engine, clock=clock)
    running = Running(daemon, engine, clock)
    running.run(120.0)
    yield running
    daemon.close()


def _serve(running: Running, web_config: WebConfig | None, enabled: bool = False) -> MetricsServer:
    daemon = running.daemon
    admin = BaselineAdmin(lambda: daemon.config, daemon, enabled)
    return serve("127.0.0.1:0", lambda: daemon.snapshot, web_config, admin=admin)


def test_accept_needs_basic_auth_and_answers_the_outcome(tmp_path: Path, learned: Running, caplog) -> None:
    server = _serve(learned, _auth_config(tmp_path))
    url = server.url + "/api/v1/baselines/chat/accept"
    try:
        assert requests.post(url, json={"model": NEW}, timeout=30).status_code == 401
        assert requests.post(url, json={"model": NEW}, auth=("ops", "wrong"), timeout=30).status_code == 401
        refused = requests.post(url, json={"model": NEW}, auth=AUTH, timeout=30)
        assert refused.status_code == 409, refused.text
        assert refused.json()["outcome"] == "refused" and "not 'llama-3.3-8b'" in refused.json()["reason"]
        learned.engine.bump(NEW, 0.48)
        learned.run(45.0)
        with caplog.at_level(logging.INFO, logger="specwatch.commands._admin"):
            adopted = requests.post(url, json={"model": NEW, "draft_length": 4}, auth=AUTH, timeout=30)
        assert adopted.status_code == 200, adopted.text
        body = adopted.json()
        assert body["route"] == "chat" and body["action"] == "accept" and body["outcome"] == "adopted"
        assert body["before"]["model"] == OLD and body["after"]["model"] == NEW
        assert "accept chat by ops" in caplog.text
        again = requests.post(url, json={"model": NEW}, auth=AUTH, timeout=30)
        assert again.status_code == 200 and again.json()["outcome"] == "already"
        listing = requests.get(server.url + "/api/v1/baselines", auth=AUTH, timeout=30).json()["baselines"]
        assert sorted(b["model"] for b in listing) == [OLD, NEW]
    finally:
        server.shutdown()


def test_a_body_that_is_not_a_json_object_is_a_400(tmp_path: Path, learned: Running) -> None:
    server = _serve(learned, _auth_config(tmp_path))
    url = server.url + "/api/v1/baselines/chat/accept"
    try:
        for data in (b"model=x", b"[1, 2]", b"{"):
            answer = requests.post(url, data=data, auth=AUTH, timeout=30)
            assert answer.status_code == 400 and "JSON object" in answer.text
        missing = requests.post(url, auth=AUTH, timeout=30)  # no body: no model
        assert missing.status_code == 400 and '"model" is required' in missing.json()["error"]
    finally:
        server.shutdown()


def test_reset_over_http_needs_the_route_named(tmp_path: Path, learned: Running) -> None:
    server = _serve(learned, _auth_config(tmp_path))
    url = server.url + "/api/v1/baselines/chat/reset"
    try:
        unconfirmed = requests.post(url, auth=AUTH, timeout=30)
        assert unconfirmed.status_code == 400 and '{"confirm": "chat"}' in unconfirmed.json()["error"]
        listing = requests.get(server.url + "/api/v1/baselines", auth=AUTH, timeout=30).json()["baselines"]
        assert [b["model"] for b in listing] == [OLD]
        answer = requests.post(url, json={"confirm": "chat"}, auth=AUTH, timeout=30)
        assert answer.status_code == 200 and answer.json()["outcome"] == "reset"
        assert requests.get(server.url + "/api/v1/baselines", auth=AUTH, timeout=30).json()["baselines"] == []
    finally:
        server.shutdown()


def test_without_auth_the_write_endpoints_are_off_unless_enabled(learned: Running) -> None:
    server = _serve(learned, None)
    try:
        answer = requests.post(server.url + "/api/v1/baselines/chat/reset", json={"confirm": "chat"}, timeout=30)
        assert answer.status_code == 403 and "--web.enable-admin-api" in answer.text
        listing = requests.get(server.url + "/api/v1/baselines", timeout=30)  # reading stays open, as /api/v1/routes
        assert listing.status_code == 200 and listing.json()["baselines"][0]["route"] == "chat"
    finally:
        server.shutdown()
    server = _serve(learned, None, enabled=True)
    try:
        answer = requests.post(server.url + "/api/v1/baselines/chat/reset", json={"confirm": "chat"}, timeout=30)
        assert answer.status_code == 200
    finally:
        server.shutdown()


def test_unknown_routes_methods_and_actions(tmp_path: Path, learned: Running) -> None:
    server = _serve(learned, _auth_config(tmp_path))
    base = server.url + "/api/v1/baselines"
    try:
        assert requests.post(base + "/nope/accept", json={"model": NEW}, auth=AUTH, timeout=30).status_code == 404
        assert requests.post(base + "/chat/forget", auth=AUTH, timeout=30).status_code == 404
        got = requests.get(base + "/chat/accept", auth=AUTH, timeout=30)
        assert got.status_code == 405 and got.headers["Allow"] == "POST"
        assert requests.post(base, auth=AUTH, timeout=30).status_code == 405
        assert requests.post(server.url + "/metrics", auth=AUTH, timeout=30).status_code == 405
        # adopt is for canary fingerprints: a route without probes has none
        assert requests.post(base + "/chat/adopt", auth=AUTH, timeout=30).status_code == 409
    finally:
        server.shutdown()


def test_adopt_queues_the_canary_round(tmp_path: Path) -> None:
    config = _config(tmp_path)
    probed = dataclasses.replace(config.routes[0], probe=ProbeConfig())
    config = dataclasses.replace(config, routes=(probed,))
    engine, clock = SwitchableEngine(), FakeClock()
    daemon = Daemon(config, source_factory=lambda r, c: engine, clock=clock)
    admin = BaselineAdmin(lambda: daemon.config, daemon)
    server = serve("127.0.0.1:0", lambda: daemon.snapshot, _auth_config(tmp_path), admin=admin)
    try:
        answer = requests.post(server.url + "/api/v1/baselines/chat/adopt", auth=AUTH, timeout=30)
        assert answer.status_code == 202 and answer.json()["action"] == "adopt"
    finally:
        server.shutdown()
        daemon.close()


def test_scrapes_are_answered_while_admin_actions_wait_for_the_cycle(tmp_path: Path, learned: Running) -> None:
    """An accept waits for the daemon's cycle (its lock); however many do, /metrics and /api/v1/routes answer."""
    from concurrent.futures import ThreadPoolExecutor

    from specwatch.export.http import RENDER_WORKERS

    daemon = learned.daemon
    server = _serve(learned, _auth_config(tmp_path))
    pool = ThreadPoolExecutor(RENDER_WORKERS + 2)
    try:
        with daemon._lock:  # a cycle that takes its time: every accept waits for it
            waiting = [
                pool.submit(
                    requests.post,
                    server.url + "/api/v1/baselines/chat/accept",
                    json={"model": NEW},
                    auth=AUTH,
                    timeout=60,
                )
                for _ in range(RENDER_WORKERS + 2)
            ]
            for path in ("/metrics", "/api/v1/routes"):
                assert requests.get(server.url + path, auth=AUTH, timeout=30).status_code == 200
            assert not any(f.done() for f in waiting)
        assert all(f.result().status_code == 409 for f in waiting)  # the node still runs the old model
    finally:
        pool.shutdown(wait=True)
        server.shutdown()
