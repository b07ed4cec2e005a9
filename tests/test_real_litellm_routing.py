"""Routing by batch size on real parts: a real LiteLLM proxy in front of two real vLLM CPU servers, steered by a
real specwatch daemon through `SpecwatchRouting` loaded from the proxy's own config.

1. Two vLLM servers serve the same heavy successor target (docs/testbed.md; 8 layers here, to keep the test
   short), one speculating with its one-layer drafter (k = 3), one plain. `specwatch run` scrapes both every
   second; the speculative route has a configured crossover of B* = 4 with a 3 s hold, low so that a short ramp
   on two shared cores crosses it whatever the pair's own crossover: the test is about the routing given the
   advice (`bench/validate_live_crossover.py` measures where B* lies).
2. The proxy (`litellm --config`, from its venv in ~/.cache/specwatch: testbed/litellm_proxy.py says why it is a venv of
   its own) serves two model groups over the same two servers: `routed`, whose deployments carry
   `specwatch_role`/`specwatch_route` and so pass through the callback, and `balanced`, which does not, so the
   callback leaves it to LiteLLM's own `simple-shuffle` (what the proxy does without the plugin).
3. The same ramp goes through each group: concurrency 1, then 6, then 1 again. At the top, a client that calls
   the speculative server directly (as another gateway replica or a batch job would) keeps B* + 2 requests on it,
   so that it runs above its crossover whatever the gateway sends: with the plugin the gateway fills the
   speculative server only up to its headroom, so its own traffic alone never takes it past B*. Every request
   records the deployment that served it (the proxy's `x-litellm-model-id` header); a sampler records the
   engines' running requests and the daemon's advice twice a second.
4. Judged per new request, by the advice in force over the 1.5 s before it started (the proxy refreshes its
   cached advice every 0.5 s): while the speculative route is advised above its crossover, at most 10% of the
   routed requests go to it; at concurrency 1 while it is advised below it with room for a request, at least
   90% do. Without the plugin about half do either way. Tokens/s of the pair at each level, with and without
   the plugin, go to `routing.json` in the test's workdir and are printed (`-s`).
5. Two nodes, each with its own `specwatch run` on its own port: a third group, `fleet`, has a speculative
   deployment per node, each naming its node's specwatch in `model_info.specwatch_url`, and the plain server.
   Node B's deployment is the same speculative vLLM process seen by node B's daemon with a B* of its own far above
   any load here (one server fewer to start on two cores: what the callback judges is each deployment's own
   node's advice). With node A above its crossover (the direct client) and node B below, at most 10% of the new
   requests go to node A's deployment and at least 90% to node B's; with node B's specwatch stopped, node B's
   deployment is served unfiltered (LiteLLM's own shuffle between it and the plain one) while node A's is still
   kept off.
6. The daemon is stopped in the middle of a routed load: every request is still served (the callback fails open)
   and the proxy logs that it routes unchanged.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from alerting_stack import Processes, answers, free_ports, wait_until
from specwatch.config import parse_config
from specwatch.sources.base import SourceError
from specwatch.sources.engines import parse_engine_sample
from testbed.litellm_proxy import LitellmProxy, LitellmProxySpec, ensure_proxy_env
from testbed.load import PROMPTS, complete
from testbed.models import build_heavy_successor
from testbed.vllm_server import VllmServer, VllmServerSpec

pytestmark = [pytest.mark.real_engine, pytest.mark.e2e]

K = 3
TARGET_LAYERS = 8
DRAFTER_WRONG_FRACTION = 0.2
B_STAR = 4
HOLD = "3s"
MAX_TOKENS = 16
TOP = 6
RAMP = ((1, 4), (TOP, 2), (1, 4))  # (concurrency, requests per client): up and back down
DIRECT = B_STAR + 2  # requests kept on the speculative server by a client that bypasses the gateway, at the top
# Room for one request: the callback counts its requests started less those finished since the advice's
# evaluation, so at concurrency 1 the request before has left room again by the time the next one is routed.
BELOW_HEADROOM = 1
ADVICE_LAG = 1.5  # seconds of unchanged advice before a request for it to count as routed on that advice
MASTER_KEY = "sk-specwatch-e2e-0123456789abcdef0123456789abcdef"
REQUEST_TIMEOUT = 180.0
FAIL_OPEN_CLIENTS = 3
NODE_B_STAR = 1000  # node B's B*: far above any load here, so node B is advised below its crossover throughout
FLEET_LOAD = (2, 10)  # (concurrency, requests per client) through `fleet` in each phase


@pytest.fixture(scope="module")
def stack(engine_env, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("routing")
    started = time.monotonic()
    target, drafter = build_heavy_successor(engine_env, DRAFTER_WRONG_FRACTION, TARGET_LAYERS, workdir / "models")
    script = ensure_proxy_env()
    ports = free_ports("plain", "spec", "daemon", "proxy", "daemon_b")
    plain = VllmServer(engine_env, VllmServerSpec(model=target), workdir / "plain", ports["plain"])
    speculative = {"method": "draft_model", "num_speculative_tokens": K, "model": str(drafter)}
    spec = VllmServer(
        engine_env, VllmServerSpec(model=target, speculative=speculative), workdir / "spec", ports["spec"]
    )
    daemon = f"http://127.0.0.1:{ports['daemon']}"
    daemon_b = f"http://127.0.0.1:{ports['daemon_b']}"
    proxy = LitellmProxy(
        script,
        LitellmProxySpec(_write_proxy_config(workdir, spec, plain, daemon, daemon_b), MASTER_KEY),
        workdir / "proxy",
        ports["proxy"],
    )
    procs = Processes(workdir)
    procs_b = Processes(workdir)  # node B's specwatch, stopped on its own
    try:
        for server in (plain, spec, proxy):
            server.start(wait=False)
        config = workdir / "specwatch.yml"
        config.write_text(yaml.safe_dump(_daemon_config(workdir, spec, plain)))
        listen = f"127.0.0.1:{ports['daemon']}"
        argv = [sys.executable, "-m", "specwatch", "run", "--config.file", str(config), "--web.listen-address", listen]
        procs.start("specwatch", argv)
        config_b = workdir / "specwatch-node-b.yml"
        config_b.write_text(yaml.safe_dump(_node_b_config(workdir, spec)))
        listen_b = f"127.0.0.1:{ports['daemon_b']}"
        argv_b = [sys.executable, "-m", "specwatch", "run", "--config.file", str(config_b)]
        procs_b.start("specwatch-node-b", argv_b + ["--web.listen-address", listen_b])
        for server in (plain, spec, proxy):
            server.wait_healthy()
        wait_until("the spec route's first advice", lambda: _spec_advice(daemon), 120, procs)
        wait_until("node B's first advice", lambda: _spec_advice(daemon_b), 120, procs_b)
        for server in (plain, spec):  # the first request on a server pays for its warm-up
            assert complete(server.base_url, "tiny", PROMPTS[0], MAX_TOKENS, REQUEST_TIMEOUT).ok
        with requests.Session() as session:  # and the first through the proxy starts the callback's refresher
            assert not _gateway_request(session, proxy.base_url, "routed", PROMPTS[0])["error"]
        print(f"\nstack ready after {time.monotonic() - started:.0f} s")
        yield {
            "plain": plain,
            "spec": spec,
            "proxy": proxy,
            "daemon": daemon,
            "daemon_b": daemon_b,
            "procs": procs,
            "procs_b": procs_b,
            "workdir": workdir,
        }
    finally:
        procs_b.stop_all()
        procs.stop_all()
        for server in (proxy, spec, plain):
            server.stop()


def _daemon_config(workdir: Path, spec: VllmServer, plain: VllmServer) -> dict[str, Any]:
    return {
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


def _node_b_config(workdir: Path, spec: VllmServer) -> dict[str, Any]:
    return {
        "interval": "1s",
        "state_dir": str(workdir / "state-node-b"),
        "gpu": {"enabled": "false"},
        "scrape": {"timeout": "0.9s"},
        "routes": [
            {"name": "spec", "url": spec.metrics_url, "engine": "vllm", "crossover": {"batch_size": NODE_B_STAR}}
        ],
    }


def _write_proxy_config(workdir: Path, spec: VllmServer, plain: VllmServer, daemon: str, daemon_b: str) -> Path:
    """LiteLLM's config with the callback module beside it, as docs/routing.md sets it up."""
    folder = workdir / "proxy-config"
    folder.mkdir()
    (folder / "specwatch_routing.py").write_text(
        "from specwatch.integrations.litellm import SpecwatchRouting\n\n"
        f"handler = SpecwatchRouting({daemon!r}, timeout=0.5, refresh_seconds=0.5, max_age_seconds=5.0)\n"
    )

    def deployment(group: str, server: VllmServer, info: dict[str, str]) -> dict[str, Any]:
        params = {"model": "text-completion-openai/tiny", "api_base": server.base_url + "/v1", "api_key": "none"}
        return {"model_name": group, "litellm_params": params, "model_info": info}

    config = {
        "model_list": [
            deployment("routed", spec, {"id": "spec", "specwatch_route": "spec", "specwatch_role": "spec"}),
            deployment("routed", plain, {"id": "plain", "specwatch_role": "plain"}),
            deployment("balanced", spec, {"id": "spec-balanced"}),
            deployment("balanced", plain, {"id": "plain-balanced"}),
            # two nodes, each deployment naming its own node's specwatch
            deployment("fleet", spec, {"id": "spec-a", **_on_node(daemon)}),
            deployment("fleet", spec, {"id": "spec-b", **_on_node(daemon_b)}),
            deployment("fleet", plain, {"id": "plain-fleet", "specwatch_role": "plain"}),
        ],
        "router_settings": {"routing_strategy": "simple-shuffle", "num_retries": 0},
        # LiteLLM's own prometheus callback mounts /metrics, where the callback's metrics show too
        "litellm_settings": {"callbacks": ["prometheus", "specwatch_routing.handler"], "num_retries": 0},
    }
    path = folder / "litellm.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _on_node(specwatch: str) -> dict[str, str]:
    return {"specwatch_url": specwatch, "specwatch_route": "spec", "specwatch_role": "spec"}


def _spec_advice(daemon: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"{daemon}/api/v1/advice", timeout=1) as response:
            doc = json.load(response)
    except OSError:
        return None
    route = next((r for r in doc["routes"] if r["route"] == "spec"), None)
    return route if route is not None and route["speculate"] is not None else None


class Sampler:
    """Twice a second: the spec route's advice from the daemon and each engine's running requests."""

    def __init__(self, stack: dict[str, Any]) -> None:
        self.daemon = stack["daemon"]
        route = parse_config({"routes": [{"name": "r", "url": "http://127.0.0.1:1/metrics", "engine": "vllm"}]})
        self.engines = {name: stack[name] for name in ("spec", "plain")}
        self.route = route.routes[0]
        self.samples: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self.thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(self.samples) < 2 * ADVICE_LAG + 1:  # advice for the first request
            time.sleep(0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)

    def _run(self) -> None:
        while not self.stop.is_set():
            advice = _spec_advice(self.daemon)
            sample: dict[str, Any] = {
                "t": time.time(),
                "speculate": None if advice is None else advice["speculate"],
                "batch": None if advice is None else advice["batch_per_engine"],
                "headroom": None if advice is None else advice["headroom"]["requests"],
            }
            for name, server in self.engines.items():
                try:
                    sample[name] = sum(
                        engine.running or 0.0
                        for engine in parse_engine_sample("vllm", server.get("/metrics", 2), self.route, 0).engines
                    )
                except (OSError, SourceError):
                    sample[name] = None
            self.samples.append(sample)
            self.stop.wait(0.5)

    def advised(self, t: float) -> str | None:
        """What the spec route was advised over the ADVICE_LAG before `t`: "above" its crossover (`speculate`
        false), "below" it (`speculate` true with room for a whole request: BELOW_HEADROOM), or None (it changed,
        or neither).
        The first sample after `t` counts too: advice that changed between the last sample and `t` shows only
        there, and the callback, refreshing on its own timer, may have seen the change before this sampler did."""
        after = next((s for s in self.samples if s["t"] > t), None)
        window = [s for s in self.samples if t - ADVICE_LAG <= s["t"] <= t] + ([after] if after else [])
        if window and all(s["speculate"] is False for s in window):
            return "above"
        if window and all(s["speculate"] is True and (s["headroom"] or 0) >= BELOW_HEADROOM for s in window):
            return "below"
        return None


def _gateway_request(session: requests.Session, proxy: str, group: str, prompt: str) -> dict[str, Any]:
    started = time.time()
    body = {"model": group, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
    try:
        response = session.post(
            f"{proxy}/v1/completions",
            json=body,
            timeout=REQUEST_TIMEOUT,
            headers={"Authorization": f"Bearer {MASTER_KEY}"},
        )
        response.raise_for_status()
        served = response.headers.get("x-litellm-model-id", "").removesuffix("-balanced")
        tokens, error = response.json()["usage"]["completion_tokens"], ""
    except (requests.RequestException, ValueError, KeyError) as exc:
        served, tokens, error = "", 0, repr(exc)
    return {"start": started, "end": time.time(), "served": served, "tokens": tokens, "error": error}


def _level(
    proxy: str, group: str, concurrency: int, per_client: int, on_record: Callable[[], None] = lambda: None
) -> list[dict[str, Any]]:
    """`concurrency` closed-loop clients through the proxy, `per_client` requests each."""
    records: list[dict[str, Any]] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        with requests.Session() as session:
            for n in range(per_client):
                record = _gateway_request(session, proxy, group, PROMPTS[(index + n * concurrency) % len(PROMPTS)])
                with lock:
                    records.append(record)
                on_record()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(REQUEST_TIMEOUT * per_client)
    return records


class DirectLoad:
    """Closed-loop clients on the speculative server's own URL, until stopped; their tokens are recorded too."""

    def __init__(self, server: VllmServer, concurrency: int) -> None:
        self.server, self.concurrency = server, concurrency
        self.stop = threading.Event()
        self.records: list[dict[str, Any]] = []
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(concurrency)]

    def _client(self, index: int) -> None:
        with requests.Session() as session:
            for n in range(200):  # bounded
                if self.stop.is_set():
                    return
                started = time.time()
                result = complete(
                    self.server.base_url,
                    "tiny",
                    PROMPTS[(index + n) % len(PROMPTS)],
                    MAX_TOKENS,
                    REQUEST_TIMEOUT,
                    session,
                )
                self.records.append(
                    {"start": started, "end": time.time(), "tokens": result.completion_tokens, "error": result.error}
                )

    def __enter__(self) -> DirectLoad:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(REQUEST_TIMEOUT)


def _ramp(stack: dict[str, Any], group: str, sampler: Sampler) -> list[dict[str, Any]]:
    """RAMP through `group`; at the top, DIRECT requests on the speculative server first take it above B*."""
    out = []
    proxy = stack["proxy"].base_url
    for step, (concurrency, per_client) in enumerate(RAMP):
        direct = DirectLoad(stack["spec"], DIRECT if concurrency == TOP else 0)
        with direct:
            if direct.concurrency:
                wait_until(
                    "the spec route advised above its crossover",
                    lambda: sampler.advised(time.time()) == "above",
                    120,
                    stack["procs"],
                )
            began = time.time()
            records = _level(proxy, group, concurrency, per_client)
        ended = time.time()
        direct_tokens = sum(r["tokens"] for r in direct.records if began <= r["end"] <= ended)
        for record in records:
            record.update(group=group, step=step, level=concurrency, advised=sampler.advised(record["start"]))
        out.append(
            {
                "step": step,
                "level": concurrency,
                "began": began,
                "ended": ended,
                "records": records,
                "direct_tokens": direct_tokens,
                "direct_errors": [r["error"] for r in direct.records if r["error"]],
            }
        )
    return out


def _share(records: list[dict[str, Any]]) -> tuple[float, int]:
    return (sum(r["served"] == "spec" for r in records) / len(records) if records else float("nan")), len(records)


def _summary(steps: list[dict[str, Any]], samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for step in steps:
        span = step["ended"] - step["began"]
        tokens = sum(r["tokens"] for r in step["records"]) + step["direct_tokens"]
        batch = [s for s in samples if step["began"] <= s["t"] <= step["ended"]]
        rows.append(
            {
                "step": step["step"],
                "level": step["level"],
                "seconds": round(span, 1),
                "tokens_per_second": round(tokens / span, 2),
                "spec_share": round(_share(step["records"])[0], 3),
                "requests": len(step["records"]),
                "spec_running_max": max((s["spec"] or 0 for s in batch), default=None),
                "plain_running_max": max((s["plain"] or 0 for s in batch), default=None),
            }
        )
    return rows


def test_the_plugin_keeps_speculation_below_the_crossover_and_spills_above_it(stack):
    with Sampler(stack) as sampler:
        routed = _ramp(stack, "routed", sampler)
        balanced = _ramp(stack, "balanced", sampler)
    routed_requests = [r for step in routed for r in step["records"]]
    balanced_requests = [r for step in balanced for r in step["records"]]
    above = [r for r in routed_requests if r["advised"] == "above"]
    below = [r for r in routed_requests if r["advised"] == "below" and r["level"] == 1]
    shares = {
        "above, plugin": _share(above),
        "below, plugin": _share(below),
        "above, no plugin": _share([r for r in balanced_requests if r["advised"] == "above"]),
        "below, no plugin": _share([r for r in balanced_requests if r["advised"] == "below" and r["level"] == 1]),
        "all, no plugin": _share(balanced_requests),
    }
    result = {
        "b_star": B_STAR,
        "ramp": RAMP,
        "direct_at_top": DIRECT,
        "max_tokens": MAX_TOKENS,
        "spec_share": shares,
        "with_plugin": _summary(routed, sampler.samples),
        "without_plugin": _summary(balanced, sampler.samples),
        "requests": routed_requests + balanced_requests,
        "samples": sampler.samples,
    }
    (stack["workdir"] / "routing.json").write_text(json.dumps(result, indent=1))
    print(f"\nrouting.json in {stack['workdir']}\nspec share (share, requests): {shares}")
    for name in ("with_plugin", "without_plugin"):
        for row in result[name]:
            print(name, row)

    errors = [r["error"] for r in routed_requests + balanced_requests if r["error"]]
    assert not errors and not [e for step in routed + balanced for e in step["direct_errors"]], errors[:5]
    assert len(above) >= 4 and len(below) >= 4, shares
    assert shares["above, plugin"][0] <= 0.10, shares
    assert shares["below, plugin"][0] >= 0.90, shares
    assert 0.2 <= shares["all, no plugin"][0] <= 0.8, shares  # LiteLLM's own balancing: about half


def test_each_node_is_routed_by_its_own_specwatch_and_a_stopped_one_fails_open_alone(stack):
    proxy, daemon_b, procs_b = stack["proxy"], stack["daemon_b"], stack["procs_b"]
    with Sampler(stack) as sampler, DirectLoad(stack["spec"], DIRECT):
        wait_until(
            "node A advised above its crossover", lambda: sampler.advised(time.time()) == "above", 120, stack["procs"]
        )
        with requests.Session() as session:  # the first request through `fleet` makes the callback see node B
            assert not _gateway_request(session, proxy.base_url, "fleet", PROMPTS[0])["error"]
        time.sleep(ADVICE_LAG)
        b_before = _spec_advice(daemon_b)
        both = _level(proxy.base_url, "fleet", *FLEET_LOAD)
        b_after = _spec_advice(daemon_b)
        procs_b.stop_all()
        wait_until("node B's specwatch stopped", lambda: not answers(f"{daemon_b}/-/ready"), 60, stack["procs"])
        time.sleep(5.0 + 2 * 0.5)  # the callback's max_age_seconds and two refreshes: node B's advice expires
        a_only = _level(proxy.base_url, "fleet", *FLEET_LOAD)
    for record in both + a_only:
        record["advised"] = sampler.advised(record["start"])
    above_both = [r for r in both if r["advised"] == "above"]
    above_a_only = [r for r in a_only if r["advised"] == "above"]

    def share(records: list[dict[str, Any]], deployment: str) -> float:
        return sum(r["served"] == deployment for r in records) / len(records) if records else float("nan")

    shares = {
        "both up: node A (above)": (share(above_both, "spec-a"), len(above_both)),
        "both up: node B (below)": (share(above_both, "spec-b"), len(above_both)),
        "node B stopped: node A (above)": (share(above_a_only, "spec-a"), len(above_a_only)),
        "node B stopped: node B (unfiltered)": (share(above_a_only, "spec-b"), len(above_a_only)),
        "node B stopped: plain": (share(above_a_only, "plain-fleet"), len(above_a_only)),
    }
    (stack["workdir"] / "routing-fleet.json").write_text(
        json.dumps({"shares": shares, "requests": both + a_only, "samples": sampler.samples}, indent=1)
    )
    print(f"\nfleet shares (share, requests): {shares}")

    errors = [r["error"] for r in both + a_only if r["error"]]
    assert not errors, errors[:5]
    for advice in (b_before, b_after):  # node B was below its crossover with room throughout
        assert advice is not None and advice["speculate"] is True and advice["headroom"]["requests"] >= 1, advice
    assert len(above_both) >= 4 and len(above_a_only) >= 4, shares
    assert shares["both up: node A (above)"][0] <= 0.10, shares
    assert shares["both up: node B (below)"][0] >= 0.90, shares
    assert shares["node B stopped: node A (above)"][0] <= 0.10, shares  # still filtered by node A's advice
    served_b_stopped = {r["served"] for r in above_a_only}
    assert {"spec-b", "plain-fleet"} <= served_b_stopped, shares  # unfiltered: LiteLLM's own shuffle over both
    log = proxy.log_path.read_text(errors="replace")
    assert f"specwatch advice from {daemon_b}/api/v1/advice failed" in log
    metrics = _proxy_metrics(proxy.base_url)
    decisions = {
        d: metrics.get(("specwatch_routing_requests_total", (("decision", d), ("model_group", "fleet"))), 0.0)
        for d in ("kept", "spilled", "failed_open")
    }
    print(f"the proxy's /metrics, fleet decisions: {decisions}")
    assert decisions["kept"] >= len(above_both) and decisions["failed_open"] >= len(above_a_only), decisions
    assert metrics[("specwatch_routing_advice_up", (("node", stack["daemon"]),))] == 1.0
    assert metrics[("specwatch_routing_advice_up", (("node", daemon_b),))] == 0.0
    assert metrics[("specwatch_routing_advice_age_seconds", (("node", daemon_b),))] > 5.0


def _proxy_metrics(proxy: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = requests.get(f"{proxy}/metrics", headers={"Authorization": f"Bearer {MASTER_KEY}"}, timeout=30)
    response.raise_for_status()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def test_the_proxy_serves_every_request_with_specwatch_stopped_mid_ramp(stack):
    procs: Processes = stack["procs"]
    done = threading.Event()
    count = [0]

    def stop_specwatch_after_the_first_round() -> None:
        count[0] += 1
        if count[0] == FAIL_OPEN_CLIENTS and not done.is_set():
            done.set()
            procs.stop_all()

    records = _level(stack["proxy"].base_url, "routed", FAIL_OPEN_CLIENTS, 3, stop_specwatch_after_the_first_round)
    assert done.is_set() and not answers(f"{stack['daemon']}/-/ready")
    assert len(records) == 3 * FAIL_OPEN_CLIENTS and all(not r["error"] for r in records), [
        r["error"] for r in records if r["error"]
    ]
    log = stack["proxy"].log_path.read_text(errors="replace")
    assert "specwatch advice from" in log and "routed unchanged until it works" in log
