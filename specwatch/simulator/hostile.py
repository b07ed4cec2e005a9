"""Hostile engines on loopback: one fault each, on its own port, for fault tests and the hostile-engine soak.

`HostileEngines(faults)` starts one server per fault in `FAULTS` (and `healthy`, a vLLM endpoint whose
counters move on every scrape); `url(fault)` is its /metrics. Every server runs in daemon threads and stops
writing as soon as the client hangs up, so a fault costs the client what the client lets it cost.
"""

from __future__ import annotations

import gzip
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterable

FAULTS = (
    "endless",  # a chunked body that never ends
    "slowloris",  # headers, then one byte of body every half second
    "huge_length",  # Content-Length: 1 GiB, then as many bytes as the client reads
    "gzip_bomb",  # 256 MiB of zeros in ~256 KB of gzip, sent unasked
    "invalid_utf8",  # an exposition with bytes that are not UTF-8
    "many_series",  # 200,000 series of a family specwatch reads (~12 MB)
    "duplicate",  # every series twice
    "silent",  # accepts the connection, never answers
)
HEALTHY = "healthy"
MANY_SERIES = 200_000
_FAMILIES = (
    ("vllm:spec_decode_num_drafts", 1.0),
    ("vllm:spec_decode_num_draft_tokens", 4.0),
    ("vllm:spec_decode_num_accepted_tokens", 2.15),
)
_PER_POS = (0.8, 0.6, 0.45, 0.3)


def vllm_exposition(drafts: float, duplicate: bool = False) -> bytes:
    """A vLLM V1 exposition with the spec-decode families (one engine, k=4); `duplicate` writes every series
    twice, as a broken multi-process merge would."""
    lines = []
    series = [(f"{name}_total", "", per_draft * drafts) for name, per_draft in _FAMILIES]
    series += [
        ("vllm:spec_decode_num_accepted_tokens_per_pos_total", f',position="{j}"', p * drafts)
        for j, p in enumerate(_PER_POS)
    ]
    for name, extra, value in series:
        line = f'{name}{{engine="0",model_name="m"{extra}}} {value!r}'
        lines += [line, line] if duplicate else [line]
    lines.append('vllm:num_requests_running{engine="0",model_name="m"} 4.0')
    return ("\n".join(lines) + "\n").encode()


def many_series(count: int = MANY_SERIES) -> bytes:
    line = 'vllm:spec_decode_num_drafts_total{{engine="{}",model_name="m"}} 1.0\n'
    return "".join(line.format(i) for i in range(count)).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _FaultServer

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        try:
            self.server.engines.answer(self.server.fault, self)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True  # the client gave up, which is what these faults are for

    def log_message(self, fmt: str, *args: Any) -> None:
        pass


class _FaultServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, engines: HostileEngines, fault: str) -> None:
        self.engines, self.fault = engines, fault
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


class HostileEngines:
    """One loopback server per fault (plus `healthy`); `close()` stops them all."""

    def __init__(self, faults: Iterable[str] = FAULTS, healthy: bool = True, series: int = MANY_SERIES) -> None:
        self.stop = threading.Event()
        self.drafts = 0.0
        self.scrapes: dict[str, int] = {}
        self._lock = threading.Lock()
        self._bodies = {
            "invalid_utf8": vllm_exposition(1000.0).replace(b'model_name="m"', b'model_name="\xff\xfe\xc3("', 1),
            "duplicate": vllm_exposition(1000.0, duplicate=True),
        }
        wanted = [*faults, *([HEALTHY] if healthy else [])]
        if "many_series" in wanted:
            self._bodies["many_series"] = many_series(series)
        if "gzip_bomb" in wanted:
            self._bodies["gzip_bomb"] = gzip.compress(bytes(256 << 20), compresslevel=9)
        self._servers: dict[str, _FaultServer] = {}
        self._silent: socket.socket | None = None
        self._held: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        for fault in wanted:
            if fault == "silent":
                self._start_silent()
            elif fault in FAULTS or fault == HEALTHY:
                server = self._servers[fault] = _FaultServer(self, fault)
                self._spawn(server.serve_forever)
            else:
                raise ValueError(f"unknown fault {fault!r}")

    def url(self, fault: str) -> str:
        if fault == "silent":
            assert self._silent is not None
            port = self._silent.getsockname()[1]
        else:
            port = self._servers[fault].server_address[1]
        return f"http://127.0.0.1:{port}/metrics"

    def close(self) -> None:
        self.stop.set()
        for server in self._servers.values():
            server.shutdown()
            server.server_close()
        if self._silent is not None:
            self._silent.close()
        for sock in self._held:
            sock.close()

    # ------------------------------------------------------------------ the faults
    def answer(self, fault: str, handler: BaseHTTPRequestHandler) -> None:
        with self._lock:
            self.scrapes[fault] = self.scrapes.get(fault, 0) + 1
        if handler.path.rstrip("/").endswith(("/version", "/props", "/server_info", "/get_server_info")):
            return self._send(handler, 404, b"no")
        out = handler.wfile
        if fault == HEALTHY:
            with self._lock:
                self.drafts += 500.0
                drafts = self.drafts
            self._send(handler, 200, vllm_exposition(drafts))
        elif fault == "endless":
            self._head(handler, {"Transfer-Encoding": "chunked"})
            chunk = vllm_exposition(1000.0) * 64
            framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
            while not self.stop.is_set():
                out.write(framed)
        elif fault == "slowloris":
            self._head(handler, {"Content-Length": str(1 << 20)})
            while not self.stop.wait(0.5):
                out.write(b"#")
                out.flush()
        elif fault == "huge_length":
            self._head(handler, {"Content-Length": str(1 << 30)})
            chunk = vllm_exposition(1000.0) * 64
            sent = 0
            while sent < 1 << 30 and not self.stop.is_set():
                out.write(chunk)
                sent += len(chunk)
        elif fault == "gzip_bomb":
            self._send(handler, 200, self._bodies["gzip_bomb"], {"Content-Encoding": "gzip"})
        else:
            self._send(handler, 200, self._bodies[fault])

    @staticmethod
    def _head(handler: BaseHTTPRequestHandler, headers: dict[str, str]) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain; version=0.0.4")
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.end_headers()

    def _send(
        self, handler: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str] | None = None
    ) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "text/plain; version=0.0.4")
        handler.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(body)

    def _start_silent(self) -> None:
        """A listener that accepts and then says nothing; it holds the last 256 connections open."""
        sock = self._silent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)

        def accept() -> None:
            while not self.stop.is_set():
                try:
                    conn, _ = sock.accept()
                except OSError:
                    return
                with self._lock:
                    self.scrapes["silent"] = self.scrapes.get("silent", 0) + 1
                self._held.append(conn)
                if len(self._held) > 256:
                    self._held.pop(0).close()

        self._spawn(accept)

    def _spawn(self, target: Any) -> None:
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        self._threads.append(thread)


def main() -> None:  # pragma: no cover - a manual check: serve every fault and print the URLs
    engines = HostileEngines()
    for fault in (*FAULTS, HEALTHY):
        print(fault, engines.url(fault), flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        engines.close()


if __name__ == "__main__":
    main()
