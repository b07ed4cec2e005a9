"""The HTTP fetcher on a loopback server: keep-alive, redirects, encodings, threads, and what each failure is called."""

from __future__ import annotations

import gzip
import ssl
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from certs import self_signed_for_localhost
from specwatch.sources import http as http_module
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
        if self.path in ("/metrics", "/slash/metrics/"):
            self.reply(200, BODY)
        elif self.path == "/slash/metrics":  # as vLLM's mounted app answers: 307 to the slashed path, absolute
            self.reply(307, b"", location=f"{self.server.scheme}://{self.headers['Host']}/slash/metrics/")
        elif self.path.startswith("/hop/"):  # /hop/N redirects N times before landing on /metrics
            hops = int(self.path.rsplit("/", 1)[1])
            self.reply(302, b"moved" * 1000, location="/metrics" if hops <= 1 else f"/hop/{hops - 1}")
        elif self.path == "/loop":
            self.reply(307, b"", location="/loop")
        elif self.path.startswith("/elsewhere"):  # ?to=URL: a redirect to another host
            self.reply(302, b"", location=self.path.split("?to=", 1)[1])
        elif self.path == "/gzip":
            self.reply(200, gzip.compress(BODY), encoding="gzip")
        elif self.path == "/gzip_two_members":
            self.reply(200, gzip.compress(BODY[:1000]) + gzip.compress(BODY[1000:]), encoding="gzip")
        elif self.path == "/raw_deflate":
            packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
            self.reply(200, packer.compress(BODY) + packer.flush(), encoding="deflate")
        elif self.path == "/gzip_bomb":  # 64 MiB of zeros in ~64 KB
            self.reply(200, gzip.compress(bytes(64 * 2**20), compresslevel=9), encoding="gzip")
        elif self.path == "/gzip_cut":
            self.reply(200, gzip.compress(BODY)[:-100], encoding="gzip")
        elif self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for start in range(0, len(BODY), 10_000):
                piece = BODY[start : start + 10_000]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
        elif self.path == "/wait":  # holds its connection until the test lets it go
            self.server.waiting.set()
            self.server.proceed.wait(5)
            self.reply(200, BODY)
        else:
            self.reply(404, b"not found")

    def reply(self, status: int, body: bytes, location: str = "", encoding: str = "") -> None:
        self.send_response(status)
        if location:
            self.send_header("Location", location)
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # a client hanging up mid-response (the gzip bomb) is what some tests are for


class ClosingServer(QuietServer):
    """Closes every connection right after its first response without saying so (no `Connection: close`),
    as a server does whose keep-alive idle timeout runs out between two scrapes. `closed` is set once the
    socket is shut, so a test needs no sleep."""

    def shutdown_request(self, request) -> None:
        super().shutdown_request(request)
        self.closed.set()


class ClosingHandler(Handler):
    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self.server.requests += 1
        if self.path == "/no_response":  # drops the connection without a status line
            self.close_connection = True
            return
        self.reply(200, BODY)
        self.close_connection = True


def start(server_class, handler, tls: ssl.SSLContext | None = None) -> ThreadingHTTPServer:
    httpd = server_class(("127.0.0.1", 0), handler)
    if tls is not None:
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    httpd.daemon_threads = True
    httpd.connections = httpd.requests = 0
    httpd.closed, httpd.waiting, httpd.proceed = threading.Event(), threading.Event(), threading.Event()
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    httpd.scheme = "https" if tls else "http"
    httpd.url = f"{httpd.scheme}://127.0.0.1:{httpd.server_address[1]}"
    return httpd


def stop(httpd: ThreadingHTTPServer) -> None:
    httpd.proceed.set()
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def server():
    httpd = start(QuietServer, Handler)
    yield httpd
    stop(httpd)


@pytest.fixture
def fetcher():
    fetcher = HttpFetcher(timeout_seconds=2.0)
    yield fetcher
    fetcher.close()


@pytest.mark.slow
def test_scrapes_reuse_one_kept_alive_connection(server, fetcher):
    before = server.connections
    assert all(fetcher.get(f"{server.url}/metrics") == BODY for _ in range(5))
    assert server.connections == before + 1


@pytest.mark.slow
def test_a_kept_alive_connection_sets_no_socket_timeout_request_after_request(server, fetcher, monkeypatch):
    """settimeout() is an ioctl each time; once the kept socket's timeout matches the scrape timeout (within
    the slack) further GETs leave it alone, and the deadline still holds (the slow-drip tests)."""
    import socket

    fetcher.get(f"{server.url}/metrics")
    calls = []
    real = socket.socket.settimeout
    monkeypatch.setattr(socket.socket, "settimeout", lambda sock, value: (calls.append(value), real(sock, value)))
    assert all(fetcher.get(f"{server.url}/metrics") == BODY for _ in range(5))
    assert calls == []


@pytest.mark.slow
@pytest.mark.parametrize("hops", [1, 4])
def test_redirects_are_followed(server, fetcher, hops):
    assert fetcher.get(f"{server.url}/hop/{hops}") == BODY
    assert fetcher.get(f"{server.url}/hop/{hops}") == BODY, "and again on the next scrape"


@pytest.mark.slow
def test_a_redirect_to_the_slashed_path_is_followed_on_the_same_kept_alive_connection(server, fetcher):
    before = server.connections
    assert all(fetcher.get(f"{server.url}/slash/metrics") == BODY for _ in range(3))
    assert server.connections == before + 1, "the redirect's body is read, so its connection stays alive"


@pytest.mark.slow
def test_a_redirect_to_another_host_is_followed(server, fetcher):
    other = start(QuietServer, Handler)
    try:
        assert fetcher.get(f"{server.url}/elsewhere?to={other.url}/metrics") == BODY
        assert other.connections == 1
    finally:
        stop(other)


@pytest.mark.slow
def test_a_redirect_loop_is_a_connection_failure(server, fetcher):
    with pytest.raises(SourceError) as info:
        fetcher.get(f"{server.url}/loop")
    assert info.value.reason == "connection" and "/loop" in str(info.value)
    assert fetcher.get(f"{server.url}/metrics") == BODY, "the fetcher is still usable"


@pytest.mark.slow
def test_too_many_redirects_are_a_connection_failure(server, fetcher):
    with pytest.raises(SourceError) as info:
        fetcher.get(f"{server.url}/hop/6")
    assert info.value.reason == "connection" and "more than 5 redirects" in str(info.value)


@pytest.mark.slow
def test_not_found_is_an_http_status_and_a_refused_port_a_connection_failure(server, fetcher):
    with pytest.raises(SourceError) as info:
        fetcher.get(f"{server.url}/nothing")
    assert info.value.reason == "http_status" and "404" in str(info.value)
    with pytest.raises(SourceError) as info:
        fetcher.get("http://127.0.0.1:9/metrics")
    assert info.value.reason == "connection"


@pytest.mark.parametrize(
    "url", ["http://[::1/metrics", "http://127.0.0.1:port/metrics", "ftp://127.0.0.1/metrics", "http:///metrics"]
)
def test_a_url_it_cannot_use_is_a_connection_failure(fetcher, url):
    with pytest.raises(SourceError) as info:
        fetcher.get(url)
    assert info.value.reason == "connection" and "invalid URL" in str(info.value)


@pytest.mark.slow
def test_a_kept_alive_connection_the_server_closed_is_replaced_transparently():
    closing = start(ClosingServer, ClosingHandler)
    fetcher = HttpFetcher(timeout_seconds=2.0)
    try:
        for scrape in range(3):
            closing.closed.clear()
            assert fetcher.get(f"{closing.url}/metrics") == BODY, f"scrape {scrape}"
            assert closing.closed.wait(2), "the server closed the connection it kept alive"
        # The first scrape connected; each later one found its kept connection closed and asked once more.
        assert closing.connections == 3 and closing.requests == 3
    finally:
        fetcher.close()
        stop(closing)


@pytest.mark.slow
def test_a_new_connection_dropped_before_the_response_is_a_failure_not_retried():
    closing = start(ClosingServer, ClosingHandler)
    fetcher = HttpFetcher(timeout_seconds=2.0)
    try:
        with pytest.raises(SourceError) as info:
            fetcher.get(f"{closing.url}/no_response")
        assert info.value.reason == "connection" and "RemoteDisconnected" in str(info.value)
        assert closing.requests == 1
    finally:
        fetcher.close()
        stop(closing)


@pytest.mark.slow
def test_a_chunked_body_is_read_whole(server, fetcher):
    before = server.connections
    assert fetcher.get(f"{server.url}/chunked") == BODY
    assert fetcher.get(f"{server.url}/chunked") == BODY and server.connections == before + 1


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/gzip", "/gzip_two_members", "/raw_deflate"])
def test_a_compressed_body_sent_unasked_is_decoded(server, fetcher, path):
    assert fetcher.get(f"{server.url}{path}") == BODY


@pytest.mark.slow
def test_a_gzip_bomb_hits_the_cap_on_its_decoded_size(server):
    # A deadline far beyond what decoding to the cap takes, even on a loaded machine: the cap must stop it.
    fetcher = HttpFetcher(timeout_seconds=30.0, max_body_bytes=2**20)
    try:
        with pytest.raises(SourceError) as info:
            fetcher.get(f"{server.url}/gzip_bomb")
        assert info.value.reason == "too_large"
    finally:
        fetcher.close()


@pytest.mark.slow
def test_a_gzip_body_cut_short_is_a_connection_failure(server, fetcher):
    with pytest.raises(SourceError) as info:
        fetcher.get(f"{server.url}/gzip_cut")
    assert info.value.reason == "connection" and "cut short" in str(info.value)


@pytest.mark.slow
def test_a_busy_connection_does_not_hold_up_another_thread(server, fetcher):
    """Thread A's request hangs on the host's connection; thread B's request to the same host goes through on
    a second connection, and only one connection is kept afterwards."""
    server.waiting.clear()
    server.proceed.clear()
    results: list[bytes] = []
    hung = threading.Thread(target=lambda: results.append(fetcher.get(f"{server.url}/wait")))
    hung.start()
    try:
        assert server.waiting.wait(2)
        assert fetcher.get(f"{server.url}/metrics") == BODY
    finally:
        server.proceed.set()
        hung.join(5)
    assert results == [BODY]
    before = server.connections
    assert fetcher.get(f"{server.url}/metrics") == BODY and server.connections == before


@pytest.mark.slow
def test_a_connection_in_use_when_the_fetcher_closes_is_not_kept(server, fetcher):
    server.waiting.clear()
    server.proceed.clear()
    hung = threading.Thread(target=lambda: fetcher.get(f"{server.url}/wait"))
    hung.start()
    assert server.waiting.wait(2)
    fetcher.close()
    server.proceed.set()
    hung.join(5)
    before = server.connections
    assert fetcher.get(f"{server.url}/metrics") == BODY
    assert server.connections == before + 1, "the connection that was in use was closed, not kept"


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    """An HTTPS engine endpoint with a self-signed certificate for 127.0.0.1 (its own CA), made with openssl."""
    cert, key = self_signed_for_localhost(tmp_path_factory.mktemp("tls"), common_name="engine")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    httpd = start(QuietServer, Handler, tls=context)
    httpd.ca_file = cert
    yield httpd
    stop(httpd)


@pytest.mark.slow
def test_https_verifies_the_certificate_against_the_system_cas(tls_server, fetcher):
    with pytest.raises(SourceError) as info:
        fetcher.get(f"{tls_server.url}/metrics")
    assert info.value.reason == "connection" and "CERTIFICATE_VERIFY_FAILED" in str(info.value)


@pytest.mark.slow
def test_https_with_a_trusted_certificate_is_kept_alive(tls_server, fetcher, monkeypatch):
    trusting = ssl.create_default_context(cafile=str(tls_server.ca_file))
    monkeypatch.setattr(http_module, "_tls_context", lambda: trusting)
    before = tls_server.connections
    assert fetcher.get(f"{tls_server.url}/metrics") == BODY and fetcher.get(f"{tls_server.url}/slash/metrics") == BODY
    assert tls_server.connections == before + 1


class CannedServer:
    """A loopback server that answers every request on a connection with the next of `answers` (raw bytes),
    then closes the connection after the last. Counts connections, so a test sees what was kept alive."""

    def __init__(self, *answers: bytes) -> None:
        import socket

        self.answers = answers
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn) -> None:
        with conn:
            for answer in self.answers:
                request = b""
                while b"\r\n\r\n" not in request:
                    data = conn.recv(65536)
                    if not data:
                        return
                    request += data
                conn.sendall(answer)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def canned():
    servers = []

    def make(*answers: bytes) -> CannedServer:
        servers.append(CannedServer(*answers))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


@pytest.mark.slow
def test_a_body_delimited_by_the_server_closing_is_read_whole(canned, fetcher):
    server = canned(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + BODY)
    assert fetcher.get(f"{server.url}/metrics") == BODY
    assert fetcher.get(f"{server.url}/metrics") == BODY and server.connections == 2, "not kept: it closed"


@pytest.mark.slow
def test_connection_close_is_honoured_and_the_next_scrape_connects_afresh(canned, fetcher):
    ok = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 4\r\n\r\nm 1\n"
    server = canned(ok, ok)
    assert fetcher.get(f"{server.url}/metrics") == b"m 1\n"
    assert fetcher.get(f"{server.url}/metrics") == b"m 1\n" and server.connections == 2


@pytest.mark.slow
def test_bytes_after_the_response_keep_the_connection_from_being_reused(canned, fetcher):
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nm 1\n"
    server = canned(ok + b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nm 9\n", ok)
    assert fetcher.get(f"{server.url}/metrics") == b"m 1\n"
    assert fetcher.get(f"{server.url}/metrics") == b"m 1\n", "never the stray second answer"
    assert server.connections == 2


@pytest.mark.slow
def test_a_header_line_that_never_ends_is_cut_at_the_header_cap_not_the_deadline(canned):
    import time

    server = canned(b"HTTP/1.1 200 OK\r\nX-Endless: " + b"a" * 300_000)  # then the connection stays open
    fetcher = HttpFetcher(timeout_seconds=5.0)
    started = time.monotonic()
    try:
        with pytest.raises(SourceError) as info:
            fetcher.get(f"{server.url}/metrics")
    finally:
        fetcher.close()
    assert info.value.reason == "connection" and "headers over" in str(info.value)
    assert time.monotonic() - started < 2.5, "stopped by the cap, long before the 5 s deadline"


@pytest.mark.slow
def test_an_interim_100_continue_is_skipped(canned, fetcher):
    server = canned(b"HTTP/1.1 100 Continue\r\nX-Interim: 1\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nm 1\n")
    assert fetcher.get(f"{server.url}/metrics") == b"m 1\n"


@pytest.mark.slow
@pytest.mark.parametrize(
    "answer, words",
    [
        (b"<html><body>Bad Gateway</body></html>\r\n", "not an HTTP response"),
        (b"HTTP/1.1 200 OK\r\n" + b"X-Filler: " + b"x" * 100_000 + b"\r\n\r\n", "headers over"),
        (
            b"HTTP/1.1 200 OK\r\n" + b"X-Many: 1\r\n" * 101 + b"Content-Length: 0\r\n\r\n",
            "more than 100 response headers",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nm 1\n", "cut short"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nm 1\n\r\n", "cut short"),
    ],
)
def test_a_malformed_or_cut_response_is_a_connection_failure(canned, fetcher, answer, words):
    server = canned(answer)
    with pytest.raises(SourceError) as info:
        fetcher.get(f"{server.url}/metrics")
    assert info.value.reason == "connection" and words in str(info.value), str(info.value)


@pytest.mark.slow
def test_the_request_names_the_host_and_asks_for_the_text_format_uncompressed(canned, fetcher):
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            seen.append(conn.recv(65536))
            conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    port = listener.getsockname()[1]
    try:
        assert fetcher.get(f"http://127.0.0.1:{port}/metrics?name[]=a%3Ab") == b""
    finally:
        listener.close()
    head = seen[0].decode()
    assert head.startswith("GET /metrics?name[]=a%3Ab HTTP/1.1\r\n")
    assert f"\r\nHost: 127.0.0.1:{port}\r\n" in head and "\r\nAccept-Encoding: identity\r\n" in head
    assert f"\r\nAccept: {http_module.ACCEPT}\r\n" in head and head.endswith("\r\n\r\n")


def test_a_path_that_needs_percent_encoding_is_refused_before_sending(fetcher):
    with pytest.raises(SourceError) as info:
        fetcher.get("http://127.0.0.1:9/met rics")
    assert info.value.reason == "connection" and "percent-encoding" in str(info.value)


@pytest.mark.slow
def test_a_get_leaves_no_garbage_for_the_cycle_collector(server, fetcher):
    """httptools' parser holds its protocol object: were the response to keep the parser, every GET would
    leave a reference cycle for the collector (64 endpoints: a gen-0 collection about every cycle)."""
    import gc

    fetcher.get(f"{server.url}/metrics")
    gc.collect()
    gc.disable()
    try:
        for path in ("/metrics", "/chunked", "/hop/2", "/nothing", "/gzip"):
            try:
                fetcher.get(f"{server.url}{path}")
            except SourceError:
                pass
        assert gc.collect() == 0
    finally:
        gc.enable()


@pytest.mark.slow
def test_bodies_past_their_small_allowance_share_one_budget_and_give_it_back(server, fetcher, monkeypatch):
    """Hostile engines on many routes cannot each hold a body up to the cap: past its first SMALL_BODY_BYTES a
    body draws on one process-wide budget; one that finds it spent is refused, and every scrape returns what it
    took, refused or not."""
    monkeypatch.setattr(http_module, "SMALL_BODY_BYTES", 10_000)
    budget = http_module._BodyBudget(len(BODY))
    monkeypatch.setattr(http_module, "_LARGE_BODIES", budget)
    assert fetcher.get(f"{server.url}/metrics") == BODY  # ~95 KB: 85 KB of it from the budget
    assert budget.free == budget.total
    held = budget.take("another scrape", budget.total - 50_000)  # another route's large body, mid-read
    with pytest.raises(SourceError) as info:
        fetcher.get(f"{server.url}/metrics")
    assert info.value.reason == "too_large"
    assert f"body past 10000 bytes while other scrapes hold the {len(BODY)} bytes that large bodies share" in str(
        info.value
    )
    assert budget.free == budget.total - held
    monkeypatch.setattr(http_module, "SMALL_BODY_BYTES", len(BODY))  # the usual answer: never touches the budget
    assert fetcher.get(f"{server.url}/metrics") == BODY
    budget.give(held)
    assert budget.free == budget.total
