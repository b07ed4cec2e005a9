"""The HTTP fetcher on a loopback server: keep-alive, redirects, and what each failure is called."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specwatch.sources.base import SourceError
from specwatch.sources.http import HttpFetcher

BODY = b"# TYPE m gauge\nm 1\n" * 5000  # ~95 KB, more than one read


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as engines serve

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        if self.path == "/metrics":
            self.reply(200, BODY)
        elif self.path.startswith("/hop/"):  # /hop/N redirects N times before landing on /metrics
            hops = int(self.path.rsplit("/", 1)[1])
            self.reply(302, b"moved" * 1000, location="/metrics" if hops <= 1 else f"/hop/{hops - 1}")
        elif self.path == "/loop":
            self.reply(307, b"", location="/loop")
        else:
            self.reply(404, b"not found")

    def reply(self, status: int, body: bytes, location: str = "") -> None:
        self.send_response(status)
        if location:
            self.send_header("Location", location)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.connections = 0
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_scrapes_reuse_one_kept_alive_connection(server):
    fetcher = HttpFetcher(timeout_seconds=2.0)
    try:
        before = server.connections
        assert all(fetcher.get(f"{server.url}/metrics") == BODY for _ in range(5))
        assert server.connections == before + 1
    finally:
        fetcher.close()


@pytest.mark.parametrize("hops", [1, 4])
def test_redirects_are_followed(server, hops):
    fetcher = HttpFetcher(timeout_seconds=2.0)
    try:
        assert fetcher.get(f"{server.url}/hop/{hops}") == BODY
        assert fetcher.get(f"{server.url}/hop/{hops}") == BODY, "and again on the next scrape"
    finally:
        fetcher.close()


def test_a_redirect_loop_is_a_connection_failure(server):
    fetcher = HttpFetcher(timeout_seconds=2.0)
    try:
        with pytest.raises(SourceError) as info:
            fetcher.get(f"{server.url}/loop")
        assert info.value.reason == "connection" and "/loop" in str(info.value)
        assert fetcher.get(f"{server.url}/metrics") == BODY, "the fetcher is still usable"
    finally:
        fetcher.close()


def test_not_found_is_an_http_status_and_a_refused_port_a_connection_failure(server):
    fetcher = HttpFetcher(timeout_seconds=2.0)
    try:
        with pytest.raises(SourceError) as info:
            fetcher.get(f"{server.url}/nothing")
        assert info.value.reason == "http_status" and "404" in str(info.value)
        with pytest.raises(SourceError) as info:
            fetcher.get("http://127.0.0.1:9/metrics")
        assert info.value.reason == "connection"
    finally:
        fetcher.close()


def test_a_url_it_cannot_use_is_a_connection_failure():
    fetcher = HttpFetcher(timeout_seconds=2.0)
    with pytest.raises(SourceError) as info:
        fetcher.get("http://[::1/metrics")
    assert info.value.reason == "connection"
