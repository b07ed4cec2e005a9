"""The HTTP endpoint: /metrics, /api/v1/routes, /api/v1/advice, /api/v1/baselines (export/admin_api.py), /-/healthy,
/-/ready and a tiny index page.

An ASGI application served by uvicorn (httptools' parser, as vLLM and SGLang serve) on one background thread,
over a private `CollectorRegistry` holding only the snapshot collector. Each connection is a coroutine, so an
idle, slow or hostile client costs a little memory, never a thread, and a scrape never queues behind one; the
work that takes CPU (rendering /metrics, a bcrypt check) runs on small thread pools. Everything a client
controls is bounded: the connections open (beyond MAX_CONNECTIONS a request gets 503), the time to send a
request head (HEAD_TIMEOUT_SECONDS) and to sit idle between requests, the head's size and field count (431),
the body (413), and password checks waiting (503). Limits that bite are logged, at most once a minute per kind.

TLS and basic auth come from an optional exporter-toolkit style web config (`specwatch.export.webconfig`),
whose own SSLContext uvicorn serves (so rotated certificate files are picked up at the next handshake); when
set, auth applies to every path and a refusal says nothing beyond `401` and `WWW-Authenticate: Basic`. POST is
taken only by the baselines API's write endpoints, which are refused (403) on a server without auth unless it
was started with them enabled (`--web.enable-admin-api`).
"""

from __future__ import annotations

import asyncio
import gzip
import html
import ipaddress
import json
import logging
import math
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from functools import partial
from http import HTTPStatus
from typing import Any, Callable, Protocol

import uvicorn
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

from specwatch import __version__
from specwatch.export import webconfig
from specwatch.export.webconfig import parse_basic_authorization
from specwatch.export.admin_api import PREFIX as BASELINES_PREFIX
from specwatch.export.admin_api import Answer, Audit, BaselineActions, Caller, admin_target, remote_address, same_origin
from specwatch.export.advice import advice_document
from specwatch.export.prometheus import AdminRequests, ExportErrors, SnapshotCollector, render_text
from specwatch.snapshot import Snapshot
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

# The Prometheus "default port allocations" range 9100-9999 has been fully taken since 2023, so no free
# number exists there; 9448 is the default until specwatch registers one. Always bind loopback by default.
DEFAULT_PORT = 9448
DEFAULT_LISTEN_ADDRESS = f"127.0.0.1:{DEFAULT_PORT}"
# Prometheus asks for /metrics with a 10 s scrape timeout; these keep a scrape answered while hostile clients
# hold connections. The backlog is the kernel's maximum (net.core.somaxconn caps it), not http.server's 5.
LISTEN_BACKLOG = socket.SOMAXCONN
MAX_CONNECTIONS = 1024  # the unit allows 4096 file descriptors; uvicorn's limit_concurrency
SHUTDOWN_GRACE_SECONDS = 2  # at shutdown, for answers being written to finish
HEAD_TIMEOUT_SECONDS = 10.0  # from a request's first byte (a connection's start) to its last header
IDLE_TIMEOUT_SECONDS = 120  # a kept-alive connection between requests (Prometheus scrapes every 15-60 s)
MAX_HEAD_BYTES = 16 * 1024  # request line and header fields (Prometheus sends about 300 bytes)
MAX_HEADERS = 64
MAX_BODY_BYTES = 64 * 1024  # an admin POST's JSON; an Alertmanager webhook's body is read and dropped
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

    @property
    def admin_identity_required(self) -> bool:
        """Whether admin POSTs need an admin user or client-certificate subject."""

    def is_admin(self, user: str | None, cert_subject: str | None) -> bool: ...

    def host_allowed(self, host: str) -> bool: ...

    def origin_allowed(self, origin: str) -> bool: ...


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

    def __init__(
        self,
        get_snapshot: Callable[[], Snapshot],
        errors: ExportErrors | None = None,
        admin: AdminRequests | None = None,
    ) -> None:
        self._get_snapshot = get_snapshot
        self.errors = errors or ExportErrors()
        self.admin = admin
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._bodies: dict[tuple[str, bool], tuple[bytes, bool]] = {}
        self._rendering: Snapshot | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(self._pinned, self.errors, admin))
        self.renders = 0  # for tests: how many times the registry was encoded

    def _render(self, snapshot: Snapshot, encoder: Callable[[CollectorRegistry], bytes]) -> bytes:
        is_openmetrics = own_writer_format(encoder)
        if is_openmetrics is not None:  # the same bytes as client_python's, from export/text_format.py
            return render_text(snapshot, is_openmetrics, self.errors, self.admin)
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
class _LimitLog(logging.Filter):
    """Lets a warning of one kind through at most once a minute, saying how many more there were, so a flood
    cannot fill the log. As a filter on uvicorn's logger it passes warnings and errors only, its start-up chatter
    not, and keys them on their message template ("Invalid HTTP request received.", "Exceeded concurrency
    limit.")."""

    def __init__(self, every: float = 60.0) -> None:
        super().__init__()
        self._every = every
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def allow(self, kind: str) -> tuple[bool, int]:
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(kind, -math.inf) < self._every:
                self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
                return False, 0
            self._last[kind] = now
            return True, self._suppressed.pop(kind, 0)

    def __call__(self, kind: str, message: str, *args: Any) -> None:
        allowed, more = self.allow(kind)
        if allowed:
            log.warning("HTTP server: " + message + (f" ({more} more in the last minute)" if more else ""), *args)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return False
        allowed, more = self.allow(str(record.msg))
        if allowed and more:
            record.msg = f"{record.msg} ({more} more in the last minute)"
        return allowed


_LIMIT_LOG = _LimitLog()
logging.getLogger("uvicorn.error").addFilter(_LIMIT_LOG)


class _Refused(Exception):
    def __init__(self, status: int, text: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(text)
        self.status, self.text, self.headers = status, text, headers or {}


class _Headers(dict[str, str]):
    """A request's header fields by lower-case name (a repeated field's values joined by ", "), with the
    case-insensitive `get` that WebConfig.authorize expects."""

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        super().__init__()
        for name, value in raw:
            key, text = name.decode("latin-1"), value.decode("latin-1")
            self[key] = f"{self[key]}, {text}" if key in self else text

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.lower(), default)


_Response = tuple[int, bytes, str, "dict[str, str] | None"]
_TEXT = "text/plain; charset=utf-8"


class _App:
    """The ASGI application: every path and its answer. Authentication comes first on every path; the work that
    takes CPU (a render, a bcrypt check, the JSON documents) runs on small thread pools."""

    def __init__(
        self,
        get_snapshot: Callable[[], Snapshot],
        renders: RenderCache,
        web_config: WebConfig | None,
        admin: BaselineActions | None,
        admin_requests: AdminRequests,
    ) -> None:
        self._get_snapshot = get_snapshot
        self._renders = renders
        self._admin_requests = admin_requests
        self._web_config = web_config
        self._admin = admin
        self._workers = ThreadPoolExecutor(RENDER_WORKERS, thread_name_prefix="specwatch-http")
        self._auth_workers = ThreadPoolExecutor(AUTH_WORKERS, thread_name_prefix="specwatch-auth")
        # An accept waits for the daemon's cycle: on the render workers, a few waiting accepts would starve /metrics.
        self._admin_workers = ThreadPoolExecutor(1, thread_name_prefix="specwatch-admin")
        self._auth_pending = 0

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":  # lifespan is off and websockets are not served
            return
        headers = _Headers(scope["headers"])
        try:
            request_body = await self._read_body(headers, receive)
            status, body, content_type, extra = await self._handle(scope, headers, request_body)
        except _Refused as refused:
            status, body, content_type, extra = refused.status, refused.text.encode(), _TEXT, refused.headers
        fields = [
            (b"server", SERVER_HEADER),
            (b"content-type", content_type.encode()),
            (b"content-length", str(len(body)).encode()),
            *((k.lower().encode(), v.encode("latin-1")) for k, v in (extra or {}).items()),
        ]
        await send({"type": "http.response.start", "status": status, "headers": fields})
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    async def _read_body(headers: _Headers, receive: Callable[..., Any]) -> bytes:
        """The request's body, refused (413) beyond MAX_BODY_BYTES before it is read when its length is declared."""
        length = headers.get("Content-Length", "")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            raise _Refused(413, "Request body too large.\n", {"Connection": "close"})
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > MAX_BODY_BYTES:
                raise _Refused(413, "Request body too large.\n", {"Connection": "close"})
            if not message.get("more_body"):
                return body

    async def _authorized(self, headers: _Headers) -> bool:
        web_config = self._web_config
        if web_config is None:
            return True
        decided = web_config.authorize_cached(headers)
        if decided is not None:
            return decided
        if self._auth_pending >= MAX_PENDING_AUTH:
            _LIMIT_LOG("auth_pending", "%d password checks waiting: refusing more", MAX_PENDING_AUTH)
            raise _Refused(503, "Too many password checks waiting.\n", {"Retry-After": "1"})
        self._auth_pending += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._auth_workers, web_config.authorize, headers)
        finally:
            self._auth_pending -= 1

    async def _handle(self, scope: dict[str, Any], headers: _Headers, request_body: bytes) -> _Response:
        """(status, body, content type, extra headers) for one request."""
        method = scope["method"]
        if method not in ("GET", "HEAD", "POST"):
            return 405, b"Method not allowed.\n", _TEXT, {"Allow": "GET, HEAD, POST"}
        target = admin_target(method, scope["raw_path"].decode("latin-1")) if self._admin is not None else None
        audit = Audit(self._admin_requests, target, remote_address(scope.get("client")))
        web_config = self._web_config
        if web_config is not None and not web_config.host_allowed(headers.get("Host", "")):
            _LIMIT_LOG("host", "refused a request for Host %r, not in allowed_hosts", headers.get("Host", "")[:100])
            return _refuse(audit, 421, "misdirected", "Misdirected request: this Host is not served.\n")
        cert_subject = scope.get("extensions", {}).get("tls", {}).get("client_cert_name")
        cert_admin = web_config is not None and web_config.is_admin(None, cert_subject)
        if not cert_admin and not await self._authorized(headers):
            status, body, content_type, extra = _refuse(audit, 401, "unauthorized", "Unauthorized\n")
            return status, body, content_type, {"WWW-Authenticate": 'Basic realm="specwatch"'}
        if target is not None:
            user = None
            if web_config is not None and web_config.auth_required:  # verified by _authorized
                user = (parse_basic_authorization(headers.get("Authorization")) or (None, ""))[0]
            return await self._admin_post(headers, request_body, target, audit, user, cert_subject)
        path = scope["path"]
        if path == BASELINES_PREFIX or path.startswith(BASELINES_PREFIX + "/"):
            return await self._baselines(method, scope["raw_path"].decode("latin-1"))
        if method == "POST":
            return 405, b"Method not allowed.\n", _TEXT, {"Allow": "GET, HEAD"}
        loop = asyncio.get_running_loop()
        if path == "/metrics":
            accept, accept_encoding = headers.get("Accept", ""), headers.get("Accept-Encoding", "")
            answer = self._renders.rendered_body(accept, accept_encoding)
            if answer is None:  # a render, on a worker
                answer = await loop.run_in_executor(self._workers, self._renders.body, accept, accept_encoding)
            body, content_type, gzipped = answer
            return 200, body, content_type, {"Content-Encoding": "gzip"} if gzipped else None
        if path == "/api/v1/routes":
            return 200, await loop.run_in_executor(self._workers, self._routes_json), "application/json", None
        if path == "/api/v1/advice":
            return 200, await loop.run_in_executor(self._workers, self._advice_json), "application/json", None
        if path == "/-/healthy":
            return 200, b"specwatch is healthy.\n", _TEXT, None
        if path == "/-/ready":
            if self._get_snapshot().timestamp > 0:
                return 200, b"specwatch is ready.\n", _TEXT, None
            return 503, b"specwatch is not ready: no evaluation completed yet.\n", _TEXT, None
        if path == "/":
            return 200, _INDEX.format(version=html.escape(__version__)).encode(), "text/html; charset=utf-8", None
        return 404, b"404 page not found\n", _TEXT, None

    async def _admin_post(
        self,
        headers: _Headers,
        request_body: bytes,
        target: tuple[str, str],
        audit: Audit,
        user: str | None,
        cert_subject: str | None,
    ) -> _Response:
        """POST /api/v1/baselines/{route}/{action}: refused unless the caller is an admin and the request could
        not have been sent by a page on another origin (a browser sends a cross-origin POST without asking only
        with a form or text/plain body, and always names its Origin); then the action, on a worker."""
        admin, web_config = self._admin, self._web_config
        assert admin is not None
        audit.user = user or cert_subject
        if web_config is not None and web_config.admin_identity_required:
            if not web_config.is_admin(user, cert_subject):
                text = "Forbidden: not an admin (admin_users or admin_client_cert_subjects in --web.config.file).\n"
                return _refuse(audit, 403, "forbidden", text)
        elif not admin.enabled_without_auth:
            text = "Admin APIs disabled: set admin_users in --web.config.file, or start with --web.enable-admin-api.\n"
            return _refuse(audit, 403, "forbidden", text)
        origin = headers.get("Origin")
        if origin is not None and not same_origin(origin, headers.get("Host", "")):
            if web_config is None or not web_config.origin_allowed(origin):
                return _refuse(audit, 403, "cross_origin", "Forbidden: cross-origin request (Origin).\n")
        if headers.get("Content-Type", "").split(";", 1)[0].strip().lower() != "application/json":
            return _refuse(audit, 415, "cross_origin", "Unsupported media type: send Content-Type: application/json.\n")
        try:
            document = json.loads(request_body) if request_body.strip() else {}
        except ValueError:
            document = None
        if not isinstance(document, dict):
            return _refuse(audit, 400, "bad_request", "Bad request: the body must be a JSON object.\n")
        route, action = target
        caller = Caller(user=audit.user, remote=audit.remote)
        loop = asyncio.get_running_loop()
        answer = await loop.run_in_executor(self._admin_workers, admin.act, route, action, caller, document)
        audit.answered(answer)
        return _json(answer)

    async def _baselines(self, method: str, raw_path: str) -> _Response:
        """GET /api/v1/baselines (the POSTs are `_admin_post`)."""
        admin = self._admin
        if admin is None:
            return 404, b"404 page not found\n", _TEXT, None
        rest = raw_path[len(BASELINES_PREFIX) :].strip("/")
        if rest:
            if len(rest.split("/")) == 2 and method != "POST":
                return 405, b"Method not allowed.\n", _TEXT, {"Allow": "POST"}
            return 404, b"404 page not found\n", _TEXT, None
        if method == "POST":
            return 405, b"Method not allowed.\n", _TEXT, {"Allow": "GET, HEAD"}
        loop = asyncio.get_running_loop()
        return _json(await loop.run_in_executor(self._workers, admin.listing))

    def _routes_json(self) -> bytes:
        return json.dumps(routes_document(self._get_snapshot()), allow_nan=False).encode()

    def _advice_json(self) -> bytes:
        return json.dumps(_finite(advice_document(self._get_snapshot(), time.time())), allow_nan=False).encode()

    def close(self) -> None:
        self._workers.shutdown(wait=False, cancel_futures=True)
        self._auth_workers.shutdown(wait=False, cancel_futures=True)
        self._admin_workers.shutdown(wait=False, cancel_futures=True)


def _refuse(audit: Audit, status: int, outcome: str, text: str) -> _Response:
    audit.record(status, outcome)
    return status, text.encode(), _TEXT, None


def _json(answer: Answer) -> _Response:
    return answer.status, json.dumps(_finite(answer.document), allow_nan=False).encode(), "application/json", None


SERVER_HEADER = f"specwatch/{__version__}".encode()


class _Protocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol (httptools) plus the limits it leaves to a proxy in front: a request head must
    arrive whole within HEAD_TIMEOUT_SECONDS of its first byte (of the connection, for the first request, so the
    TLS handshake counts) and within MAX_HEAD_BYTES and MAX_HEADERS, else 408 or 431 and the connection closes.
    Slowloris clients are cut there; uvicorn's keep-alive timeout covers the idle time between requests."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._client_cert_name = _subject_name(transport.get_extra_info("peercert"))
        self._head_bytes, self._head_fields, self._in_head = 0, 0, True
        self._head_timer: asyncio.TimerHandle | None = self.loop.call_later(HEAD_TIMEOUT_SECONDS, self._head_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
            self._refuse(431, "Request header fields too large.\n", "head_size")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._client_cert_name is not None:  # the ASGI TLS extension's field, for the admin check
            self.scope["extensions"] = {"tls": {"client_cert_name": self._client_cert_name}}
        if not self._in_head:  # the next request on a kept-alive connection: its head gets its own time
            self._in_head, self._head_bytes, self._head_fields = True, 0, 0
            self._head_timer = self.loop.call_later(HEAD_TIMEOUT_SECONDS, self._head_timeout)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_fields += 1
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._stop_head_timer()
        if self._head_fields > MAX_HEADERS:
            self._refuse(431, "Request header fields too large.\n", "head_size")
            return
        super().on_headers_complete()

    def shutdown(self) -> None:
        """At shutdown an idle connection is aborted: a graceful TLS close waits for the client's close_notify,
        which an idle keep-alive client (Prometheus between scrapes) never sends."""
        if self.cycle is None or self.cycle.response_complete:
            self.transport.abort()
        else:
            super().shutdown()

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            if self._head_bytes:
                self._refuse(408, "Request timeout.\n", "head_timeout")
            else:  # nothing sent: nothing to answer
                self.transport.close()

    def _refuse(self, status: int, text: str, kind: str) -> None:
        _LIMIT_LOG(kind, "refused a request: %d %s", status, text.strip())
        self._in_head = False
        self._stop_head_timer()
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nserver: {SERVER_HEADER.decode()}\r\n"
            f"content-type: {_TEXT}\r\ncontent-length: {len(text)}\r\nconnection: close\r\n\r\n{text}"
        )
        self.transport.write(head.encode("latin-1"))
        self.transport.close()


# getpeercert()'s attribute names -> RFC 4514's (the rest keep their long names)
_RDN_NAMES = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}


def _subject_name(peercert: Any) -> str | None:
    """A verified client certificate's subject as RFC 4514 writes it ("CN=ops,O=example": the last RDN first,
    as Go's pkix.Name.String() and `openssl x509 -subject -nameopt RFC2253` do); None without one."""
    if not peercert or not peercert.get("subject"):
        return None

    def escape(value: str) -> str:
        value = "".join("\\" + c if c in ',+"\\<>;' else c for c in value)
        if value.startswith(("#", " ")):
            value = "\\" + value
        return value[:-1] + "\\ " if value.endswith(" ") else value

    rdns = ["+".join(f"{_RDN_NAMES.get(k, k)}={escape(v)}" for k, v in rdn) for rdn in peercert["subject"]]
    return ",".join(reversed(rdns))


class _Loop(asyncio.SelectorEventLoop):
    """The server thread's loop: a TLS handshake gets HEAD_TIMEOUT_SECONDS, not asyncio's 60 s (uvicorn has no
    setting for it), so a client that opens connections and never finishes its handshake is cut as early as one
    that never finishes its request head; until then it is not among the connections uvicorn counts."""

    async def create_server(self, *args: Any, **kwargs: Any) -> asyncio.Server:
        if kwargs.get("ssl") is not None:
            kwargs.setdefault("ssl_handshake_timeout", HEAD_TIMEOUT_SECONDS)
        return await super().create_server(*args, **kwargs)


class MetricsServer:
    """A running HTTP server; `shutdown()` stops it and closes the socket."""

    def __init__(self, server: uvicorn.Server, app: _App, thread: threading.Thread, address: Any, scheme: str) -> None:
        self._server, self._app, self._thread = server, app, thread
        self._stopped = False
        host, port = address[:2]
        self.port = int(port)
        display = f"[{host}]" if ":" in str(host) else host
        self.url = f"{scheme}://{display}:{port}"

    def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._server.should_exit = True
        self._thread.join(timeout=SHUTDOWN_GRACE_SECONDS + 5)
        self._app.close()


def serve(
    address: str,
    get_snapshot: Callable[[], Snapshot],
    web_config: WebConfig | None = None,
    errors: ExportErrors | None = None,
    admin: BaselineActions | None = None,
    admin_requests: AdminRequests | None = None,
) -> MetricsServer:
    """Start serving in a background thread. Raises ValueError (bad address) or OSError (cannot bind).
    `errors` counts the exporters' own failures (shared with the OTLP export, so /metrics shows its errors);
    `admin` serves /api/v1/baselines (None: 404 there), its requests counted in `admin_requests`."""
    host, port = parse_listen_address(address)
    family = socket.AF_INET6 if _is_ipv6(host) else socket.AF_INET
    # "[::]" takes IPv4 too, as http.server's socket did by the kernel's default
    dualstack = family == socket.AF_INET6 and ipaddress.ip_address(host).is_unspecified and socket.has_dualstack_ipv6()
    listener = socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG, dualstack_ipv6=dualstack)
    ssl_context = web_config.ssl_context() if web_config is not None else None
    admin_requests = admin_requests or AdminRequests()
    app = _App(get_snapshot, RenderCache(get_snapshot, errors, admin_requests), web_config, admin, admin_requests)
    config = uvicorn.Config(
        app,
        http=_Protocol,
        ws="none",
        lifespan="off",
        interface="asgi3",
        log_config=None,  # the daemon's logging stays as configured; _LIMIT_LOG filters uvicorn's warnings
        access_log=False,
        server_header=False,
        backlog=LISTEN_BACKLOG,
        limit_concurrency=MAX_CONNECTIONS,
        timeout_keep_alive=IDLE_TIMEOUT_SECONDS,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS,
        # our context, not one built from ssl_* file names: its SNI callback reloads rotated certificate files
        ssl_context_factory=(lambda _config, _default: ssl_context) if ssl_context is not None else None,
    )
    server = uvicorn.Server(config)

    def run() -> None:
        loop = _Loop()
        try:
            loop.run_until_complete(server.serve(sockets=[listener]))
        finally:
            loop.close()
            listener.close()

    thread = threading.Thread(target=run, name="specwatch-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not server.started:
        server.should_exit = True
        raise OSError(f"the HTTP server on {address} did not start")
    return MetricsServer(server, app, thread, listener.getsockname(), "https" if ssl_context is not None else "http")


def _is_ipv6(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
    except ValueError:
        return False
