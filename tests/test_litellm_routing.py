"""The LiteLLM routing callback: a real `litellm.Router` over two loopback OpenAI stubs (one speculative, one
plain), steered by a fake specwatch advice server on loopback."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import threading
import time
from typing import Any, Iterator

import pytest

# LiteLLM fetches its model cost map from GitHub at import unless told to use the copy in its wheel.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
litellm = pytest.importorskip("litellm", reason="the litellm extra is not installed: pip install '.[litellm]'")

from prometheus_client import CollectorRegistry  # noqa: E402

from specwatch.integrations.litellm import AdviceCache, SpecwatchRouting  # noqa: E402

pytestmark = pytest.mark.slow  # loopback servers


class _Stub(http.server.BaseHTTPRequestHandler):
    """An OpenAI chat-completions endpoint that names itself in its answer; or, as advice, serves `doc`."""

    name = ""
    doc: dict[str, Any] | None = None
    status = 200
    gets = 0
    posts = 0
    hold: threading.Event | None = None  # set: completions wait for it (requests in flight); then answer
    answer = 200

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).posts += 1
        if self.hold is not None:
            self.hold.wait(60)
        if self.answer != 200:
            self._send(self.answer, {"error": {"message": "boom"}})
            return
        body = {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": self.name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": self.name}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        self._send(200, body)

    def do_GET(self) -> None:
        type(self).gets += 1
        self._send(self.status, type(self).doc or {})

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def servers() -> Iterator[dict[str, Any]]:
    started = {}
    for name in ("spec", "plain", "advice"):
        handler = type(name, (_Stub,), {"name": name, "doc": None})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        started[name] = server
    yield started
    for server in started.values():
        server.shutdown()
        server.server_close()


def url(server: Any) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def advice(speculate: bool | None, headroom: float, evaluated: float | None = None) -> dict[str, Any]:
    return {
        "version": 1,
        "generated": time.time(),
        "evaluated": time.time() if evaluated is None else evaluated,
        "routes": [{"route": "chat-spec", "up": True, "speculate": speculate, "headroom": {"requests": headroom}}],
    }


def router(servers: dict[str, Any]) -> Any:
    return litellm.Router(
        num_retries=0,
        model_list=[
            {
                "model_name": "chat",
                "litellm_params": {"model": "openai/m", "api_base": url(servers[role]) + "/v1", "api_key": "x"},
                "model_info": {"id": role, "specwatch_route": "chat-spec", "specwatch_role": role},
            }
            for role in ("spec", "plain")
        ],
        routing_strategy="simple-shuffle",
    )


def served(r: Any, n: int) -> list[str]:
    async def run() -> list[str]:
        out = []
        for _ in range(n):
            response = await r.acompletion(model="chat", messages=[{"role": "user", "content": "hi"}])
            out.append(response.choices[0].message.content)
        return out

    return asyncio.run(run())


def served_at_once(r: Any, servers: dict[str, Any], n: int) -> list[str]:
    """`n` requests in flight together: the speculative deployment answers none until all `n` have reached a
    server, so each is routed while the earlier ones still run there."""
    spec, plain = servers["spec"].RequestHandlerClass, servers["plain"].RequestHandlerClass
    gate = spec.hold = threading.Event()
    out: list[str] = []

    async def run() -> None:
        tasks = [r.acompletion(model="chat", messages=[{"role": "user", "content": "hi"}]) for _ in range(n)]
        out.extend(response.choices[0].message.content for response in await asyncio.gather(*tasks))

    runner = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
    runner.start()
    wait_until(lambda: spec.posts + plain.posts >= n)
    gate.set()
    runner.join(60)
    spec.hold = None
    return sorted(out, key=lambda name: name != "spec")


def wait_until(condition: Any, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert condition()


@pytest.fixture
def routing(servers, monkeypatch) -> Iterator[SpecwatchRouting]:
    registry = CollectorRegistry()
    plugin = SpecwatchRouting(
        advice=AdviceCache(url(servers["advice"]), timeout=2.0, refresh_seconds=3600.0, registry=registry)
    )
    fresh_callbacks(monkeypatch, plugin)
    yield plugin
    plugin.advice.close()


def fresh_callbacks(monkeypatch: Any, plugin: SpecwatchRouting) -> None:
    monkeypatch.setattr(litellm, "callbacks", [plugin])
    # LiteLLM copies its callbacks into these lists on first use and keeps them: a fresh set per test, or the
    # hooks of one test's request would go to an earlier test's callback
    for name in ("success_callback", "failure_callback", "_async_success_callback", "_async_failure_callback"):
        monkeypatch.setattr(litellm, name, [])


def test_below_the_crossover_every_request_goes_to_the_speculative_deployment(servers, routing):
    servers["advice"].RequestHandlerClass.doc = advice(True, 100.0)
    routing.advice.refresh_now()
    assert served(router(servers), 12) == ["spec"] * 12


def test_above_the_crossover_every_request_spills_to_the_plain_deployment(servers, routing):
    servers["advice"].RequestHandlerClass.doc = advice(False, -4.0)
    routing.advice.refresh_now()
    assert served(router(servers), 12) == ["plain"] * 12


def test_the_headroom_left_goes_to_speculation_and_the_rest_spills(servers, routing):
    servers["advice"].RequestHandlerClass.doc = advice(True, 3.0)
    routing.advice.refresh_now()
    assert served_at_once(router(servers), servers, 8) == ["spec"] * 3 + ["plain"] * 5


def test_a_fractional_headroom_is_not_overshot(servers, routing):
    servers["advice"].RequestHandlerClass.doc = advice(True, 2.5)
    routing.advice.refresh_now()
    assert served_at_once(router(servers), servers, 5) == ["spec"] * 2 + ["plain"] * 3


def test_the_count_is_requests_started_less_those_finished_since_the_evaluation(servers, routing):
    """LiteLLM's own success hook ends a request: requests that finished leave room under the same advice, so
    one after another they all fit a headroom of 1 (counting only starts, all but the first would spill)."""
    servers["advice"].RequestHandlerClass.doc = advice(True, 1.0)
    routing.advice.refresh_now()
    spec = servers["spec"].RequestHandlerClass
    r = router(servers)
    gate = spec.hold = threading.Event()

    async def scenario() -> list[str]:
        first = asyncio.create_task(ask(r))
        await until(lambda: spec.posts == 1)  # the stub holds it: in flight
        assert routing.counted("chat-spec") == 1.0  # up when routed
        gate.set()
        out = [await first]
        await until(lambda: routing.counted("chat-spec") == 0.0)  # down when LiteLLM logs its success
        for _ in range(5):
            out.append(await ask(r))
            await until(lambda: routing.counted("chat-spec") == 0.0)
        return out

    assert asyncio.run(scenario()) == ["spec"] * 6


def test_a_failed_request_ends_its_count_too(servers, routing):
    servers["advice"].RequestHandlerClass.doc = advice(True, 1.0)
    routing.advice.refresh_now()
    spec = servers["spec"].RequestHandlerClass
    gate, spec.answer = threading.Event(), 500
    spec.hold = gate
    r = router(servers)

    async def scenario() -> None:
        request = asyncio.create_task(ask(r))
        await until(lambda: spec.posts == 1)
        assert routing.counted("chat-spec") == 1.0
        gate.set()
        with pytest.raises(Exception, match="boom"):  # the speculative deployment answered 500
            await request
        await until(lambda: routing.counted("chat-spec") == 0.0)  # down when LiteLLM logs its failure

    asyncio.run(scenario())


async def ask(r: Any) -> str:
    response = await r.acompletion(model="chat", messages=[{"role": "user", "content": "hi"}])
    return str(response.choices[0].message.content)


async def until(condition: Any, seconds: float = 30.0) -> None:
    """Wait on the request's own event loop, where LiteLLM runs its logging hooks after the response."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert condition()


def test_a_new_evaluation_restarts_the_count_and_later_ends_give_room(servers, routing):
    """A request routed before an evaluation is in that evaluation's running count; its end after it frees
    room the new headroom does not show yet. Requests the callback did not narrow are no one's count."""
    servers["advice"].RequestHandlerClass.doc = advice(True, 1.0, evaluated=time.time() - 2)
    routing.advice.refresh_now()
    routing.narrow([_deployment("spec"), _deployment("plain")], "t1")
    assert routing.counted("chat-spec") == 1.0
    servers["advice"].RequestHandlerClass.doc = advice(True, 0.0)  # the engine runs t1: no headroom
    routing.advice.refresh_now()
    assert routing.counted("chat-spec") == 0.0
    assert [d["model_info"]["id"] for d in routing.narrow([_deployment("spec"), _deployment("plain")])] == ["plain"]
    routing.ended("t1", "spec", "call-1")
    routing.ended("t1", "spec", "call-1")  # the sync and the async hook of one call end it once
    routing.ended("t-plain", "plain", "call-2")
    assert routing.counted("chat-spec") == -1.0
    assert [d["model_info"]["id"] for d in routing.narrow([_deployment("spec"), _deployment("plain")])] == ["spec"]


def _deployment(role: str) -> dict[str, Any]:
    return {"model_name": "chat", "model_info": {"id": role, "specwatch_route": "chat-spec", "specwatch_role": role}}


def test_without_advice_both_deployments_serve(servers, routing):
    servers["advice"].shutdown()  # specwatch unreachable: fail open
    servers["advice"].server_close()
    routing.advice.refresh_now()
    assert set(served(router(servers), 40)) == {"spec", "plain"}


def test_stale_or_unknown_advice_narrows_nothing(servers, routing):
    servers["advice"].RequestHandlerClass.doc = advice(False, -4.0, evaluated=time.time() - 3600)
    routing.advice.refresh_now()
    assert set(served(router(servers), 40)) == {"spec", "plain"}
    servers["advice"].RequestHandlerClass.doc = advice(None, 0.0)
    routing.advice.refresh_now()
    assert set(served(router(servers), 40)) == {"spec", "plain"}


def test_the_advice_is_refreshed_between_requests(servers):
    handler = servers["advice"].RequestHandlerClass
    handler.doc = advice(True, 3.0)
    cache = AdviceCache(url(servers["advice"]), timeout=2.0, refresh_seconds=0.05)
    try:
        cache.current()  # the first request starts the refresher; then no request comes for a while
        deadline = time.monotonic() + 20
        while handler.gets < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert handler.gets >= 4
        assert cache.current() == handler.doc
    finally:
        cache.close()


def test_a_request_never_waits_for_the_advice_server():
    hang = threading.Event()

    class Hanging(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hang.wait(30)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hanging)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cache = AdviceCache(url(server), timeout=0.1)
        done = threading.Event()

        def ask() -> None:
            cache.current()
            done.set()

        threading.Thread(target=ask, daemon=True).start()
        # current() only starts the refresher; it returns at once with no advice, however long the server hangs
        assert done.wait(20) and cache.current() is None
    finally:
        cache.close()
        hang.set()
        server.shutdown()
        server.server_close()


# --- a fleet: speculative deployments on two nodes, each with its own specwatch


@pytest.fixture
def fleet(monkeypatch) -> Iterator[dict[str, Any]]:
    """Two nodes, each a speculative OpenAI stub and its specwatch's advice, one shared plain stub, and a
    callback whose own URL is neither node's (every deployment names its node in `model_info`)."""
    started = {}
    for name in ("spec-a", "spec-b", "plain", "advice-a", "advice-b"):
        handler = type(name, (_Stub,), {"name": name, "doc": None})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        started[name] = server
    registry = CollectorRegistry()
    plugin = SpecwatchRouting(
        advice=AdviceCache("http://127.0.0.1:9", timeout=2.0, refresh_seconds=3600.0, registry=registry)
    )
    fresh_callbacks(monkeypatch, plugin)
    for node in ("advice-a", "advice-b"):  # known before the first request, as after a proxy's first requests
        plugin.advice.node(url(started[node]))
    yield {"servers": started, "routing": plugin, "registry": registry}
    plugin.advice.close()
    for server in started.values():
        server.shutdown()
        server.server_close()


def fleet_router(fleet: dict[str, Any]) -> Any:
    servers = fleet["servers"]

    def deployment(name: str, info: dict[str, str]) -> dict[str, Any]:
        params = {"model": "openai/m", "api_base": url(servers[name]) + "/v1", "api_key": "x"}
        role = "plain" if name == "plain" else "spec"
        return {
            "model_name": "chat",
            "litellm_params": params,
            "model_info": {"id": name, "specwatch_role": role, **info},
        }

    return litellm.Router(
        num_retries=0,
        model_list=[
            # the same route name on both nodes: two routes, one per node's specwatch
            deployment("spec-a", {"specwatch_url": url(servers["advice-a"]) + "/", "specwatch_route": "chat"}),
            deployment("spec-b", {"specwatch_url": url(servers["advice-b"]), "specwatch_route": "chat"}),
            deployment("plain", {}),
        ],
        routing_strategy="simple-shuffle",
    )


def node_advice(speculate: bool | None, headroom: float) -> dict[str, Any]:
    doc = advice(speculate, headroom)
    doc["routes"][0]["route"] = "chat"
    return doc


def test_each_speculative_deployment_follows_its_own_nodes_advice(fleet):
    servers, routing = fleet["servers"], fleet["routing"]
    router_ = fleet_router(fleet)
    servers["advice-a"].RequestHandlerClass.doc = node_advice(False, -4.0)  # node A above its crossover
    servers["advice-b"].RequestHandlerClass.doc = node_advice(True, 100.0)  # node B below it
    routing.advice.refresh_now()
    assert served(router_, 12) == ["spec-b"] * 12
    servers["advice-a"].RequestHandlerClass.doc = node_advice(True, 100.0)
    servers["advice-b"].RequestHandlerClass.doc = node_advice(False, -4.0)
    routing.advice.refresh_now()
    assert served(router_, 12) == ["spec-a"] * 12
    assert routing.counted("chat", url(servers["advice-a"])) == 0.0  # each ended on its own node's route


def test_a_node_without_specwatch_is_served_unfiltered_and_the_other_still_filtered(fleet):
    servers, routing = fleet["servers"], fleet["routing"]
    router_ = fleet_router(fleet)
    servers["advice-a"].shutdown()  # node A's specwatch is down
    servers["advice-a"].server_close()
    servers["advice-b"].RequestHandlerClass.doc = node_advice(False, -4.0)  # node B above its crossover
    routing.advice.refresh_now()
    assert set(served(router_, 40)) == {"spec-a", "plain"}  # as without the callback, less spec-b
    servers["advice-b"].RequestHandlerClass.doc = node_advice(True, 100.0)  # node B below it: plain goes
    routing.advice.refresh_now()
    assert set(served(router_, 40)) == {"spec-a", "spec-b"}
    requests = {
        decision: fleet["registry"].get_sample_value(
            "specwatch_routing_requests_total", {"model_group": "chat", "decision": decision}
        )
        for decision in ("kept", "spilled", "failed_open")
    }
    assert requests == {"kept": None, "spilled": None, "failed_open": 80.0}
    assert fleet["registry"].get_sample_value("specwatch_routing_advice_up", {"node": url(servers["advice-a"])}) == 0


def test_one_advice_request_per_node_and_refresh_whatever_its_deployments(fleet):
    servers, routing = fleet["servers"], fleet["routing"]
    a, b = servers["advice-a"].RequestHandlerClass, servers["advice-b"].RequestHandlerClass
    a.doc, b.doc = node_advice(True, 100.0), node_advice(True, 100.0)
    deployments = [
        {
            "model_info": {
                "id": f"a{i}",
                "specwatch_role": "spec",
                "specwatch_route": "chat",
                "specwatch_url": url(servers["advice-a"]),
            }
        }
        for i in range(5)
    ] + [
        {
            "model_info": {
                "id": "b",
                "specwatch_role": "spec",
                "specwatch_route": "chat",
                "specwatch_url": url(servers["advice-b"]),
            }
        },
        {"model_info": {"id": "p", "specwatch_role": "plain"}},
    ]
    routing.narrow(deployments)  # the first sight of the nodes: no advice yet, all left in
    routing.advice.refresh_now()
    before = (a.gets, b.gets)
    routing.advice.refresh_now()
    assert (a.gets - before[0], b.gets - before[1]) == (1, 1)
    assert [d["model_info"]["id"] for d in routing.narrow(deployments)] == ["a0", "a1", "a2", "a3", "a4", "b"]


def test_the_callback_counts_its_decisions_and_each_nodes_advice_age(fleet):
    servers, routing, registry = fleet["servers"], fleet["routing"], fleet["registry"]
    a, b = url(servers["advice-a"]), url(servers["advice-b"])
    spec_a = {"model_info": {"id": "a", "specwatch_role": "spec", "specwatch_route": "chat", "specwatch_url": a}}
    spec_b = {"model_info": {"id": "b", "specwatch_role": "spec", "specwatch_route": "chat", "specwatch_url": b}}
    plain = {"model_info": {"id": "p", "specwatch_role": "plain"}}
    servers["advice-a"].RequestHandlerClass.doc = node_advice(True, 2.0)
    evaluated_b = time.time() - 7.0
    servers["advice-b"].RequestHandlerClass.doc = {**node_advice(False, -4.0), "evaluated": evaluated_b}
    routing.narrow([spec_a, spec_b, plain], model_group="chat")  # no advice yet: failed open
    routing.advice.refresh_now()
    ids = [
        [d["model_info"]["id"] for d in routing.narrow([spec_a, spec_b, plain], model_group="chat")] for _ in range(4)
    ]
    assert ids == [["a"], ["a"], ["p"], ["p"]]  # node A's headroom of 2, then spilled

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert [
        sample("specwatch_routing_requests_total", model_group="chat", decision=d)
        for d in ("kept", "spilled", "failed_open")
    ] == [2.0, 2.0, 1.0]
    assert sample("specwatch_routing_advice_up", node=a) == sample("specwatch_routing_advice_up", node=b) == 1.0
    assert 0.0 <= sample("specwatch_routing_advice_age_seconds", node=a) < 5.0
    assert 7.0 <= sample("specwatch_routing_advice_age_seconds", node=b) < 60.0
    servers["advice-b"].shutdown()
    servers["advice-b"].server_close()
    routing.advice.refresh_now()
    assert sample("specwatch_routing_advice_up", node=b) == 0.0
    assert sample("specwatch_routing_advice_age_seconds", node=b) >= 7.0  # the age of what it still holds


def test_a_hanging_node_neither_blocks_a_request_nor_the_other_nodes_advice(fleet):
    servers = fleet["servers"]
    hang = threading.Event()

    class Hanging(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hang.wait(30)

        def log_message(self, *args: Any) -> None:
            pass

    hanging = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hanging)
    threading.Thread(target=hanging.serve_forever, daemon=True).start()
    cache = AdviceCache(url(hanging), timeout=0.2, refresh_seconds=0.05, registry=CollectorRegistry())
    try:
        servers["advice-b"].RequestHandlerClass.doc = node_advice(False, -4.0)
        plugin = SpecwatchRouting(advice=cache)
        spec_a = {"model_info": {"id": "a", "specwatch_role": "spec", "specwatch_route": "chat"}}  # the hanging one
        spec_b = {
            "model_info": {
                "id": "b",
                "specwatch_role": "spec",
                "specwatch_route": "chat",
                "specwatch_url": url(servers["advice-b"]),
            }
        }
        plain = {"model_info": {"id": "p", "specwatch_role": "plain"}}
        plugin.narrow([spec_a, spec_b, plain])  # starts the refresher, names node B
        wait_until(lambda: cache.current(url(servers["advice-b"])) is not None)
        assert [d["model_info"]["id"] for d in plugin.narrow([spec_a, spec_b, plain])] == ["a", "p"]
    finally:
        cache.close()
        hang.set()
        hanging.shutdown()
        hanging.server_close()
