"""The LiteLLM routing callback's added latency per request, at 3 and 100 deployments, side by side with no
callback, in one process.

A real `litellm.Router` per size: half of the deployments (rounded up) speculative, each on a node of its own with
its own specwatch URL, the rest plain, one model group. The advice is cached before timing: every node's
specwatch is one loopback server that answers every path (`http://127.0.0.1:PORT/node-N/api/v1/advice`), fetched
once by `refresh_now()`, its refresher idle for the run. Timed per request, in interleaved rounds so that load on
the machine hits both alike:

- `route`: `Router.async_get_available_deployment` (the router's deployment choice, filter hooks included),
  with the callback in `litellm.callbacks` and without;
- `request`: `Router.acompletion(mock_response=...)`, the whole request path in LiteLLM with no network (the
  callback's success hook included), with and without;
- `hook`: the callback's `async_filter_deployments` alone on the router's deployment list.

Prints the medians (microseconds) and the difference per request. Usage:
    .venv/bin/python bench/bench_litellm_routing.py [--requests 400] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import importlib.metadata
import json
import os
import statistics
import threading
import time
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from specwatch.integrations.litellm import AdviceCache, SpecwatchRouting  # noqa: E402

MESSAGES = [{"role": "user", "content": "hi"}]


class _Advice(http.server.BaseHTTPRequestHandler):
    """Every node's advice: below the crossover with ample headroom, so the callback keeps speculating."""

    def do_GET(self) -> None:
        now = time.time()
        route = {"route": "chat", "up": True, "speculate": True, "headroom": {"requests": 1e9}}
        body = json.dumps({"version": 1, "generated": now, "evaluated": now, "routes": [route]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def model_list(deployments: int, advice: str) -> list[dict[str, Any]]:
    spec = (deployments + 1) // 2
    out = []
    for i in range(deployments):
        info: dict[str, Any] = {"id": f"d{i}", "specwatch_role": "plain"}
        if i < spec:
            info = {"id": f"d{i}", "specwatch_role": "spec", "specwatch_route": "chat"}
            info["specwatch_url"] = f"{advice}/node-{i}"
        params = {"model": "openai/m", "api_base": f"http://127.0.0.1:9/v{i}", "api_key": "x"}
        out.append({"model_name": "chat", "litellm_params": params, "model_info": info})
    return out


async def timed(call: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        out.append(time.perf_counter() - started)
    return out


def set_callbacks(callbacks: list[Any]) -> None:
    litellm.callbacks = callbacks
    for name in ("success_callback", "failure_callback", "_async_success_callback", "_async_failure_callback"):
        setattr(litellm, name, [])


async def measure(deployments: int, advice: str, n: int, rounds: int) -> dict[str, dict[str, float]]:
    router = litellm.Router(model_list=model_list(deployments, advice), routing_strategy="simple-shuffle")
    routing = SpecwatchRouting(
        advice=AdviceCache(advice, timeout=2.0, refresh_seconds=3600.0, registry=CollectorRegistry())
    )
    try:
        routing.narrow(router.get_model_list())  # registers every node
        routing.advice.refresh_now()
        kept = routing.narrow(router.get_model_list())
        assert kept and all(d["model_info"]["specwatch_role"] == "spec" for d in kept), "advice not cached"
        samples: dict[str, list[float]] = {}

        async def route() -> None:
            await router.async_get_available_deployment(model="chat", messages=MESSAGES, request_kwargs={})

        async def request() -> None:
            await router.acompletion(model="chat", messages=MESSAGES, mock_response="ok")

        async def hook() -> None:
            await routing.async_filter_deployments("chat", router.get_model_list(), MESSAGES, {})

        async def nothing() -> None:
            router.get_model_list()

        for _ in range(rounds):
            for name, call, callbacks in (
                ("route, no callback", route, []),
                ("route, callback", route, [routing]),
                ("request, no callback", request, []),
                ("request, callback", request, [routing]),
                ("hook", hook, []),
                ("hook's input alone", nothing, []),
            ):
                set_callbacks(callbacks)
                await timed(call, 20)  # warm
                samples.setdefault(name, []).extend(await timed(call, n))
        set_callbacks([])
        return {name: {"median_us": statistics.median(v) * 1e6} for name, v in samples.items()}
    finally:
        routing.advice.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400, help="requests per variant and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="3,100")
    args = parser.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Advice)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    advice = f"http://127.0.0.1:{server.server_address[1]}"
    print(f"litellm {importlib.metadata.version('litellm')}")
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            result = asyncio.run(measure(size, advice, args.requests, args.rounds))
            print(f"\n{size} deployments ({(size + 1) // 2} speculative on as many nodes), median us per request:")
            for name, row in result.items():
                print(f"  {name:22s} {row['median_us']:9.1f}")
            for what in ("route", "request"):
                base, with_ = result[f"{what}, no callback"]["median_us"], result[f"{what}, callback"]["median_us"]
                print(f"  {what}: +{with_ - base:.1f} us with the callback ({with_ / base:.2f}x)")
            hook = result["hook"]["median_us"] - result["hook's input alone"]["median_us"]
            print(f"  hook alone: {hook:.1f} us")
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
