"""HTTP for engine sources: the standard library's http.client, one kept-alive connection per (scheme, host,
port), a whole-response deadline and a body cap.

A socket timeout bounds each read, not the response: an engine that drips one byte a second would never
time out. So the body is read in chunks and both the wall-clock deadline and the byte cap are enforced
between reads (each read waits at most what is left of the deadline); a 100 MB body costs at most the cap.

http.client rather than urllib3 or requests (both built on it): 64 GETs of an 83 KB vLLM exposition from 64
simulated engines on loopback, side by side in one process, cost 12.9-13.1 ms of CPU here against 21.1-24.3 ms
through urllib3's connection pools (two runs, medians); requests costs more again (docs/benchmarks.md,
Overhead). What urllib3 added and a scrape needs is here, a few lines each: one connection kept per host,
redirects, a stale kept-alive connection retried once, gzip that a server sends unasked decoded. Responses
read their headers without the email package (lean_http.py): a third of a small GET's CPU.
"""

from __future__ import annotations

import functools
import json
import ssl
import threading
import time
import zlib
from http.client import HTTPConnection, HTTPException, HTTPResponse
from socket import socket
from typing import Callable, Mapping
from urllib.parse import urljoin, urlsplit

from specwatch.sources.base import SourceError
from specwatch.sources.lean_http import LeanHTTPConnection, LeanHTTPSConnection

ACCEPT = "text/plain;version=0.0.4;q=1.0, */*;q=0.1"  # never OpenMetrics: it escapes `vllm:` to `vllm_`
_HEADERS = {"Accept": ACCEPT, "User-Agent": "specwatch"}  # http.client adds `Accept-Encoding: identity`
_CHUNK = 64 * 1024
_SLACK = 0.05  # how far past the deadline a socket wait may end, as a share of the scrape timeout
# No retries of a failed request (the next cycle is the retry); redirects are followed, as Prometheus does
# (vLLM may answer /metrics with a 307 to /metrics/), and a redirect loop is a connection error.
_MAX_REDIRECTS = 5
_REDIRECT_STATUSES = frozenset((301, 302, 303, 307, 308))
_REDIRECT_BODY_KEPT = 64 * 1024  # a redirect body up to this is read, so its connection stays alive
# Connections kept per fetcher: the /metrics host and, rarely, a version endpoint or redirect on another.
_HOSTS_KEPT = 4
_URLS_KEPT = 16  # parsed URLs cached per fetcher; redirects can name new ones, so the cache is bounded
# What a reused connection raises when the server closed it while idle (uvicorn does after 5 s): the request
# never reached it, so it is sent once more on a new connection. RemoteDisconnected is a ConnectionResetError.
_STALE_ERRORS = (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)

Origin = tuple[str, str, int]  # (scheme, host, port): what one connection serves


class HttpFetcher:
    """GETs URLs with a total deadline and a body cap; failures raise SourceError with a fixed reason.

    Thread-safe: a connection is used by one thread at a time. A thread that finds its host's connection
    busy opens another for that request rather than wait behind a hung one; only one is kept afterwards.
    """

    def __init__(self, timeout_seconds: float = 2.0, max_body_bytes: int = 16 * 1024 * 1024,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout_seconds
        self.max_body = max_body_bytes
        self.clock = clock
        self._lock = threading.Lock()  # guards _idle and _generation
        self._idle: dict[Origin, HTTPConnection] = {}  # kept-alive connections not in use, oldest first
        self._generation = 0  # bumped by close(): connections in use at that moment are not kept afterwards
        self._urls: dict[str, tuple[Origin, str]] = {}  # url -> (origin, request path)

    def get(self, url: str, accept: str | None = None) -> bytes:
        deadline = self.clock() + self.timeout
        headers = _HEADERS if accept is None else {**_HEADERS, "Accept": accept}
        target, visited = url, {url}
        try:
            for _ in range(_MAX_REDIRECTS + 1):
                body, location = self._exchange(url, target, headers, deadline)
                if location is None:
                    return body
                target = urljoin(target, location)
                if target in visited:
                    raise SourceError("connection", f"GET {url}: redirect loop at {target}")
                visited.add(target)
        except SourceError:
            raise
        except (OSError, HTTPException, ValueError, zlib.error) as exc:
            raise _failure(url, exc, self.timeout) from None
        raise SourceError("connection", f"GET {url}: more than {_MAX_REDIRECTS} redirects")

    def get_json_field(self, url: str, key: str) -> str:
        """`body[key]` of a JSON object at `url` as a string; "" when absent. Raises SourceError."""
        body = self.get(url, accept="application/json")
        try:
            value = json.loads(body).get(key, "")
        except (ValueError, AttributeError) as exc:
            raise SourceError("parse", f"GET {url}: not a JSON object ({exc})") from None
        return value if isinstance(value, str) else ""

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
            self._generation += 1
        for conn in idle.values():
            conn.close()
        self._urls.clear()

    def _exchange(self, url: str, target: str, headers: Mapping[str, str],
                  deadline: float) -> tuple[bytes, str | None]:
        """One GET of `target` on its host's connection: (body, None), or (b"", location) for a redirect."""
        origin, path = self._split(url, target)
        conn, generation = self._checkout(origin)
        response: HTTPResponse | None = None
        try:
            response, sock = self._send(conn, url, path, headers, deadline)
            location = response.getheader("Location") if response.status in _REDIRECT_STATUSES else None
            if location:
                if response.length is not None and response.length <= _REDIRECT_BODY_KEPT:
                    self._read(response, sock, url, deadline, _REDIRECT_BODY_KEPT, decoder=None)
                else:  # a large or unsized redirect body is not worth reading: drop the connection instead
                    conn.close()
                result = b"", location
            else:
                if response.status >= 400:
                    raise SourceError("http_status", f"GET {url}: HTTP {response.status} {response.reason}".strip())
                if response.length is not None and response.length > self.max_body:
                    raise SourceError("too_large", f"GET {url}: Content-Length {response.length} over the "
                                                   f"{self.max_body}-byte cap")
                decoder = _decoder(response.getheader("Content-Encoding"))
                result = self._read(response, sock, url, deadline, self.max_body, decoder), None
        except BaseException:
            conn.close()  # failed or half-read: its next request would read this one's leftovers
            if response is not None:
                response.close()  # it holds the socket alone when the server said it would close
            raise
        self._checkin(origin, conn, generation)
        return result

    def _send(self, conn: HTTPConnection, url: str, path: str, headers: Mapping[str, str],
              deadline: float) -> tuple[HTTPResponse, socket]:
        """The request sent and the response's status and headers read; a stale kept-alive connection is
        replaced once, transparently."""
        reused = conn.sock is not None
        try:
            return self._send_once(conn, url, path, headers, deadline)
        except _STALE_ERRORS:
            if not reused:
                raise
            conn.close()  # the next request on it connects afresh
            return self._send_once(conn, url, path, headers, deadline)

    def _send_once(self, conn: HTTPConnection, url: str, path: str, headers: Mapping[str, str],
                   deadline: float) -> tuple[HTTPResponse, socket]:
        conn.timeout = self._remaining(url, deadline)  # what connect() waits, when there is no socket yet
        if conn.sock is not None:
            self._bound(conn.sock, url, deadline)
        conn.request("GET", path, headers=headers)
        sock = conn.sock  # held here: getresponse() drops it from `conn` when the server will close after
        self._bound(sock, url, deadline)
        return conn.getresponse(), sock

    def _read(self, response: HTTPResponse, sock: socket, url: str, deadline: float, cap: int,
              decoder: _Decoder | None) -> bytes:
        """The whole body, each read waiting only what is left of the deadline; over `cap` bytes (decoded:
        a gzip bomb hits the cap too) is too_large."""
        body = bytearray()
        while response.length != 0:  # None: chunked, or until the server closes; 0: all declared bytes read
            self._bound(sock, url, deadline)
            # read1 returns as soon as any bytes arrive; undecoded, never more than one byte past the cap
            chunk = response.read1(_CHUNK if decoder else min(_CHUNK, cap + 1 - len(body)))
            if not chunk:
                if response.length:
                    raise SourceError("connection", f"GET {url}: response cut short, {response.length} bytes "
                                                    f"missing of its Content-Length")
                break
            body += decoder.decode(chunk, cap + 1 - len(body)) if decoder else chunk
            if len(body) > cap:
                raise SourceError("too_large", f"GET {url}: body over the {cap}-byte cap")
        if decoder:
            decoder.check_complete(url)
        response.close()  # the body is complete: the connection can carry the next request
        return bytes(body)

    def _bound(self, sock: socket, url: str, deadline: float) -> None:
        """Make the socket's next wait end at the deadline, give or take `_SLACK` of the scrape timeout.

        `settimeout()` is a system call every time (an ioctl), and it was called three times a GET; in a gVisor
        sandbox system calls are dear. So it is called only when the timeout already on the socket is off by
        more than the slack: a kept-alive connection's is within it request after request."""
        remaining = self._remaining(url, deadline)
        current = sock.gettimeout()
        if current is None or abs(current - remaining) > _SLACK * self.timeout:
            sock.settimeout(remaining)

    def _remaining(self, url: str, deadline: float) -> float:
        remaining = deadline - self.clock()
        if remaining <= 0:
            raise SourceError("timeout", f"GET {url}: response not complete within {self.timeout:g}s")
        return remaining

    def _split(self, url: str, target: str) -> tuple[Origin, str]:
        """(origin, request path) of `target`, parsed once per URL. Raises SourceError for one it cannot use."""
        known = self._urls.get(target)
        if known is not None:
            return known
        try:
            parts = urlsplit(target)
            scheme, host, port = parts.scheme.lower(), parts.hostname, parts.port
        except ValueError as exc:  # an unclosed IPv6 bracket, a port that is not a number
            raise SourceError("connection", f"GET {url}: invalid URL {target!r}: {exc}") from None
        if scheme not in ("http", "https") or not host:
            raise SourceError("connection", f"GET {url}: invalid URL {target!r}: not http(s)://host")
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        known = (scheme, host, port or (443 if scheme == "https" else 80)), path
        if len(self._urls) >= _URLS_KEPT:
            self._urls.clear()
        self._urls[target] = known
        return known

    def _checkout(self, origin: Origin) -> tuple[HTTPConnection, int]:
        """The host's idle connection, or a new one (not yet connected) when it has none or it is in use."""
        with self._lock:
            conn, generation = self._idle.pop(origin, None), self._generation
        if conn is None:
            scheme, host, port = origin
            if scheme == "https":
                conn = LeanHTTPSConnection(host, port, timeout=self.timeout, context=_tls_context())
            else:
                conn = LeanHTTPConnection(host, port, timeout=self.timeout)
        return conn, generation

    def _checkin(self, origin: Origin, conn: HTTPConnection, generation: int) -> None:
        evicted: HTTPConnection | None = None
        with self._lock:
            keep = generation == self._generation and origin not in self._idle
            if keep:
                self._idle[origin] = conn
                if len(self._idle) > _HOSTS_KEPT:
                    evicted = self._idle.pop(next(iter(self._idle)))
        if not keep:
            conn.close()  # the fetcher was closed meanwhile, or another thread's connection is already kept
        if evicted is not None:
            evicted.close()


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """Certificates verified against the system's CAs, host names checked, TLS 1.2 or later: as urllib3's
    defaults were. One context for every connection (loading the CAs takes milliseconds)."""
    context = ssl.create_default_context()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    return context


class _Decoder:
    """Undoes a Content-Encoding we never asked for but a server may send anyway (gzip, deflate), a chunk at
    a time and never more than the room left under the body cap."""

    def __init__(self, wbits: int, raw_fallback: bool) -> None:
        self._wbits = wbits
        self._raw_fallback = raw_fallback  # "deflate" is zlib-wrapped by the RFC, raw from some servers
        self._inflate = zlib.decompressobj(wbits)
        self._started = False

    def decode(self, data: bytes, room: int) -> bytes:
        try:
            out = self._inflate.decompress(data, room)
        except zlib.error:
            if self._started or not self._raw_fallback:
                raise
            self._inflate, self._raw_fallback = zlib.decompressobj(-zlib.MAX_WBITS), False
            out = self._inflate.decompress(data, room)
        self._started = True
        # Concatenated gzip members (RFC 1952 allows them): start on the next one.
        while self._inflate.eof and self._inflate.unused_data and len(out) < room:
            rest = self._inflate.unused_data
            self._inflate = zlib.decompressobj(self._wbits)
            out += self._inflate.decompress(rest, room - len(out))
        return out

    def check_complete(self, url: str) -> None:
        if self._started and not self._inflate.eof:
            raise SourceError("connection", f"GET {url}: compressed body cut short")


def _decoder(content_encoding: str | None) -> _Decoder | None:
    """A decoder for gzip or deflate; None for identity, and for codings we cannot undo (the body then fails
    to parse, with a parse error)."""
    coding = (content_encoding or "").strip().lower()
    if coding in ("gzip", "x-gzip"):
        return _Decoder(16 + zlib.MAX_WBITS, raw_fallback=False)
    if coding == "deflate":
        return _Decoder(zlib.MAX_WBITS, raw_fallback=True)
    return None


def _failure(url: str, exc: BaseException, timeout: float) -> SourceError:
    if isinstance(exc, TimeoutError):  # socket.timeout: connecting, sending or waiting for the headers
        return SourceError("timeout", f"GET {url}: no complete response within {timeout:g}s")
    if isinstance(exc, zlib.error):
        return SourceError("connection", f"GET {url}: compressed body not valid: {exc}")
    # refused, reset, DNS, TLS, a malformed status line or headers, a chunked body cut short, a bad path
    return SourceError("connection", f"GET {url}: {type(exc).__name__}: {exc}")
