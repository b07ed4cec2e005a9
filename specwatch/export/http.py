"""The HTTP endpoint: /metrics, /api/v1/routes, /api/v1/advice, /api/v1/baselines (export/admin_api.py), /-/healthy,
/-/ready and a tiny index page.

An asyncio server (stdlib) on one background thread, over a private `CollectorRegistry` holding only the
snapshot collector. Each connection is a coroutine, so an idle, slow or hostile client costs a little memory,
never a thread, and a scrape never queues behind one; the work that takes CPU (rendering /metrics, a bcrypt
check) runs on small thread pools. Everything a client controls is bounded: the connections open (beyond
MAX_CONNECTIONS the one idle longest is closed, else the slowest to send its request head, else the newcomer
gets 503), the time to send a request head (HEAD_TIMEOUT_SECONDS, the TLS handshake included) and to sit idle
between requests, the head's size and field count (431), the body (413; a body is read whole, never taken
for the next request, and used by the baselines API's POSTs alone; a repeated Content-Length is a 400), and
password checks waiting (503). Limits that bite are logged, at most once a minute per kind. Plain HTTP sent to
the TLS port gets a 400 saying so, as Go's net/http answers.

TLS and basic auth come from an optional exporter-toolkit style web config (`specwatch.export.webconfig`);
when set, auth applies to every path and a refusal says nothing beyond `401` and `WWW-Authenticate: Basic`.
POST is taken only by the baselines API's write endpoints, which are refused (403) on a server without auth
unless it was started with them enabled (`--web.enable-admin-api`).
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import html
import io
import ipaddress
import json
import logging
import math
import socket
import ssl
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from email.message import Message
from email.utils import formatdate
from functools import partial
from http import HTTPStatus
from http.client import HTTPException, parse_headers
from typing import Any, Callable, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

from specwatch import __version__
from specwatch.export import webconfig
from specwatch.export.admin_api import PREFIX as BASELINES_PREFIX
from specwatch.export.admin_api import Answer, BaselineActions, Caller
from specwatch.export.advice import advice_document
from specwatch.export.prometheus import ExportErrors, SnapshotCollector, render_text
from specwatch.snapshot import Snapshot

log = logging.getLogger(__name__)

# The Prometheus "default port allocations" range 9100-9999 has been fully taken since 2023, so no free
# number exists there; 9448 is the default until specwatch registers one. Always bind loopback by default.
DEFAULT_PORT = 9448
DEFAULT_LISTEN_ADDRESS = f"127.0.0.1:{DEFAULT_PORT}"
# Prometheus asks for /metrics with a 10 s scrape timeout; these keep a scrape answered while hostile clients
# hold connections. The backlog is the kernel's maximum (net.core.somaxconn caps it), not http.server's 5.
LISTEN_BACKLOG = socket.SOMAXCONN
MAX_CONNECTIONS = 1024  # the unit allows 4096 file descriptors
SHUTDOWN_GRACE_SECONDS = 2.0  # at shutdown, for answers being written to finish
SLOW_HEAD_SECONDS = 1.0  # at the cap, a connection this long into its request head may be closed for a newcomer
HEAD_TIMEOUT_SECONDS = 10.0  # from a request's first byte to its last header (and for the TLS handshake)
IDLE_TIMEOUT_SECONDS = 120.0  # a kept-alive connection between requests (Prometheus scrapes every 15-60 s)
WRITE_TIMEOUT_SECONDS = 30.0  # a client that does not read its response
LINGER_SECONDS, LINGER_BYTES = 1.0, 1 << 20  # after a refusal, input drained so that the refusal is not lost
MAX_HEAD_BYTES = 16 * 1024  # request line and header fields (Prometheus sends about 300 bytes)
MAX_HEADERS = 64
MAX_BODY_BYTES = 64 * 1024  # only the baselines API's POSTs read theirs (an Alertmanager webhook's is dropped)
RENDER_WORKERS = 4  # /metrics renders serialize on the RenderCache anyway
AUTH_WORKERS = 2  # concurrent bcrypt checks: a flood of wrong passwords costs at most two cores
MAX_PENDING_AUTH = 64
# Below this size gzip costs more than it saves.
GZIP_MIN_BYTES = 1024
# Prometheus always asks for gzip; level 1 costs a third of level 6's CPU for about 15% more bytes.
GZIP_LEVEL = 1


class WebConfig(Protocol):
    def ssl_context(self) -> Any: ...

    def authorize(self, headers: Any) -> bool: ...

    def authorize_cached(self, headers: Any) -> bool | None:
        """The answer when it needs no bcrypt check, else None (then `authorize` runs on a worker)."""

    @property
    def auth_required(self) -> bool:
        """Whether requests need credentials (basic auth users are configured)."""


def load_web_config(path: str) -> WebConfig | None:
    """The optional `--web.config.file`; None when not given. Raises ConfigError listing its problems."""
    if not path:
        return None
    return webconfig.load_web_config(path)


def parse_listen_address(address: str) -> tuple[str, int]:
    """'127.0.0.1:9448' -> ('127.0.0.1', 9448); '[::1]:9448' -> ('::1', 9448); ':9448' -> all interfaces."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen address {address!r}: want HOST:PORT, e.g. {DEFAULT_LISTEN_ADDRESS}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def routes_document(snapshot: Snapshot) -> dict[str, Any]:
    """The /api/v1/routes JSON: every RouteState, plus when it was evaluated. Non-finite floats become null."""
    return _finite(
        {"timestamp": snapshot.timestamp, "version": __version__, "routes": [asdict(r) for r in snapshot.routes]}
    )


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


_INDEX = """<!doctype html>
<html><head><meta charset="utf-8"><title>specwatch</title></head>
<body><h1>specwatch {version}</h1>
<p>Speculative-decoding monitor for vLLM and SGLang.</p>
<ul>
<li><a href="metrics">/metrics</a>: Prometheus metrics</li>
<li><a href="api/v1/routes">/api/v1/routes</a>: routes as JSON</li>
<li><a href="api/v1/advice">/api/v1/advice</a>: routing advice as JSON (docs/routing.md)</li>
<li><a href="api/v1/baselines">/api/v1/baselines</a>: stored baselines as JSON (docs/runbook.md: fleet)</li>
<li><a href="-/healthy">/-/healthy</a>, <a href="-/ready">/-/ready</a></li>
</ul></body></html>
"""


# Escapings that leave specwatch's names (all legacy, no colons: tests/test_text_format.py) unchanged.
_NAME_PRESERVING_ESCAPINGS = (openmetrics.ALLOWUTF8, openmetrics.UNDERSCORES)


def own_writer_format(encoder: Callable[[CollectorRegistry], bytes]) -> bool | None:
    """Whether `encoder`, as chosen by client_python's `choose_encoder`, writes OpenMetrics (True) or the
    0.0.4 text format (False) that `render_text` reproduces byte for byte; None for any other encoder,
    which then renders through client_python. Prometheus asks for OpenMetrics 1.0.0 first; curl gets 0.0.4.
    """
    if encoder is generate_latest:
        return False
    if not isinstance(encoder, partial) or encoder.args:
        return None
    options = dict(encoder.keywords)
    if options.pop("escaping", openmetrics.UNDERSCORES) not in _NAME_PRESERVING_ESCAPINGS:
        return None
    if encoder.func is generate_latest and not options:
        return False
    if encoder.func is openmetrics.generate_latest and options in ({}, {"version": "1.0.0"}):
        return True
    return None


class RenderCache:
    """/metrics bodies of the current Snapshot, rendered once per Snapshot, format and encoding.

    A Snapshot is immutable, so every scrape of the same one (a pair of HA Prometheus servers, a scrape
    interval shorter than the evaluation interval, a curl beside Prometheus) gets the same bytes: they are
    rendered, and gzipped, once. Renders are serialized, and each renders the Snapshot it was asked for
    (pinned), never a newer one published meanwhile under the old one's key.
    """

    def __init__(self, get_snapshot: Callable[[], Snapshot], errors: ExportErrors | None = None) -> None:
        self._get_snapshot = get_snapshot
        self.errors = errors or ExportErrors()
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._bodies: dict[tuple[str, bool], tuple[bytes, bool]] = {}
        self._rendering: Snapshot | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(self._pinned, self.errors))
        self.renders = 0  # for tests: how many times the registry was encoded

    def _render(self, snapshot: Snapshot, encoder: Callable[[CollectorRegistry], bytes]) -> bytes:
        is_openmetrics = own_writer_format(encoder)
        if is_openmetrics is not None:  # the same bytes as client_python's, from export/text_format.py
            return render_text(snapshot, is_openmetrics, self.errors)
        self._rendering = snapshot
        try:
            return encoder(self.registry)
        finally:
            self._rendering = None

    def _pinned(self) -> Snapshot:
        return self._rendering if self._rendering is not None else self._get_snapshot()

    def body(self, accept: str, accept_encoding: str) -> tuple[bytes, str, bool]:
        """(body, content type, gzipped) for one scrape's Accept and Accept-Encoding headers."""
        encoder, content_type = choose_encoder(accept)
        with self._lock:
            answer = self._body(encoder, content_type, "gzip" in accept_encoding, render=True)
        assert answer is not None
        return answer

    def rendered_body(self, accept: str, accept_encoding: str) -> tuple[bytes, str, bool] | None:
        """`body()`'s answer when it is rendered already and no render is under way, else None: never waits,
        so the HTTP server's event loop answers most scrapes itself."""
        encoder, content_type = choose_encoder(accept)
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._body(encoder, content_type, "gzip" in accept_encoding, render=False)
        finally:
            self._lock.release()

    def _body(
        self, encoder: Callable[[CollectorRegistry], bytes], content_type: str, want_gzip: bool, render: bool
    ) -> tuple[bytes, str, bool] | None:
        snapshot = self._get_snapshot()
        if snapshot is not self._snapshot:
            if not render:
                return None
            self._snapshot, self._bodies = snapshot, {}
        cached = self._bodies.get((content_type, want_gzip))
        if cached is None:
            if not render:
                return None
            plain = self._bodies.get((content_type, False))
            if plain is None:
                plain = (self._render(snapshot, encoder), False)
                self.renders += 1
                self._bodies[(content_type, False)] = plain
            cached = plain
            if want_gzip and len(plain[0]) >= GZIP_MIN_BYTES:
                cached = (gzip.compress(plain[0], compresslevel=GZIP_LEVEL), True)
            self._bodies[(content_type, want_gzip)] = cached
        return cached[0], content_type, cached[1]


# ---------------------------------------------------------------------------------------------- the server
class _LimitLog:
    """At most one warning per kind a minute, saying how many more there were, so a flood cannot fill the log."""

    def __init__(self, every: float = 60.0) -> None:
        self._every = every
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def __call__(self, kind: str, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last.get(kind, -math.inf) < self._every:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return
        self._last[kind] = now
        more = self._suppressed.pop(kind, 0)
        log.warning("HTTP server: " + message + (f" ({more} more in the last minute)" if more else ""), *args)


class _Refused(Exception):
    """A request answered with an error status, after which the connection is closed."""

    def __init__(self, status: int, text: str, kind: str = "", headers: dict[str, str] | None = None) -> None:
        super().__init__(text)
        self.status, self.text, self.kind, self.headers = status, text, kind, headers or {}


class _Request:
    __slots__ = ("method", "path", "headers", "close", "body", "remote")

    def __init__(self, method: str, path: str, headers: Message, close: bool, body: bytes = b"") -> None:
        self.method, self.path, self.headers, self.close, self.body = method, path, headers, close, body
        self.remote = ""


class _Connection:
    """One client connection's task and what it is doing: "head" (waiting for or reading a request head),
    "busy" (being answered) or "idle" (kept alive between requests), since when."""

    __slots__ = ("sock", "task", "started", "writer", "state", "since")

    def __init__(self, sock: socket.socket, now: float) -> None:
        self.sock = sock
        self.task: asyncio.Task[None] | None = None
        self.started = False
        self.writer: asyncio.StreamWriter | None = None
        self.state, self.since = "head", now

    def now_in(self, state: str, now: float) -> None:
        self.state, self.since = state, now

    def drop(self, graceful: bool = False) -> None:
        """Close the connection; its task ends on the closed stream. At once unless `graceful`: a graceful close
        flushes what is being written and, on TLS, waits up to 30 s for the client's close_notify, which an idle
        keep-alive client never sends. (Python 3.10/3.11's wait_for can swallow a task's cancellation, so a task
        is cancelled only before it has streams. A task cancelled before it first ran never reaches its
        `finally`: then the socket, not yet watched by the loop, is closed here.)"""
        if self.writer is not None:
            if graceful:
                self.writer.close()
            else:
                self.writer.transport.abort()
        elif self.task is not None:
            self.task.cancel()
        if not self.started:
            self.sock.close()


class _Server:
    """The event loop's side: accepts, reads and checks requests, writes responses; `_handle` routes them."""

    def __init__(
        self,
        listener: socket.socket,
        get_snapshot: Callable[[], Snapshot],
        renders: RenderCache,
        web_config: WebConfig | None,
        ssl_context: ssl.SSLContext | None,
        admin: BaselineActions | None = None,
    ) -> None:
        self._listener = listener
        self._get_snapshot = get_snapshot
        self._renders = renders
        self._web_config = web_config
        self._ssl = ssl_context
        self._admin = admin
        self._workers = ThreadPoolExecutor(RENDER_WORKERS, thread_name_prefix="specwatch-http")
        self._auth_workers = ThreadPoolExecutor(AUTH_WORKERS, thread_name_prefix="specwatch-auth")
        # an admin action waits for the daemon's cycle to end: on a thread of its own, never a scrape's
        self._admin_workers = ThreadPoolExecutor(1, thread_name_prefix="specwatch-admin")
        self._auth_pending = 0
        self._connections: set[_Connection] = set()
        self._accept_task: asyncio.Task[None] | None = None
        self._limit_log = _LimitLog()
        self.loop = asyncio.new_event_loop()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    # -- accepting
    def start(self) -> None:
        self._accept_task = self.loop.create_task(self._accept_forever())

    async def _accept_forever(self) -> None:
        while True:
            try:
                sock, address = await self.loop.sock_accept(self._listener)
            except OSError as exc:  # out of file descriptors: let the kernel's backlog hold them meanwhile
                self._limit_log("accept", "accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            try:
                if len(self._connections) >= MAX_CONNECTIONS and not self._make_room():
                    self._limit_log(
                        "connections", "%d connections open, none idle or slow: refusing more", MAX_CONNECTIONS
                    )
                    self._refuse(sock)
                    continue
                connection = _Connection(sock, self.loop.time())
                self._connections.add(connection)
                connection.task = self.loop.create_task(self._connection(address, connection))
            except Exception:  # noqa: BLE001 - accepting must go on whatever one connection did
                log.exception("HTTP server: accepting a connection from %s failed", address)
                sock.close()

    def _make_room(self) -> bool:
        """Close the connection idle longest, else the one slowest to send its request head (beyond
        SLOW_HEAD_SECONDS: Prometheus sends its head in one packet); False when there is none."""
        now = self.loop.time()
        idle = [c for c in self._connections if c.state == "idle"]
        slow = [c for c in self._connections if c.state == "head" and now - c.since > SLOW_HEAD_SECONDS]
        candidates = idle or slow
        if not candidates:
            return False
        victim = min(candidates, key=lambda c: c.since)
        if not idle:
            self._limit_log("slow_evicted", "%d connections open: closed the slowest to send a request", len(slow))
        self._connections.discard(victim)
        victim.drop()
        return True

    def _refuse(self, sock: socket.socket) -> None:
        try:
            if self._ssl is None:  # a TLS client could not read a plain answer
                sock.setblocking(False)
                sock.send(_plain_response(503, b"Too many open connections.\n", close=True))
        except OSError:
            pass
        sock.close()

    async def _connection(self, address: Any, connection: _Connection) -> None:
        connection.started = True
        writer = None
        try:
            streams = await self._open(connection.sock)
            if streams is not None:
                reader, writer = streams
                connection.writer = writer
                await self._serve(reader, writer, connection)
        except (asyncio.TimeoutError, ConnectionError, ssl.SSLError, OSError) as exc:
            log.debug("HTTP connection from %s ended: %r", address, exc)
        except Exception:  # noqa: BLE001 - one connection's bug must not stop the server
            log.exception("HTTP connection from %s failed", address)
        finally:  # also when cancelled, to make room or at shutdown
            self._connections.discard(connection)
            if writer is not None:
                writer.close()
            connection.sock.close()

    async def _open(self, sock: socket.socket) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """Streams over `sock`; on a TLS port, a client that speaks plain HTTP gets a 400 and None."""
        reader = asyncio.StreamReader(limit=MAX_HEAD_BYTES)
        protocol = asyncio.StreamReaderProtocol(reader)
        tls = self._ssl
        if tls is not None:
            first = await asyncio.wait_for(self._peek(sock), HEAD_TIMEOUT_SECONDS)
            if not first:
                return None
            if first != b"\x16":  # not a TLS handshake record: answer as Go's net/http does
                tls = None
        transport, _ = await self.loop.connect_accepted_socket(
            lambda: protocol, sock, ssl=tls, ssl_handshake_timeout=HEAD_TIMEOUT_SECONDS if tls else None
        )
        writer = asyncio.StreamWriter(transport, protocol, reader, self.loop)
        if self._ssl is not None and tls is None:
            self._limit_log("plain_on_tls", "a client sent plain HTTP to the HTTPS port")
            refusal = _Refused(400, "Client sent an HTTP request to an HTTPS server.\n")
            try:
                await self._refuse_request(reader, writer, refusal)
            finally:
                writer.close()
            return None
        return reader, writer

    async def _peek(self, sock: socket.socket) -> bytes:
        readable: asyncio.Future[None] = self.loop.create_future()

        def ready() -> None:
            if not readable.done():
                readable.set_result(None)

        self.loop.add_reader(sock, ready)
        try:
            await readable
        finally:
            self.loop.remove_reader(sock)
        return sock.recv(1, socket.MSG_PEEK)

    # -- requests
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connection: _Connection) -> None:
        while True:
            # A request head must be whole HEAD_TIMEOUT_SECONDS after the connection was accepted (after its first
            # byte, on a kept-alive connection, which may first sit idle for IDLE_TIMEOUT_SECONDS).
            idle = connection.state == "idle"
            wait = IDLE_TIMEOUT_SECONDS if idle else connection.since + HEAD_TIMEOUT_SECONDS - self.loop.time()
            try:
                first = await asyncio.wait_for(reader.read(1), max(wait, 0.0))
            except asyncio.TimeoutError:
                if not idle:
                    self._limit_log("head_timeout", "a client sent no request within %gs", HEAD_TIMEOUT_SECONDS)
                return
            if not first:
                return
            if idle:
                connection.now_in("head", self.loop.time())
            try:
                left = connection.since + HEAD_TIMEOUT_SECONDS - self.loop.time()
                request = await self._read_request(first, reader, left)
                request.remote = _peer(connection.sock)
            except _Refused as refused:
                if refused.kind:
                    self._limit_log(refused.kind, "refused a request: %d %s", refused.status, refused.text.strip())
                connection.now_in("busy", self.loop.time())
                await self._refuse_request(reader, writer, refused)
                return
            connection.now_in("busy", self.loop.time())
            status, body, content_type, headers = await self._handle(request)
            if not request.close:  # from here it may be closed to make room for a newcomer
                connection.now_in("idle", self.loop.time())
            await self._write(writer, status, body, content_type, headers, request.close, request.method == "HEAD")
            if request.close:
                return

    async def _read_request(self, first: bytes, reader: asyncio.StreamReader, timeout: float) -> _Request:
        """One request's head, read within `timeout` and checked, and its body read and dropped. Raises _Refused."""
        try:
            request_line, fields = await asyncio.wait_for(self._read_head(first, reader), max(timeout, 0.0))
        except asyncio.TimeoutError:
            raise _Refused(408, "Request timeout.\n", "head_timeout") from None
        words = request_line.decode("latin-1").split()
        if len(words) != 3 or not words[2].startswith("HTTP/"):
            raise _Refused(400, "Bad request line.\n", "bad_request")
        method, target, version = words
        if version not in ("HTTP/1.0", "HTTP/1.1"):
            raise _Refused(505, "HTTP version not supported.\n", "bad_request")
        try:
            headers = parse_headers(io.BytesIO(b"".join(fields)))
        except (HTTPException, ValueError):
            raise _Refused(400, "Bad header fields.\n", "bad_request") from None
        if headers.defects:
            raise _Refused(400, "Bad header fields.\n", "bad_request")
        body = await self._read_body(headers, reader)
        connection = {t.strip().lower() for t in ",".join(headers.get_all("Connection") or ()).split(",")}
        close = "close" in connection or (version == "HTTP/1.0" and "keep-alive" not in connection)
        if method not in ("GET", "HEAD", "POST"):
            raise _Refused(405, "Method not allowed.\n", headers={"Allow": "GET, HEAD, POST"})
        return _Request(method, target.split("?", 1)[0], headers, close, body)

    @staticmethod
    async def _read_head(first: bytes, reader: asyncio.StreamReader) -> tuple[bytes, list[bytes]]:
        """The request line and the header lines (CRLF or bare LF, as http.server takes them), up to the blank
        line; raises _Refused when they are too many or too large."""
        too_large = _Refused(431, "Request header fields too large.\n", "head_size")
        lines: list[bytes] = []
        size = 0
        while True:
            try:
                line = await reader.readline()
            except ValueError:  # one line past the StreamReader's limit (MAX_HEAD_BYTES)
                raise too_large from None
            if first:
                line, first = first + line, b""
            if not line.endswith(b"\n"):
                raise ConnectionResetError("the client closed the connection mid-request")
            size += len(line)
            if size > MAX_HEAD_BYTES or len(lines) > MAX_HEADERS:
                raise too_large
            if line in (b"\r\n", b"\n") and lines:
                return lines[0], lines[1:]
            if line not in (b"\r\n", b"\n"):  # blank lines before the request line are skipped (RFC 9112)
                lines.append(line)

    async def _read_body(self, headers: Message, reader: asyncio.StreamReader) -> bytes:
        """Read a request's body, if any, so that it is never taken for the next request; only the baselines
        API's POSTs use it."""
        if headers.get_all("Transfer-Encoding"):
            raise _Refused(501, "Transfer-Encoding is not supported.\n", "bad_request")
        lengths = headers.get_all("Content-Length") or []
        if not lengths:
            return b""
        if len(lengths) > 1 or not lengths[0].strip().isdigit() or not lengths[0].strip().isascii():
            raise _Refused(400, "Bad or repeated Content-Length.\n", "bad_request")
        length = int(lengths[0])
        if length > MAX_BODY_BYTES:
            raise _Refused(413, "Request body too large.\n", "body_size")
        try:
            return await asyncio.wait_for(reader.readexactly(length), HEAD_TIMEOUT_SECONDS)
        except asyncio.TimeoutError:
            raise _Refused(408, "Request timeout.\n", "head_timeout") from None
        except asyncio.IncompleteReadError:
            raise ConnectionResetError("the client closed the connection mid-body") from None

    async def _refuse_request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, refused: _Refused
    ) -> None:
        """Answer `refused` and close, reading what the client still sends for a moment first: closing a
        socket with unread input resets the connection, and the client would lose the answer."""
        body = refused.text.encode()
        await self._write(writer, refused.status, body, "text/plain; charset=utf-8", refused.headers, True)
        if writer.can_write_eof():
            writer.write_eof()
        deadline = self.loop.time() + LINGER_SECONDS
        drained = 0
        while drained < LINGER_BYTES and (left := deadline - self.loop.time()) > 0:
            try:
                chunk = await asyncio.wait_for(reader.read(MAX_HEAD_BYTES), left)
            except (asyncio.TimeoutError, ConnectionError, OSError):
                return
            if not chunk:
                return
            drained += len(chunk)

    async def _write(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes,
        content_type: str,
        headers: dict[str, str] | None,
        close: bool,
        head_only: bool = False,
    ) -> None:
        writer.write(_plain_response(status, body, content_type, headers, close, head_only))
        if writer.transport.get_write_buffer_size():  # the kernel did not take it all: wait, for so long
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_SECONDS)

    async def _authorized(self, headers: Message) -> bool:
        web_config = self._web_config
        if web_config is None:
            return True
        decided = web_config.authorize_cached(headers)
        if decided is not None:
            return decided
        if self._auth_pending >= MAX_PENDING_AUTH:
            self._limit_log("auth_pending", "%d password checks waiting: refusing more", MAX_PENDING_AUTH)
            raise _Refused(503, "Too many password checks waiting.\n", headers={"Retry-After": "1"})
        self._auth_pending += 1
        try:
            return await self.loop.run_in_executor(self._auth_workers, web_config.authorize, headers)
        finally:
            self._auth_pending -= 1

    async def _handle(self, request: _Request) -> tuple[int, bytes, str, dict[str, str] | None]:
        """(status, body, content type, extra headers) for one request."""
        text = "text/plain; charset=utf-8"
        try:
            if not await self._authorized(request.headers):
                return 401, b"Unauthorized\n", text, {"WWW-Authenticate": 'Basic realm="specwatch"'}
        except _Refused as refused:
            request.close = True
            return refused.status, refused.text.encode(), text, {**refused.headers, "Connection": "close"}
        path = request.path
        if path == BASELINES_PREFIX or path.startswith(BASELINES_PREFIX + "/"):
            return await self._baselines(request)
        if request.method == "POST":
            return 405, b"Method not allowed.\n", text, {"Allow": "GET, HEAD"}
        if path == "/metrics":
            accept, accept_encoding = request.headers.get("Accept", ""), request.headers.get("Accept-Encoding", "")
            answer = self._renders.rendered_body(accept, accept_encoding)
            if answer is None:  # a render, on a worker
                answer = await self.loop.run_in_executor(self._workers, self._renders.body, accept, accept_encoding)
            body, content_type, gzipped = answer
            return 200, body, content_type, {"Content-Encoding": "gzip"} if gzipped else None
        if path == "/api/v1/routes":
            body = await self.loop.run_in_executor(self._workers, self._routes_json)
            return 200, body, "application/json", None
        if path == "/api/v1/advice":
            body = await self.loop.run_in_executor(self._workers, self._advice_json)
            return 200, body, "application/json", None
        if path == "/-/healthy":
            return 200, b"specwatch is healthy.\n", text, None
        if path == "/-/ready":
            if self._get_snapshot().timestamp > 0:
                return 200, b"specwatch is ready.\n", text, None
            return 503, b"specwatch is not ready: no evaluation completed yet.\n", text, None
        if path == "/":
            return 200, _INDEX.format(version=html.escape(__version__)).encode(), "text/html; charset=utf-8", None
        return 404, b"404 page not found\n", text, None

    async def _baselines(self, request: _Request) -> tuple[int, bytes, str, dict[str, str] | None]:
        """GET /api/v1/baselines, POST /api/v1/baselines/{route}/{accept|reset|adopt} (export/admin_api.py)."""
        text = "text/plain; charset=utf-8"
        admin = self._admin
        if admin is None:
            return 404, b"404 page not found\n", text, None
        rest = request.path[len(BASELINES_PREFIX) :].strip("/")
        if not rest:
            if request.method == "POST":
                return 405, b"Method not allowed.\n", text, {"Allow": "GET, HEAD"}
            return _json(await self.loop.run_in_executor(self._workers, admin.listing))
        parts = rest.split("/")
        if len(parts) != 2 or not parts[0]:
            return 404, b"404 page not found\n", text, None
        if request.method != "POST":
            return 405, b"Method not allowed.\n", text, {"Allow": "POST"}
        web_config = self._web_config
        if not (web_config is not None and web_config.auth_required) and not admin.enabled_without_auth:
            body = b"Admin APIs disabled: set basic auth in --web.config.file, or start with --web.enable-admin-api.\n"
            return 403, body, text, None
        route = urllib.parse.unquote(parts[0])
        try:
            fields = json.loads(request.body) if request.body.strip() else {}
        except ValueError:
            fields = None
        if not isinstance(fields, dict):
            return 400, b"The request body must be a JSON object.\n", text, None
        verified = web_config is not None and web_config.auth_required
        caller = Caller(_basic_user(request.headers) if verified else None, request.remote)
        return _json(await self.loop.run_in_executor(self._admin_workers, admin.act, route, parts[1], caller, fields))

    def _routes_json(self) -> bytes:
        return json.dumps(routes_document(self._get_snapshot()), allow_nan=False).encode()

    def _advice_json(self) -> bytes:
        return json.dumps(_finite(advice_document(self._get_snapshot(), time.time())), allow_nan=False).encode()

    # -- stopping
    async def close(self) -> None:
        if self._accept_task is not None:
            self._accept_task.cancel()
            await asyncio.gather(self._accept_task, return_exceptions=True)
        self._listener.close()
        tasks = [c.task for c in self._connections if c.task is not None]
        for connection in list(self._connections):
            connection.drop(graceful=connection.state == "busy")  # an answer being written may finish
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=SHUTDOWN_GRACE_SECONDS)
            if pending:
                for connection in list(self._connections):
                    connection.drop()
                await asyncio.wait(pending, timeout=1.0)
        self._workers.shutdown(wait=False, cancel_futures=True)
        self._auth_workers.shutdown(wait=False, cancel_futures=True)
        self._admin_workers.shutdown(wait=False, cancel_futures=True)


def _peer(sock: socket.socket) -> str:
    try:
        peer = sock.getpeername()
    except OSError:
        return ""
    return f"[{peer[0]}]:{peer[1]}" if ":" in str(peer[0]) else f"{peer[0]}:{peer[1]}"


def _basic_user(headers: Message) -> str | None:
    """The user named by a basic-auth header (already checked by the web config), None without one."""
    scheme, _, token = (headers.get("Authorization") or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        return base64.b64decode(token.strip(), validate=True).decode("utf-8").partition(":")[0]
    except (ValueError, UnicodeDecodeError):
        return None


def _json(answer: Answer) -> tuple[int, bytes, str, dict[str, str] | None]:
    return answer.status, json.dumps(_finite(answer.document), allow_nan=False).encode(), "application/json", None


def _plain_response(
    status: int,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
    headers: dict[str, str] | None = None,
    close: bool = False,
    head_only: bool = False,
) -> bytes:
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        f"Server: specwatch/{__version__}",
        f"Date: {formatdate(usegmt=True)}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    if close:
        lines.append("Connection: close")
    return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + (b"" if head_only else body)


class MetricsServer:
    """A running HTTP server; `shutdown()` stops it and closes the socket."""

    def __init__(self, server: _Server, thread: threading.Thread, scheme: str) -> None:
        self._server, self._thread = server, thread
        self._stopped = False
        host, port = server.address
        self.port = int(port)
        display = f"[{host}]" if ":" in str(host) else host
        self.url = f"{scheme}://{display}:{port}"

    def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        loop = self._server.loop
        asyncio.run_coroutine_threadsafe(self._server.close(), loop).result(timeout=5)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout=5)


def serve(
    address: str,
    get_snapshot: Callable[[], Snapshot],
    web_config: WebConfig | None = None,
    errors: ExportErrors | None = None,
    admin: BaselineActions | None = None,
) -> MetricsServer:
    """Start serving in a background thread. Raises ValueError (bad address) or OSError (cannot bind).
    `errors` counts the exporters' own failures (shared with the OTLP export, so /metrics shows its errors);
    `admin` serves /api/v1/baselines (None: 404 there)."""
    host, port = parse_listen_address(address)
    family = socket.AF_INET6 if _is_ipv6(host) else socket.AF_INET
    # "[::]" takes IPv4 too, as http.server's socket did by the kernel's default
    dualstack = family == socket.AF_INET6 and ipaddress.ip_address(host).is_unspecified and socket.has_dualstack_ipv6()
    listener = socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG, dualstack_ipv6=dualstack)
    listener.setblocking(False)
    ssl_context = web_config.ssl_context() if web_config is not None else None
    server = _Server(listener, get_snapshot, RenderCache(get_snapshot, errors), web_config, ssl_context, admin)
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(server.loop)
        server.start()
        server.loop.call_soon(started.set)
        try:
            server.loop.run_forever()
        finally:
            server.loop.close()

    thread = threading.Thread(target=run, name="specwatch-http", daemon=True)
    thread.start()
    started.wait(5)
    return MetricsServer(server, thread, "https" if ssl_context is not None else "http")


def _is_ipv6(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
    except ValueError:
        return False
