"""/metrics is rendered once per Snapshot, format and encoding; a new Snapshot renders afresh."""

from __future__ import annotations

import dataclasses
import gzip

from specwatch.export import http as http_module
from specwatch.export.http import RenderCache
from specwatch.snapshot import EMPTY_SNAPSHOT, RouteState

TEXT = "text/plain"
OPENMETRICS = "application/openmetrics-text"


def snapshot(ts: float, routes: int = 40):
    return dataclasses.replace(
        EMPTY_SNAPSHOT,
        timestamp=ts,
        routes=tuple(
            RouteState(name=f"r{i}", up=True, acceptance_source="counter", drafts_total=float(i)) for i in range(routes)
        ),
    )


def test_scrapes_of_one_snapshot_share_one_render_per_format_and_encoding():
    current = {"snap": snapshot(1.0)}
    cache = RenderCache(lambda: current["snap"])
    plain, content_type, gzipped = cache.body(TEXT, "")
    assert content_type.startswith("text/plain") and not gzipped and b'route="r39"' in plain
    assert cache.body(TEXT, "identity") == (plain, content_type, False)
    packed, _, gzipped = cache.body(TEXT, "gzip, deflate")
    assert gzipped and gzip.decompress(packed) == plain
    assert cache.renders == 1, "gzip reuses the plain render"
    om, om_type, _ = cache.body(OPENMETRICS, "")
    assert om_type.startswith("application/openmetrics-text") and om.endswith(b"# EOF\n") and cache.renders == 2

    current["snap"] = snapshot(2.0)  # a new cycle: rendered afresh, never served from the old one
    fresh, _, _ = cache.body(TEXT, "")
    assert cache.renders == 3 and fresh != plain and b"specwatch_last_evaluation_timestamp_seconds 2.0" in fresh


def test_a_small_body_is_never_gzipped(monkeypatch):
    plain, _, _ = RenderCache(lambda: EMPTY_SNAPSHOT).body(TEXT, "")
    monkeypatch.setattr(http_module, "GZIP_MIN_BYTES", len(plain) + 1)
    body, _, gzipped = RenderCache(lambda: EMPTY_SNAPSHOT).body(TEXT, "gzip")
    assert not gzipped and body == plain
    monkeypatch.setattr(http_module, "GZIP_MIN_BYTES", len(plain))
    assert RenderCache(lambda: EMPTY_SNAPSHOT).body(TEXT, "gzip")[2]


def test_a_prometheus_scrape_gets_gzipped_openmetrics_rendered_once_for_both_of_an_ha_pair():
    prometheus_accept = (
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
        "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    )
    current = snapshot(1.0)
    cache = RenderCache(lambda: current)
    first = cache.body(prometheus_accept, "gzip")
    packed, content_type, gzipped = first
    assert content_type.startswith(OPENMETRICS) and gzipped
    assert gzip.decompress(packed).endswith(b"# EOF\n")
    assert cache.body(prometheus_accept, "gzip") == first and cache.renders == 1


def test_rendered_body_answers_only_what_is_rendered_and_never_waits_or_renders():
    current = {"snap": snapshot(1.0)}
    cache = RenderCache(lambda: current["snap"])
    assert cache.rendered_body(TEXT, "gzip") is None and cache.renders == 0
    assert cache.rendered_body(TEXT, "gzip") is None  # still nothing: it never renders
    answer = cache.body(TEXT, "gzip")
    assert cache.rendered_body(TEXT, "gzip") == answer and cache.renders == 1
    assert cache.rendered_body(OPENMETRICS, "gzip") is None  # another format is not rendered yet
    with cache._lock:  # a render under way
        assert cache.rendered_body(TEXT, "gzip") is None
    current["snap"] = snapshot(2.0)
    assert cache.rendered_body(TEXT, "gzip") is None and cache.renders == 1
