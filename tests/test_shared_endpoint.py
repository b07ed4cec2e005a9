"""Routes on one URL share one fetch and parse per cycle; a failed endpoint fails all of them alike."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from specwatch.config import parse_config
from specwatch.daemon import Daemon
from specwatch.sources import engines

pytestmark = pytest.mark.slow  # loopback HTTP servers

BODY = (Path(__file__).parent / "fixtures" / "vllm" / "v1_k4_2engines.prom").read_bytes()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        server = self.server
        if self.path == "/metrics":
            with server.lock:
                server.metrics_calls += 1
            status, body = server.status, BODY
        else:
            status, body = 200, b'{"version": "0.33.0"}'
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.lock, httpd.metrics_calls, httpd.status = threading.Lock(), 0, 200
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}/metrics"
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def daemon_for(url: str, tmp_path, extra_url: str | None = None) -> Daemon:
    routes = [
        {"name": "both", "url": url, "engine": "vllm"},
        {"name": "e0", "url": url, "engine": "vllm", "engines": ["0"]},
        {"name": "e1", "url": url, "engine": "auto", "engines": ["1"]},
    ]
    if extra_url:
        routes.append({"name": "other", "url": extra_url, "engine": "vllm"})
    config = parse_config({"gpu": {"enabled": "false"}, "state_dir": str(tmp_path), "routes": routes})
    return Daemon(config)


def test_routes_on_one_url_share_one_fetch_per_cycle_and_keep_their_filters(server, tmp_path):
    daemon = daemon_for(server.url, tmp_path)
    try:
        for cycle in range(1, 4):
            snap = daemon.tick(1000.0 + 5 * cycle)
            assert server.metrics_calls == cycle
        routes = {r.name: r for r in snap.routes}
        assert all(r.up for r in routes.values())
        # The fixture's two engines: each filtered route holds its own engine's totals, together the unfiltered one.
        assert routes["e0"].drafts_total > 0 and routes["e1"].drafts_total > 0
        assert routes["e0"].drafts_total + routes["e1"].drafts_total == routes["both"].drafts_total
        assert {r.engine_version for r in routes.values()} == {"0.33.0"}
    finally:
        daemon.close()
    assert not engines.ENDPOINTS._endpoints, "the endpoint closes with its last route"


def test_a_failed_shared_endpoint_fails_every_route_on_it_with_the_same_reason(server, tmp_path):
    daemon = daemon_for(server.url, tmp_path)
    try:
        daemon.tick(1005.0)
        server.status = 503
        snap = daemon.tick(1010.0)
        assert server.metrics_calls == 2
        assert [(r.up, r.error_reason, r.errors_total["http_status"]) for r in snap.routes] == [
            (False, "http_status", 1.0)
        ] * 3
    finally:
        daemon.close()


def test_a_refused_endpoint_fails_only_its_routes(server, tmp_path):
    daemon = daemon_for("http://127.0.0.1:9/metrics", tmp_path, extra_url=server.url)
    try:
        snap = daemon.tick(1005.0)
        assert {r.name: (r.up, r.error_reason) for r in snap.routes} == {
            "both": (False, "connection"),
            "e0": (False, "connection"),
            "e1": (False, "connection"),
            "other": (True, ""),
        }
    finally:
        daemon.close()


def test_a_second_call_in_the_same_cycle_fetches_afresh(server):
    route = parse_config(
        {"gpu": {"enabled": "false"}, "routes": [{"name": "r", "url": server.url, "engine": "vllm"}]}
    ).routes[0]
    config = parse_config({"gpu": {"enabled": "false"}, "routes": [{"name": "r", "url": server.url}]})
    source = engines.make_source(route, config)
    try:
        source.sample(5.0)
        source.sample(5.0)
        assert server.metrics_calls == 2
    finally:
        source.close()
