"""HTTP front of a simulated engine: `/metrics`, OpenAI-compatible streaming completions, `/v1/models`,
`/version` (vLLM) or `/get_server_info` (SGLang), `/health`, and a `/` page that says what this is.

Every response carries `X-Specwatch-Simulator: 1`; `/version` says `<version>-simulated`; models are
`owned_by` "specwatch-simulator". The `/metrics` body itself is the engine's exact format, nothing added.

Streaming: a handler thread waits on its request's `ready` event and writes everything generated since its
last write as one SSE event, then pauses `flush_interval` (real seconds) so that 128 concurrent streams
cost a few thousand writes a second, not one per token. The final event carries `finish_reason`, then a
`usage` chunk (`choices: []`), then `data: [DONE]`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from specwatch.simulator.simulation import Simulation

log = logging.getLogger(__name__)

SIMULATOR_HEADER = "X-Specwatch-Simulator"
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_WORDS = (
    "simulated",
    "tokens",
    "from",
    "the",
    "specwatch",
    "engine",
    "simulator",
    "flow",
    "through",
    "a",
    "continuous",
    "batch",
    "while",
    "drafts",
    "are",
    "verified",
    "and",
    "accepted",
    "or",
    "rejected",
)
_MAX_BODY = 1 << 20


class SimulatorHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024  # 128+ clients connect at once; the default backlog of 5 would drop SYNs

    def __init__(self, address: tuple[str, int], simulation: Simulation, flush_interval: float = 0.02) -> None:
        self.simulation = simulation
        self.flush_interval = flush_interval
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), self.server_address[1]
        return f"http://{host}:{port}"


class RunningSimulator:
    """A started simulation and its HTTP server on a background thread; `stop()` ends both."""

    def __init__(
        self, simulation: Simulation, host: str = "127.0.0.1", port: int = 0, flush_interval: float = 0.02
    ) -> None:
        self.simulation = simulation
        self.httpd = SimulatorHTTPServer((host, port), simulation, flush_interval)
        self._thread = threading.Thread(
            target=self.httpd.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"sim-http-{self.httpd.server_address[1]}",
            daemon=True,
        )

    @property
    def url(self) -> str:
        return self.httpd.url

    def start(self) -> "RunningSimulator":
        self.simulation.start()
        self._thread.start()
        sim = self.simulation
        log.info(
            "SIMULATED %s %s (%d engine(s), model %s, k=%d, time scale %g) serving on %s; "
            "this is the specwatch simulator, not a real engine",
            sim.kind,
            sim.version,
            len(sim.engines),
            sim.model_name,
            sim.k,
            sim.clock.time_scale,
            self.url,
        )
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.simulation.stop()  # aborts streams in flight, so their handler threads finish
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as the engines' uvicorn sets it: headers and body are two writes, and with Nagle on a small
    # body (a filtered /metrics, /version) waits ~40 ms for the client's delayed ACK of the headers.
    disable_nagle_algorithm = True
    timeout = 60  # a client that stops reading times out a blocked write, and its request is cancelled
    server: SimulatorHTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s %s", self.address_string(), format % args)

    # ------------------------------------------------------------------ routing
    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        sim = self.server.simulation
        path, _, query = self.path.partition("?")
        if path == "/":
            return self._send(200, _index_page(sim).encode(), "text/plain; charset=utf-8")
        if path == "/simulator/status":
            return self._json(200, sim.status())
        if sim.down:
            return self._error(503, "simulated outage: the engine is down", "ServiceUnavailable")
        if path == "/metrics":
            # `name[]` parameters restrict the output, as prometheus_client's app (vLLM's and SGLang's) does.
            return self._send(200, sim.render_metrics(parse_qs(query).get("name[]")), METRICS_CONTENT_TYPE)
        if path == "/health":
            return self._send(200, b"", "text/plain")
        if path == "/v1/models":
            return self._json(200, _models(sim))
        if path == "/version":
            return self._json(200, {"version": f"{sim.version}-simulated", "simulator": "specwatch"})
        if sim.kind == "sglang" and path in ("/get_server_info", "/server_info"):
            return self._json(200, _server_info(sim))
        if sim.kind == "sglang" and path == "/get_model_info":
            return self._json(
                200, {"model_path": sim.model_name, "tokenizer_path": sim.model_name, "is_generation": True}
            )
        return self._error(404, f"no route {path} on the simulated {sim.kind} server", "NotFound")

    def do_POST(self) -> None:  # noqa: N802
        sim = self.server.simulation
        path = self.path.split("?", 1)[0]
        if sim.kind == "sglang" and path == "/generate":
            return self._generate()
        if path not in ("/v1/completions", "/v1/chat/completions"):
            return self._error(404, f"no route {path} on the simulated {sim.kind} server", "NotFound")
        body = self._read_json()
        if body is None:
            return None
        if sim.down:
            return self._error(503, "simulated outage: the engine is down", "ServiceUnavailable")
        chat = path == "/v1/chat/completions"
        try:
            prompt_tokens, max_tokens, stream = _parse_request(body, chat)
        except ValueError as exc:
            return self._error(400, str(exc), "BadRequestError")
        model = body.get("model") or sim.model_name
        if model != sim.model_name:
            return self._error(404, f"The model `{model}` does not exist.", "NotFoundError")
        engine, request = sim.submit(
            prompt_tokens,
            max_tokens,
            streaming=stream,
            custom_labels=_custom_labels(self.headers.get("x-custom-labels")),
            greedy_seed=_greedy_seed(body, chat),
        )
        spec_details = sim.kind == "sglang" and body.get("return_spec_tokens_details") is True
        try:
            if stream:
                self._stream(request, chat, model)
            else:
                self._complete(request, chat, model, spec_details)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            engine.cancel(request)  # the client went away: free its slot in the batch

    def _generate(self) -> None:
        """SGLang's native /generate (text or input_ids in, `meta_info` with the request's spec fields out),
        non-streaming."""
        sim = self.server.simulation
        body = self._read_json()
        if body is None:
            return None
        if sim.down:
            return self._error(503, "simulated outage: the engine is down", "ServiceUnavailable")
        text, ids, params = body.get("text"), body.get("input_ids"), body.get("sampling_params") or {}
        if isinstance(ids, list) and ids and all(isinstance(t, int) for t in ids) and text is None:
            prompt_tokens, seed_text = len(ids), json.dumps(ids)
        elif isinstance(text, str):
            prompt_tokens, seed_text = _count_tokens(text), text
        else:
            return self._error(400, "text (a string) or input_ids (a list of token ids) is required", "BadRequestError")
        if not isinstance(params, dict):
            return self._error(400, "sampling_params must be an object", "BadRequestError")
        max_tokens = params.get("max_new_tokens", 128)  # SGLang's SamplingParams default
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            return self._error(
                400, f"max_new_tokens: must be a positive integer, got {max_tokens!r}", "BadRequestError"
            )
        greedy = params.get("temperature", 1.0) == 0
        engine, request = sim.submit(prompt_tokens, max_tokens, greedy_seed=_seed(seed_text) if greedy else None)
        try:
            _wait(request)
            self._json(
                200,
                {
                    "text": _text(0, request.generated),
                    "output_ids": list(range(request.generated)),
                    "meta_info": _sglang_meta_info(request, sim.k),
                },
            )
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            engine.cancel(request)

    # ------------------------------------------------------------------ completions
    def _stream(self, request, chat: bool, model: str) -> None:
        rid, created = _ids(chat)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.send_header(SIMULATOR_HEADER, "1")
        self.end_headers()
        self.close_connection = True
        if chat:
            self._event(_chunk(rid, created, model, chat, {"role": "assistant", "content": ""}, None))
        sent = 0
        while True:
            request.ready.wait(timeout=1.0)
            request.ready.clear()
            generated, done = request.generated, request.done
            if generated > sent:
                text = _text(sent, generated)
                sent = generated
                reason = request.finish_reason if done else None
                self._event(_chunk(rid, created, model, chat, text, reason))
            elif done:
                self._event(_chunk(rid, created, model, chat, "", request.finish_reason))
            if done:
                break
            time.sleep(self.server.flush_interval)
        usage = _usage(request)
        final: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage,
        }
        metrics = self._vllm_metrics(request)
        if metrics is not None:  # vLLM sends per-request metrics on the final usage chunk only
            final["metrics"] = {k: v for k, v in metrics.items() if v is not None}
        self._event(final)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _complete(self, request, chat: bool, model: str, spec_details: bool = False) -> None:
        _wait(request)
        rid, created = _ids(chat)
        text = _text(0, request.generated)
        if chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": request.finish_reason,
                "stop_reason": None,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": request.finish_reason,
                "stop_reason": None,
            }
        answer: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": _usage(request),
        }
        metrics = self._vllm_metrics(request)
        if metrics is not None:
            answer["metrics"] = metrics
        if spec_details and request.verify_steps > 0:
            answer["sglext"] = {"spec_tokens_details": _sglang_spec_fields(request, self.server.simulation.k)}
        self._json(200, answer)

    def _vllm_metrics(self, request) -> dict[str, Any] | None:
        """vLLM's `metrics` object with `--per-request-spec-decode-metrics summary` (timing fields off)."""
        sim = self.server.simulation
        if sim.kind != "vllm" or sim.spec.per_request_spec_decode_metrics == "none" or not sim.k:
            return None
        return {
            "time_to_first_token_ms": None,
            "generation_time_ms": None,
            "queue_time_ms": None,
            "mean_itl_ms": None,
            "tokens_per_second": None,
            "speculative_decoding": _vllm_spec_decoding(request, sim.k),
        }

    # ------------------------------------------------------------------ plumbing
    def _event(self, payload: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n")
        self.wfile.flush()

    def _read_json(self) -> dict[str, Any] | None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 < length <= _MAX_BODY:
            self._error(400, "a JSON body with a Content-Length up to 1 MiB is required", "BadRequestError")
            return None
        try:
            body = json.loads(self.rfile.read(length))
        except (ValueError, UnicodeDecodeError) as exc:
            self._error(400, f"body is not valid JSON: {exc}", "BadRequestError")
            return None
        if not isinstance(body, dict):
            self._error(400, "body must be a JSON object", "BadRequestError")
            return None
        return body

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _error(self, status: int, message: str, kind: str) -> None:
        self._json(status, {"error": {"message": message, "type": kind, "param": None, "code": status}})

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status, HTTPStatus(status).phrase)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header(SIMULATOR_HEADER, "1")
        self.end_headers()
        self.wfile.write(body)


def _parse_request(body: dict[str, Any], chat: bool) -> tuple[int, int, bool]:
    """(prompt tokens, max tokens, stream) from an OpenAI request; prompt tokens are estimated from text."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages: a non-empty list is required")
        text = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        prompt_tokens = _count_tokens(text) + 4 * len(messages)  # chat template overhead
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            prompt_tokens = len(prompt)
        elif isinstance(prompt, str):
            prompt_tokens = _count_tokens(prompt)
        else:
            raise ValueError("prompt: a string or a list of token ids is required")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:
        max_tokens = 256 if chat else 16  # vLLM's completions default is 16, like OpenAI's
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens: must be a positive integer, got {max_tokens!r}")
    if body.get("n", 1) != 1:
        raise ValueError("n: the simulator serves n=1 only")
    return max(1, prompt_tokens), max_tokens, bool(body.get("stream", False))


def _wait(request) -> None:
    while not request.done:
        request.ready.wait(timeout=1.0)
        request.ready.clear()


def _seed(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _greedy_seed(body: dict[str, Any], chat: bool) -> int | None:
    """A seed of the prompt for a temperature-0 request (repeatable acceptance), else None."""
    if body.get("temperature", 1.0) != 0:
        return None
    prompt = json.dumps(body.get("messages")) if chat else json.dumps(body.get("prompt"))
    return _seed(prompt)


def _vllm_spec_decoding(request, k: int) -> dict[str, Any]:
    """vLLM 0.32's `SpeculativeDecodingMetrics` (vllm/v1/metrics/stats.py RequestSpecDecodeMetrics.to_dict)."""
    histogram = request.spec_histogram or [0] * (k + 1)
    steps = sum(histogram)
    accepted = sum(j * n for j, n in enumerate(histogram))
    return {
        "mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
        "draft_acceptance_rate": accepted / request.spec_draft_tokens if request.spec_draft_tokens else 0.0,
        "acceptance_histogram": list(histogram),
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": request.spec_draft_tokens,
        "num_spec_tokens": k,
        "per_step_accepted": None,
        "per_step_drafted": None,
    }


def _sglang_spec_fields(request, k: int) -> dict[str, Any]:
    """SGLang 0.5.23's per-request spec fields (tokenizer_manager.py `_calculate_spec_decoding_metrics`)."""
    proposed = request.verify_steps * k  # verify_ct x (speculative_num_draft_tokens - 1)
    return {
        "spec_accept_rate": request.spec_accepted_tokens / proposed if proposed else 0.0,
        "spec_accept_length": request.generated / request.verify_steps,
        "spec_num_correct_drafts": request.spec_accepted_tokens,
        "spec_num_proposed_drafts": proposed,
        "spec_verify_ct": request.verify_steps,
        "spec_correct_drafts_histogram": list(request.spec_histogram),
    }


def _sglang_meta_info(request, k: int) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "finish_reason": {"type": "length", "length": request.generated},
        "prompt_tokens": request.prompt_tokens,
        "weight_version": "default",
        "num_retractions": 0,
        "completion_tokens": request.generated,
        "cached_tokens": 0,
    }
    if request.verify_steps > 0 and k:  # SGLang leaves the fields out when the request never verified
        meta.update(_sglang_spec_fields(request, k))
    return meta


def _custom_labels(header: str | None) -> dict[str, str] | None:
    """SGLang's per-request metric labels, `x-custom-labels: {"route": "chat"}`; malformed ones are ignored."""
    if not header:
        return None
    try:
        labels = json.loads(header)
    except ValueError:
        return None
    if not isinstance(labels, dict):
        return None
    return {str(k): str(v) for k, v in labels.items() if isinstance(v, (str, int, float))}


def _count_tokens(text: str) -> int:
    return max(1, round(len(text) / 4))  # ~4 characters per token for English text


def _text(start: int, end: int) -> str:
    return "".join(" " + _WORDS[i % len(_WORDS)] for i in range(start, end))


def _ids(chat: bool) -> tuple[str, int]:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())


def _chunk(rid: str, created: int, model: str, chat: bool, content: Any, finish: str | None) -> dict[str, Any]:
    if chat:
        delta = content if isinstance(content, dict) else {"content": content}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}
    choice = {"index": 0, "text": content, "logprobs": None, "finish_reason": finish, "stop_reason": None}
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice]}


def _usage(request) -> dict[str, int]:
    return {
        "prompt_tokens": request.prompt_tokens,
        "total_tokens": request.prompt_tokens + request.generated,
        "completion_tokens": request.generated,
    }


def _models(sim: Simulation) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": sim.model_name,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "specwatch-simulator",
                "root": sim.model_name,
                "parent": None,
                "max_model_len": sim.spec.max_model_len,
            }
        ],
    }


def _server_info(sim: Simulation) -> dict[str, Any]:
    version = f"{sim.version}-simulated"
    spec = (
        {
            "speculative_algorithm": "EAGLE",
            "speculative_num_steps": sim.k,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": sim.k + 1,
        }
        if sim.k
        else {"speculative_algorithm": None}
    )
    return {
        "version": version,
        "simulator": "specwatch",
        "model_path": sim.model_name,
        "served_model_name": sim.model_name,
        "dp_size": len(sim.engines),
        "enable_metrics": True,
        "decode_log_interval": 40,
        **spec,
    }


def _index_page(sim: Simulation) -> str:
    return (
        f"SIMULATED {sim.kind} {sim.version} engine: this is the specwatch simulator, not a real engine.\n"
        f"model {sim.model_name}, {len(sim.engines)} DP engine(s), speculation "
        f"{'k=' + str(sim.k) if sim.k else 'off'}, time scale {sim.clock.time_scale:g}\n\n"
        "GET  /metrics              engine metrics, exact engine format\n"
        "POST /v1/completions       OpenAI-compatible, stream=true for SSE\n"
        "POST /v1/chat/completions  OpenAI-compatible, stream=true for SSE\n"
        "GET  /v1/models\n"
        "GET  /version"
        + (
            "\nGET  /get_server_info\nPOST /generate            SGLang native, meta_info with the request's spec fields"
            if sim.kind == "sglang"
            else ""
        )
        + "\n"
        "GET  /simulator/status     simulated clock, batch and token counts per engine (JSON)\n"
    )
