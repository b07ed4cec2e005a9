"""The HTTP endpoint: /metrics, /api/v1/routes, /-/healthy, /-/ready and a tiny index page.

A stdlib `ThreadingHTTPServer` (one thread per connection, so a slow client never blocks a scrape) over a
private `CollectorRegistry` holding only the snapshot collector. TLS and basic auth come from an optional
exporter-toolkit style web config (`specwatch.export.webconfig`); when set, auth applies to every path and
a refusal says nothing beyond `401` and `WWW-Authenticate: Basic`.
"""

from __future__ import annotations

import gzip
import html
import ipaddress
import json
import logging
import math
import socket
import ssl
import threading
from dataclasses import asdict
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

from specwatch import __version__
from specwatch.export import webconfig
from specwatch.export.prometheus import ExportErrors, SnapshotCollector, render_text
from specwatch.snapshot import Snapshot

log = logging.getLogger(__name__)

# The Prometheus "default port allocations" range 9100-9999 has been fully taken since 2023, so no free
# number exists there; 9448 is the default until specwatch registers one. Always bind loopback by default.
DEFAULT_PORT = 9448
DEFAULT_LISTEN_ADDRESS = f"127.0.0.1:{DEFAULT_PORT}"
# A client that sends nothing for this long loses its connection (and its thread).
REQUEST_TIMEOUT_SECONDS = 30.0
# Below this size gzip costs more than it saves.
GZIP_MIN_BYTES = 1024
# Prometheus always asks for gzip. For the 64-route, 8-GPU /metrics (175 KB), level 1 took 1.25 ms and wrote
# 23.8 KB where level 6 took 3.67 ms for 20.4 KB: a third of the CPU for 3.4 KB more per scrape.
GZIP_LEVEL = 1


class WebConfig(Protocol):
    def ssl_context(self) -> Any: ...

    def authorize(self, headers: Any) -> bool: ...


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
        if is_openmetrics is not None:  # specwatch's own writer: the same bytes, a third to an eighth of the CPU
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
        want_gzip = "gzip" in accept_encoding
        with self._lock:
            snapshot = self._get_snapshot()
            if snapshot is not self._snapshot:
                self._snapshot, self._bodies = snapshot, {}
            cached = self._bodies.get((content_type, want_gzip))
            if cached is None:
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


def _make_handler(
    get_snapshot: Callable[[], Snapshot], renders: RenderCache, web_config: WebConfig | None
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = f"specwatch/{__version__}"
        protocol_version = "HTTP/1.1"  # keep-alive for Prometheus' connection reuse
        timeout = REQUEST_TIMEOUT_SECONDS

        def setup(self) -> None:
            super().setup()  # applies the timeout, which then bounds the TLS handshake too
            if isinstance(self.connection, ssl.SSLSocket):
                self.connection.do_handshake()

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if web_config is not None and not web_config.authorize(self.headers):
                self._send(
                    401, b"Unauthorized\n", "text/plain; charset=utf-8", {"WWW-Authenticate": 'Basic realm="specwatch"'}
                )
                return
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._metrics()
            elif path == "/api/v1/routes":
                body = json.dumps(routes_document(get_snapshot()), allow_nan=False).encode()
                self._send(200, body, "application/json")
            elif path == "/-/healthy":
                self._send(200, b"specwatch is healthy.\n", "text/plain; charset=utf-8")
            elif path == "/-/ready":
                if get_snapshot().timestamp > 0:
                    self._send(200, b"specwatch is ready.\n", "text/plain; charset=utf-8")
                else:
                    self._send(
                        503, b"specwatch is not ready: no evaluation completed yet.\n", "text/plain; charset=utf-8"
                    )
            elif path == "/":
                self._send(200, _INDEX.format(version=html.escape(__version__)).encode(), "text/html; charset=utf-8")
            else:
                self._send(404, b"404 page not found\n", "text/plain; charset=utf-8")

        def _metrics(self) -> None:
            body, content_type, gzipped = renders.body(
                self.headers.get("Accept", ""), self.headers.get("Accept-Encoding", "")
            )
            self._send(200, body, content_type, {"Content-Encoding": "gzip"} if gzipped else None)

        def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_HEAD = do_GET  # noqa: N815

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("%s %s", self.address_string(), fmt % args)

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # never let a stuck client hold up shutdown

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client hanging up mid-response (or failing a TLS handshake) is routine, not a stack trace.
        log.debug("HTTP request from %s failed", client_address, exc_info=True)


class MetricsServer:
    """A running HTTP server; `shutdown()` stops it and closes the socket."""

    def __init__(self, server: _Server, thread: threading.Thread, scheme: str) -> None:
        self._server, self._thread = server, thread
        host, port = str(server.server_address[0]), int(server.server_address[1])
        self.port = port
        display = f"[{host}]" if ":" in str(host) else host
        self.url = f"{scheme}://{display}:{port}"

    def shutdown(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve(
    address: str,
    get_snapshot: Callable[[], Snapshot],
    web_config: WebConfig | None = None,
    errors: ExportErrors | None = None,
) -> MetricsServer:
    """Start serving in a background thread. Raises ValueError (bad address) or OSError (cannot bind).
    `errors` counts the exporters' own failures (shared with the OTLP export, so /metrics shows its errors)."""
    host, port = parse_listen_address(address)
    server_cls: type[_Server] = _Server
    if _is_ipv6(host):
        server_cls = type("_Server6", (_Server,), {"address_family": socket.AF_INET6})
    server = server_cls((host, port), _make_handler(get_snapshot, RenderCache(get_snapshot, errors), web_config))
    scheme = "http"
    ssl_context = web_config.ssl_context() if web_config is not None else None
    if ssl_context is not None:
        # Handshake lazily, in the connection's own thread, so a slow TLS client cannot stall accept().
        server.socket = ssl_context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        scheme = "https"
    thread = threading.Thread(target=server.serve_forever, name="specwatch-http", daemon=True)
    thread.start()
    return MetricsServer(server, thread, scheme)


def _is_ipv6(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
    except ValueError:
        return False
