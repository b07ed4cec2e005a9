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
   has room for a whole request, counting the requests it sent since that advice's evaluation (a fractional B*
   is not overshot: past it the flag would hold the route above its crossover); otherwise it keeps the plain
   ones. It fails open: no advice yet, an unreachable or erroring daemon, advice older than `max_age_seconds`,
   an unknown version, a group without both kinds, or any error leaves the deployments as they were.

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
        self._sent: dict[str, tuple[Any, float]] = {}  # route -> (the evaluation counted against, requests sent)

    async def async_filter_deployments(
        self,
        model: str,
        healthy_deployments: list,
        messages: Any,
        request_kwargs: dict | None = None,
        parent_otel_span: Any = None,
    ) -> list:
        try:
            return self.narrow(healthy_deployments)
        except Exception:  # noqa: BLE001 - fail open
            log.exception("specwatch routing failed; deployments left as they were")
            return healthy_deployments

    def narrow(self, deployments: list) -> list:
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
            for _, name in keep:  # the router picks one of them: count the request once among them
                seen, sent = self._sent[name]
                self._sent[name] = (seen, sent + 1.0 / len(keep))
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
