"""The simulator over HTTP (loopback only): OpenAI streaming, the SIMULATED markings, scenario events,
and 128 concurrent streaming clients."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from specwatch.simulator.launch import free_port, spawn, start_inprocess, wait_ready
from specwatch.simulator.scenario import Event
from specwatch.simulator.simulation import SimulationSpec

pytestmark = pytest.mark.slow  # simulator servers and processes

FAST = 50.0  # time scale: a 100-token request takes ~10 ms of real time


@pytest.fixture
def vllm():
    sim = start_inprocess(SimulationSpec(engine_kind="vllm", dp=2, k=4, time_scale=FAST, seed=5))
    yield sim
    sim.stop()


@pytest.fixture
def sglang():
    sim = start_inprocess(SimulationSpec(engine_kind="sglang", dp=1, k=3, time_scale=FAST, seed=6))
    yield sim
    sim.stop()


def _sse(response: requests.Response) -> list:
    events = []
    for line in response.iter_lines():
        if line:
            assert line.startswith(b"data: ")
            payload = line[len(b"data: ") :]
            events.append(payload.decode() if payload == b"[DONE]" else json.loads(payload))
    return events


@pytest.mark.parametrize("chat", [False, True])
def test_streaming_completion_ends_with_usage_then_done(vllm, chat):
    model = vllm.simulation.model_name
    body = {"model": model, "max_tokens": 40, "stream": True}
    if chat:
        body["messages"] = [{"role": "user", "content": "Say something long."}]
    else:
        body["prompt"] = "Once upon a time"
    r = requests.post(
        vllm.url + ("/v1/chat/completions" if chat else "/v1/completions"), json=body, stream=True, timeout=10
    )
    assert r.status_code == 200 and r.headers["Content-Type"] == "text/event-stream"
    assert r.headers["X-Specwatch-Simulator"] == "1"
    events = _sse(r)
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 40
    content = events[:-2]
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    if chat:
        assert content[0]["choices"][0]["delta"]["role"] == "assistant"
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in content)
        assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])
    else:
        text = "".join(e["choices"][0]["text"] for e in content)
    assert len(text.split()) == 40  # one word per simulated token


def test_non_streaming_completion(sglang):
    r = requests.post(
        sglang.url + "/v1/completions",
        json={"model": sglang.simulation.model_name, "prompt": "hi", "max_tokens": 7},
        timeout=10,
    )
    doc = r.json()
    assert doc["object"] == "text_completion" and doc["usage"]["completion_tokens"] == 7
    assert doc["choices"][0]["finish_reason"] == "length"


def test_every_page_says_simulated(vllm, sglang):
    assert requests.get(vllm.url + "/version").json()["version"] == "0.33.0-simulated"
    models = requests.get(vllm.url + "/v1/models").json()["data"]
    assert models[0]["owned_by"] == "specwatch-simulator"
    assert "SIMULATED vllm" in requests.get(vllm.url + "/").text
    info = requests.get(sglang.url + "/get_server_info").json()
    assert info["version"] == "0.5.23-simulated" and info["speculative_num_draft_tokens"] == 4
    for url in (vllm.url, sglang.url):
        r = requests.get(url + "/metrics")
        assert r.headers["X-Specwatch-Simulator"] == "1"
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert "specwatch" not in r.text and "simulat" not in r.text.lower()  # the exposition is the engine's own


def test_bad_requests_get_openai_errors(vllm):
    url = vllm.url + "/v1/completions"
    r = requests.post(url, json={"model": "other", "prompt": "x"})
    assert r.status_code == 404 and "does not exist" in r.json()["error"]["message"]
    assert requests.post(url, data=b"{nope", headers={"Content-Type": "application/json"}).status_code == 400
    assert requests.post(url, json={"prompt": "x", "max_tokens": 0}).status_code == 400
    assert requests.post(vllm.url + "/v1/chat/completions", json={"messages": []}).status_code == 400
    assert requests.get(vllm.url + "/nope").status_code == 404


def test_client_disconnect_frees_the_batch_slot(vllm):
    conn = http.client.HTTPConnection("127.0.0.1", int(vllm.url.rsplit(":", 1)[1]), timeout=5)
    conn.request(
        "POST",
        "/v1/completions",
        json.dumps({"prompt": "x", "max_tokens": 1_000_000, "stream": True}),
        {"Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    resp.read1(100)
    resp.close()  # the response holds the socket: close both, as a client going away does
    conn.close()
    _wait_for(lambda: sum(e.load for e in vllm.simulation.engines) == 0)


def test_model_bump_restarts_counters_under_the_new_name(vllm):
    sim = vllm.simulation
    sim.engines[0].set_offered_concurrency(4)
    _wait_for(lambda: _value(vllm, "vllm:spec_decode_num_drafts_total", engine="0") > 100)
    created = _value(vllm, "vllm:spec_decode_num_drafts_created", engine="0")
    sim.apply(Event(at=0, type="model_bump", params={"model_name": "m-2", "acceptance_factor": 0.8}))
    assert sim.model_name == "m-2"
    fams = _families(vllm)
    labels = {s.labels["model_name"] for s in fams["vllm:spec_decode_num_drafts"].samples}
    assert labels == {"m-2"}
    assert _value(vllm, "vllm:spec_decode_num_drafts_created", engine="0") > created
    assert sim.profile.acceptance_rate() == pytest.approx(0.8 * sim.base_profile.acceptance_rate())
    assert requests.get(vllm.url + "/v1/models").json()["data"][0]["id"] == "m-2"


def test_outage_answers_503_then_recovers(sglang):
    sim = sglang.simulation
    sim.apply(Event(at=0, type="outage", params={"duration": 0.5 * FAST}))  # 0.5 s of real time
    assert requests.get(sglang.url + "/metrics").status_code == 503
    assert requests.post(sglang.url + "/v1/completions", json={"prompt": "x"}).status_code == 503
    assert requests.get(sglang.url + "/").status_code == 200  # the simulator's own page stays up
    _wait_for(lambda: requests.get(sglang.url + "/metrics").status_code == 200)


def test_128_concurrent_streaming_clients(vllm):
    port = int(vllm.url.rsplit(":", 1)[1])
    results: list[int] = []
    errors: list[str] = []

    def client() -> None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request(
                "POST",
                "/v1/completions",
                json.dumps(
                    {"prompt": "x", "max_tokens": 60, "stream": True, "stream_options": {"include_usage": True}}
                ),
                {"Content-Type": "application/json"},
            )
            body = conn.getresponse().read()
            conn.close()
            events = [line[6:] for line in body.split(b"\n") if line.startswith(b"data: ")]
            results.append(json.loads(events[-2])["usage"]["completion_tokens"])
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(repr(exc))

    threads = [threading.Thread(target=client) for _ in range(128)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors[:3]
    assert results == [60] * 128


# ----------------------------------------------------------------------------------------- helpers
def _families(sim) -> dict:
    text = requests.get(sim.url + "/metrics").text
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(sim, sample_name: str, **labels: str) -> float:
    for fam in _families(sim).values():
        for s in fam.samples:
            if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def _wait_for(predicate, timeout: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


# ----------------------------------------------------------------------------------------- the command
def test_simulate_command_serves_until_sigterm():
    port = free_port()
    proc = spawn(port, "--engine", "sglang", "--dp", "2", "--time-scale", "5", "--load", "4")
    try:
        wait_ready(f"http://127.0.0.1:{port}/version", process=proc)
        assert requests.get(f"http://127.0.0.1:{port}/version").json()["version"] == "0.5.23-simulated"
        _wait_for(lambda: "sglang:num_running_reqs" in requests.get(f"http://127.0.0.1:{port}/metrics").text)
    finally:
        proc.terminate()
    assert proc.wait(timeout=10) == 0


def test_simulate_command_rejects_a_bad_scenario(tmp_path):
    scenario = tmp_path / "bad.yaml"
    scenario.write_text("events: [{at: 1m, type: nope}]\n")
    result = subprocess.run(
        [sys.executable, "-m", "specwatch", "simulate", "--port", "0", "--scenario", str(scenario)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "events[0].type" in result.stderr
