"""The admin API's protections over loopback: an admin identity apart from the scrape users (bcrypt users or
verified client certificates), no simple cross-origin POSTs (a JSON content type, no foreign Origin), an
allow list of Host values against DNS rebinding, and an audit line and a counted outcome for every admin
request. The actions themselves are a recording stand-in: what reaches them is what is checked here."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Iterator

import bcrypt
import pytest
import requests

from certs import ca_server_client
from specwatch.config import ConfigError
from specwatch.export.admin_api import Answer, Caller
from specwatch.export.http import MetricsServer, serve
from specwatch.export.webconfig import WebConfig, parse_web_config
from specwatch.snapshot import Snapshot

pytestmark = pytest.mark.slow  # loopback servers

SCRAPE, ADMIN = ("prometheus", "scrape-pass"), ("ops", "admin-pass")
HASHES = {user: bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode() for user, password in (SCRAPE, ADMIN)}


class Recorder:
    """The admin actions, recording each call; its answer carries before/after as the real one may."""

    def __init__(self, enabled_without_auth: bool = False) -> None:
        self.enabled_without_auth = enabled_without_auth
        self.calls: list[tuple[str, str, Caller, dict[str, Any]]] = []

    def act(self, route: str, action: str, caller: Caller, body: dict[str, Any]) -> Answer:
        self.calls.append((route, action, caller, body))
        return Answer(202, {"route": route, "action": action, "before": {"ratio": 0.7}, "after": {"ratio": 0.56}})

    def listing(self) -> Answer:
        return Answer(200, {"baselines": []})


def fresh_snapshot() -> Snapshot:
    return Snapshot(timestamp=time.time())  # a new object per call: /metrics renders afresh


@pytest.fixture
def start() -> Iterator[Any]:
    servers: list[MetricsServer] = []

    def start_server(web: WebConfig | None, admin: Recorder) -> MetricsServer:
        server = serve("127.0.0.1:0", fresh_snapshot, web, admin=admin)
        servers.append(server)
        return server

    yield start_server
    for server in servers:
        server.shutdown()


def users_config(**extra: Any) -> WebConfig:
    return parse_web_config(
        {"basic_auth_users": {SCRAPE[0]: HASHES[SCRAPE[0]]}, "admin_users": {ADMIN[0]: HASHES[ADMIN[0]]}, **extra}
    )


def admin_counts(server: MetricsServer, auth: tuple[str, str] | None = None) -> dict[tuple[str, str], float]:
    text = requests.get(server.url + "/metrics", auth=auth, timeout=30).text
    counts = {}
    for line in text.splitlines():
        if line.startswith("specwatch_admin_requests_total{"):
            labels, value = line[len("specwatch_admin_requests_total{") :].split("} ")
            parsed = dict(item.split("=") for item in labels.split(","))
            counts[(parsed["action"].strip('"'), parsed["outcome"].strip('"'))] = float(value)
    return counts


def test_a_scrape_user_may_scrape_but_is_refused_admin_and_an_admin_user_may_act(start):
    recorder = Recorder()
    server = start(users_config(), recorder)
    url = server.url + "/api/v1/baselines/chat/reset"
    assert requests.get(server.url + "/metrics", auth=SCRAPE, timeout=30).status_code == 200
    refused = requests.post(url, json={}, auth=SCRAPE, timeout=30)
    assert refused.status_code == 403 and "not an admin" in refused.text
    assert recorder.calls == []
    answer = requests.post(url, json={"model": "m2"}, auth=ADMIN, timeout=30)
    assert answer.status_code == 202
    (route, action, caller, body), *_ = recorder.calls
    assert (route, action, caller.user, body) == ("chat", "reset", "ops", {"model": "m2"})
    assert caller.remote.startswith("127.0.0.1:")
    assert requests.get(server.url + "/metrics", auth=ADMIN, timeout=30).status_code == 200  # admins scrape too


def test_without_auth_a_cross_origin_text_plain_or_form_post_is_refused(start):
    """A browser sends these without a preflight, from any page the operator has open."""
    recorder = Recorder(enabled_without_auth=True)
    server = start(None, recorder)
    url = server.url + "/api/v1/baselines/chat/reset"
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        answer = requests.post(url, data=b"{}", headers={"Content-Type": content_type}, timeout=30)
        assert answer.status_code == 415, content_type
    assert requests.post(url, timeout=30).status_code == 415  # no content type at all
    assert recorder.calls == []
    assert requests.post(url, json={}, timeout=30).status_code == 202
    assert len(recorder.calls) == 1


def test_a_foreign_origin_is_refused_and_the_own_or_an_allowed_origin_served(start):
    recorder = Recorder()
    server = start(users_config(allowed_origins=["https://ops.example.com"]), recorder)
    url = server.url + "/api/v1/baselines/chat/accept"
    for origin in ("https://evil.example", "null", f"http://127.0.0.1:{server.port + 1}"):
        answer = requests.post(url, json={}, auth=ADMIN, headers={"Origin": origin}, timeout=30)
        assert answer.status_code == 403 and "cross-origin" in answer.text, origin
    assert recorder.calls == []
    for origin in (server.url, "https://ops.example.com"):
        assert requests.post(url, json={}, auth=ADMIN, headers={"Origin": origin}, timeout=30).status_code == 202
    assert len(recorder.calls) == 2


def test_a_body_that_is_not_a_json_object_is_a_400_before_the_action(start):
    recorder = Recorder(enabled_without_auth=True)
    server = start(None, recorder)
    url = server.url + "/api/v1/baselines/chat/accept"
    for body in (b"[1, 2]", b"not json", b'"text"'):
        answer = requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=30)
        assert answer.status_code == 400, body
    assert recorder.calls == []


def test_a_foreign_host_is_refused_on_every_path_when_allowed_hosts_is_set(start):
    """DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 sends Host: evil.example."""
    recorder = Recorder(enabled_without_auth=True)
    server = start(parse_web_config({"allowed_hosts": ["localhost", "127.0.0.1"]}), recorder)
    evil = {"Host": "evil.example:9448"}
    assert requests.get(server.url + "/metrics", headers=evil, timeout=30).status_code == 421
    assert (
        requests.post(server.url + "/api/v1/baselines/chat/reset", json={}, headers=evil, timeout=30).status_code == 421
    )
    assert recorder.calls == []
    assert requests.get(server.url + "/metrics", timeout=30).status_code == 200  # Host: 127.0.0.1:PORT
    ok = requests.post(server.url + "/api/v1/baselines/chat/reset", json={}, headers={"Host": "localhost"}, timeout=30)
    assert ok.status_code == 202


def test_every_admin_request_is_logged_with_user_remote_route_and_before_after(start, caplog):
    caplog.set_level(logging.INFO, logger="specwatch.export.admin_api")
    server = start(users_config(), Recorder())
    url = server.url + "/api/v1/baselines/chat/reset"
    requests.post(url, json={}, auth=ADMIN, timeout=30)
    requests.post(url, json={}, auth=SCRAPE, timeout=30)
    requests.post(url, json={}, timeout=30)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("admin request:")]
    assert len(lines) == 3, lines
    performed, forbidden, unauthorized = lines
    for line in lines:
        assert 'route="chat"' in line and 'action="reset"' in line and "remote=127.0.0.1:" in line
    assert 'user="ops"' in performed and "status=202 outcome=performed" in performed
    assert 'before={"ratio": 0.7}' in performed and 'after={"ratio": 0.56}' in performed
    assert 'user="prometheus"' in forbidden and "status=403 outcome=forbidden" in forbidden
    assert "user=null" in unauthorized and "status=401 outcome=unauthorized" in unauthorized
    assert all(r.levelno == logging.INFO for r in caplog.records if r.getMessage().startswith("admin request:"))


def test_admin_requests_are_counted_by_action_and_outcome(start):
    server = start(users_config(), Recorder())
    base = server.url + "/api/v1/baselines/chat/"
    requests.post(base + "reset", json={}, auth=ADMIN, timeout=30)
    requests.post(base + "reset", json={}, auth=ADMIN, timeout=30)
    requests.post(base + "accept", json={}, auth=SCRAPE, timeout=30)
    requests.post(base + "accept", data="{}", auth=ADMIN, headers={"Content-Type": "text/plain"}, timeout=30)
    requests.post(base + "x" * 5000, json={}, auth=ADMIN, timeout=30)  # the label stays bounded
    requests.post(base + "adopt", json={}, timeout=30)
    assert admin_counts(server, SCRAPE) == {
        ("reset", "performed"): 2.0,
        ("accept", "forbidden"): 1.0,
        ("accept", "cross_origin"): 1.0,
        ("other", "performed"): 1.0,
        ("adopt", "unauthorized"): 1.0,
    }


def test_a_verified_client_certificate_named_in_the_config_is_an_admin(start, tmp_path: Path):
    pki = ca_server_client(tmp_path)
    tls = {
        "cert_file": str(pki["server.pem"]),
        "key_file": str(pki["server.key"]),
        "client_auth_type": "VerifyClientCertIfGiven",
        "client_ca_file": str(pki["ca.pem"]),
    }
    recorder = Recorder()
    server = start(parse_web_config({"tls_server_config": tls, "admin_client_cert_subjects": ["CN=client"]}), recorder)
    url = server.url + "/api/v1/baselines/chat/accept"
    verify, cert = str(pki["ca.pem"]), (str(pki["client.pem"]), str(pki["client.key"]))
    assert requests.post(url, json={}, verify=verify, timeout=30).status_code == 403  # no certificate
    assert requests.post(url, json={}, verify=verify, cert=cert, timeout=30).status_code == 202
    assert recorder.calls[0][2].user == "CN=client"


def test_admin_keys_are_checked_with_the_rest_of_the_web_config():
    with pytest.raises(ConfigError) as raised:
        parse_web_config(
            {
                "basic_auth_users": {"ops": HASHES["prometheus"]},
                "admin_users": {"ops": HASHES["ops"], "bad": "plaintext"},
                "admin_client_cert_subjects": ["CN=ops"],
                "allowed_hosts": "localhost",
                "allowed_origins": ["ops.example.com"],
            }
        )
    problems = "\n".join(raised.value.problems)
    assert "admin_users.ops: also in basic_auth_users with another hash" in problems
    assert "admin_users.bad: not a bcrypt hash" in problems and "plaintext" not in problems
    assert "admin_client_cert_subjects: needs tls_server_config with client_auth_type" in problems
    assert "allowed_hosts: must be a list" in problems
    assert "allowed_origins: 'ops.example.com': want scheme://host[:port]" in problems
