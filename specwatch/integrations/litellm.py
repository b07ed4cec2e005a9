"""A LiteLLM routing callback: keep a model group's traffic on its speculative deployments while they have
headroom before their crossover, and spill the rest to its plain deployments (docs/routing.md).

Install with `pip install 'specwatch[litellm]'`. Deployments say which specwatch route they are and whether
they speculate in their own LiteLLM config:

    model_list:
      - model_name: chat
        litellm_params: {model: hosted_vllm/qwen, api_base: http://spec-node:8000/v1}
        model_info: {specwatch_route: chat-spec, specwatch_role: spec}
      - model_name: chat
        litellm_params: {model: hosted_vllm/qwen, api_base: http://plain-node:8000/v1}
        model_info: {specwatch_role: plain}

1. `AdviceCache` holds the daemon's last `/api/v1/advice` answer. A background thread, started by the first
   request, refreshes it every `refresh_seconds` with a `timeout` (100 ms by default), between requests too;
   a request never waits for it.
2. `SpecwatchRouting.async_filter_deployments` (LiteLLM's `CustomLogger` hook for narrowing a request's
   candidate deployments) keeps the speculative deployments whose route advises `speculate: true` and still
   has room for a whole request, counting the requests it sent since that advice's evaluation less those of
   its requests that finished since (a fractional B* is not overshot: past it the flag would hold the route
   above its crossover); otherwise it keeps the plain ones. It fails open: no advice yet, an unreachable or
   erroring daemon, advice older than `max_age_seconds`, an unknown version, a group without both kinds, or
   any error leaves the deployments as they were.
3. LiteLLM's success and failure hooks (`async_log_success_event`, `async_log_failure_event`, and the sync
   ones) end a request it routed: matched by `litellm_trace_id` (the filter's request and every attempt's
   logging carry the router's one) and the deployment that served it (`model_info.id`). Each attempt of a
   retried request is filtered, and logged, on its own.

LiteLLM runs this hook on its async path (the proxy, `Router.acompletion`); the sync `Router.completion`
does not run routing callbacks.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import requests

try:
    from litellm.integrations.custom_logger import CustomLogger
except ImportError as exc:  # the extra is missing: say how to get it
    raise ImportError("specwatch.integrations.litellm needs LiteLLM: pip install 'specwatch[litellm]'") from exc

log = logging.getLogger(__name__)

ADVICE_VERSION = 1
ROUTE_KEY, ROLE_KEY = "specwatch_route", "specwatch_role"
SPEC, PLAIN = "spec", "plain"
# Routed requests (and ended call ids) remembered at most: one whose end is never logged is forgotten in time;
# its count lasts only until the next evaluation anyway.
_MAX_TRACKED = 10_000


class AdviceCache:
    """The daemon's last advice, kept fresh by a background thread; `current()` never blocks on the network."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 0.1,
        refresh_seconds: float = 1.0,
        max_age_seconds: float = 30.0,
        auth: tuple[str, str] | None = None,
        verify: bool | str = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url.rstrip("/") + "/api/v1/advice"
        self.timeout, self.refresh_seconds, self.max_age_seconds = timeout, refresh_seconds, max_age_seconds
        self._clock = clock
        self._session = requests.Session()
        self._session.auth = auth
        self._session.verify = verify
        self._lock = threading.Lock()
        self._doc: dict[str, Any] | None = None
        self._fetched_at = 0.0  # when the held answer arrived
        self._refresher: threading.Thread | None = None
        self._closed = threading.Event()
        self._failing = False

    def current(self) -> dict[str, Any] | None:
        """The advice if fresh enough to act on, else None. The first call starts the refresher."""
        self._start_refresher()
        now = self._clock()
        with self._lock:
            doc, fetched_at = self._doc, self._fetched_at
        if doc is None or now - fetched_at > self.max_age_seconds:
            return None
        evaluated = doc.get("evaluated")
        if not isinstance(evaluated, (int, float)) or now - evaluated > self.max_age_seconds:
            return None  # the daemon answers but has stopped evaluating
        return doc

    def last_evaluated(self) -> Any:
        """The `evaluated` of the held advice however old (None before the first): the evaluation that the
        counts of requests started and finished are kept against."""
        with self._lock:
            return None if self._doc is None else self._doc.get("evaluated")

    def refresh_now(self) -> None:
        """One synchronous refresh (for tests and start-up)."""
        self._refresh()

    def close(self) -> None:
        """Stop the refresher."""
        self._closed.set()

    def _start_refresher(self) -> None:
        """Fetch every `refresh_seconds` whether requests come or not, so a request after a quiet spell finds
        fresh advice rather than none (a refresh driven by requests would leave it stale)."""
        with self._lock:
            if self._refresher is not None:
                return
            self._refresher = threading.Thread(target=self._refresh_loop, name="specwatch-advice", daemon=True)
        self._refresher.start()

    def _refresh_loop(self) -> None:
        while not self._closed.is_set():
            self._refresh()
            self._closed.wait(self.refresh_seconds)

    def _refresh(self) -> None:
        try:
            response = self._session.get(self.url, timeout=self.timeout)
            response.raise_for_status()
            doc = response.json()
            if not isinstance(doc, dict) or doc.get("version") != ADVICE_VERSION:
                raise ValueError(f"advice version {doc.get('version') if isinstance(doc, dict) else '?'!r}")
            with self._lock:
                self._doc, self._fetched_at = doc, self._clock()
            if self._failing:
                log.info("specwatch advice from %s works again", self.url)
            self._failing = False
        except Exception as exc:  # noqa: BLE001 - any failure means no advice, never a failed request
            if not self._failing:
                log.warning("specwatch advice from %s failed (routing unchanged until it works): %s", self.url, exc)
            self._failing = True


class SpecwatchRouting(CustomLogger):
    """Register as a LiteLLM callback (`litellm.callbacks = [SpecwatchRouting(url)]`, or the proxy's
    `litellm_settings.callbacks`)."""

    def __init__(self, url: str = "http://127.0.0.1:9448", advice: AdviceCache | None = None, **cache: Any) -> None:
        super().__init__()
        self.advice = advice or AdviceCache(url, **cache)
        self._lock = threading.Lock()
        # route -> (the evaluation counted against, requests sent since it less those of them that finished)
        self._sent: dict[str, tuple[Any, float]] = {}
        # trace id -> per routed attempt: the deployment ids it was narrowed to, and its share of each route
        self._routed: dict[str, list[tuple[frozenset[str], dict[str, float]]]] = {}
        self._ended: dict[str, None] = {}  # call ids already ended, so a sync and an async hook end one once

    async def async_filter_deployments(
        self,
        model: str,
        healthy_deployments: list,
        messages: Any,
        request_kwargs: dict | None = None,
        parent_otel_span: Any = None,
    ) -> list:
        try:
            trace = (request_kwargs or {}).get("litellm_trace_id")
            return self.narrow(healthy_deployments, trace if isinstance(trace, str) else None)
        except Exception:  # noqa: BLE001 - fail open
            log.exception("specwatch routing failed; deployments left as they were")
            return healthy_deployments

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self._ended_safely(kwargs)

    async def async_log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self._ended_safely(kwargs)

    def log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self._ended_safely(kwargs)

    def log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self._ended_safely(kwargs)

    def counted(self, route: str) -> float:
        """Requests this callback sent `route` since the held advice's evaluation, less those of them that
        finished since: what it takes off the advice's headroom."""
        with self._lock:
            seen, sent = self._sent.get(route, (None, 0.0))
            return sent if seen == self.advice.last_evaluated() else 0.0

    def ended(self, trace: str | None, deployment_id: str | None, call_id: str | None = None) -> None:
        """A request (attempt) this callback may have routed finished, on `deployment_id`: its share comes off
        each route's count. Anything it did not narrow (fail-open, a plain deployment) is no one's count."""
        if not trace or not deployment_id:
            return
        with self._lock:
            if call_id:
                if call_id in self._ended:
                    return
                self._ended[call_id] = None
                if len(self._ended) > _MAX_TRACKED:
                    del self._ended[next(iter(self._ended))]
            attempts = self._routed.get(trace)
            i = next((i for i, (ids, _) in enumerate(attempts or ()) if deployment_id in ids), None)
            if attempts is None or i is None:
                return
            _, shares = attempts.pop(i)
            if not attempts:
                del self._routed[trace]
            evaluated = self.advice.last_evaluated()
            for route, share in shares.items():
                seen, sent = self._sent.get(route, (None, 0.0))
                if seen != evaluated:  # finished after a new evaluation that counted it running: room again
                    sent = 0.0
                self._sent[route] = (evaluated, sent - share)

    def _ended_safely(self, kwargs: Any) -> None:
        try:
            if not isinstance(kwargs, dict):
                return
            params = kwargs.get("litellm_params")
            info = params.get("model_info") if isinstance(params, dict) else None
            deployment = info.get("id") if isinstance(info, dict) else None
            trace, call_id = kwargs.get("litellm_trace_id"), kwargs.get("litellm_call_id")
            self.ended(
                trace if isinstance(trace, str) else None,
                str(deployment) if deployment is not None else None,
                call_id if isinstance(call_id, str) else None,
            )
        except Exception:  # noqa: BLE001 - a logging hook never fails a request
            log.exception("specwatch routing: counting a finished request failed")

    def narrow(self, deployments: list, trace: str | None = None) -> list:
        spec = [d for d in deployments if _info(d).get(ROLE_KEY) == SPEC and _info(d).get(ROUTE_KEY)]
        plain = [d for d in deployments if _info(d).get(ROLE_KEY) == PLAIN]
        if not spec or not plain:
            return deployments
        doc = self.advice.current()
        if doc is None:
            return deployments
        by_route = {r.get("route"): r for r in doc.get("routes") or () if isinstance(r, dict)}
        advised = [by_route.get(_info(d)[ROUTE_KEY]) for d in spec]
        if any(a is None or a.get("speculate") is None for a in advised):
            return deployments  # a spec deployment specwatch knows nothing about: no narrowing
        evaluated = doc.get("evaluated")
        keep = []
        with self._lock:
            for deployment, route in zip(spec, advised):
                assert route is not None
                if route["speculate"] and self._room(route, evaluated) >= 1:
                    keep.append((deployment, route["route"]))
            shares: dict[str, float] = {}
            for _, name in keep:  # the router picks one of them: count the request once among them
                seen, sent = self._sent[name]
                self._sent[name] = (seen, sent + 1.0 / len(keep))
                shares[name] = shares.get(name, 0.0) + 1.0 / len(keep)
            if keep and trace:
                ids = frozenset(str(_info(d).get("id")) for d, _ in keep)
                self._routed.setdefault(trace, []).append((ids, shares))
                if len(self._routed) > _MAX_TRACKED:  # a request whose end is never logged: forget the oldest
                    del self._routed[next(iter(self._routed))]
        return [d for d, _ in keep] if keep else plain

    def _room(self, route: dict[str, Any], evaluated: Any) -> float:
        """Headroom left on the route: the advice's, less the requests sent since that evaluation."""
        headroom = (route.get("headroom") or {}).get("requests")
        if not isinstance(headroom, (int, float)):
            return 0.0
        seen, sent = self._sent.get(route["route"], (None, 0.0))
        if seen != evaluated:  # a new evaluation counts what was sent before it in its running requests
            sent = 0.0
        self._sent[route["route"]] = (evaluated, sent)
        return headroom - sent


def _info(deployment: Any) -> dict[str, Any]:
    if not isinstance(deployment, dict):
        return {}
    info = deployment.get("model_info")
    return info if isinstance(info, dict) else {}
