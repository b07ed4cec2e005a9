"""HTTP for engine sources: one keep-alive urllib3 pool per source, a whole-response deadline and a body cap.

A socket timeout bounds each read, not the response: an engine that drips one byte a second would never
time out. So the body is streamed and both the wall-clock deadline and the byte cap are enforced while
reading; a 100 MB body costs at most the cap in memory.

urllib3 directly rather than `requests.Session` (which sits on the same urllib3): a GET of an 80 KB
exposition over loopback costs 0.34 ms of CPU here against 1.12 ms through requests (0.80 ms with
`trust_env` off), most of it requests reading proxy settings from the environment on every call. With
64 routes per 5 s cycle that difference alone is 1% of a core (docs/benchmarks.md, Overhead).

And through the URL's own connection pool rather than the PoolManager's `request()`, which parses the URL
and looks its pool up again on every call: 64 GETs of 83 KB from 64 loopback servers, side by side, 26.6 ->
22.1 ms of CPU. The PoolManager still owns the pools and follows redirects, which are rare: the first hop of a
scrape goes straight to the pool, a redirect hands over to the PoolManager.
"""

from __future__ import annotations

import json
import time
from typing import Callable, Mapping
from urllib.parse import urljoin

import urllib3
from urllib3.connectionpool import HTTPConnectionPool
from urllib3.exceptions import ClosedPoolError, HTTPError, LocationValueError, MaxRetryError, NewConnectionError
from urllib3.util import parse_url

from specwatch.sources.base import SourceError

ACCEPT = "text/plain;version=0.0.4;q=1.0, */*;q=0.1"  # never OpenMetrics: it escapes `vllm:` to `vllm_`
_CHUNK = 64 * 1024
# No retries of a failed request (the next cycle is the retry); redirects are followed, as Prometheus and
# requests do, and a redirect loop is a connection error.
_MAX_REDIRECTS = 5
_RETRIES = urllib3.Retry(total=None, connect=0, read=0, status=0, other=0, redirect=_MAX_REDIRECTS,
                         raise_on_status=False)
# Pools kept per source: the /metrics endpoint and, rarely, a version endpoint on another host.
_POOLS = 4


class HttpFetcher:
    """GETs URLs with a total deadline and a body cap; failures raise SourceError with a fixed reason."""

    def __init__(self, timeout_seconds: float = 2.0, max_body_bytes: int = 16 * 1024 * 1024,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout_seconds
        self.max_body = max_body_bytes
        self.clock = clock
        # One connection per host, kept alive between scrapes.
        self.pools = urllib3.PoolManager(num_pools=_POOLS, maxsize=1, block=False, retries=_RETRIES,
                                         headers={"Accept": ACCEPT, "User-Agent": "specwatch"})
        self._timeouts = urllib3.Timeout(connect=timeout_seconds, read=timeout_seconds)
        self._first_hops: dict[str, tuple[HTTPConnectionPool, str]] = {}  # url -> (its pool, request path)

    def get(self, url: str, accept: str | None = None) -> bytes:
        deadline = self.clock() + self.timeout
        headers = {**self.pools.headers, "Accept": accept} if accept else self.pools.headers
        try:
            resp = self._first_hop(url, headers)
            location = resp.get_redirect_location()
            if location:  # rare: the PoolManager follows the rest of the way
                resp.close()  # not drained: a redirect's body is not worth reading, whatever its size
                resp.release_conn()
                resp = self.pools.request("GET", urljoin(url, location), headers=headers, preload_content=False,
                                          timeout=self._timeouts, retries=_RETRIES.new(redirect=_MAX_REDIRECTS - 1))
        except MaxRetryError as exc:  # the one failed attempt, wrapped: report its cause
            raise _failure(url, exc.reason or exc, self.timeout) from None
        except (HTTPError, OSError, ValueError) as exc:
            raise _failure(url, exc, self.timeout) from None
        complete = False
        try:
            if resp.status >= 400:
                raise SourceError("http_status", f"GET {url}: HTTP {resp.status} {resp.reason or ''}".strip())
            declared = resp.headers.get("Content-Length", "")
            if declared.isdigit() and int(declared) > self.max_body:
                raise SourceError("too_large", f"GET {url}: Content-Length {declared} over the "
                                               f"{self.max_body}-byte cap")
            body = self._read_body(resp, url, deadline)
            complete = True
            return body
        except SourceError:
            raise
        except (HTTPError, OSError) as exc:
            raise _failure(url, exc, self.timeout) from None
        finally:
            if not complete:
                resp.close()  # a half-read connection must not go back to the pool
            resp.release_conn()

    def _first_hop(self, url: str, headers: Mapping[str, str]) -> urllib3.BaseHTTPResponse:
        """GET `url` from its host's pool, redirects not followed. The pool is looked up once per URL."""
        try:
            return self._urlopen(url, headers)
        except ClosedPoolError:  # the PoolManager retired that pool (more hosts than _POOLS): look it up again
            del self._first_hops[url]
            return self._urlopen(url, headers)

    def _urlopen(self, url: str, headers: Mapping[str, str]) -> urllib3.BaseHTTPResponse:
        hop = self._first_hops.get(url)
        if hop is None:
            hop = self._first_hops[url] = (self.pools.connection_from_url(url), parse_url(url).request_uri)
        pool, path = hop
        return pool.urlopen("GET", path, headers=headers, retries=_RETRIES, redirect=False, preload_content=False,
                            timeout=self._timeouts)

    def _read_body(self, raw: urllib3.BaseHTTPResponse, url: str, deadline: float) -> bytes:
        body = bytearray()
        while True:
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise SourceError("timeout", f"GET {url}: response not complete within {self.timeout:g}s")
            _limit_next_read(raw, remaining)
            chunk = raw.read1(_CHUNK, decode_content=True)  # returns as soon as any bytes arrive
            if not chunk:
                return bytes(body)
            body += chunk  # decoded bytes: a gzip bomb hits the cap too
            if len(body) > self.max_body:
                raise SourceError("too_large", f"GET {url}: body over the {self.max_body}-byte cap")

    def get_json_field(self, url: str, key: str) -> str:
        """`body[key]` of a JSON object at `url` as a string; "" when absent. Raises SourceError."""
        body = self.get(url, accept="application/json")
        try:
            value = json.loads(body).get(key, "")
        except (ValueError, AttributeError) as exc:
            raise SourceError("parse", f"GET {url}: not a JSON object ({exc})") from None
        return value if isinstance(value, str) else ""

    def close(self) -> None:
        self._first_hops.clear()
        self.pools.clear()


def _failure(url: str, exc: BaseException, timeout: float) -> SourceError:
    # NewConnectionError (refused, unreachable) subclasses urllib3's ConnectTimeoutError: test it first.
    if isinstance(exc, (urllib3.exceptions.TimeoutError, TimeoutError)) and not isinstance(exc, NewConnectionError):
        return SourceError("timeout", f"GET {url}: no complete response within {timeout:g}s")
    if isinstance(exc, (LocationValueError, ValueError)):
        return SourceError("connection", f"GET {url}: invalid URL: {exc}")
    # refused, reset, DNS, a response cut short (ProtocolError), too many redirects
    return SourceError("connection", f"GET {url}: {type(exc).__name__}: {exc}")


def _limit_next_read(raw: urllib3.BaseHTTPResponse, seconds: float) -> None:
    """Shrink the socket timeout to what is left of the deadline, so one stalled read cannot overrun it."""
    sock = getattr(getattr(raw, "connection", None), "sock", None)
    if sock is not None:
        sock.settimeout(max(seconds, 0.001))
