"""http.client connections whose responses read their headers without the `email` package.

http.client hands every response's header block to `email.parser`. For the few headers an engine sends that is
a third of a small GET's CPU: with `?name[]=` filtering (name_filter.py) a 64-endpoint cycle fetches 3 KB
answers, and one GET cost 81 us of CPU through HTTPResponse against 59 us through LeanResponse (same server,
same run). A scrape needs a handful of headers looked up by name, so `LeanResponse.begin` reads them into a
small case-insensitive mapping, split as the email parser splits them, and decides exactly what
`HTTPResponse.begin` decides (status, chunked, length, whether the connection closes); reading the body,
chunked decoding and keep-alive stay http.client's. `response_class` is http.client's own hook for this, and
tests/test_lean_http.py holds both to the same answers on the same bytes.
"""

from __future__ import annotations

import re
from http.client import HTTPConnection, HTTPException, HTTPResponse, HTTPSConnection, LineTooLong, UnknownProtocol
from typing import BinaryIO

_MAX_LINE = 65536  # what http.client allows for one header line
_MAX_HEADERS = 100  # and for their number
_NAME = re.compile(r"[\x21-\x39\x3b-\x7e]*")  # the email parser's header name: printable, no colon or blank


class Headers:
    """A response's headers: case-insensitive lookup, in the order they came, repeats kept. Quacks like the
    parts of `http.client.HTTPMessage` that HTTPResponse and specwatch use (get, get_all, items)."""

    __slots__ = ("_items", "_by_name")

    def __init__(self, items: list[tuple[str, str]]) -> None:
        self._items = items
        self._by_name: dict[str, list[str]] = {}
        for name, value in items:
            self._by_name.setdefault(name.lower(), []).append(value)

    def get(self, name: str, default: str | None = None) -> str | None:
        values = self._by_name.get(name.lower())
        return values[0] if values else default

    def get_all(self, name: str, failobj: list[str] | None = None) -> list[str] | None:
        return self._by_name.get(name.lower(), failobj)

    def items(self) -> list[tuple[str, str]]:
        return list(self._items)


def read_header_block(fp: BinaryIO) -> Headers:
    """Header lines up to the blank line, split as the email parser splits them: the name is everything
    before the first colon and must hold no blanks or controls, the value loses its leading blanks and line
    end only. As there, a line that is not a header ends the headers (the rest of the block is read and
    dropped), and an obsolete folded line continues the header above."""
    items: list[tuple[str, str]] = []
    ended = False
    for _ in range(_MAX_HEADERS + 1):
        line = fp.readline(_MAX_LINE + 1)
        if len(line) > _MAX_LINE:
            raise LineTooLong("header line")
        if line in (b"\r\n", b"\n", b""):
            return Headers(items)
        if ended:
            continue
        text = line.decode("iso-8859-1").rstrip("\r\n")
        if text[:1] in (" ", "\t"):
            if items:
                name, value = items[-1]
                items[-1] = (name, f"{value} {text.strip()}")
            continue
        name, colon, value = text.partition(":")
        if not colon or not _NAME.fullmatch(name):
            ended = True
            continue
        items.append((name, value.lstrip(" \t")))
    raise HTTPException(f"got more than {_MAX_HEADERS} headers")


class LeanResponse(HTTPResponse):
    def begin(self) -> None:
        # HTTPResponse.begin's decisions (CPython 3.10-3.13), on a Headers instead of a Message.
        if self.headers is not None:
            return
        while True:
            version, status, reason = self._read_status()
            if status != 100:
                break
            read_header_block(self.fp)  # an interim 100 Continue: its headers are skipped
        self.code = self.status = status
        self.reason = reason.strip()
        if version in ("HTTP/1.0", "HTTP/0.9"):
            self.version = 10
        elif version.startswith("HTTP/1."):
            self.version = 11
        else:
            raise UnknownProtocol(version)
        self.headers = self.msg = read_header_block(self.fp)  # type: ignore[assignment]
        te = self.headers.get("transfer-encoding")
        self.chunked = bool(te and te.lower() == "chunked")
        if self.chunked:
            self.chunk_left = None
        self.will_close = self._check_close()
        self.length = None
        length = self.headers.get("content-length")
        if length and not self.chunked:
            try:
                self.length = int(length)
            except ValueError:
                self.length = None
            else:
                if self.length < 0:
                    self.length = None
        if status in (204, 304) or 100 <= status < 200 or self._method == "HEAD":
            self.length = 0
        if not self.will_close and not self.chunked and self.length is None:
            self.will_close = True


class LeanHTTPConnection(HTTPConnection):
    response_class = LeanResponse


class LeanHTTPSConnection(HTTPSConnection):
    response_class = LeanResponse
