"""A real vLLM (the CPU build, testbed) with a batch-size schedule, `num_speculative_tokens_per_batch_size`:
the draft length follows the load without a model-change event, and the band with K = 0 turns
`specwatch_route_speculation_active` to 0 while tokens keep being generated.

The daemon ticks on a test clock 400 s apart, so each tick's 5-minute window holds exactly the traffic between it
and the previous tick (one load phase), while the engine runs in real time. Every figure is compared with the
engine's own /metrics bodies that the daemon read (through the recording proxy of test_real_vllm).
"""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.config import parse_config
from specwatch.daemon import Daemon
from testbed.load import BackgroundLoad, run_requests
from testbed.models import GOOD_DRAFTER_NOISE
from testbed.vllm_server import VllmServer, VllmServerSpec
from specwatch.tracking.routes import MIN_ACTIVE_DRAFT_SHARE
from engine_counters import engine_values
from test_real_vllm import RecordingProxy

pytestmark = [pytest.mark.real_engine, pytest.mark.e2e]

K = 3
# vLLM's batch size here is the number of requests scheduled in the step: alone, a request drafts 3 tokens;
# two at a time draft 1; three or more do not draft at all.
SCHEDULE = [[1, 1, K], [2, 2, 1], [3, 16, 0]]
MAX_NUM_SEQS = 4
STEP = 400.0  # test-clock seconds between ticks: more than the 5m window, so each window is one phase


def generation_tokens(body: str) -> float:
    return sum(
        s.value
        for f in text_string_to_metric_families(body)
        for s in f.samples
        if s.name == "vllm:generation_tokens_total"
    )


@pytest.fixture(scope="module")
def scheduled(engine_env, tiny_models, tmp_path_factory):
    speculative = {
        "method": "draft_model",
        "model": str(tiny_models.drafter(GOOD_DRAFTER_NOISE)),
        "num_speculative_tokens": K,
        "num_speculative_tokens_per_batch_size": SCHEDULE,
    }
    spec = VllmServerSpec(model=tiny_models.target, speculative=speculative, max_num_seqs=MAX_NUM_SEQS)
    with VllmServer(engine_env, spec, tmp_path_factory.mktemp("vllm-schedule")) as server:
        yield server


class Watch:
    """The daemon on a test clock, reading the engine through the recording proxy."""

    def __init__(self, server: VllmServer, state_dir: str) -> None:
        self.server = server
        self.proxy = RecordingProxy(server.base_url)
        config = parse_config(
            {
                "interval": "15s",
                "state_dir": state_dir,
                "gpu": {"enabled": "false"},
                "scrape": {"timeout": "10s"},
                "routes": [{"name": "r", "url": self.proxy.url + "/metrics", "engine": "vllm"}],
            }
        )
        self.daemon = Daemon(config)
        self.now = 1_000_000.0
        self.last_body = ""

    def tick(self):
        self.now += STEP
        (state,) = self.daemon.tick(self.now).routes
        assert state.up, state.error_reason
        body = self.proxy.take_metrics_body()
        before, self.last_body = self.last_body, body
        return state, before, body

    def wait_running(self, at_least: int, seconds: float = 120.0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if engine_values(self.server.get("/metrics"))["running"] >= at_least:
                return
            time.sleep(0.5)
        raise AssertionError(f"the engine never ran {at_least} requests at once")

    def close(self) -> None:
        self.daemon.close()
        self.proxy.close()


def test_k_follows_the_schedule_without_a_model_change_and_k0_reads_inactive(scheduled, tmp_path):
    watch = Watch(scheduled, str(tmp_path / "state"))
    try:
        watch.tick()

        # Phase A, one request at a time: every step drafts K tokens.
        results = run_requests(scheduled.base_url, "tiny", 4, concurrency=1, max_tokens=32)
        assert all(r.ok for r in results), [r.error for r in results if not r.ok]
        a, before, after = watch.tick()
        ea, eb = engine_values(before), engine_values(after)
        drafts, draft_tokens = eb["drafts"] - ea["drafts"], eb["draft_tokens"] - ea["draft_tokens"]
        assert drafts > 0 and a.draft_length == pytest.approx(draft_tokens / drafts) == pytest.approx(K)
        assert a.speculation_active is True

        # Phase B, two at a time: the steps at batch 2 draft 1 token (a lone request between two finishes: 3).
        # Long requests keep those lone steps rare when a busy box slows the clients' next request.
        with BackgroundLoad(scheduled.base_url, "tiny", concurrency=2, max_tokens=96, max_seconds=180):
            watch.wait_running(2)
            watch.tick()  # the phase's window starts here
            time.sleep(20)
            b, before, after = watch.tick()
        ea, eb = engine_values(before), engine_values(after)
        drafts, draft_tokens = eb["drafts"] - ea["drafts"], eb["draft_tokens"] - ea["draft_tokens"]
        assert drafts > 0 and b.draft_length == pytest.approx(draft_tokens / drafts)
        assert 1.0 <= b.draft_length < 2.0, f"batch 2 should draft mostly 1 token, drafted {b.draft_length}"
        assert b.speculation_active is True

        b_share = draft_tokens / (generation_tokens(after) - generation_tokens(before))

        # Phase C, more clients than slots: requests wait, so the batch stays at MAX_NUM_SEQS: K = 0. The engine
        # still drafts for the odd step whose batch dips at a request boundary; on a quiet box those strays are
        # under 1 draft token per 100 generated and the route reads inactive. On a box whose cores are all busy
        # the engine's front end is slow to hand over the next request and the batch dips more often (with
        # 48-token requests: 8% of the tokens drafted at load 12-14, 26% at load 8 beside four other busy
        # processes), and then the engine *is* still speculating: the route must say what the engine did either
        # way, and the schedule must have cut drafting. 128-token requests make request boundaries rarer.
        with BackgroundLoad(scheduled.base_url, "tiny", concurrency=4 * MAX_NUM_SEQS, max_tokens=128, max_seconds=180):
            watch.wait_running(MAX_NUM_SEQS)
            watch.tick()
            time.sleep(30)
            c, before, after = watch.tick()
        ea, eb = engine_values(before), engine_values(after)
        generated = generation_tokens(after) - generation_tokens(before)
        drafted = eb["draft_tokens"] - ea["draft_tokens"]
        assert generated > 0, "the engine generated nothing"
        assert drafted < 0.25 * b_share * generated, f"K = 0 band drafted {drafted} of {generated}"
        assert c.speculation_active is (drafted >= MIN_ACTIVE_DRAFT_SHARE * generated)

        # The draft length moved three times with the load: none of it was a model change.
        for state in (a, b, c):
            assert state.model_changes_total == 0.0 and state.engine_kind == "vllm"
    finally:
        watch.close()
