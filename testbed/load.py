"""Bounded greedy load for a testbed server, through its OpenAI completions API.

Greedy (temperature 0) requests with `ignore_eos` produce exactly `max_tokens` tokens each and, for a given
(target, drafter) pair, the same drafts and acceptances every run: counter deltas are reproducible.
Every loop here is bounded in requests and in time, and stops by itself.
"""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Sequence, Union

import requests

from specwatch.probe.responses import VLLM_METRICS_FIELD, VLLM_SPEC_FIELD

Prompt = Union[str, list[int]]  # text, or token ids (the completions API takes either)

PROMPTS: tuple[str, ...] = (
    "def fibonacci(n: int) -> int:",
    "Summarise the incident: acceptance fell after the drafter was replaced",
    "Question: a train travels 180 km in 2.5 hours. What is its average speed? Answer:",
    "Dear team, the production freeze starts on Friday.",
    "for (int i = 0; i < n; i++) {",
    "Solve for x: 3x + 7 = 2x - 5.",
    "class Counter:\n    def __init__(self) -> None:",
    "The quick brown fox jumps over the lazy dog.",
)


@dataclass(frozen=True)
class Completion:
    ok: bool
    prompt: Prompt = ""
    completion_tokens: int = 0
    spec_metrics: dict[str, Any] | None = None  # the response's `metrics.speculative_decoding`, when asked for
    error: str = ""


def complete(
    base_url: str,
    model: str,
    prompt: Prompt,
    max_tokens: int = 32,
    timeout: float = 120.0,
    session: requests.Session | None = None,
) -> Completion:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    http = session or requests
    try:
        response = http.post(f"{base_url}/v1/completions", json=body, timeout=timeout)
        response.raise_for_status()
        document = response.json()
    except (requests.RequestException, ValueError) as exc:
        return Completion(ok=False, prompt=prompt, error=str(exc))
    metrics = (document.get(VLLM_METRICS_FIELD) or {}).get(VLLM_SPEC_FIELD)
    return Completion(
        ok=True,
        prompt=prompt,
        completion_tokens=document.get("usage", {}).get("completion_tokens", 0),
        spec_metrics=metrics,
    )


def run_requests(
    base_url: str,
    model: str,
    count: int,
    *,
    concurrency: int = 1,
    max_tokens: int = 32,
    prompts: Sequence[Prompt] = PROMPTS,
    timeout: float = 120.0,
) -> list[Completion]:
    """`count` requests over `concurrency` closed-loop clients; prompts taken in order, cycling."""
    chosen = list(itertools.islice(itertools.cycle(prompts), count))
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        return list(pool.map(lambda p: complete(base_url, model, p, max_tokens, timeout), chosen))


@dataclass
class LoadStats:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)


class BackgroundLoad:
    """Closed-loop clients sending greedy requests until stop(), `max_seconds` or `max_requests`.

    A failed request (the server restarting, say) is counted and retried after a pause, so a load can run
    across an engine restart, as real traffic does.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        concurrency: int = 2,
        max_tokens: int = 32,
        pause_seconds: float = 0.0,
        max_seconds: float = 900.0,
        max_requests: int = 100_000,
        prompts: Sequence[Prompt] = PROMPTS,
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.concurrency = concurrency
        self.max_tokens = max_tokens
        self.pause_seconds = pause_seconds
        self.max_seconds = max_seconds
        self.max_requests = max_requests
        self.prompts = tuple(prompts)
        self.stats = LoadStats()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> "BackgroundLoad":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        for index in range(self.concurrency):
            thread = threading.Thread(
                target=self._client, args=(index, deadline), daemon=True, name=f"testbed-load-{index}"
            )
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 180.0) -> LoadStats:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)
        return self.stats

    def _client(self, index: int, deadline: float) -> None:
        session = requests.Session()
        while not self._stop.is_set() and time.monotonic() < deadline:
            with self._lock:
                if self.stats.sent >= self.max_requests:
                    return
                # All clients take the prompts in one shared order, so the first n requests are the first n prompts.
                prompt = self.prompts[self.stats.sent % len(self.prompts)]
                self.stats.sent += 1
            result = complete(self.base_url, self.model, prompt, self.max_tokens, session=session)
            with self._lock:
                if result.ok:
                    self.stats.ok += 1
                else:
                    self.stats.failed += 1
                    self.stats.errors = (self.stats.errors + [result.error])[-10:]
            if not result.ok:
                self._stop.wait(1.0)  # the server is restarting or overloaded: back off, then carry on
            elif self.pause_seconds:
                self._stop.wait(self.pause_seconds)
