"""End to end for the added engines: their fixtures served over HTTP on loopback, read by the daemon with its real
HTTP sources and `engine: auto`, and the exported /metrics text compared with the counters the fixtures were made
from. The fixtures are transcribed from the engines' source (see their headers); the daemon, HTTP client, parser,
tracking and exporter are the production ones.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.config import parse_config
from specwatch.daemon import Daemon
from specwatch.export.prometheus import SnapshotCollector

from fakes import FakeClock

pytestmark = pytest.mark.slow  # loopback HTTP servers

FIXTURES = Path(__file__).parent / "fixtures"
# route -> (URL path, fixture of the first and second scrape); every route uses `engine: auto`
ROUTES = {
    "trt": ("/prometheus/metrics", "trtllm/serve_dynamic_k"),
    "dynamo": ("/dynamo/metrics", "dynamo/trtllm_passthrough"),
    "llama": ("/llama/metrics", "llamacpp/server_k3"),
    "trtjson": ("/metrics", "trtllm/iteration_stats"),
}


class FixtureServer:
    """Serves the current body per path; `advance()` moves every path to its second scrape."""

    def __init__(self) -> None:
        self.scrape = 1
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                path = self.path.split("?")[0]
                body = outer.body(path)
                if body is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def body(self, path: str) -> bytes | None:
        for url_path, name in ROUTES.values():
            if path == url_path:
                suffix = "" if self.scrape == 1 else "_scrape2"
                ext = ".json" if name.endswith("iteration_stats") else ".prom"
                return (FIXTURES / f"{name}{suffix}{ext}").read_bytes()
        return None


def truth(name: str, scrape: int) -> dict:
    return json.loads((FIXTURES / f"{name}{'' if scrape == 1 else '_scrape2'}.truth.json").read_text())


@pytest.fixture
def server():
    s = FixtureServer()
    yield s
    s.httpd.shutdown()


def exported(daemon: Daemon) -> dict[tuple[str, tuple], float]:
    registry = CollectorRegistry(auto_describe=False)
    snapshot = daemon.snapshot
    registry.register(SnapshotCollector(lambda: snapshot))
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(metrics, name, **labels):
    return metrics[(name, tuple(sorted(labels.items())))]


def test_daemon_reports_the_engines_own_counter_ratios(server, tmp_path):
    config = parse_config(
        {
            "interval": "5s",
            "state_dir": str(tmp_path),
            "gpu": {"enabled": "false"},
            "routes": [{"name": r, "url": server.url + path, "engine": "auto"} for r, (path, _) in ROUTES.items()],
        }
    )
    daemon = Daemon(config, clock=FakeClock(1000.0))
    try:
        daemon.tick(1000.0)
        server.scrape = 2
        daemon.tick(1030.0)
        m = exported(daemon)
        snapshot = daemon.snapshot
    finally:
        daemon.close()

    kinds = {
        dict(labels)["route"]: dict(labels)["engine_kind"] for (name, labels) in m if name == "specwatch_route_info"
    }
    assert kinds == {"trt": "trtllm", "dynamo": "trtllm", "llama": "llamacpp", "trtjson": "trtllm"}
    for route, (_, name) in ROUTES.items():
        a, b = truth(name, 1), truth(name, 2)
        if "drafted_per_pos" in a and route != "trtjson":  # TensorRT-LLM Prometheus: the per-position counters
            acc = [y - x for x, y in zip(a["accepted_per_pos"], b["accepted_per_pos"])]
            drafted = [y - x for x, y in zip(a["drafted_per_pos"], b["drafted_per_pos"])]
            d_acc, d_drafted, d_drafts = sum(acc), sum(drafted), drafted[0]
            positions = [x / n for x, n in zip(acc, drafted)]
        else:
            d_acc = b["accepted_tokens"] - a["accepted_tokens"]
            d_drafted = b["draft_tokens"] - a["draft_tokens"]
            d_drafts = b["drafts"] - a["drafts"]
            positions = (
                [(y - x) / d_drafts for x, y in zip(a["accepted_per_pos"], b["accepted_per_pos"])]
                if route == "llama"
                else []
            )
        assert value(m, "specwatch_route_up", route=route) == 1.0
        assert value(m, "specwatch_route_acceptance_ratio", route=route, window="1m") == pytest.approx(
            d_acc / d_drafted
        )
        # Counter routes: /metrics leaves 1 + accepted / drafts to PromQL; the API keeps it.
        assert ("specwatch_route_mean_acceptance_length", (("route", route), ("window", "1m"))) not in m
        state = snapshot.route(route)
        assert state is not None and state.mean_acceptance_length["1m"] == pytest.approx(1 + d_acc / d_drafts)
        assert value(m, "specwatch_route_draft_length", route=route) == pytest.approx(d_drafted / d_drafts)
        for j, p in enumerate(positions):
            assert value(
                m, "specwatch_route_position_acceptance_ratio", route=route, position=str(j), window="5m"
            ) == pytest.approx(p)
        if route != "trtjson":  # the JSON iteration stats carry no generated-token count
            assert value(m, "specwatch_route_speculation_active", route=route) == 1.0
