"""Canary probes against a real vLLM (the CPU build of testbed/) started with `--api-key`.

vLLM's `--api-key` guards its /v1 endpoints with a bearer token (its AuthenticationMiddleware; /metrics and
/health stay open). A route whose config carries that token as `authorization` probes the engine as any other;
without it every probe is answered 401 and the round is an error that says so. On the shared successor server
(tests/real_vllm_servers.py), first of its block: one start.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwatch.config import Config, parse_config
from specwatch.evaluators.canary import bracket_scraper
from specwatch.probe.prompts import load_prompt_set
from specwatch.probe.runner import ProbeRunner
from real_vllm_servers import successor_spec
from testbed import successor
from testbed.models import SUCCESSOR_BASE
from testbed.vllm_server import VllmServer

pytestmark = [pytest.mark.real_engine, pytest.mark.e2e]

VOCAB = 795
PROMPTS, MAX_TOKENS = successor.prompts(VOCAB, 3), 16
API_KEY = "sk-specwatch-probe-test"


@pytest.fixture
def server(successor_vllm, tiny_models) -> VllmServer:
    """The shared successor server on the base drafter, behind vLLM's --api-key."""
    return successor_vllm.serve(successor_spec(tiny_models, SUCCESSOR_BASE, api_key=API_KEY))


def _config(srv: VllmServer, directory: Path, token_file: Path | None) -> Config:
    directory.mkdir(parents=True, exist_ok=True)
    prompts = directory / "prompts.json"
    prompts.write_text(json.dumps({"prompts": [{"id": f"from-{p[0]}", "prompt": p} for p in PROMPTS]}))
    route: dict = {
        "name": "guarded",
        "url": srv.metrics_url,
        "probe": {"every": "1m", "prompts": str(prompts), "max_tokens": MAX_TOKENS, "timeout": "120s"},
    }
    if token_file is not None:
        route["authorization"] = {"credentials_file": str(token_file)}
    return parse_config({"state_dir": str(directory / "state"), "routes": [route]})


def _runner(cfg: Config) -> ProbeRunner:
    route = cfg.routes[0]
    assert route.probe is not None
    return ProbeRunner(
        route,
        route.probe,
        load_prompt_set(route.probe.prompts),
        engine_kind=lambda: "vllm",
        scrape=bracket_scraper(route, cfg),
    )


@pytest.mark.successor_vllm("api_key")
def test_a_vllm_started_with_api_key_is_probed_with_the_routes_bearer_token(server, tmp_path):
    token = tmp_path / "token"
    token.write_text(API_KEY + "\n")
    rnd = _runner(_config(server, tmp_path / "with", token)).run_now()
    assert rnd.outcome == "ok" and rnd.method == "vllm_response", rnd.message
    assert len(rnd.read()) == len(PROMPTS) and rnd.totals().drafted > 0

    refused = _runner(_config(server, tmp_path / "without", None)).run_now()
    assert refused.outcome == "error" and "HTTP 401" in refused.message, refused.message
