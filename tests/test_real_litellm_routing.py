"""Routing by batch size on real parts: LiteLLM in front of two real vLLM CPU servers, steered by specwatch.

Two servers serve the heavy successor target (docs/testbed.md: speculation gains about 2x at batch 1 and
loses past a batch of 10-15 on two cores), one speculating (k = 3, its one-layer drafter), one plain. A real
`specwatch run` scrapes both (the spec route with a fixed B* in that range and a short hold); a real
`litellm.Router` (LiteLLM's routing core, the one its proxy runs; the proxy's own extra is not installable
here) with `SpecwatchRouting` as its callback sends a load that ramps from concurrency 1 to well above the
crossover and back. Every request records which deployment served it; the engines' running requests are
sampled from the daemon once a second. Then the daemon is stopped mid-load and every request must still be
served (fail open). Tokens/s of the pair at each level are written to `routing.json` in the test's workdir.

Acceptance: while the spec route is advised above its crossover, at most 10% of new requests go to it; below
it, at least 90% do. Needs a quiet machine: about 15 minutes.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
litellm = pytest.importorskip("litellm", reason="the litellm extra is not installed: pip install '.[litellm]'")

from alerting_stack import Processes, answers, free_port, wait_until  # noqa: E402
from specwatch.integrations.litellm import AdviceCache, SpecwatchRouting  # noqa: E402
from testbed.load import PROMPTS  # noqa: E402
from testbed.models import build_heavy_successor  # noqa: E402
from testbed.vllm_server import VllmServer, VllmServerSpec  # noqa: E402

pytestmark = [pytest.mark.real_engine, pytest.mark.e2e]

K = 3
DRAFTER_WRONG_FRACTION = 0.2  # as bench/validate_live_crossover.py
B_STAR = 12.0  # docs/benchmarks.md, "Live calibration on the CPU engine": sweep B* 9.9-14.7 on this CPU
HOLD = "10s"
MAX_TOKENS = 24
# (concurrency, seconds): up from 1 to twice the crossover and back
RAMP = ((1, 40), (4, 40), (24, 90), (2, 60))
SETTLE_SECONDS = 25.0  # new requests are judged after the batch window (<= hold) and the hold have passed


@pytest.fixture(scope="module")
def stack(engine_env, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("routing")
    target, drafter = build_heavy_successor(engine_env, DRAFTER_WRONG_FRACTION)
    plain = VllmServer(engine_env, VllmServerSpec(model=target, max_num_seqs=32), workdir / "plain")
    spec = VllmServer(
        engine_env,
        VllmServerSpec(
            model=target,
            max_num_seqs=32,
            speculative={"method": "draft_model", "num_speculative_tokens": K, "model": str(drafter)},
        ),
        workdir / "spec",
    )
    procs = Processes(workdir)
    try:
        for server in (plain, spec):
            server.start(wait=False)
        for server in (plain, spec):
            server.wait_healthy()
        port = free_port()
        config = {
            "interval": "1s",
            "state_dir": str(workdir / "state"),
            "gpu": {"enabled": "false"},
            "scrape": {"timeout": "0.9s"},
            "routes": [
                {
                    "name": "spec",
                    "url": spec.metrics_url,
                    "engine": "vllm",
                    "crossover": {"batch_size": B_STAR, "hold": HOLD},
                },
                {"name": "plain", "url": plain.metrics_url, "engine": "vllm"},
            ],
        }
        config_file = workdir / "specwatch.yml"
        config_file.write_text(yaml.safe_dump(config))
        argv = [sys.executable, "-m", "specwatch", "run", "--config.file", str(config_file)]
        procs.start("specwatch", [*argv, "--web.listen-address", f"127.0.0.1:{port}"])
        daemon = f"http://127.0.0.1:{port}"
        wait_until("specwatch to answer", lambda: answers(f"{daemon}/-/ready"), 60, procs)
        yield {"plain": plain, "spec": spec, "daemon": daemon, "procs": procs, "workdir": workdir}
    finally:
        procs.stop_all()
        plain.stop()
        spec.stop()


def _router(stack: dict[str, Any]) -> Any:
    return litellm.Router(
        model_list=[
            {
                "model_name": "tiny",
                "litellm_params": {
                    "model": "text-completion-openai/tiny",
                    "api_base": stack[role].base_url + "/v1",
                    "api_key": "none",
                },
                "model_info": {"id": role, "specwatch_route": "spec", "specwatch_role": role},
            }
            for role in ("spec", "plain")
        ],
        routing_strategy="simple-shuffle",
        num_retries=0,
    )


def _advice(daemon: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"{daemon}/api/v1/advice", timeout=2) as response:
            return json.load(response)
    except OSError:
        return None


def _ramp(router: Any, daemon: str, ramp: tuple[tuple[int, int], ...], on_level=None) -> list[dict[str, Any]]:
    """Closed-loop clients through the router at each level; one record per request, plus the advice and the
    engines' batch sampled once a second in the background."""
    records: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            doc = _advice(daemon)
            if doc is not None:
                samples.append({"t": time.time(), "routes": doc["routes"]})
            stop.wait(1.0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    async def client(level: int, deadline: float, index: int) -> None:
        n = index
        while time.monotonic() < deadline:
            started = time.time()
            prompt = PROMPTS[n % len(PROMPTS)]
            n += level
            try:
                response = await router.atext_completion(
                    model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True
                )
                served, tokens, error = response._hidden_params.get("model_id"), response.usage.completion_tokens, ""
            except Exception as exc:  # noqa: BLE001 - a failed request is recorded, not fatal
                served, tokens, error = None, 0, repr(exc)
            records.append(
                {
                    "level": level,
                    "start": started,
                    "end": time.time(),
                    "served": served,
                    "tokens": tokens,
                    "error": error,
                }
            )

    async def run() -> None:
        for level, seconds in ramp:
            if on_level is not None:
                on_level(level)
            deadline = time.monotonic() + seconds
            await asyncio.gather(*(client(level, deadline, i) for i in range(level)))

    try:
        asyncio.run(run())
    finally:
        stop.set()
        sampler.join(5)
    for record in records:
        record["advice"] = _advice_at(samples, record["start"])
    return records


def _advice_at(samples: list[dict[str, Any]], t: float) -> dict[str, Any] | None:
    before = [s for s in samples if s["t"] <= t]
    if not before:
        return None
    spec = next((r for r in before[-1]["routes"] if r["route"] == "spec"), None)
    return None if spec is None else {"speculate": spec["speculate"], "batch": spec["batch_per_engine"]}


def _tokens_per_second(records: list[dict[str, Any]]) -> dict[int, float]:
    out = {}
    for level in sorted({r["level"] for r in records}):
        mine = [r for r in records if r["level"] == level and not r["error"]]
        if mine:
            span = max(r["end"] for r in mine) - min(r["start"] for r in mine)
            out[level] = sum(r["tokens"] for r in mine) / span if span > 0 else 0.0
    return out


def test_litellm_keeps_speculation_below_the_crossover_and_spills_above_it(stack, monkeypatch):
    routing = SpecwatchRouting(advice=AdviceCache(stack["daemon"], timeout=0.1, max_age_seconds=10.0))
    monkeypatch.setattr(litellm, "callbacks", [routing])
    with_plugin = _ramp(_router(stack), stack["daemon"], RAMP)
    monkeypatch.setattr(litellm, "callbacks", [])
    without_plugin = _ramp(_router(stack), stack["daemon"], RAMP)
    result = {
        "b_star": B_STAR,
        "ramp": RAMP,
        "tokens_per_second": {
            "with_plugin": _tokens_per_second(with_plugin),
            "round_robin": _tokens_per_second(without_plugin),
        },
        "requests": with_plugin,
    }
    (Path(stack["workdir"]) / "routing.json").write_text(json.dumps(result, indent=1))
    assert all(not r["error"] for r in with_plugin), [r["error"] for r in with_plugin if r["error"]][:5]

    above = [r for r in with_plugin if r["advice"] and r["advice"]["speculate"] is False]
    below = [r for r in with_plugin if r["advice"] and r["advice"]["speculate"] is True]
    assert above, "the spec route was never advised above its crossover: raise the top level of the ramp"
    assert below
    above_share = sum(r["served"] == "spec" for r in above) / len(above)
    below_share = sum(r["served"] == "spec" for r in below) / len(below)
    round_robin_share = sum(r["served"] == "spec" for r in without_plugin) / len(without_plugin)
    assert above_share <= 0.10, (above_share, round_robin_share)
    assert below_share >= 0.90, (below_share, round_robin_share)


def test_litellm_serves_every_request_with_specwatch_stopped_mid_ramp(stack, monkeypatch):
    routing = SpecwatchRouting(advice=AdviceCache(stack["daemon"], timeout=0.1, max_age_seconds=10.0))
    monkeypatch.setattr(litellm, "callbacks", [routing])
    procs: Processes = stack["procs"]

    def stop_daemon_at_the_top(level: int) -> None:
        if level == max(c for c, _ in RAMP):
            procs.stop_all()

    records = _ramp(_router(stack), stack["daemon"], ((1, 20), (24, 40), (2, 30)), on_level=stop_daemon_at_the_top)
    assert records and all(not r["error"] for r in records), [r["error"] for r in records if r["error"]][:5]
    late = [r for r in records if r["level"] == 2]
    assert {r["served"] for r in late} == {"spec", "plain"}  # no advice: LiteLLM's own balancing, both serve
