"""A loopback engine that demands credentials: a reverse proxy in front of a fake engine (the simulator, a
stub) that answers 401 to any request without the expected `Authorization` header, or, serving TLS, refuses a
client without a certificate from its CA. As a vLLM started with `--api-key`, or an engine behind an
authenticating proxy, does; here every path is guarded, /metrics too."""

from __future__ import annotations

import http.client
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

_FORWARDED = ("Content-Type", "Accept")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def handle_error(self, request, client_address) -> None:
        pass  # refused TLS handshakes are what some tests are for


class GuardedEngine:
    """`authorization`: the exact header value required (None: none). `tls`: (CA, server cert, server key)
    to serve HTTPS that requires a client certificate from that CA. `seen`: (method, path, answered status)."""

    def __init__(
        self, upstream: str, authorization: str | None = None, tls: tuple[Path, Path, Path] | None = None
    ) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.authorization = authorization
        self.seen: list[tuple[str, str, int]] = []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - stdlib naming
                self.forward()

            def do_POST(self) -> None:  # noqa: N802 - stdlib naming
                self.forward()

            def forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if engine.authorization is not None and self.headers.get("Authorization") != engine.authorization:
                    self.reply(401, {"Content-Type": "application/json"}, b'{"error": "Unauthorized"}')
                    return
                upstream = http.client.HTTPConnection(*engine.upstream, timeout=60)
                try:
                    headers = {h: self.headers[h] for h in _FORWARDED if self.headers.get(h)}
                    upstream.request(self.command, self.path, body=body or None, headers=headers)
                    response = upstream.getresponse()
                    data = response.read()
                    kept = {"Content-Type": response.getheader("Content-Type") or "text/plain"}
                    self.reply(response.status, kept, data)
                finally:
                    upstream.close()

            def reply(self, status: int, headers: dict[str, str], body: bytes) -> None:
                engine.seen.append((self.command, self.path, status))
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = _Server(("127.0.0.1", 0), Handler)
        scheme = "http"
        if tls is not None:
            ca, cert, key = tls
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(ca)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
