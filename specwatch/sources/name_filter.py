"""Scraping only the series specwatch reads, where an engine's /metrics can filter them, and proving it can.

prometheus_client's exposition app, which vLLM and SGLang mount at /metrics, restricts its output to the
samples named by `name[]` query parameters. A vLLM /metrics with 2 DP engines is ~85 KB, of which specwatch
reads ~2 KB: fetching only that cuts the bytes each scrape moves and parses by ~30x, which is most of the
daemon's CPU on a host with many endpoints (docs/benchmarks.md, Overhead).

The filter works only where the registry knows its metrics' names: vLLM with one API server. SGLang, and
vLLM with `--api-server-count` > 1, serve /metrics from a multiprocess collector that names nothing, so a
filtered request gets an empty body; a proxy in between may ignore the parameters or refuse them. So the
filter is never assumed: an endpoint is *checked* by fetching it both ways in one cycle, and the filter is
used only when both answers hold the same wanted series. The check is repeated every `recheck_seconds`,
and a filtered answer that fails or holds none of the wanted series switches back to the whole exposition
in the same cycle (the cycle loses nothing).
"""

from __future__ import annotations

import logging
import re
from typing import Callable, Iterable
from urllib.parse import quote, urlsplit

from specwatch.sources.base import SourceError
from specwatch.sources.exposition import ExpositionError, parse

log = logging.getLogger(__name__)

RECHECK_SECONDS = 3600.0
# A filtered answer failing for these reasons says the filter (or what serves it) is the problem; any other
# failure (refused, timeout) would have hit the whole exposition too, and is the endpoint's.
_FILTER_FAULTS = frozenset(("http_status", "too_large", "parse"))


def filtered_url(url: str, names: Iterable[str]) -> str | None:
    """`url` with one `name[]` parameter per name; None when the URL already chooses its own names."""
    query = urlsplit(url).query
    if "name[]=" in query or "name%5B%5D=" in query.replace("%5b%5d", "%5B%5D"):
        return None
    params = "&".join("name[]=" + quote(name, safe="") for name in sorted(names))
    return url + ("&" if query else "?") + params


class NameFilter:
    """Whether one endpoint is fetched with `name[]` (state "on") or whole ("off"), and when to check again.

    `fetch(get, now)` returns this cycle's body for the wanted `names`, fetched with `get(url)` (which
    raises SourceError), checking the filter when one is due.
    """

    def __init__(self, url: str, names: Iterable[str], recheck_seconds: float = RECHECK_SECONDS) -> None:
        self.url = url
        self.names = frozenset(names)
        self.filtered_url = filtered_url(url, self.names)
        self.recheck_seconds = recheck_seconds
        self.state = "check" if self.filtered_url else "off"
        # A line that starts a sample of a wanted name: what an empty or error answer lacks.
        self._sample_line = re.compile(
            b"^(?:" + b"|".join(re.escape(n.encode()) for n in sorted(self.names)) + rb")[{ \t]", re.M
        )
        self._next_check = float("-inf")
        self._last_now = float("-inf")
        self._announced: bool | None = None  # what the log last said: filtering or not

    def fetch(self, get: Callable[[str], bytes], now: float) -> bytes:
        due = now >= self._next_check or now < self._last_now  # a clock that went back checks at once
        self._last_now = now
        if self.state == "on" and not due:
            body = self._filtered(get)
            if body is not None and self._sample_line.search(body):  # a full check is for `due` cycles
                return body
            self._switch("check", now, "its filtered answer held none of the wanted series")
        body = get(self.url)  # the endpoint's own failure propagates, and the check waits for a good cycle
        if self.filtered_url and (self.state == "check" or due):
            self._check(get, body, now)
        return body

    def disable(self) -> None:
        """Never ask for a filtered answer again: the endpoint is not Prometheus text (TensorRT-LLM's JSON
        iteration stats, which a second GET would drain)."""
        self.filtered_url = ""
        self.state = "off"

    # ------------------------------------------------------------------ internals
    def _filtered(self, get: Callable[[str], bytes], checking: bool = False) -> bytes | None:
        """The filtered answer; None when the filter itself failed (while checking: whatever failed, since the
        whole exposition has just been fetched)."""
        url = self.filtered_url
        assert url is not None  # called only when the filter is in use
        try:
            return get(url)
        except SourceError as exc:
            if not checking and exc.reason not in _FILTER_FAULTS:
                # The endpoint's own failure; its message names the URL without the long parameter list.
                raise SourceError(exc.reason, str(exc).replace(url, self.url + "?name[]=...")) from None
            log.debug("%s: filtered scrape failed (%s): %s", self.url, exc.reason, exc)
            return None

    def _check(self, get: Callable[[str], bytes], whole: bytes, now: float) -> None:
        self._next_check = now + self.recheck_seconds
        filtered = self._filtered(get, checking=True)
        expected = self._series(whole)
        if filtered is not None and expected and self._series(filtered) == expected and not self._unwanted(filtered):
            self._switch(
                "on", now, f"it serves the {len(expected)} wanted series alone ({len(filtered)} of {len(whole)} bytes)"
            )
        else:
            reason = (
                "the filtered request failed"
                if filtered is None
                else "the whole exposition holds none of the wanted series"
                if not expected
                else "it ignores ?name[]= (the filtered answer holds other series too)"
                if self._unwanted(filtered)
                else "its filtered answer differs from the whole exposition"
            )
            self._switch("off", now, reason)

    def _switch(self, state: str, now: float, why: str) -> None:
        """Change state; the log says so when what is fetched changes (and at the first decision)."""
        filtering = state == "on"
        if filtering != self._announced:
            if filtering:
                log.info("%s: scraping with ?name[]=... from now on: %s", self.url, why)
            else:
                log.info(
                    "%s: scraping the whole exposition: %s; checked again in %gs", self.url, why, self.recheck_seconds
                )
            self._announced = filtering
        self.state = state
        if state == "check":
            self._next_check = float("-inf")

    def _unwanted(self, body: bytes) -> bool:
        """Whether `body` holds a sample of a series not asked for: an endpoint (vLLM's CPU build 0.32, a proxy)
        that ignores `name[]` answers the whole exposition, and fetching it twice would save nothing."""
        for line in body.splitlines():
            if line and not line.startswith(b"#"):
                name = line.split(b"{", 1)[0].split(b" ", 1)[0]
                if name.decode(errors="replace") not in self.names:
                    return True
        return False

    def _series(self, body: bytes) -> frozenset[tuple]:
        """The wanted series (name and label set) in `body`; empty when it holds none or does not parse.

        Only samples named exactly as asked count: a filter returns a histogram's `_sum` and `_count` when
        those are asked for, and never its `_bucket` lines, which a whole exposition has.
        """
        try:
            families = parse(body, self.names, comments=False)
        except ExpositionError:
            return frozenset()
        names = self.names
        return frozenset(
            (s.name, frozenset(s.labels.items())) for fam in families.values() for s in fam.samples if s.name in names
        )
