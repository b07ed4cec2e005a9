"""HTTP for engine sources: one `requests.Session` per source, a whole-response deadline and a body cap.

`requests`' own timeout bounds each socket read, not the response: an engine that drips one byte a
second would never time out. So the body is streamed and both the wall-clock deadline and the byte cap
are enforced while reading; a 100 MB body costs at most the cap in memory.
"""

from __future__ import annotations

import json
import time
from typing import Callable

import requests
import urllib3

from specwatch.sources.base import SourceError

ACCEPT = "text/plain;version=0.0.4;q=1.0, */*;q=0.1"  # never OpenMetrics: it escapes `vllm:` to `vllm_`
_CHUNK = 64 * 1024


class HttpFetcher:
    """GETs URLs with a total deadline and a body cap; failures raise SourceError with a fixed reason."""

    def __init__(self, timeout_seconds: float = 2.0, max_body_bytes: int = 16 * 1024 * 1024,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout_seconds
        self.max_body = max_body_bytes
        self.clock = clock
        self.session = requests.Session()
        self.session.headers.update({"Accept": ACCEPT, "User-Agent": "specwatch"})

    def get(self, url: str, accept: str | None = None) -> bytes:
        deadline = self.clock() + self.timeout
        headers = {"Accept": accept} if accept else None
        try:
            with self.session.get(url, timeout=self.timeout, stream=True, headers=headers) as resp:
                if resp.status_code >= 400:
                    raise SourceError("http_status", f"GET {url}: HTTP {resp.status_code} {resp.reason or ''}".strip())
                declared = resp.headers.get("Content-Length", "")
                if declared.isdigit() and int(declared) > self.max_body:
                    raise SourceError("too_large", f"GET {url}: Content-Length {declared} over the "
                                                   f"{self.max_body}-byte cap")
                return self._read_body(resp.raw, url, deadline)
        except SourceError:
            raise
        except (requests.Timeout, urllib3.exceptions.TimeoutError, TimeoutError):
            raise SourceError("timeout", f"GET {url}: no complete response within {self.timeout:g}s") from None
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            # refused, reset, DNS, a response cut short (ProtocolError), a malformed URL
            raise SourceError("connection", f"GET {url}: {type(exc).__name__}: {exc}") from None

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
        self.session.close()


def _limit_next_read(raw: urllib3.BaseHTTPResponse, seconds: float) -> None:
    """Shrink the socket timeout to what is left of the deadline, so one stalled read cannot overrun it."""
    sock = getattr(getattr(raw, "connection", None), "sock", None)
    if sock is not None:
        sock.settimeout(max(seconds, 0.001))
