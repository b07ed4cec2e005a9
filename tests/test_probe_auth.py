"""Canary probes and counter bracketing reach an engine that demands credentials (a bearer token, basic auth
or a TLS client certificate) with the route's own HTTP client config, as its scrapes do; without it, a round is
an error that says why and bracketing's scrape fails with the engine's answer, never an exception.

The engine is the simulator behind a loopback proxy that guards every path (tests/guarded.py)."""

from __future__ import annotations

import base64
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from certs import ca_server_client
from guarded import GuardedEngine
from specwatch.config import parse_config
from specwatch.evaluators.canary import bracket_scraper
from specwatch.probe.prompts import BUILTIN, load_prompt_set
from specwatch.probe.runner import ProbeRunner
from specwatch.sources.base import SourceError
from specwatch.sources.http import client_session

pytestmark = pytest.mark.slow  # loopback servers (guarded engines, the daemon's own server)

TOKEN = "sk-probe-token"
USER, PASSWORD = "prober", "pr0be-pass"
GUARDS = ("bearer", "basic", "client_certificate")


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    return ca_server_client(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def guarded(tmp_path, pki):
    """guard(kind, upstream URL) -> (engine, the route keys that get in, the route keys that do not)."""
    engines = []

    def guard(kind: str, upstream: str) -> tuple[GuardedEngine, dict, dict]:
        if kind == "bearer":
            token = tmp_path / "token"
            token.write_text(TOKEN + "\n")  # read per request, as a scrape reads it
            engine = GuardedEngine(upstream, authorization=f"Bearer {TOKEN}")
            good, bad = {"authorization": {"credentials_file": str(token)}}, {}
        elif kind == "basic":
            pair = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
            engine = GuardedEngine(upstream, authorization=f"Basic {pair}")
            good, bad = {"basic_auth": {"username": USER, "password": PASSWORD}}, {}
        else:
            engine = GuardedEngine(upstream, tls=(pki["ca.pem"], pki["server.pem"], pki["server.key"]))
            trust = {"ca_file": str(pki["ca.pem"])}  # the server is trusted; only the client certificate is missing
            good = {"tls_config": {**trust, "cert_file": str(pki["client.pem"]), "key_file": str(pki["client.key"])}}
            bad = {"tls_config": trust}
        engines.append(engine)
        return engine, good, bad

    yield guard
    for engine in engines:
        engine.close()


def _config(url: str, http: dict):
    route = {"name": "r", "url": url + "/metrics", "probe": {"every": "1m", "max_tokens": 24}, **http}
    return parse_config({"interval": "30s", "scrape": {"timeout": "20s"}, "routes": [route]})


def _runner(cfg, prompts: int = 4) -> ProbeRunner:
    route = cfg.routes[0]
    ps = load_prompt_set(BUILTIN)
    ps = type(ps)(ps.name, ps.prompts[:prompts])
    return ProbeRunner(route, route.probe, ps, engine_kind=lambda: "vllm", scrape=bracket_scraper(route, cfg))


@pytest.mark.parametrize("kind", GUARDS)
def test_probe_rounds_and_bracketing_reads_use_the_routes_credentials(simulator, guarded, kind):
    direct_engine, good, _ = guarded(kind, simulator(per_request="summary").url)
    direct = _runner(_config(direct_engine.url, good)).run_now()
    assert direct.outcome == "ok" and direct.method == "vllm_response", direct.message
    assert len(direct.read()) == 4

    bracket_engine, good, _ = guarded(kind, simulator(per_request="none").url)
    cfg = _config(bracket_engine.url, good)
    bracketed = _runner(cfg).run_now()
    assert bracketed.outcome == "ok" and bracketed.method == "bracketing", bracketed.message
    assert {p: (a.drafted, a.accepted) for p, a in bracketed.read().items()} == {
        p: (a.drafted, a.accepted) for p, a in direct.read().items()
    }
    assert ("GET", "/metrics", 200) in bracket_engine.seen and ("POST", "/v1/completions", 200) in bracket_engine.seen


@pytest.mark.parametrize("kind", GUARDS)
def test_without_the_routes_credentials_rounds_and_bracketing_reads_fail_cleanly(simulator, guarded, kind):
    engine, _, bad = guarded(kind, simulator(per_request="none").url)
    cfg = _config(engine.url, bad)
    rnd = _runner(cfg).run_now()
    assert rnd.outcome == "error" and not rnd.read()
    with pytest.raises(SourceError) as refused:
        bracket_scraper(cfg.routes[0], cfg)()
    if kind == "client_certificate":
        assert "SSL" in rnd.message and refused.value.reason == "connection", (rnd.message, refused.value)
        assert not engine.seen  # no request got through the handshake
    else:
        assert "HTTP 401" in rnd.message, rnd.message
        assert refused.value.reason == "http_status" and "401" in str(refused.value)
        assert all(status == 401 for _, _, status in engine.seen)


def test_a_probe_session_sends_the_token_to_its_own_origin_only():
    """Headers go everywhere; the route's secret does not follow a redirect to another host, as a scrape's
    does not. 127.0.0.1 redirects to localhost: the same server, another origin."""
    seen: list[tuple[str, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - stdlib naming
            seen.append((self.path, dict(self.headers)))
            self.send_response(307 if self.path == "/away" else 200)
            if self.path == "/away":
                self.send_header("Location", f"http://localhost:{self.server.server_address[1]}/there")
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    cfg = _config(url, {"authorization": {"credentials": TOKEN}, "headers": {"X-Tenant": "a"}})
    session = client_session(cfg.routes[0].http)
    try:
        assert session.get(url + "/away", timeout=20).status_code == 200
    finally:
        session.close()
        server.shutdown()
        server.server_close()
    (first, asked), (second, redirected) = seen
    assert (first, second) == ("/away", "/there")
    assert asked["Authorization"] == f"Bearer {TOKEN}" and asked["X-Tenant"] == "a"
    assert "Authorization" not in redirected and redirected["X-Tenant"] == "a"


@pytest.mark.parametrize("server_name, outcome", [("engine.test", "ok"), ("other.test", "error")])
def test_a_probe_verifies_the_tls_server_name_of_the_route(simulator, guarded, pki, server_name, outcome):
    engine, good, _ = guarded("client_certificate", simulator(per_request="summary").url)
    rnd = _runner(_config(engine.url, {"tls_config": {**good["tls_config"], "server_name": server_name}})).run_now()
    assert rnd.outcome == outcome, rnd.message
    if outcome == "error":
        assert "CERTIFICATE_VERIFY_FAILED" in rnd.message, rnd.message  # 127.0.0.1 alone would pass


def test_sessions_without_a_tls_config_share_one_context_that_still_verifies(simulator, guarded, pki):
    """Without a tls_config a session uses the one shared context (a sweep opens a session per client), and
    that context still checks the server against the system's CAs: a server of a private CA is refused."""
    engine, good, _ = guarded("client_certificate", simulator(per_request="summary").url)
    plain = _config(engine.url, {})
    first, second = client_session(plain.routes[0].http), client_session(plain.routes[0].http)
    try:
        assert (
            first.get_adapter("https://x").poolmanager.connection_pool_kw["ssl_context"]
            is (second.get_adapter("https://x").poolmanager.connection_pool_kw["ssl_context"])
        )
        with pytest.raises(requests.exceptions.SSLError, match="CERTIFICATE_VERIFY_FAILED"):
            first.get(engine.url.replace("/metrics", "") + "/v1/models", timeout=20)
    finally:
        first.close()
        second.close()
    trusted = client_session(_config(engine.url, good).routes[0].http)
    try:
        assert trusted.get(engine.url.replace("/metrics", "") + "/v1/models", timeout=20).status_code == 200
    finally:
        trusted.close()
