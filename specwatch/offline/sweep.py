"""The two-server sweep: drive a plain and a speculative OpenAI-compatible server at rising concurrency and
measure where speculation stops paying.

Per level, each server in turn (never both at once, so servers sharing a host do not disturb each other)
gets `concurrency` closed-loop clients streaming `requests_per_client` requests each at a fixed max_tokens.
Throughput is output tokens over the level's wall time; TTFT and TPOT come from stream timings; the spec
server's acceptance is the delta of its `/metrics` counters across its level. The result file is rewritten
after every level, so an interrupted sweep keeps what it measured.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import requests

from specwatch.config import DEFAULT_HTTP_CLIENT, HttpClientConfig, RouteConfig
from specwatch.crossover.sweepfile import FORMAT, crossover_concurrency
from specwatch.snapshot import EngineSample
from specwatch.sources.base import SourceError
from specwatch.sources.engines import parse_engine_sample
from specwatch.sources.http import client_session

DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128)
FAILED_SHARE_LIMIT = 0.1  # a level with more failed requests than this stops the sweep

BUILTIN_PROMPTS: tuple[dict[str, Any], ...] = (
    {
        "kind": "chat",
        "messages": [
            {
                "role": "user",
                "content": "Explain to a new on-call engineer what a KV cache is and why it fills up under load.",
            }
        ],
    },
    {
        "kind": "chat",
        "messages": [
            {
                "role": "user",
                "content": "Write a short, friendly reply declining a meeting "
                "invitation because of a production freeze.",
            }
        ],
    },
    {
        "kind": "code",
        "prompt": "# Python\n# Return the n-th Fibonacci number iteratively, with type hints and a "
        "docstring.\ndef fibonacci(n: int) -> int:\n",
    },
    {
        "kind": "code",
        "prompt": "// Go: an HTTP handler that returns the server's uptime as JSON.\npackage main\n\nimport (\n",
    },
    {
        "kind": "math",
        "prompt": "Question: A train travels 180 km in 2.5 hours, then 120 km in 1.5 hours. What is "
        "its average speed over the whole trip? Answer step by step.\nAnswer:",
    },
    {"kind": "math", "prompt": "Solve for x: 3x + 7 = 2x - 5. Show each step.\nSolution:"},
)


@dataclass(frozen=True)
class RequestResult:
    ok: bool
    output_tokens: int = 0
    ttft_s: float | None = None
    tpot_s: float | None = None
    latency_s: float | None = None
    error: str = ""


@dataclass(frozen=True)
class SweepSettings:
    plain_url: str
    spec_url: str
    concurrency: Sequence[int] = DEFAULT_CONCURRENCY
    prompts: Sequence[dict[str, Any]] = BUILTIN_PROMPTS
    prompts_source: str = "builtin"
    max_tokens: int = 128
    requests_per_client: int = 3
    model: str = ""  # "" = each server's first /v1/models entry
    timeout_s: float = 120.0
    note: str = ""  # free text kept in the file and the plot, e.g. what hardware this measured
    http: HttpClientConfig = DEFAULT_HTTP_CLIENT  # auth, TLS and headers for both servers, as a route's


@dataclass
class SweepOutcome:
    document: dict[str, Any]
    failure: str = ""
    interrupted: bool = False
    levels: list[dict[str, Any]] = field(default_factory=list)


def load_prompts(path: str | Path) -> list[dict[str, Any]]:
    """JSONL, one object a line with "prompt" (completions) or "messages" (chat). Raises ValueError."""
    prompts = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read prompts: {exc}") from exc
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{path}:{n}: not JSON: {exc}") from exc
        if not isinstance(obj, dict) or not (
            isinstance(obj.get("prompt"), str) or isinstance(obj.get("messages"), list)
        ):
            raise ValueError(f'{path}:{n}: expected an object with a "prompt" string or a "messages" list')
        prompts.append(obj)
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def base_url(url: str) -> str:
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def discover_model(session: requests.Session, url: str, timeout: float) -> str:
    resp = session.get(f"{base_url(url)}/v1/models", timeout=timeout)
    resp.raise_for_status()
    data = resp.json().get("data") or []
    if not data:
        raise ValueError(f"{url}: /v1/models lists no model")
    return str(data[0]["id"])


def stream_one(
    session: requests.Session,
    url: str,
    model: str,
    prompt: dict[str, Any],
    max_tokens: int,
    timeout: float,
    clock: Callable[[], float] = time.perf_counter,
) -> RequestResult:
    """One streaming request; token count from the final usage chunk when the server sends one."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    if "messages" in prompt:
        endpoint, body["messages"] = "/v1/chat/completions", prompt["messages"]
    else:
        endpoint, body["prompt"] = "/v1/completions", prompt["prompt"]
    start = clock()
    first = last = None
    chunks = 0
    usage_tokens = None
    try:
        with session.post(base_url(url) + endpoint, json=body, stream=True, timeout=timeout) as resp:
            if resp.status_code != 200:
                return RequestResult(False, error=f"HTTP {resp.status_code} from {endpoint}")
            for raw in _lines_as_they_arrive(resp):
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                event = json.loads(payload)
                usage = event.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    usage_tokens = int(usage["completion_tokens"])
                if _chunk_text(event):
                    now = clock()
                    first = now if first is None else first
                    last = now
                    chunks += 1
    except (requests.RequestException, ValueError) as exc:
        return RequestResult(False, error=f"{type(exc).__name__}: {exc}")
    tokens = usage_tokens if usage_tokens is not None else chunks
    if first is None or last is None:
        return RequestResult(False, error="stream ended without any token")
    tpot = (last - first) / (tokens - 1) if tokens > 1 else None
    return RequestResult(True, tokens, first - start, tpot, clock() - start)


def _lines_as_they_arrive(resp: requests.Response) -> Iterator[bytes]:
    """SSE lines the moment their bytes arrive. requests' iter_lines either waits for a full chunk_size or,
    with chunk_size=None on a response without chunked encoding, for the end of the body: both ruin TTFT and
    TPOT. urllib3's read1 returns whatever one read of the socket brings."""
    pending = b""
    while True:
        data = resp.raw.read1(65536)
        if not data:
            break
        pending += data
        *lines, pending = pending.split(b"\n")
        yield from lines
    if pending:
        yield pending


def _chunk_text(event: dict[str, Any]) -> str:
    text = ""
    for choice in event.get("choices") or []:
        text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
    return text


# --------------------------------------------------------------------------- acceptance from /metrics
def read_spec_counters(session: requests.Session, url: str, timeout: float) -> EngineSample | None:
    """The spec server's counters, read through the daemon's own engine sources; None when unreadable."""
    try:
        resp = session.get(f"{base_url(url)}/metrics", timeout=timeout, headers={"Accept": "text/plain"})
        resp.raise_for_status()
        return parse_engine_sample("auto", resp.content, RouteConfig(name="sweep", url=url), time.time())
    except (requests.RequestException, SourceError):
        return None


def acceptance_between(before: EngineSample | None, after: EngineSample | None) -> dict[str, Any]:
    """Acceptance over a level from two samples of the spec server: vLLM's draft counters, or SGLang's tokens
    per verify step (its tokenizer counters move as requests finish)."""
    if not before or not after:
        return {}

    def delta(field_name: str) -> float:
        return _total(after, field_name) - _total(before, field_name)

    drafts, draft_tokens, accepted = delta("drafts"), delta("draft_tokens"), delta("accepted_tokens")
    if drafts > 0 and draft_tokens > 0:
        per_pos_before, per_pos_after = _per_position(before), _per_position(after)
        positions = [
            (per_pos_after[p] - (per_pos_before[p] if p < len(per_pos_before) else 0.0)) / drafts
            for p in range(len(per_pos_after))
        ]
        return {
            "acceptance_ratio": accepted / draft_tokens,
            "mean_acceptance_length": 1.0 + accepted / drafts,
            "draft_length": draft_tokens / drafts,
            "position_acceptance": [round(p, 4) for p in positions],
        }
    verify, generated = delta("drafts"), delta("generation_tokens")
    if any(e.verify_counts for e in after.engines) and verify > 0 and generated > 0:
        out: dict[str, Any] = {"mean_acceptance_length": generated / verify}
        k = after.num_speculative_tokens
        if k:
            out.update(draft_length=k, acceptance_ratio=(generated / verify - 1) / k)
        return out
    return {}


def _total(sample: EngineSample, field_name: str) -> float:
    return sum(getattr(engine, field_name) or 0.0 for engine in sample.engines)


def _per_position(sample: EngineSample) -> list[float]:
    width = max((len(engine.accepted_per_pos) for engine in sample.engines), default=0)
    return [sum(e.accepted_per_pos[p] for e in sample.engines if p < len(e.accepted_per_pos)) for p in range(width)]


# --------------------------------------------------------------------------- one level
def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))]


def run_level(
    url: str,
    model: str,
    settings: SweepSettings,
    concurrency: int,
    on_request: Callable[[], None] = lambda: None,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """Closed loop: `concurrency` clients, each sending `requests_per_client` requests back to back."""
    stop = stop or threading.Event()
    results: list[RequestResult] = []
    lock = threading.Lock()
    counter = iter(range(concurrency * settings.requests_per_client))

    def client() -> None:
        session = client_session(settings.http)
        try:
            while not stop.is_set():
                with lock:
                    n = next(counter, None)
                if n is None:
                    return
                prompt = settings.prompts[n % len(settings.prompts)]
                r = stream_one(session, url, model, prompt, settings.max_tokens, settings.timeout_s)
                with lock:
                    results.append(r)
                on_request()
        finally:
            session.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.2)  # short joins keep Ctrl-C responsive in the main thread
    elapsed = time.perf_counter() - start
    return summarize(results, elapsed, concurrency)


def summarize(results: Sequence[RequestResult], elapsed: float, concurrency: int) -> dict[str, Any]:
    """Throughput by Little's law: `concurrency` requests always in flight, each lasting the mean latency.
    Wall-clock throughput (tokens / level duration) is kept beside it; it undercounts by the ramp-up and the
    tail, when fewer than `concurrency` requests are in flight."""
    ok = [r for r in results if r.ok]
    tokens = sum(r.output_tokens for r in ok)
    latencies = [r.latency_s for r in ok if r.latency_s]
    mean_latency = sum(latencies) / len(latencies) if latencies else 0.0
    tokens_per_request = tokens / len(ok) if ok else 0.0
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    per_token = [r.latency_s / r.output_tokens for r in ok if r.latency_s and r.output_tokens]
    errors = [r.error for r in results if not r.ok]
    out: dict[str, Any] = {
        "requests": len(results),
        "failed": len(errors),
        "output_tokens": tokens,
        "duration_s": round(elapsed, 4),
        "output_tokens_per_s": concurrency * tokens_per_request / mean_latency if mean_latency else 0.0,
        "requests_per_s": concurrency / mean_latency if mean_latency else 0.0,
        "wall_output_tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "tpot_p50_s": percentile(tpot, 50),
        "tpot_p99_s": percentile(tpot, 99),
        # a request's latency over its tokens: the spread the gate's interval on the speedup comes from
        "latency_per_token_mean_s": sum(per_token) / len(per_token) if per_token else None,
        "latency_per_token_sd_s": statistics.stdev(per_token) if len(per_token) > 1 else None,
        "latency_per_token_n": len(per_token),
    }
    if errors:
        out["first_error"] = errors[0]
    return out


# --------------------------------------------------------------------------- the sweep
def run_sweep(
    settings: SweepSettings,
    out_path: str | Path,
    on_progress: Callable[[str, int, int], None] = lambda label, done, total: None,
) -> SweepOutcome:
    """Measure every level (plain, then spec). Stops at the first failing server or Ctrl-C and still writes
    the file with the levels measured so far; `outcome.failure` says what failed."""
    session = client_session(settings.http)
    doc: dict[str, Any] = {
        "format": FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "plain_url": settings.plain_url,
        "spec_url": settings.spec_url,
        "model": settings.model,
        "max_tokens": settings.max_tokens,
        "prompts": settings.prompts_source,
        "requests_per_client": settings.requests_per_client,
        "context_tokens": context_estimate(settings),
        "num_speculative_tokens": None,
        "levels": [],
        "complete": False,
        "failure": None,
        "crossover_concurrency": None,
        "mean_acceptance_length": None,
        "position_acceptance": [],
        "note": settings.note,
    }
    outcome = SweepOutcome(document=doc)
    stop = threading.Event()
    try:
        models = {}
        for role, url in (("plain", settings.plain_url), ("spec", settings.spec_url)):
            try:
                models[role] = settings.model or discover_model(session, url, settings.timeout_s)
            except (requests.RequestException, ValueError, KeyError) as exc:
                outcome.failure = f"{role} server {url}: cannot list models: {exc}"
                return _finish(outcome, out_path)
        doc["model"] = models["spec"]
        for concurrency in settings.concurrency:
            level: dict[str, Any] = {"concurrency": concurrency}
            for role, url in (("plain", settings.plain_url), ("spec", settings.spec_url)):
                total = concurrency * settings.requests_per_client
                done = [0]

                def tick(label=f"{role} c={concurrency}", total=total, done=done) -> None:
                    done[0] += 1
                    on_progress(label, done[0], total)

                on_progress(f"{role} c={concurrency}", 0, total)
                before = read_spec_counters(session, url, settings.timeout_s) if role == "spec" else None
                result = run_level(url, models[role], settings, concurrency, tick, stop)
                if role == "spec":
                    result.update(acceptance_between(before, read_spec_counters(session, url, settings.timeout_s)))
                level[role] = result
                if result["requests"] == 0 or result["failed"] > FAILED_SHARE_LIMIT * result["requests"]:
                    outcome.failure = (
                        f"{role} server {url} at concurrency {concurrency}: {result['failed']}/"
                        f"{result['requests']} requests failed ({result.get('first_error', '')})"
                    )
                    return _finish(outcome, out_path)
            plain_tps = level["plain"]["output_tokens_per_s"]
            level["speedup"] = level["spec"]["output_tokens_per_s"] / plain_tps if plain_tps else None
            outcome.levels.append(level)
            _finish(outcome, out_path, complete=False)
        return _finish(outcome, out_path, complete=True)
    except KeyboardInterrupt:
        stop.set()
        outcome.interrupted = True
        outcome.failure = f"interrupted after {len(outcome.levels)} complete level(s)"
        return _finish(outcome, out_path)
    finally:
        session.close()


def context_estimate(settings: SweepSettings) -> float:
    """Mean tokens in the KV cache per running request: prompt (~4 characters a token) + half the output."""
    chars = [
        len(p.get("prompt") or "".join(m.get("content", "") for m in p.get("messages", []))) for p in settings.prompts
    ]
    return round(sum(chars) / len(chars) / 4 + settings.max_tokens / 2, 1)


def _finish(outcome: SweepOutcome, out_path: str | Path, complete: bool = False) -> SweepOutcome:
    doc = outcome.document
    doc["levels"] = outcome.levels
    doc["complete"] = complete
    doc["failure"] = outcome.failure or None
    doc["crossover_concurrency"] = crossover_concurrency(outcome.levels)
    _overall_acceptance(doc)
    tmp = Path(f"{out_path}.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out_path)  # atomic: a reader never sees half a file
    return outcome


def _overall_acceptance(doc: dict[str, Any]) -> None:
    """Token-weighted means over the levels whose spec side reported acceptance."""
    specs = [lv["spec"] for lv in doc["levels"] if lv.get("spec", {}).get("mean_acceptance_length")]
    if not specs:
        return
    weights = [max(1, s["output_tokens"]) for s in specs]
    doc["mean_acceptance_length"] = sum(w * s["mean_acceptance_length"] for w, s in zip(weights, specs)) / sum(weights)
    with_pos = [(w, s) for w, s in zip(weights, specs) if s.get("position_acceptance")]
    if with_pos:
        width = min(len(s["position_acceptance"]) for _, s in with_pos)
        total = sum(w for w, _ in with_pos)
        doc["position_acceptance"] = [
            round(sum(w * s["position_acceptance"][j] for w, s in with_pos) / total, 4) for j in range(width)
        ]
        doc["num_speculative_tokens"] = width
