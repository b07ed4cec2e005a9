"""Scraping with `?name[]=...` only where the endpoint proves it serves the same series that way.

Against the simulator's engines, whose /metrics answer `name[]` as the real ones do (prometheus_client's
restricted registry: vLLM with one API server filters; SGLang's multiprocess registry answers nothing).
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from specwatch.config import RouteConfig
from specwatch.sources import vllm as vllm_map
from specwatch.sources.base import SourceError
from specwatch.sources.engines import FILTER_NAMES, SharedEndpoint, parse_engine_sample
from specwatch.sources.http import HttpFetcher
from specwatch.sources.name_filter import RECHECK_SECONDS, NameFilter, filtered_url
from specwatch.simulator.launch import start_inprocess
from specwatch.simulator.simulation import SimulationSpec

FIXTURE = (Path(__file__).parent / "fixtures" / "vllm" / "v1_k4_2engines.prom").read_bytes()


class RecordingFetcher(HttpFetcher):
    def __init__(self) -> None:
        super().__init__(timeout_seconds=10.0)  # loopback, but a loaded box can stall a scrape for seconds
        self.urls: list[str] = []
        self.bodies: list[bytes] = []

    def get(self, url: str, accept: str | None = None) -> bytes:
        self.urls.append(url)
        body = super().get(url, accept)
        self.bodies.append(body)
        return body

    def take(self) -> list[str]:
        """The URLs fetched since the last take(), as "full" / "filtered"."""
        urls, self.urls = self.urls, []
        return ["filtered" if "name[]=" in u else "full" for u in urls]


@pytest.fixture
def vllm_sim():
    sim = start_inprocess(SimulationSpec(engine_kind="vllm", dp=2, k=4, time_scale=50.0, seed=3))
    yield sim
    sim.stop()


@pytest.fixture
def sglang_sim():
    sim = start_inprocess(SimulationSpec(engine_kind="sglang", dp=1, k=3, time_scale=50.0, seed=4))
    yield sim
    sim.stop()


def _route(url: str, engine: str = "vllm") -> RouteConfig:
    return RouteConfig(name="r", url=url, engine=engine)


@pytest.mark.slow
def test_a_vllm_endpoint_is_checked_once_then_scraped_filtered(vllm_sim):
    fetcher = RecordingFetcher()
    endpoint = SharedEndpoint(vllm_sim.url + "/metrics", fetcher)
    kind, whole = endpoint.families("reader", "vllm", now=1000.0)
    assert fetcher.take() == ["full", "filtered"] and endpoint.name_filter.state == "on"
    full_size = len(fetcher.bodies[0])

    for cycle in range(1, 4):
        kind, families = endpoint.families("reader", "vllm", now=1000.0 + 5 * cycle)
        assert fetcher.take() == ["filtered"]
        assert len(fetcher.bodies[-1]) * 10 < full_size  # the point of it
        # The same families and series as the whole exposition holds, and the same sample out of them
        # (a histogram's `_bucket` lines are not asked for: only its `_sum` and `_count`).
        assert set(families) == set(whole)
        for name in families:
            assert [(s.name, dict(s.labels)) for s in families[name].samples] == [
                (s.name, dict(s.labels)) for s in whole[name].samples if s.name in FILTER_NAMES
            ]
    sample = vllm_map.extract(families, {}, (), 1015.0)
    assert [e.engine for e in sample.engines] == ["0", "1"] and sample.num_speculative_tokens == 4

    endpoint.families("reader", "vllm", now=1000.0 + RECHECK_SECONDS + 1)  # checked again, hourly
    assert fetcher.take() == ["full", "filtered"] and endpoint.name_filter.state == "on"
    fetcher.close()


@pytest.mark.slow
def test_an_sglang_endpoint_keeps_the_whole_exposition(sglang_sim):
    fetcher = RecordingFetcher()
    endpoint = SharedEndpoint(sglang_sim.url + "/metrics", fetcher)
    endpoint.families("reader", "sglang", now=1000.0)
    assert fetcher.take() == ["full", "filtered"]
    assert fetcher.bodies[1] == b""  # SGLang's multiprocess registry names nothing: an empty answer
    assert endpoint.name_filter.state == "off"
    for cycle in range(1, 3):
        kind, families = endpoint.families("reader", "auto", now=1000.0 + 5 * cycle)
        assert kind == "sglang" and families and fetcher.take() == ["full"]
    endpoint.families("reader", "sglang", now=1000.0 + RECHECK_SECONDS + 1)
    assert fetcher.take() == ["full", "filtered"] and endpoint.name_filter.state == "off"
    fetcher.close()


@pytest.mark.slow
def test_a_filter_that_stops_working_falls_back_within_the_same_cycle(vllm_sim):
    """vLLM restarted with several API servers (a multiprocess registry): filtered answers turn empty."""
    fetcher = RecordingFetcher()
    endpoint = SharedEndpoint(vllm_sim.url + "/metrics", fetcher)
    endpoint.families("reader", "vllm", now=1000.0)
    endpoint.families("reader", "vllm", now=1005.0)
    assert fetcher.take() == ["full", "filtered", "filtered"] and endpoint.name_filter.state == "on"

    metrics = vllm_sim.simulation.metrics
    whole_only = metrics.render
    metrics.render = lambda names=None: b"" if names else whole_only()
    kind, families = endpoint.families("reader", "vllm", now=1010.0)
    assert fetcher.take() == ["filtered", "full", "filtered"]  # the empty answer, the whole one, the check
    assert families and endpoint.name_filter.state == "off"
    assert vllm_map.extract(families, {}, (), 1010.0).engines  # the cycle lost nothing
    endpoint.families("reader", "vllm", now=1015.0)
    assert fetcher.take() == ["full"]
    fetcher.close()


class _Refusing(BaseHTTPRequestHandler):
    """A proxy that refuses query strings on /metrics (400), or, once `down`, closes every connection.
    Not refusing, it filters by `name[]` as prometheus_client does, or (`ignore_names`) answers everything."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.server.down:
            self.close_connection = True
            return
        status, body = (400, b"no query strings here") if "?" in self.path and self.server.refuse else (200, FIXTURE)
        names = parse_qs(urlsplit(self.path).query).get("name[]")
        if status == 200 and names and not self.server.ignore_names:
            body = b"".join(
                line
                for line in FIXTURE.splitlines(keepends=True)
                if line.split(b"{")[0].split(b" ")[0].decode() in names
            )
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def proxy():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    httpd.daemon_threads, httpd.refuse, httpd.down, httpd.ignore_names = True, True, False, False
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}/metrics"
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.slow
def test_a_refused_filter_is_dropped_and_the_scrape_goes_on(proxy):
    fetcher = RecordingFetcher()
    endpoint = SharedEndpoint(proxy.url, fetcher)
    for cycle in range(3):
        kind, families = endpoint.families("reader", "vllm", now=1000.0 + 5 * cycle)
        assert families
    assert fetcher.take() == ["full", "filtered", "full", "full"] and endpoint.name_filter.state == "off"
    fetcher.close()


@pytest.mark.slow
def test_a_server_that_ignores_the_parameters_is_scraped_whole_and_says_so(proxy, caplog):
    """Parameters ignored (vLLM's CPU build 0.32 does this): the "filtered" answer is the whole exposition, so
    the filter is off, the log says why, and nothing is lost."""
    proxy.refuse = False
    proxy.ignore_names = True
    fetcher = RecordingFetcher()
    endpoint = SharedEndpoint(proxy.url, fetcher)
    with caplog.at_level(logging.INFO, logger="specwatch.sources.name_filter"):
        for cycle in range(3):
            kind, families = endpoint.families("reader", "vllm", now=1000.0 + 5 * cycle)
            assert families["vllm:spec_decode_num_drafts_total"].samples
    assert fetcher.take() == ["full", "filtered", "full", "full"] and endpoint.name_filter.state == "off"
    assert "ignores ?name[]=" in caplog.text and "scraping with ?name[]=" not in caplog.text
    fetcher.close()


@pytest.mark.slow
def test_a_dead_endpoint_fails_with_a_readable_message_while_filtered(proxy):
    proxy.refuse = False
    fetcher = RecordingFetcher()
    endpoint = SharedEndpoint(proxy.url, fetcher)
    endpoint.families("reader", "vllm", now=1000.0)
    assert endpoint.name_filter.state == "on"
    proxy.down = True
    with pytest.raises(SourceError) as failure:
        endpoint.families("reader", "vllm", now=1005.0)
    assert failure.value.reason == "connection"
    assert "?name[]=..." in str(failure.value) and "vllm%3A" not in str(failure.value)
    assert endpoint.name_filter.state == "on"  # a dead engine says nothing about the filter
    fetcher.close()


def test_urls_with_their_own_names_or_query_are_respected():
    assert filtered_url("http://h:8000/metrics?name[]=vllm:x", ["a"]) is None
    assert NameFilter("http://h:8000/metrics?name%5B%5D=x", ["a"]).state == "off"
    assert (
        filtered_url("http://h:8000/metrics?token=1", ["vllm:a", "sglang:b"])
        == "http://h:8000/metrics?token=1&name[]=sglang%3Ab&name[]=vllm%3Aa"
    )


def test_every_family_an_extractor_reads_is_asked_for():
    from specwatch.sources.engines import ENGINES

    for kind in ENGINES.values():
        assert kind.wanted <= FILTER_NAMES


@pytest.mark.slow
def test_a_route_reads_the_same_sample_from_the_filtered_answer(vllm_sim):
    """End to end through the HTTP source's parse: filtered and whole bodies of one moment give one sample."""
    metrics = vllm_sim.simulation.metrics
    whole = metrics.render()
    filtered = metrics.render(sorted(FILTER_NAMES))
    route = _route(vllm_sim.url + "/metrics")
    a, b = parse_engine_sample("vllm", whole, route, 5.0), parse_engine_sample("vllm", filtered, route, 5.0)
    if a.engines != b.engines:  # the simulation moved between the two renders: render both again
        whole, filtered = metrics.render(), metrics.render(sorted(FILTER_NAMES))
        a, b = parse_engine_sample("vllm", whole, route, 5.0), parse_engine_sample("vllm", filtered, route, 5.0)
    assert a.engines == b.engines and a.model_name == b.model_name
    assert len(filtered) * 10 < len(whole)
