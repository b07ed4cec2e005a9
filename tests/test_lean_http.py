"""LeanResponse must decide what http.client's HTTPResponse decides, on the same bytes (differential tests)."""

from __future__ import annotations

import io
from http.client import HTTPException, HTTPResponse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specwatch.sources.lean_http import LeanResponse


class _Socket:
    def __init__(self, raw: bytes) -> None:
        self._raw = raw

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self._raw))


def _read(cls: type[HTTPResponse], raw: bytes, method: str = "GET") -> dict:
    """What a scrape looks at, or the exception type begin() raised."""
    response = cls(_Socket(raw), method=method)
    try:
        response.begin()
    except HTTPException as exc:
        return {"error": type(exc).__name__}
    seen = {"status": response.status, "reason": response.reason, "version": response.version,
            "chunked": response.chunked, "length": response.length, "will_close": response.will_close,
            "headers": {name: response.getheader(name) for name in
                        ("Content-Type", "content-length", "LOCATION", "Content-Encoding", "Set-Cookie", "X-Absent")}}
    try:
        seen["body"] = response.read()
    except HTTPException as exc:
        seen["body"] = type(exc).__name__
    return seen


def _same(raw: bytes, method: str = "GET") -> dict:
    ours, stdlib = _read(LeanResponse, raw, method), _read(HTTPResponse, raw, method)
    assert ours == stdlib, raw
    return ours


CASES = {
    "length, kept alive": b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: 5\r\n\r\nhello",
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    "chunked wins over length": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
                                b"5\r\nhello\r\n0\r\n\r\n",
    "1.0 closes": b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    "1.0 keep-alive": b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\nok",
    "1.0 keep-alive header": b"HTTP/1.0 200 OK\r\nKeep-Alive: timeout=5\r\nContent-Length: 2\r\n\r\nok",
    "1.1 close": b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
    "no length: until close": b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it",
    "100 continue first": b"HTTP/1.1 100 Continue\r\nX-Interim: 1\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    "204": b"HTTP/1.1 204 No Content\r\nContent-Length: 10\r\n\r\n",
    "304": b"HTTP/1.1 304 Not Modified\r\n\r\n",
    "negative length": b"HTTP/1.1 200 OK\r\nContent-Length: -4\r\n\r\nbody",
    "bad length": b"HTTP/1.1 200 OK\r\nContent-Length: four\r\n\r\nbody",
    "blank around values": b"HTTP/1.1 307 Temporary Redirect\r\nLocation: \t /metrics/  \r\ncontent-length:0\r\n\r\n",
    "repeated": b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nContent-Length: 0\r\n\r\n",
    "bare LF": b"HTTP/1.1 200 OK\nContent-Length: 2\nContent-Encoding: gzip\n\nok",
    "not a header ends them": b"HTTP/1.1 200 OK\r\nContent-Type: a\r\nno colon here\r\nContent-Length: 2\r\n\r\nok",
    "blank in a name": b"HTTP/1.1 200 OK\r\nContent Length: 2\r\nContent-Type: b\r\n\r\nok",
    "HTTP/1.1 error page": b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/html\r\nContent-Length: 13\r\n\r\n"
                           b"<html></html>",
    "latin-1 value": b"HTTP/1.1 200 OK\r\nContent-Type: caf\xe9\r\nContent-Length: 0\r\n\r\n",
    "empty reason": b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n",
    "garbage": b"\x00\xff\xfe binary garbage\r\n\r\n",
    "HTTP/2": b"HTTP/2.0 200 OK\r\n\r\n",
    "nothing": b"",
    "header line too long": b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70000 + b"\r\n\r\n",
    "too many headers": b"HTTP/1.1 200 OK\r\n" + b"X-H: 1\r\n" * 101 + b"\r\n",
    "cut in the headers": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n",
}


@pytest.mark.parametrize("raw", CASES.values(), ids=CASES.keys())
def test_lean_response_decides_as_http_client_does(raw):
    _same(raw)


def test_the_cases_cover_what_a_scrape_relies_on():
    """Guards the table above against losing its point: errors, chunked bodies, closes and redirects occur."""
    results = [_same(raw) for raw in CASES.values()]
    assert {r.get("error") for r in results} >= {"BadStatusLine", "UnknownProtocol", "RemoteDisconnected",
                                                 "LineTooLong", "HTTPException"}
    assert any(r.get("chunked") for r in results) and any(r.get("will_close") for r in results)
    assert any((r.get("headers") or {}).get("LOCATION") == "/metrics/  " for r in results)


def test_head_has_no_body():
    assert _same(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", method="HEAD")["length"] == 0


def test_folded_header_continues_the_one_above():
    """Obsolete line folding: the value is joined (http.client keeps the raw CRLF; a scrape never sees one)."""
    raw = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain;\r\n version=0.0.4\r\nContent-Length: 0\r\n\r\n"
    response = LeanResponse(_Socket(raw))
    response.begin()
    assert response.getheader("content-type") == "text/plain; version=0.0.4"
    assert response.length == 0


_token = st.text(alphabet=st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"),
                 min_size=1, max_size=12)
_name = st.one_of(st.sampled_from(["Content-Length", "content-length", "Transfer-Encoding", "Connection",
                                   "Keep-Alive", "Content-Type", "Location", "Set-Cookie", "Content-Encoding"]),
                  _token)
_value = st.one_of(st.sampled_from(["0", "5", "12", "-1", "x", "chunked", "Chunked", "close", "keep-alive",
                                    "gzip", " 5 ", "chunked, gzip"]),
                   st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=20))


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/0.9"]),
       status=st.sampled_from([200, 204, 301, 307, 404, 500]),
       headers=st.lists(st.tuples(_name, _value), max_size=8),
       body=st.binary(max_size=40), line_end=st.sampled_from([b"\r\n", b"\n"]))
def test_lean_response_matches_http_client_on_random_responses(version, status, headers, body, line_end):
    head = f"{version} {status} Reason".encode() + line_end
    head += b"".join(f"{name}: {value}".encode() + line_end for name, value in headers)
    _same(head + line_end + body)
