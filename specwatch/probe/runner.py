"""Running one canary round against one route's engine, on a thread of its own.

`ProbeRunner.start(now)` begins a round unless one is still running (rounds never overlap) and returns at
once; the daemon's tick reads `latest`, the last finished `Round`, and never waits for HTTP. A round sends
every prompt of the set greedily (temperature 0, `max_tokens`, `concurrency` at a time, each with `timeout`)
and reads each prompt's own acceptance, in this order of preference (probe/responses.py has the fields):

1. `vllm_response`: vLLM's `metrics.speculative_decoding` (server started with
   `--per-request-spec-decode-metrics summary`);
2. `sglang_generate`: SGLang's native `/generate` `meta_info` (api sglang, the default for SGLang routes);
3. `sglang_openai`: SGLang's OpenAI completions with `return_spec_tokens_details: true` (api openai);
4. `llamacpp_timings`: llama-server's `timings.draft_n` / `draft_n_accepted` (no verify-step count);
5. `bracketing`: when the answer carries none of these, each prompt is bracketed by two scrapes of the
   engine's /metrics: sent only while nothing runs or waits, and kept only if the finished-request counter
   rose by exactly one and nothing runs or waits afterwards; its acceptance is the counters' difference.
   Prompts go one at a time, and a round where too few prompts could be bracketed is `busy`.

The method found is kept for the next rounds and looked for again after `forget_method()` (an engine restart).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlsplit, urlunsplit

import requests

from specwatch.config import ProbeConfig, RouteConfig
from specwatch.probe import responses
from specwatch.probe.prompts import Prompt, PromptSet
from specwatch.probe.responses import Acceptance, ResponseError
from specwatch.snapshot import EngineSample
from specwatch.sources.base import SourceError
from specwatch.sources.http import client_session

log = logging.getLogger(__name__)

METHODS = ("vllm_response", "sglang_generate", "sglang_openai", "llamacpp_timings", "bracketing")
OUTCOMES = ("ok", "busy", "error")
# A bracketed prompt waits this long at most for the engine to be idle before it is sent, and for the
# finished-request counter to show it afterwards (engines update counters just after answering).
BRACKET_IDLE_WAIT_SECONDS = 5.0
BRACKET_SETTLE_SECONDS = 3.0
BRACKET_POLL_SECONDS = 0.1
# A round is usable when at least this share of its prompts were read.
MIN_READ_SHARE = 0.5

Scrape = Callable[[], "tuple[EngineSample, float | None]"]  # (sample, finished requests) of the route


@dataclass(frozen=True)
class PromptResult:
    prompt_id: str
    kind: str
    acceptance: Acceptance | None = None
    completion_tokens: int | None = None
    error: str = ""  # why this prompt has no acceptance


@dataclass(frozen=True)
class Round:
    """One finished round; `seq` grows by one per round of this runner."""

    seq: int
    started: float  # wall-clock
    duration_seconds: float
    outcome: str  # ok | busy | error
    method: str = ""
    message: str = ""
    model: str = ""
    prompts: tuple[PromptResult, ...] = ()
    reason: str = ""  # why it ran: schedule | change | manual

    def read(self) -> dict[str, Acceptance]:
        return {p.prompt_id: p.acceptance for p in self.prompts if p.acceptance is not None}

    def totals(self) -> Acceptance:
        read = [p.acceptance for p in self.prompts if p.acceptance is not None]
        return Acceptance(
            drafted=sum(a.drafted for a in read),
            accepted=sum(a.accepted for a in read),
            steps=sum(a.steps for a in read),
        )


class _NoAcceptance(Exception):
    """The engine answered but reported no per-request acceptance: bracketing is needed."""


class ProbeRunner:
    """Rounds of one route, one at a time. `previous`: the runner this one replaces (a config reload), whose
    round still in flight keeps this one from starting, so rounds never overlap across reloads either."""

    def __init__(
        self,
        route: RouteConfig,
        probe: ProbeConfig,
        prompt_set: PromptSet,
        engine_kind: Callable[[], str],
        scrape: Scrape | None = None,
        *,
        session_factory: Callable[[], requests.Session] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        previous: "ProbeRunner | None" = None,
        bracketing_only: bool = False,
    ) -> None:
        self.route = route
        self.probe = probe
        self.prompt_set = prompt_set
        self.engine_kind = engine_kind  # "vllm" | "sglang" | "" (not known yet), read when a round starts
        self.scrape = scrape  # None: no bracketing fallback
        # The route's HTTP client config (auth, TLS, headers) holds for the probes as for its scrapes.
        self.session_factory = session_factory or (lambda: client_session(route.http))
        self.clock = clock
        self.sleep = sleep
        self.latest: Round | None = None
        self._previous = previous if previous is not None and previous.running else None
        self._seq = 0
        self._bracketing_only = bracketing_only  # bracket even where the answer has acceptance (tests, comparison)
        self._method = "bracketing" if bracketing_only else ""
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._read: list[Acceptance] = []  # read since the last take_read()

    # ------------------------------------------------------------------ control (tick thread)
    @property
    def running(self) -> bool:
        thread = self._thread
        if thread is not None and thread.is_alive():
            return True
        if self._previous is not None:
            if self._previous.running:
                return True
            self._previous = None
        return False

    def start(self, reason: str = "schedule") -> bool:
        """Begin a round on its own thread; False when one is still running."""
        with self._lock:
            if self.running:
                return False
            self._seq += 1
            seq = self._seq
            self._thread = threading.Thread(
                target=self._run, args=(seq, reason), daemon=True, name=f"probe-{self.route.name}"
            )
            self._thread.start()
            return True

    def join(self, timeout: float | None = None) -> None:
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def forget_method(self) -> None:
        self._method = "bracketing" if self._bracketing_only else ""

    def take_read(self) -> list[Acceptance]:
        """Acceptances read since the last call: the probes' own tokens, which tracking leaves out of the
        route's windows (each one is handed over once, as soon as its prompt is read)."""
        with self._lock:
            read, self._read = self._read, []
        return read

    def _note(self, acceptance: Acceptance) -> None:
        with self._lock:
            self._read.append(acceptance)

    def run_now(self, reason: str = "manual") -> Round:
        """One round on the calling thread (the `specwatch probe` command)."""
        with self._lock:
            self._seq += 1
            seq = self._seq
        self._run(seq, reason)
        assert self.latest is not None
        return self.latest

    # ------------------------------------------------------------------ one round (probe thread)
    def _run(self, seq: int, reason: str) -> None:
        started, begin = self.clock(), time.monotonic()
        try:
            result = self._round(seq, started, reason)
        except Exception as exc:  # noqa: BLE001 - a probe bug costs its round, never the daemon
            log.exception("route %s: canary round failed unexpectedly", self.route.name)
            result = Round(
                seq, started, 0.0, "error", self._method, f"internal: {type(exc).__name__}: {exc}", reason=reason
            )
        self.latest = dataclasses.replace(result, duration_seconds=time.monotonic() - begin)

    def _round(self, seq: int, started: float, reason: str) -> Round:
        session = self.session_factory()
        try:
            kind = self.engine_kind()
            api = self.probe.api if self.probe.api != "auto" else ("sglang" if kind == "sglang" else "openai")
            model = self._model(session, kind)
            prompts = self.prompt_set.prompts
            if self._method != "bracketing":
                try:
                    results = self._direct(session, api, kind, model, prompts)
                except _NoAcceptance:
                    results = None
                    if self.scrape is None:
                        return Round(
                            seq,
                            started,
                            0.0,
                            "error",
                            "",
                            "the engine reports no per-request "
                            "acceptance and there is no /metrics source to bracket with",
                            model,
                            reason=reason,
                        )
                    self._method = "bracketing"
                if results is not None:
                    return self._finish(seq, started, model, results, reason)
            return self._finish(seq, started, model, self._bracketed(session, api, kind, model, prompts), reason)
        finally:
            session.close()

    def _finish(self, seq: int, started: float, model: str, results: list[PromptResult], reason: str) -> Round:
        read = sum(1 for r in results if r.acceptance is not None)
        errors = [r.error for r in results if r.acceptance is None and r.error]
        if read >= max(1, MIN_READ_SHARE * len(results)):
            outcome, message = "ok", f"{read}/{len(results)} prompts read"
        elif self._method == "bracketing" and all(e.startswith("busy") for e in errors):
            outcome, message = "busy", f"only {read}/{len(results)} prompts could be bracketed: the engine was busy"
        else:
            outcome = "error"
            message = f"{read}/{len(results)} prompts read; first error: {errors[0] if errors else 'none'}"
        return Round(seq, started, 0.0, outcome, self._method, message, model, tuple(results), reason)

    # ------------------------------------------------------------------ per-request acceptance
    def _direct(
        self, session: requests.Session, api: str, kind: str, model: str, prompts: tuple[Prompt, ...]
    ) -> list[PromptResult]:
        """Every prompt, `concurrency` at a time; raises _NoAcceptance when the first answer has none."""
        first = self._send(session, api, kind, model, prompts[0])
        if first.error == _NO_ACCEPTANCE:
            raise _NoAcceptance()
        if first.error:  # a dead or hung engine costs one timeout, not one per prompt
            return [
                first,
                *(PromptResult(p.id, p.kind, error="not sent: the first prompt failed") for p in prompts[1:]),
            ]
        with ThreadPoolExecutor(
            max_workers=self.probe.concurrency, thread_name_prefix=f"probe-{self.route.name}"
        ) as pool:
            rest = list(pool.map(lambda p: self._send(session, api, kind, model, p), prompts[1:]))
        return [first, *rest]

    def _send(self, session: requests.Session, api: str, kind: str, model: str, prompt: Prompt) -> PromptResult:
        try:
            body, method = self._request(session, api, kind, model, prompt)
        except (requests.RequestException, ValueError) as exc:
            return PromptResult(prompt.id, prompt.kind, error=_short(exc))
        try:
            if method == "vllm_response":
                acceptance = responses.vllm_completion(body) or responses.sglang_openai(body)
                if acceptance is not None and "sglext" in body:
                    method = "sglang_openai"
                elif acceptance is None:
                    acceptance = responses.llamacpp_completion(body)
                    method = "llamacpp_timings"
            else:
                acceptance = responses.sglang_generate(body)
        except ResponseError as exc:
            return PromptResult(prompt.id, prompt.kind, error=f"unexpected answer: {exc}")
        tokens = responses.completion_tokens(body)
        if acceptance is None:
            return PromptResult(prompt.id, prompt.kind, completion_tokens=tokens, error=_NO_ACCEPTANCE)
        if self._method != "bracketing":
            self._method = method
            self._note(acceptance)
        return PromptResult(prompt.id, prompt.kind, acceptance, tokens)

    def _request(
        self, session: requests.Session, api: str, kind: str, model: str, prompt: Prompt
    ) -> tuple[dict[str, Any], str]:
        base = _base_url(self.route.url)
        if api == "sglang":
            # GenerateReqInput takes token ids as `input_ids` (sglang/srt/managers/io_struct.py)
            payload: dict[str, Any] = (
                {"input_ids": list(prompt.token_ids)} if prompt.token_ids else {"text": prompt.text}
            )
            payload["sampling_params"] = {"temperature": 0, "max_new_tokens": self.probe.max_tokens}
            url, method = base + "/generate", "sglang_generate"
        else:
            payload = {
                "model": model,
                "prompt": prompt.payload,
                "max_tokens": self.probe.max_tokens,
                "temperature": 0,
                "stream": False,
                "n": 1,
            }
            if kind == "sglang":
                payload[responses.SGLANG_REQUEST_FLAG] = True
            url, method = base + "/v1/completions", "vllm_response"
        response = session.post(url, json=payload, timeout=self.probe.timeout_seconds)
        if response.status_code != 200:
            raise ValueError(f"HTTP {response.status_code} from {url}: {response.text[:200]}")
        body = response.json()
        if not isinstance(body, dict):
            raise ValueError(f"{url}: answer is not a JSON object")
        return body, method

    def _model(self, session: requests.Session, kind: str) -> str:
        if self.probe.model != "auto":
            return self.probe.model
        url = _base_url(self.route.url) + "/v1/models"
        try:
            response = session.get(url, timeout=self.probe.timeout_seconds)
            data = response.json().get("data") if response.status_code == 200 else None
            if isinstance(data, list) and data and isinstance(data[0], dict) and data[0].get("id"):
                return str(data[0]["id"])
        except (requests.RequestException, ValueError, AttributeError):
            pass
        return ""  # the OpenAI servers of both engines default to their one model when none is named

    # ------------------------------------------------------------------ counter bracketing
    def _bracketed(
        self, session: requests.Session, api: str, kind: str, model: str, prompts: tuple[Prompt, ...]
    ) -> list[PromptResult]:
        return [self._bracket_one(session, api, kind, model, p) for p in prompts]

    def _bracket_one(self, session: requests.Session, api: str, kind: str, model: str, prompt: Prompt) -> PromptResult:
        assert self.scrape is not None
        try:
            before = self._idle_reading(BRACKET_IDLE_WAIT_SECONDS)
        except SourceError as exc:
            return PromptResult(prompt.id, prompt.kind, error=f"scrape failed: {exc}")
        if before is None:
            return PromptResult(prompt.id, prompt.kind, error="busy: requests running or waiting before the prompt")
        sent = self._send(session, api, kind, model, prompt)
        if sent.error not in ("", _NO_ACCEPTANCE):
            return sent
        try:
            after = self._settled_reading(before[1] + 1, BRACKET_SETTLE_SECONDS)
        except SourceError as exc:
            return PromptResult(prompt.id, prompt.kind, error=f"scrape failed: {exc}")
        finished_delta = after[1] - before[1]
        if finished_delta != 1 or _busy(after[0]):
            return PromptResult(
                prompt.id,
                prompt.kind,
                completion_tokens=sent.completion_tokens,
                error=f"busy: {finished_delta:g} requests finished during the bracket",
            )
        drafted, accepted, steps = (
            _counter(after[0], name) - _counter(before[0], name)
            for name in ("draft_tokens", "accepted_tokens", "drafts")
        )
        if min(drafted, accepted, steps) < 0:
            return PromptResult(prompt.id, prompt.kind, error="busy: the engine restarted during the bracket")
        acceptance = Acceptance(drafted, accepted, steps)
        self._note(acceptance)
        return PromptResult(prompt.id, prompt.kind, acceptance, sent.completion_tokens)

    def _reading(self) -> tuple[EngineSample, float]:
        assert self.scrape is not None
        sample, finished = self.scrape()
        if finished is None:
            raise SourceError("no_spec_metrics", "the engine exposes no finished-request counter")
        return sample, finished

    def _idle_reading(self, wait: float) -> tuple[EngineSample, float] | None:
        deadline = time.monotonic() + wait
        while True:
            reading = self._reading()
            if not _busy(reading[0]):
                return reading
            if time.monotonic() >= deadline:
                return None
            self.sleep(BRACKET_POLL_SECONDS)

    def _settled_reading(self, expect_finished: float, wait: float) -> tuple[EngineSample, float]:
        """The first idle reading, at or past `expect_finished`, that the next poll repeats: an engine may answer
        a request before it counts it finished, so one quiet reading can hold an organic request's finish in
        place of the prompt's (and both requests' tokens)."""
        deadline = time.monotonic() + wait
        previous: tuple[EngineSample, float] | None = None
        while True:
            reading = self._reading()
            settled = reading[1] >= expect_finished and not _busy(reading[0])
            if settled and previous is not None and _same_counts(previous, reading):
                return reading
            if time.monotonic() >= deadline:
                return reading
            previous = reading if settled else None
            self.sleep(BRACKET_POLL_SECONDS)


_NO_ACCEPTANCE = "no per-request acceptance in the answer"


def _same_counts(a: tuple[EngineSample, float], b: tuple[EngineSample, float]) -> bool:
    return a[1] == b[1] and all(
        _counter(a[0], name) == _counter(b[0], name) for name in ("draft_tokens", "accepted_tokens", "drafts")
    )


def _busy(sample: EngineSample) -> bool:
    return any((e.running or 0) > 0 or (e.waiting or 0) > 0 for e in sample.engines)


def _counter(sample: EngineSample, name: str) -> float:
    """A counter summed over the route's engines; an engine that counts verify steps only (`verify_counts`) has
    them derived as tracking does (routes.py)."""
    if any(e.verify_counts for e in sample.engines):
        k = sample.num_speculative_tokens or 0
        verify = sum(e.drafts or 0.0 for e in sample.engines)
        generated = sum(e.generation_tokens or 0.0 for e in sample.engines)
        return {"drafts": verify, "draft_tokens": verify * k, "accepted_tokens": generated - verify}[name]
    return sum(getattr(e, name) or 0.0 for e in sample.engines)


def _base_url(metrics_url: str) -> str:
    parts = urlsplit(metrics_url)
    return urlunsplit((parts.scheme, parts.netloc, "", "", ""))


def _short(exc: Exception) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 200 else text[:197] + "..."
