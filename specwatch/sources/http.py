"""HTTP for engine sources: plain sockets and httptools' response parser, one kept-alive connection per
(scheme, host, port), a whole-response deadline and a body cap.

A socket timeout bounds each read, not the response: an engine that drips one byte a second would never
time out. So the deadline and the byte cap are enforced between reads (each read waits at most what is left
of the deadline, within `_SLACK`); a 100 MB body costs at most the cap. Past its first `SMALL_BODY_BYTES`, a
body's bytes come out of one budget the whole process shares (`LARGE_BODY_BUDGET_BYTES`): what hostile engines
can make the daemon hold is bounded by that, not by the number of routes times the cap. A body that finds the
budget spent is refused (too_large) and says so; engines' usual answers (tens to hundreds of KB) never touch it.

Why not http.client (or urllib3 and requests, built on it): a scrape's CPU there is mostly the client's
Python, not the bytes. Per response http.client builds a socket file, a buffered reader, a response object
and reads the status and every header line by line; with `?name[]=` filtering (name_filter.py) a
64-endpoint cycle moves 3 KB answers, and that overhead is a GET's cost. httptools wraps llhttp, Node.js's
C parser (also uvicorn's, so the engines' own servers speak through it): one `feed_data` call per read
parses the status, the headers and a chunked or sized body. A filtered GET cost 47-53 us of CPU this way
against 146-152 us through http.client (same server, same process, alternating).
What a scrape needs from a client is here, a few lines each: one connection kept per host, redirects, a
stale kept-alive connection retried once, gzip that a server sends unasked decoded, TLS.

Each fetcher follows one `HttpClientConfig` (Prometheus's `http_config` keys): extra headers on every
request; an `Authorization` header (bearer-style or basic) sent only to the origin of the URL asked for, so a
redirect to another host never carries the secret; secrets in files read on every request, as Prometheus
does, so a rotated token needs no reload; a TLS context with its own CA, client certificate, server name or
no verification, rebuilt when one of its files changes.

Canary probes, sweeps and `specwatch status` POST JSON or read a stream, which this GET client does not do:
`client_session()` builds their `requests.Session` from the same `HttpClientConfig` with the same rules (the
same Authorization header, files read per request, the same TLS context), so auth and TLS hold on every
request to an engine, whichever client sends it.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import socket
import ssl
import threading
import time
import zlib
from http.client import RemoteDisconnected
from typing import Any, Callable, Iterator
from urllib.parse import urljoin, urlsplit

import httptools
import requests
from requests.adapters import HTTPAdapter

from specwatch.config import DEFAULT_HTTP_CLIENT, HttpClientConfig, ScrapeConfig, TlsConfig
from specwatch.secret_files import MAX_TLS_FILE_BYTES, SecretFileError, checked_stamp, exposure_once, read_secret
from specwatch.sources.base import SourceError

log = logging.getLogger(__name__)

ACCEPT = "text/plain;version=0.0.4;q=1.0, */*;q=0.1"  # never OpenMetrics: it escapes `vllm:` to `vllm_`
_CHUNK = 64 * 1024  # one read
SMALL_BODY_BYTES = 1 << 20  # each scrape's own; a vLLM or SGLang /metrics is 10-300 KB
LARGE_BODY_BUDGET_BYTES = 32 << 20  # shared by every scrape's bytes past SMALL_BODY_BYTES
_SLACK = 0.05  # how far past the deadline a socket wait may end, as a share of the scrape timeout
# No retries of a failed request (the next cycle is the retry); redirects are followed, as Prometheus does
# (vLLM may answer /metrics with a 307 to /metrics/), and a redirect loop is a connection error.
_MAX_REDIRECTS = 5
_REDIRECT_STATUSES = frozenset((301, 302, 303, 307, 308))
_REDIRECT_BODY_KEPT = 64 * 1024  # a redirect body up to this is read, so its connection stays alive
_MAX_HEADER_BYTES = 64 * 1024  # status line and headers together; http.client allowed 100 lines of 64 KB
_MAX_HEADERS = 100
# Connections kept per fetcher: the /metrics host and, rarely, a version endpoint or redirect on another.
_HOSTS_KEPT = 4
_URLS_KEPT = 16  # parsed URLs cached per fetcher; redirects can name new ones, so the cache is bounded
# What a reused connection raises when the server closed it while idle (uvicorn does after 5 s): the request
# never reached it, so it is sent once more on a new connection. RemoteDisconnected is a ConnectionResetError.
_STALE_ERRORS = (ConnectionResetError, ConnectionAbortedError, BrokenPipeError, ssl.SSLEOFError)
_NO_BODY_STATUSES = frozenset((204, 304))

Origin = tuple[str, str, int]  # (scheme, host, port): what one connection serves
_buffers = threading.local()  # one read buffer per thread, not per connection (64 endpoints x 64 KB of RSS)


class HttpFetcher:
    """GETs URLs with a total deadline and a body cap; failures raise SourceError with a fixed reason.

    Thread-safe: a connection is used by one thread at a time. A thread that finds its host's connection
    busy opens another for that request rather than wait behind a hung one; only one is kept afterwards.
    """

    def __init__(
        self,
        timeout_seconds: float = ScrapeConfig.timeout_seconds,
        max_body_bytes: int = ScrapeConfig.max_body_bytes,
        clock: Callable[[], float] = time.monotonic,
        client: HttpClientConfig = DEFAULT_HTTP_CLIENT,
    ) -> None:
        self.timeout = timeout_seconds
        self.max_body = max_body_bytes
        self.clock = clock
        self.client = client
        self._headers = "".join(f"{name}: {value}\r\n" for name, value in client.headers)
        self._tls = _TlsContext(client.tls_config)
        self._lock = threading.Lock()  # guards _idle and _generation
        self._idle: dict[Origin, _Connection] = {}  # kept-alive connections not in use, oldest first
        self._generation = 0  # bumped by close(): connections in use at that moment are not kept afterwards
        self._urls: dict[str, tuple[Origin, bytes]] = {}  # url -> (origin, request head for its Accept)

    def get(self, url: str, accept: str | None = None, deadline: float | None = None) -> bytes:
        """The body of `url`, complete by `deadline` (on `clock`; default: the timeout from now), so that several
        GETs of one exchange can share one deadline."""
        deadline = self.clock() + self.timeout if deadline is None else deadline
        accept = ACCEPT if accept is None else accept
        target, visited = url, {url}
        try:
            credentials = _authorization_header(self.client, url)
            home = self._request(url, url, accept)[0]
            for _ in range(_MAX_REDIRECTS + 1):
                body, location = self._exchange(url, target, accept, deadline, credentials)
                if location is None:
                    return body
                target = urljoin(target, location)
                if target in visited:
                    raise SourceError("connection", f"GET {url}: redirect loop at {target}")
                visited.add(target)
                if self._request(url, target, accept)[0] != home:
                    credentials = b""  # the secret is for the origin configured, not wherever it redirects
        except SourceError:
            raise
        except (OSError, httptools.HttpParserError, ValueError, zlib.error) as exc:
            raise _failure(url, exc, self.timeout) from None
        raise SourceError("connection", f"GET {url}: more than {_MAX_REDIRECTS} redirects")

    def get_json(self, url: str) -> Any:
        """The JSON document at `url`. Raises SourceError."""
        body = self.get(url, accept="application/json")
        try:
            return json.loads(body)
        except ValueError as exc:
            raise SourceError("parse", f"GET {url}: not JSON ({exc})") from None

    def get_json_field(self, url: str, key: str) -> str:
        """`body[key]` of a JSON object at `url` as a string; "" when absent. Raises SourceError."""
        document = self.get_json(url)
        if not isinstance(document, dict):
            raise SourceError("parse", f"GET {url}: not a JSON object ({type(document).__name__})")
        value = document.get(key, "")
        return value if isinstance(value, str) else ""

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
            self._generation += 1
        for conn in idle.values():
            conn.close()
        self._urls.clear()

    def _exchange(
        self, url: str, target: str, accept: str, deadline: float, credentials: bytes
    ) -> tuple[bytes, str | None]:
        """One GET of `target` on its host's connection: (body, None), or (b"", location) for a redirect."""
        origin, head = self._request(url, target, accept)
        request = head + credentials + b"\r\n"
        conn, generation = self._checkout(origin)
        response: _Response | None = None
        result: tuple[bytes, str | None]
        try:
            response = self._send(conn, url, request, deadline)
            location = response.header(b"location") if response.status in _REDIRECT_STATUSES else None
            if location:
                length = response.length
                if length is not None and length <= _REDIRECT_BODY_KEPT:
                    self._read_body(conn, response, url, deadline, _REDIRECT_BODY_KEPT)
                else:  # a large or unsized redirect body is not worth reading: drop the connection instead
                    response.keep_alive = False
                result = b"", location
            else:
                if response.status >= 400:
                    raise SourceError("http_status", f"GET {url}: HTTP {response.status} {response.reason}".strip())
                if response.length is not None and response.length > self.max_body:
                    raise SourceError(
                        "too_large", f"GET {url}: Content-Length {response.length} over the {self.max_body}-byte cap"
                    )
                result = self._read_body(conn, response, url, deadline, self.max_body), None
        except BaseException:
            conn.close()  # failed or half-read: its next request would read this one's leftovers
            raise
        finally:
            if response is not None:
                response.release()
        if response.keep_alive:
            self._checkin(origin, conn, generation)
        else:
            conn.close()
        return result

    def _send(self, conn: _Connection, url: str, request: bytes, deadline: float) -> _Response:
        """The request sent and the response's status and headers read; a stale kept-alive connection is
        replaced once, transparently."""
        reused = conn.sock is not None
        try:
            return self._send_once(conn, url, request, deadline)
        except _STALE_ERRORS:
            if not reused:
                raise
            conn.close()  # the next request on it connects afresh
            return self._send_once(conn, url, request, deadline)

    def _send_once(self, conn: _Connection, url: str, request: bytes, deadline: float) -> _Response:
        sock = conn.sock
        if sock is None:
            sock = conn.connect(self._remaining(url, deadline), self._tls)
        else:
            self._bound(sock, url, deadline)
        sock.sendall(request)
        response = _Response()
        try:
            while True:
                # Until the headers end, every byte fed was the status line or a header; then, their parsed size.
                size = response.head_bytes if response.headers_complete else response.fed_bytes
                if size > _MAX_HEADER_BYTES:
                    raise SourceError("connection", f"GET {url}: response headers over {_MAX_HEADER_BYTES} bytes")
                if response.headers_complete:
                    break
                self._feed(conn, response, url, deadline, before_headers=True)
            if len(response.headers) > _MAX_HEADERS:
                raise SourceError("connection", f"GET {url}: more than {_MAX_HEADERS} response headers")
        except BaseException:
            response.release()
            raise
        return response

    def _read_body(self, conn: _Connection, response: _Response, url: str, deadline: float, cap: int) -> bytes:
        """The whole body, each read waiting only what is left of the deadline; over `cap` bytes (decoded:
        a gzip bomb hits the cap too) is too_large."""
        decoder = _decoder(response.header(b"content-encoding"))
        if response.complete and not decoder and len(response.chunks) <= 1:  # the usual small answer: one read
            body = response.chunks[0] if response.chunks else b""
            if len(body) > cap:
                raise SourceError("too_large", f"GET {url}: body over the {cap}-byte cap")
            return body
        # Pieces, joined once at the end: a growing buffer would hold its old and new copies at each resize, and a
        # body refused at the cap would cost several times the cap while hostile engines on many routes send one.
        pieces: list[bytes] = []
        size = reserved = 0
        try:
            while True:
                chunks, response.chunks = response.chunks, []
                for chunk in chunks:
                    for piece in decoder.pieces(chunk, cap + 1 - size) if decoder else (chunk,):
                        size += len(piece)
                        if size > cap:
                            raise SourceError("too_large", f"GET {url}: body over the {cap}-byte cap")
                        if size > SMALL_BODY_BYTES + reserved:
                            reserved += _LARGE_BODIES.take(url, size - SMALL_BODY_BYTES - reserved)
                        pieces.append(piece)
                if response.complete:
                    break
                self._feed(conn, response, url, deadline)
                if response.eof and not response.complete:
                    if response.length is not None or response.chunked:
                        raise SourceError(
                            "connection",
                            f"GET {url}: response cut short: the server closed the connection before the end of its "
                            "body",
                        )
                    response.complete = True  # a body delimited by the server closing the connection
            if decoder:
                decoder.check_complete(url)
            return b"".join(pieces)
        finally:
            pieces.clear()
            _LARGE_BODIES.give(reserved)

    def _feed(
        self, conn: _Connection, response: _Response, url: str, deadline: float, before_headers: bool = False
    ) -> None:
        """One read from the socket into the parser; EOF is noted on the response."""
        sock = conn.sock
        assert sock is not None  # read only after _send_once connected it
        self._bound(sock, url, deadline)
        buffer = _read_buffer()
        n = sock.recv_into(buffer)
        if not n:
            response.eof = True
            response.keep_alive = False
            if before_headers:
                raise RemoteDisconnected("Remote end closed connection without response")
            return
        if before_headers:
            response.fed_bytes += n
        try:
            response.parser.feed_data(memoryview(buffer)[:n])
        except httptools.HttpParserError:
            if not response.complete:
                raise
            response.keep_alive = False  # bytes after the response: the connection cannot carry another

    def _bound(self, sock: socket.socket, url: str, deadline: float) -> None:
        """Make the socket's next wait end at the deadline, give or take `_SLACK` of the scrape timeout.

        `settimeout()` is a system call every time (an ioctl); a kept-alive connection's timeout is within
        the slack request after request, so it is called only when it is off by more."""
        remaining = self._remaining(url, deadline)
        current = sock.gettimeout()
        if current is None or abs(current - remaining) > _SLACK * self.timeout:
            sock.settimeout(remaining)

    def _remaining(self, url: str, deadline: float) -> float:
        remaining = deadline - self.clock()
        if remaining <= 0:
            raise SourceError("timeout", f"GET {url}: response not complete within {self.timeout:g}s")
        return remaining

    def _request(self, url: str, target: str, accept: str) -> tuple[Origin, bytes]:
        """(origin, the request's head without its closing blank line or credentials) of `target`, built
        once per URL and Accept. Raises SourceError for a URL it cannot use."""
        key = target if accept is ACCEPT else f"{accept}\n{target}"
        known = self._urls.get(key)
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
        default_port = 443 if scheme == "https" else 80
        port = port or default_port
        host_header = f"[{host}]" if ":" in host else host
        if port != default_port:
            host_header += f":{port}"
        if any(c <= " " or c == "\x7f" for c in path) or not path.isascii():
            raise SourceError("connection", f"GET {url}: invalid URL {target!r}: the path needs percent-encoding")
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {host_header}\r\nAccept-Encoding: identity\r\n"
            f"Accept: {accept}\r\nUser-Agent: specwatch\r\n{self._headers}"
        ).encode("latin-1")
        known = (scheme, host, port), request
        if len(self._urls) >= _URLS_KEPT:
            self._urls.clear()
        self._urls[key] = known
        return known

    def _checkout(self, origin: Origin) -> tuple[_Connection, int]:
        """The host's idle connection, or a new one (not yet connected) when it has none or it is in use."""
        with self._lock:
            conn, generation = self._idle.pop(origin, None), self._generation
        return conn or _Connection(origin), generation

    def _checkin(self, origin: Origin, conn: _Connection, generation: int) -> None:
        evicted: _Connection | None = None
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


class _Connection:
    """One TCP (or TLS) connection to an origin; `sock` is None until connected and after close()."""

    __slots__ = ("origin", "sock")

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self.sock: socket.socket | None = None

    def connect(self, timeout: float, tls: _TlsContext) -> socket.socket:
        scheme, host, port = self.origin
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a request is one small write
            if scheme == "https":
                sock = tls.context().wrap_socket(sock, server_hostname=tls.config.server_name or host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        return sock

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()


class _Response:
    """httptools' callbacks for one response: status, headers and body chunks as they are parsed."""

    __slots__ = (
        "parser",
        "status",
        "reason",
        "headers",
        "by_name",
        "chunks",
        "headers_complete",
        "complete",
        "eof",
        "keep_alive",
        "length",
        "chunked",
        "fed_bytes",
        "head_bytes",
    )

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.reason = ""
        self.headers: list[tuple[bytes, bytes]] = []
        self.by_name: dict[bytes, bytes] = {}  # lower-case name -> first value, once the headers are complete
        self.chunks: list[bytes] = []  # body bytes parsed and not yet taken by the reader
        self.headers_complete = self.complete = self.eof = False
        self.keep_alive = False
        self.length: int | None = None  # Content-Length, when the body has one
        self.chunked = False
        self.fed_bytes = 0  # read before the headers were complete
        self.head_bytes = 0  # of the status line and headers, as parsed

    def release(self) -> None:
        """Drop the parser: it holds this object as its protocol, and a reference cycle per GET would leave
        every response for the cyclic garbage collector (64 a cycle: a gen-0 collection every ~1.2 cycles)."""
        del self.parser

    def header(self, name: bytes) -> str | None:
        """The first header of that (lower-case) name, decoded as HTTP/1.1 headers are (ISO-8859-1)."""
        value = self.by_name.get(name)
        return None if value is None else value.decode("iso-8859-1").strip()

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self.headers_complete:  # a second response after the first: bytes nobody asked for
            self.keep_alive = False

    def on_status(self, reason: bytes) -> None:
        self.reason += reason.decode("iso-8859-1")
        self.head_bytes += len(reason)

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.headers_complete:
            self.headers.append((name, value))
            self.head_bytes += len(name) + len(value)

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim response (100 Continue): its headers are skipped
            self.headers, self.reason = [], ""
            return
        if self.headers_complete:
            return
        self.status = status
        self.headers_complete = True
        self.keep_alive = self.parser.should_keep_alive()  # only right here: llhttp resets it afterwards
        by_name = self.by_name
        for key, value in self.headers:
            by_name.setdefault(key.lower(), value)
        te = by_name.get(b"transfer-encoding")
        self.chunked = te is not None and te.strip().lower() == b"chunked"
        length = by_name.get(b"content-length")
        if status in _NO_BODY_STATUSES:
            self.length = 0
        elif length is not None and not self.chunked:
            length = length.strip()
            self.length = int(length) if length.isdigit() else None

    def on_body(self, data: bytes) -> None:
        if not self.complete:
            self.chunks.append(data)

    def on_message_complete(self) -> None:
        if self.headers_complete:
            self.complete = True


class _BodyBudget:
    """Body bytes past each scrape's first SMALL_BODY_BYTES, shared by the whole process."""

    def __init__(self, total: int) -> None:
        self.total = self.free = total
        self._lock = threading.Lock()

    def take(self, url: str, n: int) -> int:
        """`n` bytes, or SourceError("too_large") when fewer are free."""
        with self._lock:
            if n <= self.free:
                self.free -= n
                return n
        raise SourceError(
            "too_large",
            f"GET {url}: body past {SMALL_BODY_BYTES} bytes while other scrapes hold the {self.total} bytes that large "
            "bodies share",
        )

    def give(self, n: int) -> None:
        with self._lock:
            self.free += n


_LARGE_BODIES = _BodyBudget(LARGE_BODY_BUDGET_BYTES)


def _read_buffer() -> bytearray:
    buffer = getattr(_buffers, "buffer", None)
    if buffer is None:
        buffer = _buffers.buffer = bytearray(_CHUNK)
    return buffer


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """Certificates verified against the system's CAs, host names checked, TLS 1.2 or later: as urllib3's
    defaults were. One context for every connection without a `tls_config` (loading the CAs takes
    milliseconds)."""
    return _new_tls_context(TlsConfig())


def _new_tls_context(config: TlsConfig) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=config.ca_file or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    if config.cert_file:
        context.load_cert_chain(config.cert_file, config.key_file)
    if config.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class _TlsContext:
    """The SSL context of one `tls_config`, rebuilt on the next connection after one of its files changes
    (a renewed client certificate is used without a reload); connections are kept alive, so that check is
    rare."""

    def __init__(self, config: TlsConfig) -> None:
        self.config = config
        self._files = tuple(f for f in (config.ca_file, config.cert_file, config.key_file) if f)
        self._lock = threading.Lock()
        self._built: tuple[tuple[tuple[int, int, int, int], ...], ssl.SSLContext] | None = None

    def context(self) -> ssl.SSLContext:
        if self.config == TlsConfig():
            return _tls_context()
        stamp = tuple(checked_stamp(f, MAX_TLS_FILE_BYTES) for f in self._files)  # no FIFO reaches `ssl`
        if self.config.key_file:
            _warn_exposed(self.config.key_file)
        with self._lock:
            if self._built is None or self._built[0] != stamp:
                self._built = stamp, _new_tls_context(self.config)
            return self._built[1]


def _authorization_header(client: HttpClientConfig, url: str) -> bytes:
    """The `Authorization` header line the config asks for, b"" for none. Secrets in files are read now."""
    if client.authorization is not None:
        auth = client.authorization
        value = f"{auth.type} {_secret(auth.credentials, auth.credentials_file, url)}"
    elif client.basic_auth is not None:
        basic = client.basic_auth
        pair = f"{basic.username}:{_secret(basic.password, basic.password_file, url)}".encode()
        value = "Basic " + base64.b64encode(pair).decode("ascii")
    else:
        return b""
    try:
        line = f"Authorization: {value}\r\n".encode("latin-1")
    except UnicodeEncodeError:
        raise SourceError("credentials", f"GET {url}: the credentials are not ASCII/Latin-1 text") from None
    if line.count(b"\n") != 1 or b"\r" in line[:-2]:
        raise SourceError("credentials", f"GET {url}: the credentials span several lines")
    return line


def _secret(inline: str, file: str, url: str) -> str:
    if not file:
        return inline
    try:
        text = read_secret(file)
    except SecretFileError as exc:
        raise SourceError("credentials", f"GET {url}: {exc}") from None
    _warn_exposed(file)
    return text


def _warn_exposed(file: str) -> None:
    warning = exposure_once(file)
    if warning:
        log.warning("secret file %s", warning)


class _Decoder:
    """Undoes a Content-Encoding we never asked for but a server may send anyway (gzip, deflate), a chunk at
    a time and never more than the room left under the body cap."""

    def __init__(self, wbits: int, raw_fallback: bool) -> None:
        self._wbits = wbits
        self._raw_fallback = raw_fallback  # "deflate" is zlib-wrapped by the RFC, raw from some servers
        self._inflate = zlib.decompressobj(wbits)
        self._started = False

    def pieces(self, data: bytes, room: int) -> Iterator[bytes]:
        """`data` decoded, at most `_CHUNK` bytes a piece and `room` in all: a gzip bomb's 64 KB expands a
        piece at a time, never into one buffer the size of the room."""
        out = self.decode(data, min(room, _CHUNK))
        room -= len(out)
        yield out
        while room > 0 and self._inflate.unconsumed_tail:
            out = self.decode(self._inflate.unconsumed_tail, min(room, _CHUNK))
            if not out:
                return
            room -= len(out)
            yield out

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
    if isinstance(exc, httptools.HttpParserError):
        return SourceError("connection", f"GET {url}: not an HTTP response: {exc}")
    # refused, reset, DNS, TLS, a connection closed before the response, a chunked body cut short
    return SourceError("connection", f"GET {url}: {type(exc).__name__}: {exc}")


def client_session(client: HttpClientConfig) -> requests.Session:
    """A `requests.Session` that follows `client` as `HttpFetcher` does: its headers on every request; its
    `Authorization` (files read per request) on the URL asked for and redirects on the same host and port,
    never to another (requests drops it there); its TLS context (CA, client certificate, server name, no
    verification). Proxies and credentials from the environment or ~/.netrc are not used, as for a scrape.
    A secret file that cannot be read fails the request with `requests.exceptions.InvalidHeader`."""
    session = requests.Session()
    session.trust_env = False
    session.headers["User-Agent"] = "specwatch"
    session.headers.update(dict(client.headers))
    session.auth = _SessionAuth(client)
    session.verify = not client.tls_config.insecure_skip_verify
    session.mount("https://", _TlsAdapter(client.tls_config))
    return session


class _SessionAuth(requests.auth.AuthBase):
    """The Authorization header of `_authorization_header`, computed when each request is prepared."""

    def __init__(self, client: HttpClientConfig) -> None:
        self.client = client

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        url = request.url or ""
        try:
            line = _authorization_header(self.client, url)
        except SourceError as exc:
            raise requests.exceptions.InvalidHeader(str(exc).replace("GET ", f"{request.method} ", 1)) from None
        if line:
            request.headers["Authorization"] = line[len(b"Authorization: ") : -2].decode("latin-1")
        return request


class _TlsAdapter(HTTPAdapter):
    """HTTPS through a context built from the `tls_config` (once per session: sessions are short-lived, one
    per probe round or command), with its server name for SNI and the certificate check."""

    def __init__(self, config: TlsConfig) -> None:
        self._tls = config
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        # Without a tls_config, the one shared context: building one loads the system's CAs (about 30 ms), which
        # a sweep's hundred clients, each with its own session, would pay on one core before the first request.
        kwargs["ssl_context"] = _tls_context() if self._tls == TlsConfig() else _new_tls_context(self._tls)
        if self._tls.server_name:
            kwargs["server_hostname"] = self._tls.server_name
        super().init_poolmanager(*args, **kwargs)
