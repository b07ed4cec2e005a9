"""The daemon's own HTTP server against hostile and careless clients: what each limit answers, and that a real
scrape is still served while other clients hold connections. Loopback only; every test binds a socket."""

from __future__ import annotations

import logging
import re
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
import requests

from certs import self_signed_for_localhost
from specwatch.export import http as http_module
from specwatch.export.http import MetricsServer, serve
from specwatch.snapshot import RouteState, Snapshot

pytestmark = pytest.mark.slow

SNAPSHOT = Snapshot(timestamp=1764403200.0, routes=(RouteState(name="chat", up=True),))


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    srv = serve("127.0.0.1:0", lambda: SNAPSHOT)
    yield srv
    srv.shutdown()


def connect(srv: MetricsServer, timeout: float = 15.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.port), timeout=timeout)


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (or the socket's timeout passes)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (TimeoutError, ConnectionError):
        pass
    return data


def exchange(srv: MetricsServer, request: bytes) -> bytes:
    with connect(srv) as sock:
        sock.sendall(request)
        return read_until_closed(sock)


def get(path: str, extra: str = "", body: bytes = b"", close: bool = True) -> bytes:
    connection = "Connection: close\r\n" if close else ""
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}{connection}\r\n".encode() + body


def statuses(answer: bytes) -> list[str]:
    """The status codes of the responses in `answer` (every body here is text ending in a newline)."""
    return re.findall(r"(?:^|\n)HTTP/1\.1 (\d{3}) ", answer.decode("latin-1"))


# ---------------------------------------------------------------------------------------------- connections
def test_the_listen_backlog_is_the_kernels_maximum_not_five(monkeypatch):
    """With http.server's backlog of 5, 168 of 200 clients connecting at once timed out."""
    backlogs: list[int] = []
    real_listen = socket.socket.listen
    monkeypatch.setattr(socket.socket, "listen", lambda self, *args: backlogs.extend(args) or real_listen(self, *args))
    srv = serve("127.0.0.1:0", lambda: SNAPSHOT)
    try:
        assert backlogs and min(backlogs) >= 1024
    finally:
        srv.shutdown()


def test_idle_connections_cost_no_thread_and_a_scrape_is_still_answered(server):
    threads_before = threading.active_count()
    idle = [connect(server) for _ in range(200)]
    try:
        # accept() takes connections in order, so once this scrape is answered all 200 have been accepted
        assert requests.get(server.url + "/metrics", timeout=10).status_code == 200
        assert threading.active_count() - threads_before < 20
    finally:
        for sock in idle:
            sock.close()


def test_a_client_that_sends_its_request_slowly_is_cut_at_the_head_timeout(monkeypatch):
    monkeypatch.setattr(http_module, "HEAD_TIMEOUT_SECONDS", 1.0, raising=False)
    srv = serve("127.0.0.1:0", lambda: SNAPSHOT)
    try:
        silent, slow = connect(srv, timeout=30), connect(srv, timeout=30)
        answers: dict[str, bytes] = {}
        readers = [
            threading.Thread(target=lambda s=s, n=n: answers.__setitem__(n, read_until_closed(s)))
            for n, s in (("silent", silent), ("slow", slow))
        ]
        for t in readers:
            t.start()
        deadline = time.monotonic() + 20
        for byte in get("/-/healthy") * 100:  # one byte every 0.1 s: never a whole head within 20 s
            if not readers[1].is_alive() or time.monotonic() > deadline:
                break
            try:
                slow.send(bytes([byte]))
            except OSError:
                break
            time.sleep(0.1)
        for t in readers:
            t.join(30)
        assert answers["silent"] == b""  # closed, nothing to answer
        assert statuses(answers["slow"]) == ["408"]
    finally:
        srv.shutdown()


def test_connections_beyond_the_cap_are_answered_503_and_served_again_once_some_close(monkeypatch):
    monkeypatch.setattr(http_module, "MAX_CONNECTIONS", 8, raising=False)
    srv = serve("127.0.0.1:0", lambda: SNAPSHOT)
    held = [connect(srv) for _ in range(8)]
    try:
        assert statuses(exchange(srv, get("/-/healthy"))) == ["503"]
        for sock in held[:4]:
            sock.close()
        deadline = time.monotonic() + 30
        while statuses(answer := exchange(srv, get("/-/healthy"))) != ["200"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert statuses(answer) == ["200"]
    finally:
        for sock in held:
            sock.close()
        srv.shutdown()


# ---------------------------------------------------------------------------------------------- requests
def test_oversized_or_too_many_header_fields_get_431(server):
    """44 connections with oversized headers took the daemon from 41 to 290 MB."""
    big = "".join(f"X-Pad-{i}: {'a' * 8000}\r\n" for i in range(64))  # 512 KB: http.server took it whole
    many = "".join(f"X-Field-{i}: 1\r\n" for i in range(80))  # http.server allows 100
    for extra in (big, many):
        with connect(server) as sock:
            sender = threading.Thread(target=_send_ignoring_errors, args=(sock, get("/-/healthy", extra)))
            sender.start()
            answer = read_until_closed(sock)
            sender.join(30)
        assert statuses(answer) == ["431"]
    assert statuses(exchange(server, get("/-/healthy"))) == ["200"]


def _send_ignoring_errors(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass  # the server refused and closed before reading it all


def test_a_body_sent_with_a_get_is_read_and_dropped_not_taken_for_a_second_request(server):
    smuggled = get("/nope")
    answer = exchange(
        server,
        get("/-/healthy", f"Content-Length: {len(smuggled)}\r\n", smuggled, close=False) + get("/-/ready"),
    )
    assert statuses(answer) == ["200", "200"]


@pytest.mark.parametrize(
    "extra, status",
    [
        ("Content-Length: 5\r\nContent-Length: 5\r\n", "400"),  # repeated
        ("Content-Length: 5\r\nContent-Length: 6\r\n", "400"),  # conflicting
        ("Content-Length: 5, 5\r\n", "400"),
        ("Content-Length: -5\r\n", "400"),
        ("Content-Length: 1000000000\r\n", "413"),
        ("Transfer-Encoding: chunked\r\n", "400"),  # "hello" is no chunk
        ("Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", "400"),
    ],
)
def test_request_bodies_the_server_cannot_delimit_safely_are_refused_and_the_connection_closed(server, extra, status):
    assert statuses(exchange(server, get("/-/healthy", extra, b"hello", close=False) + get("/nope"))) == [status]


def test_a_request_with_a_leading_blank_line_is_answered_and_one_with_bare_newlines_refused(server):
    assert statuses(exchange(server, b"\r\nGET /-/healthy HTTP/1.0\r\nHost: x\r\n\r\n")) == ["200"]
    assert statuses(exchange(server, b"GET /-/healthy HTTP/1.0\nHost: x\n\n")) == ["400"]


def test_methods_other_than_get_and_head_get_405(server):
    answer = exchange(server, b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    assert statuses(answer) == ["405"] and b"allow: GET, HEAD" in answer.lower().replace(b"get, head", b"GET, HEAD")


class TlsOnly:
    """A web config with TLS and no authentication."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)

    def ssl_context(self) -> ssl.SSLContext:
        return self.context

    def authorize(self, headers) -> bool:
        return True

    def authorize_cached(self, headers) -> bool:
        return True

    auth_required = admin_identity_required = False

    def is_admin(self, user, cert_subject) -> bool:
        return False

    def host_allowed(self, host) -> bool:
        return True

    def origin_allowed(self, origin) -> bool:
        return False


def test_plain_http_to_the_tls_port_is_closed_unanswered_and_https_still_served(tmp_path: Path):
    cert, key = self_signed_for_localhost(tmp_path)
    srv = serve("127.0.0.1:0", lambda: SNAPSHOT, TlsOnly(cert, key))
    try:
        assert exchange(srv, get("/metrics")) == b""
        assert requests.get(srv.url + "/metrics", verify=str(cert), timeout=10).status_code == 200
    finally:
        srv.shutdown()


def test_a_tls_client_that_never_finishes_its_handshake_is_cut_at_the_head_timeout(tmp_path: Path, monkeypatch):
    """asyncio's own handshake timeout is 60 s, and a connection still handshaking is not counted against the
    connection cap: silent TLS clients could hold file descriptors for a minute each."""
    monkeypatch.setattr(http_module, "HEAD_TIMEOUT_SECONDS", 1.0, raising=False)
    cert, key = self_signed_for_localhost(tmp_path)
    srv = serve("127.0.0.1:0", lambda: SNAPSHOT, TlsOnly(cert, key))
    try:
        with connect(srv, timeout=30) as silent:
            begin = time.monotonic()
            assert read_until_closed(silent) == b""
            assert time.monotonic() - begin < 25  # closed by the server, well before asyncio's 60 s
    finally:
        srv.shutdown()


def test_shutdown_closes_idle_tls_connections_at_once(tmp_path: Path, caplog):
    """A graceful TLS close waits for the client's close_notify, which an idle keep-alive client (Prometheus
    between scrapes) never sends: shutdown gave up after its grace and left their tasks pending."""
    cert, key = self_signed_for_localhost(tmp_path)
    srv = serve("127.0.0.1:0", lambda: SNAPSHOT, TlsOnly(cert, key))
    sessions = [requests.Session() for _ in range(3)]
    try:
        for session in sessions:
            assert session.get(srv.url + "/-/healthy", verify=str(cert), timeout=10).status_code == 200
    finally:
        srv.shutdown()
        for session in sessions:
            session.close()
    assert not srv._thread.is_alive()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


# ---------------------------------------------------------------------------------------------- under load
def test_scrapes_are_answered_while_hostile_clients_hold_connections(server):
    """50 scrapers in a loop and 100 connections that trickle a request head byte by byte: every one of a
    Prometheus-like scraper's scrapes is answered within Prometheus's 10 s timeout, on a bounded number of
    threads. (bench/http_load.py measures the p99 at 200 scrapers.)"""
    stop = threading.Event()
    threads_before = threading.active_count()

    def scraper() -> None:
        with requests.Session() as session:
            while not stop.is_set():
                try:
                    session.get(server.url + "/metrics", timeout=10)
                except requests.RequestException:
                    pass

    slow = [connect(server) for _ in range(100)]
    scrapers = [threading.Thread(target=scraper, daemon=True) for _ in range(50)]
    for t in scrapers:
        t.start()
    try:
        server_threads = []
        with requests.Session() as prometheus:
            for i in range(20):
                for sock in slow:
                    _send_ignoring_errors(sock, b"G"[:1] if i == 0 else b"E")
                answer = prometheus.get(
                    server.url + "/metrics",
                    headers={"Accept": "application/openmetrics-text;version=1.0.0", "Accept-Encoding": "gzip"},
                    timeout=10,
                )
                assert answer.status_code == 200 and answer.text.endswith("# EOF\n")
                server_threads.append(threading.active_count() - threads_before - len(scrapers))
        assert max(server_threads) < 20
    finally:
        stop.set()
        for t in scrapers:
            t.join(15)
        for sock in slow:
            sock.close()
