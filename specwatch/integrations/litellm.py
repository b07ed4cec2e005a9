"""A LiteLLM routing callback: keep a model group's traffic on its speculative deployments while they have
headroom before their crossover, and spill the rest to its plain deployments (docs/routing.md).

Install with `pip install 'specwatch[litellm]'`. Deployments say which specwatch route they are, on which node's
specwatch, and whether they speculate, in their own LiteLLM config:

    model_list:
      - model_name: chat
        litellm_params: {model: hosted_vllm/qwen, api_base: http://node-a:8000/v1}
        model_info: {specwatch_url: http://node-a:9448, specwatch_route: chat-spec, specwatch_role: spec}
      - model_name: chat
        litellm_params: {model: hosted_vllm/qwen, api_base: http://plain-node:8000/v1}
        model_info: {specwatch_role: plain}

1. `NodeAdvice` holds one specwatch daemon's last `/api/v1/advice` answer; `AdviceCache` holds one per node a
   deployment names (`model_info.specwatch_url`, else the callback's own URL). One background thread, started
   by the first request, refreshes every node every `refresh_seconds`, one request per node whatever the number
   of its deployments, each bounded by `timeout` (100 ms by default), between requests too; a request never
   waits for it. A node first seen by a request wakes the thread at once.
2. `SpecwatchRouting.async_filter_deployments` (LiteLLM's `CustomLogger` hook for narrowing a request's
   candidate deployments) judges each speculative deployment by its own node's advice: kept while its route
   advises `speculate: true` and still has room for a whole request, counting the requests it sent since that
   advice's evaluation less those of its requests that finished since (a fractional B* is not overshot: past it
   the flag would hold the route above its crossover); dropped otherwise. It fails open per deployment: a
   deployment whose node has no fresh advice (unreachable or erroring daemon, advice older than
   `max_age_seconds`, an unknown version) or whose route is unknown or undecided is left in, unfiltered, while
   the other nodes' deployments are still judged. When a speculative deployment with advice is kept, the plain
   ones go; when none is, they stay. A group without both kinds, or any error, leaves the deployments as they
   were.
3. LiteLLM's success and failure hooks (`async_log_success_event`, `async_log_failure_event`, and the sync
   ones) end a request it routed: matched by `litellm_trace_id` (the filter's request and every attempt's
   logging carry the router's one) and the deployment that served it (`model_info.id`). Each attempt of a
   retried request is filtered, and logged, on its own.
4. `RoutingMetrics`: the callback's own counters and gauges, prometheus_client metrics in the process's
   registry as LiteLLM's own `prometheus` callback registers its own, so the proxy's `/metrics` serves them.

LiteLLM runs this hook on its async path (the proxy, `Router.acompletion`); the sync `Router.completion`
does not run routing callbacks.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import requests
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

try:
    from litellm.integrations.custom_logger import CustomLogger
except ImportError as exc:  # the extra is missing: say how to get it
    raise ImportError("specwatch.integrations.litellm needs LiteLLM: pip install 'specwatch[litellm]'") from exc

log = logging.getLogger(__name__)

ADVICE_VERSION = 1
ROUTE_KEY, ROLE_KEY, URL_KEY = "specwatch_route", "specwatch_role", "specwatch_url"
SPEC, PLAIN = "spec", "plain"
KEPT, SPILLED, FAILED_OPEN = "kept", "spilled", "failed_open"
# Routed requests (and ended call ids) remembered at most: one whose end is never logged is forgotten in time;
# its count lasts only until the next evaluation anyway.
_MAX_TRACKED = 10_000
# Nodes fetched at once by the refresher: a fleet's refresh takes about one timeout, not one per node.
_MAX_PARALLEL_FETCHES = 16


class RoutingMetrics:
    """The callback's own metrics. In a multi-worker proxy (PROMETHEUS_MULTIPROC_DIR) the counters add up
    across workers and each gauge shows the worst live worker."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "specwatch_routing_requests",
            "Requests of a model group with speculative and plain deployments, by the callback's decision: kept "
            "(narrowed to speculative deployments with headroom), spilled (every speculative deployment advised "
            "above its crossover or out of headroom: sent to the plain ones), failed_open (a speculative "
            "deployment had no usable advice and was left in unfiltered)",
            ("model_group", "decision"),
            registry=registry,
        )
        self.advice_age = Gauge(
            "specwatch_routing_advice_age_seconds",
            "Seconds since the evaluation of the node's held advice, at the last refresh; absent before the first",
            ("node",),
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.advice_up = Gauge(
            "specwatch_routing_advice_up",
            "Whether the last fetch of the node's advice succeeded (1) or not (0)",
            ("node",),
            registry=registry,
            multiprocess_mode="livemin",
        )


_metrics: dict[CollectorRegistry, RoutingMetrics] = {}  # keyed by the registry itself: an id could be reused
_metrics_lock = threading.Lock()


def routing_metrics(registry: CollectorRegistry = REGISTRY) -> RoutingMetrics:
    """The metrics in `registry`, registered once however many callbacks share it (a registry refuses a name
    twice)."""
    with _metrics_lock:
        if registry not in _metrics:
            _metrics[registry] = RoutingMetrics(registry)
        return _metrics[registry]


class NodeAdvice:
    """One specwatch daemon's last advice."""

    def __init__(self, url: str, session: requests.Session, timeout: float, clock: Callable[[], float]) -> None:
        self.url = url
        self._advice_url = url + "/api/v1/advice"
        self._session, self._timeout, self._clock = session, timeout, clock
        self._lock = threading.Lock()
        self._doc: dict[str, Any] | None = None
        self._fetched_at = 0.0  # when the held answer arrived
        self._failing = False

    def current(self, max_age_seconds: float) -> dict[str, Any] | None:
        """The advice if fresh enough to act on, else None."""
        now = self._clock()
        with self._lock:
            doc, fetched_at = self._doc, self._fetched_at
        if doc is None or now - fetched_at > max_age_seconds:
            return None
        evaluated = doc.get("evaluated")
        if not isinstance(evaluated, (int, float)) or now - evaluated > max_age_seconds:
            return None  # the daemon answers but has stopped evaluating
        return doc

    def last_evaluated(self) -> Any:
        """The `evaluated` of the held advice however old (None before the first)."""
        with self._lock:
            return None if self._doc is None else self._doc.get("evaluated")

    def fetch(self, metrics: RoutingMetrics) -> None:
        try:
            response = self._session.get(self._advice_url, timeout=self._timeout)
            response.raise_for_status()
            doc = response.json()
            if not isinstance(doc, dict) or doc.get("version") != ADVICE_VERSION:
                raise ValueError(f"advice version {doc.get('version') if isinstance(doc, dict) else '?'!r}")
            with self._lock:
                self._doc, self._fetched_at = doc, self._clock()
            if self._failing:
                log.info("specwatch advice from %s works again", self._advice_url)
            self._failing = False
        except Exception as exc:  # noqa: BLE001 - any failure means no advice, never a failed request
            if not self._failing:
                log.warning(
                    "specwatch advice from %s failed (its deployments routed unchanged until it works): %s",
                    self._advice_url,
                    exc,
                )
            self._failing = True
        metrics.advice_up.labels(self.url).set(0 if self._failing else 1)
        evaluated = self.last_evaluated()
        if isinstance(evaluated, (int, float)):
            metrics.advice_age.labels(self.url).set(max(0.0, self._clock() - evaluated))


class AdviceCache:
    """Every node's last advice, kept fresh by one background thread; `current()` never blocks on the network.
    `url` is the node of deployments that name none; auth, TLS and timeouts are the same for every node."""

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
        registry: CollectorRegistry = REGISTRY,
    ) -> None:
        self.url = _node_url(url)
        self.timeout, self.refresh_seconds, self.max_age_seconds = timeout, refresh_seconds, max_age_seconds
        self.metrics = routing_metrics(registry)
        self._clock = clock
        # one Session (its connection pool) per node, pooled across refreshes
        self._auth, self._verify = auth, verify
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeAdvice] = {}
        self._refresher: threading.Thread | None = None
        self._closed = threading.Event()
        self._wake = threading.Event()
        self.node(self.url)

    def node(self, url: str | None = None) -> NodeAdvice:
        """The node at `url` (None: the default one), added on first sight; a new node wakes the refresher."""
        key = self.url if url is None else _node_url(url)
        with self._lock:
            found = self._nodes.get(key)
            if found is None:
                session = requests.Session()
                session.auth, session.verify = self._auth, self._verify
                found = self._nodes[key] = NodeAdvice(key, session, self.timeout, self._clock)
                self._wake.set()
        return found

    def nodes(self) -> list[NodeAdvice]:
        with self._lock:
            return list(self._nodes.values())

    def current(self, url: str | None = None) -> dict[str, Any] | None:
        """The node's advice if fresh enough to act on, else None. The first call starts the refresher."""
        self.start()
        return self.node(url).current(self.max_age_seconds)

    def last_evaluated(self, url: str | None = None) -> Any:
        """The `evaluated` of the node's held advice however old (None before the first): the evaluation that
        the counts of requests started and finished are kept against."""
        return self.node(url).last_evaluated()

    def refresh_now(self) -> None:
        """One synchronous refresh of every node (for tests and start-up)."""
        self._refresh_all()

    def close(self) -> None:
        """Stop the refresher."""
        self._closed.set()
        self._wake.set()

    def start(self) -> None:
        """Start the refresher, once: it fetches every `refresh_seconds` whether requests come or not, so a
        request after a quiet spell finds fresh advice rather than none (a refresh driven by requests would leave
        it stale)."""
        if self._refresher is not None:
            return
        with self._lock:
            if self._refresher is not None:
                return
            self._refresher = threading.Thread(target=self._refresh_loop, name="specwatch-advice", daemon=True)
        self._refresher.start()

    def _refresh_loop(self) -> None:
        with ThreadPoolExecutor(_MAX_PARALLEL_FETCHES, thread_name_prefix="specwatch-advice-fetch") as pool:
            while not self._closed.is_set():
                self._wake.clear()
                self._refresh_all(pool)
                self._wake.wait(self.refresh_seconds)

    def _refresh_all(self, pool: ThreadPoolExecutor | None = None) -> None:
        nodes = self.nodes()
        if pool is None or len(nodes) == 1:
            for node in nodes:
                node.fetch(self.metrics)
        else:
            list(pool.map(lambda node: node.fetch(self.metrics), nodes))


class SpecwatchRouting(CustomLogger):
    """Register as a LiteLLM callback (`litellm.callbacks = [SpecwatchRouting(url)]`, or the proxy's
    `litellm_settings.callbacks`). `url` is the specwatch of deployments whose `model_info` names none."""

    def __init__(self, url: str = "http://127.0.0.1:9448", advice: AdviceCache | None = None, **cache: Any) -> None:
        super().__init__()
        self.advice = advice or AdviceCache(url, **cache)
        self.metrics = self.advice.metrics
        self._lock = threading.Lock()
        # (node, route) -> (the evaluation counted against, requests sent since it less those of them that ended)
        self._sent: dict[tuple[str, str], tuple[Any, float]] = {}
        # trace id -> per routed attempt: the deployment ids it was narrowed to, and its share of each route
        self._routed: dict[str, list[tuple[frozenset[str], dict[tuple[str, str], float]]]] = {}
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
            return self.narrow(healthy_deployments, trace if isinstance(trace, str) else None, model)
        except Exception:  # noqa: BLE001 - fail open
            log.exception("specwatch routing failed; deployments left as they were")
            self.metrics.requests.labels(str(model), FAILED_OPEN).inc()
            return healthy_deployments

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self._ended_safely(kwargs)

    async def async_log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self._ended_safely(kwargs)

    def log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self._ended_safely(kwargs)

    def log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self._ended_safely(kwargs)

    def counted(self, route: str, node: str | None = None) -> float:
        """Requests this callback sent the node's `route` since the node's held advice's evaluation, less those
        of them that finished since: what it takes off the advice's headroom."""
        key = (self.advice.node(node).url, route)
        with self._lock:
            seen, sent = self._sent.get(key, (None, 0.0))
            return sent if seen == self.advice.last_evaluated(key[0]) else 0.0

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
            for key, share in shares.items():
                evaluated = self.advice.last_evaluated(key[0])
                seen, sent = self._sent.get(key, (None, 0.0))
                if seen != evaluated:  # finished after a new evaluation that counted it running: room again
                    sent = 0.0
                self._sent[key] = (evaluated, sent - share)

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

    def narrow(self, deployments: list, trace: str | None = None, model_group: str = "") -> list:
        spec = [d for d in deployments if _info(d).get(ROLE_KEY) == SPEC and _info(d).get(ROUTE_KEY)]
        plain = [d for d in deployments if _info(d).get(ROLE_KEY) == PLAIN]
        if not spec or not plain:
            return deployments
        unfiltered: list[Any] = []  # no usable advice: left in, as without the callback
        advised: list[tuple[Any, tuple[str, str], dict[str, Any], Any]] = []
        self.advice.start()
        routes: dict[str | None, tuple[str, dict[Any, dict[str, Any]], Any] | None] = {}  # node -> advice, per request
        for deployment in spec:
            url = _node_of(deployment)
            if url not in routes:
                node = self.advice.node(url)
                doc = node.current(self.advice.max_age_seconds)
                by_route: dict[Any, dict[str, Any]] = {}
                for r in (doc or {}).get("routes") or ():
                    if isinstance(r, dict):
                        by_route[r.get("route")] = r
                routes[url] = None if doc is None else (node.url, by_route, doc.get("evaluated"))
            held = routes[url]
            route = held[1].get(_info(deployment)[ROUTE_KEY]) if held is not None else None
            if held is None or route is None or route.get("speculate") is None:
                unfiltered.append(deployment)
            else:
                advised.append((deployment, (held[0], route["route"]), route, held[2]))
        with self._lock:
            keep = [
                (d, key)
                for d, key, route, evaluated in advised
                if route["speculate"] and self._room(key, route, evaluated) >= 1
            ]
            # with room on a speculative deployment the plain ones go; the unfiltered stay either way
            chosen = {id(d) for d in ([d for d, _ in keep] + unfiltered if keep else unfiltered + plain)}
            shares: dict[tuple[str, str], float] = {}
            for _, key in keep:  # the router picks one of the candidates: count the request once among them
                seen, sent = self._sent[key]
                self._sent[key] = (seen, sent + 1.0 / len(chosen))
                shares[key] = shares.get(key, 0.0) + 1.0 / len(chosen)
            if keep and trace:
                ids = frozenset(str(_info(d).get("id")) for d, _ in keep)
                self._routed.setdefault(trace, []).append((ids, shares))
                if len(self._routed) > _MAX_TRACKED:  # a request whose end is never logged: forget the oldest
                    del self._routed[next(iter(self._routed))]
        self.metrics.requests.labels(model_group, FAILED_OPEN if unfiltered else KEPT if keep else SPILLED).inc()
        mapped = {id(d) for d in spec + plain}
        return [d for d in deployments if id(d) in chosen or id(d) not in mapped]

    def _room(self, key: tuple[str, str], route: dict[str, Any], evaluated: Any) -> float:
        """Headroom left on the route: the advice's, less the requests sent since that evaluation."""
        headroom = (route.get("headroom") or {}).get("requests")
        if not isinstance(headroom, (int, float)):
            return 0.0
        seen, sent = self._sent.get(key, (None, 0.0))
        if seen != evaluated:  # a new evaluation counts what was sent before it in its running requests
            sent = 0.0
        self._sent[key] = (evaluated, sent)
        return headroom - sent


def _info(deployment: Any) -> dict[str, Any]:
    if not isinstance(deployment, dict):
        return {}
    info = deployment.get("model_info")
    return info if isinstance(info, dict) else {}


def _node_of(deployment: Any) -> str | None:
    url = _info(deployment).get(URL_KEY)
    return url if isinstance(url, str) and url else None


def _node_url(url: str) -> str:
    return url.rstrip("/")
