"""Engine sources: one route's engine /metrics endpoint -> EngineSample.

`make_source(route, config)` is what the daemon calls; `parse_engine_sample()` is the same extraction
without HTTP, for the simulator, replay and benchmarks. Engine `auto` is resolved from the first
exposition (the first `vllm:`, `sglang:`, `trtllm_` or `llamacpp:` family; a JSON list is TensorRT-LLM's
iteration stats) and then kept.

Routes on one URL (several models or DP engines behind one server, told apart by `match` / `engines`)
share one `SharedEndpoint`: its /metrics is fetched and parsed once per cycle, and each route extracts
its own series from the parsed families. A failed fetch fails every route on the endpoint with the same
reason and message.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Protocol
from urllib.parse import urlsplit, urlunsplit

from specwatch.config import Config, HttpClientConfig, RouteConfig
from specwatch.snapshot import EngineSample
from specwatch.sources import llamacpp, sglang, trtllm, vllm
from specwatch.sources.base import SourceError
from specwatch.sources.exposition import ExpositionError, Family, TooManySeries, parse
from specwatch.sources.gateway import WORKER_LABEL
from specwatch.sources.http import HttpFetcher
from specwatch.engine_kinds import REQUEST_LOG
from specwatch.sources.name_filter import NameFilter
from specwatch.sources.sglang_request_log import SGLangRequestLogSource

log = logging.getLogger(__name__)


class Extract(Protocol):
    """An engine module's `extract`: one route's sample, in tracking's one meaning (`EngineCounters`), from the
    parsed families. `match` and `engines` are the route's filters; `version` the engine's, where known (an
    engine whose meaning changed between releases reads it); `worker_label` the label that names each worker
    of a gateway's merged exposition (sources/gateway.py). Raises SourceError / NoData only."""

    def __call__(
        self,
        families: Mapping[str, Family],
        match: Mapping[str, str],
        engines: tuple[str, ...],
        ts: float,
        version: str = "",
        worker_label: str = WORKER_LABEL,
    ) -> EngineSample: ...


class FinishedRequests(Protocol):
    """An engine module's `finished_requests`: the route's finished-request count, or None when not exposed."""

    def __call__(
        self, families: Mapping[str, Family], match: Mapping[str, str], engines: tuple[str, ...] = ()
    ) -> float | None: ...


@dataclass(frozen=True)
class EngineKind:
    wanted: frozenset[str]  # the families to parse out of /metrics
    counters: frozenset[str]  # those summed as counters: their `# TYPE` lines are read too (checked by extract)
    extract: Extract
    version_endpoints: tuple[tuple[str, str], ...]  # (path beside /metrics, JSON key), tried in order
    finished_family: str = ""  # the finished-requests counter (canary probes' counter bracketing)
    finished: FinishedRequests | None = None
    # (path beside /metrics, JSON key) of the served model's name, read with the version once per engine
    # start, for engines whose /metrics does not carry it.
    model_endpoint: tuple[str, str] | None = None
    # The exposition never says when the engine started (no `_created` in llama.cpp's or SGLang's, none in
    # vLLM's multiprocess mode): the source stands in with the start it can see (`_engine_gone`).
    observed_start: bool = False
    # (path beside /metrics, (method, drafter) from its JSON) for engines that tell them outside /metrics: asked
    # once the engine has speculated, until it tells the method.
    speculative_endpoint: tuple[str, Callable[[Any], tuple[str, str]]] | None = None


# One entry per name in kinds.SCRAPED, the names a route's `engine:` is checked against.
ENGINES: Mapping[str, EngineKind] = {
    "vllm": EngineKind(
        vllm.WANTED,
        vllm.COUNTER_FAMILIES,
        vllm.extract,
        (("/version", "version"),),
        vllm.FINISHED_REQUESTS,
        vllm.finished_requests,
        observed_start=True,
    ),
    # SGLang answers on one of these two paths depending on the release; both carry `version`.
    "sglang": EngineKind(
        sglang.WANTED,
        sglang.COUNTER_FAMILIES,
        sglang.extract,
        (("/get_server_info", "version"), ("/server_info", "version")),
        sglang.FINISHED_REQUESTS,
        sglang.finished_requests,
        observed_start=True,
        speculative_endpoint=(sglang.SERVER_INFO_ENDPOINT, sglang.speculative_of_server_info),
    ),
    # trtllm-serve lists /version among its endpoints; the JSON key is assumed, not checked.
    "trtllm": EngineKind(trtllm.WANTED, trtllm.COUNTER_FAMILIES, trtllm.extract, (("/version", "version"),)),
    # llama-server's /props carries `build_info` ("b<build>-<commit>") and the model file's path.
    "llamacpp": EngineKind(
        llamacpp.WANTED,
        llamacpp.COUNTER_FAMILIES,
        llamacpp.extract,
        llamacpp.VERSION_ENDPOINTS,
        model_endpoint=llamacpp.MODEL_ENDPOINT,
        observed_start=True,
        speculative_endpoint=(llamacpp.METHOD_ENDPOINT, llamacpp.speculative_of_slots),
    ),
}
# What an endpoint is asked to filter its /metrics down to (name_filter.py): every engine kind's families, so
# one request serves routes of any kind and `auto` detection still sees the engine's prefix.
FILTER_NAMES = frozenset().union(*(kind.wanted for kind in ENGINES.values())) | vllm.FILTER_EXTRA | sglang.FILTER_EXTRA
# The first engine-prefixed line names the engine. vLLM and SGLang also appear as `vllm_`/`sglang_`
# (OpenMetrics escaping, SGLang's gRPC sidecar); Dynamo once documented `trtllm:`.
_KIND_RE = re.compile(rb"^(?:# (?:TYPE|HELP) )?(?:(vllm|sglang)[:_]|(trtllm)[_:]|(llamacpp):)", re.M)
# Dynamo's prefix-stripped TensorRT-LLM spelling (unconfirmed): a spec counter sample with backend="trtllm".
_BARE_TRTLLM_RE = re.compile(rb'^spec_decode_num_(?:draft|accepted)_tokens_total\{[^}\n]*backend="trtllm"', re.M)


def with_route_speculative(
    sample: EngineSample, route: RouteConfig, method: str = "", drafter: str = ""
) -> EngineSample:
    """The sample's method and drafter: what the engine tells (`method` and `drafter` from an info endpoint, or
    the extract's own), each one it leaves out taken from the route's `speculative` config."""
    configured = route.speculative
    spec_method = method or sample.spec_method or (configured.method if configured else "")
    spec_drafter = drafter or sample.spec_drafter or (configured.drafter if configured else "")
    # vLLM counts a short draft as k tokens for some methods: only the method says the per-position curve mixes.
    varies = sample.draft_length_varies or (
        sample.engine_kind.startswith("vllm") and vllm.draft_length_varies(spec_method)
    )
    if (spec_method, spec_drafter, varies) == (sample.spec_method, sample.spec_drafter, sample.draft_length_varies):
        return sample
    return replace(sample, spec_method=spec_method, spec_drafter=spec_drafter, draft_length_varies=varies)


def detect_kind(body: str | bytes) -> str | None:
    """The engine kind of the first engine-prefixed line ("vllm", "sglang", "trtllm" or "llamacpp"); a JSON
    list is TensorRT-LLM's iteration stats; None when nothing tells."""
    data = body.encode("utf-8", "replace") if isinstance(body, str) else bytes(body)
    m = _KIND_RE.search(data)
    if m:
        return next(group for group in m.groups() if group).decode()
    if trtllm.is_iteration_stats(data) or _BARE_TRTLLM_RE.search(data):
        return "trtllm"
    return None


def parse_engine_sample(
    kind: str, body: str | bytes, route: RouteConfig, now: float, version: str = ""
) -> EngineSample:
    """Parse one /metrics body for `route` (its `match` and `engines` filters). Raises SourceError only.

    `kind` is an engine kind or "auto" (detected from the body). TensorRT-LLM's JSON iteration stats need
    state across scrapes and are read through `SharedEndpoint` only.
    """
    kind, families = parse_families(kind, body)
    try:
        sample = ENGINES[kind].extract(families, route.match, route.engines, now, version, route.worker_label)
    except SourceError as exc:
        raise _another_engine(exc, kind, body) from exc
    return with_route_speculative(sample, route)


def _another_engine(exc: SourceError, kind: str, body: str | bytes) -> SourceError:
    """A route whose `engine:` names another engine than the endpoint serves: say which one it does serve,
    rather than the engine module's guess at a missing server flag."""
    served = detect_kind(body) if exc.reason == "no_spec_metrics" else None
    if served is None or served == kind:
        return exc
    return SourceError(
        "no_spec_metrics", f"the endpoint serves {served} metrics, not {kind}: set engine: {served} (or auto)"
    )


def parse_families(kind: str, body: str | bytes, max_series: int | None = None) -> tuple[str, dict[str, Family]]:
    """(the engine kind, its families) of one /metrics body, whatever route reads it. Raises SourceError only.

    `kind` is an engine kind or "auto" (detected from the body); a body with more than `max_series` samples is
    refused (reason too_many_series).
    """
    if kind == "auto":
        detected = detect_kind(body)
        if detected is None:
            _parse_or_raise(body, frozenset(), max_series)  # garbage is a parse error, not "no metrics"
            raise SourceError("no_spec_metrics", "no vllm:, sglang:, trtllm_ or llamacpp: families in the exposition")
        kind = detected
    if kind not in ENGINES:
        raise SourceError("internal", f"unknown engine kind {kind!r}")
    return kind, _parse_or_raise(body, ENGINES[kind].wanted, max_series, ENGINES[kind].counters)


def parse_bracket(kind: str, body: str | bytes, route: RouteConfig, now: float) -> tuple[EngineSample, float | None]:
    """(the route's EngineSample, its finished-request count or None) from one full /metrics body, for canary
    probes' counter bracketing. Raises SourceError only."""
    if kind == "auto":
        kind = detect_kind(body) or "auto"
    if kind not in ENGINES:
        raise SourceError("no_spec_metrics", "neither vllm: nor sglang: families in the exposition")
    engine = ENGINES[kind]
    families = _parse_or_raise(body, engine.wanted | {engine.finished_family}, types=engine.counters)
    sample = engine.extract(families, route.match, route.engines, now, "", route.worker_label)
    finished = engine.finished(families, route.match, route.engines) if engine.finished else None
    return sample, finished


def _parse_or_raise(
    body: str | bytes, wanted: frozenset[str], max_series: int | None = None, types: frozenset[str] = frozenset()
) -> dict[str, Family]:
    # unique: two samples with one name and label set refuse the scrape, as Prometheus does, rather than sum.
    try:
        return parse(body, wanted, comments=False, types=types, unique=True, max_series=max_series)
    except TooManySeries as exc:
        refused = SourceError("too_many_series", f"refused: {exc}")
    except ExpositionError as exc:
        refused = SourceError("parse", f"invalid exposition: {exc}")
    # Raised here, not inside `except`: as the context of the parser's error it would keep the parser's frames,
    # and the whole decoded text, alive as long as the error is kept.
    raise refused


class SharedEndpoint:
    """One /metrics URL, fetched and parsed at most once per cycle however many routes read it.

    A reader gets the result already fetched for the same `now` unless it has read that one before (a
    second call in one cycle, as after a retry, fetches afresh): so each route sees exactly one fetch per
    call, and routes of one cycle share it. Fetches are serialized, so a hung endpoint holds one thread.
    Where the endpoint proves it can, only the wanted series are fetched (`NameFilter`).
    """

    def __init__(self, url: str, fetcher: HttpFetcher, max_series: int | None = None) -> None:
        self.url = url
        self.fetcher = fetcher
        self.max_series = max_series
        self.key: _EndpointKey = (url, fetcher.timeout, fetcher.max_body, fetcher.client, max_series)
        self.name_filter = NameFilter(url, FILTER_NAMES)
        self.users = 0  # sources holding it (the registry's reference count)
        self._lock = threading.Lock()
        self._now: float | None = None
        self._readers: set[int] = set()
        self._body: bytes | SourceError = b""
        self._parsed: dict[str, tuple[str, dict[str, Family]] | SourceError] = {}
        # trtllm-serve's JSON /metrics: per-iteration stats summed into counters here, once per fetch,
        # because the server hands each iteration out once whichever route asked.
        self._iteration_totals: trtllm.IterationStatsTotals | None = None

    def families(self, reader: object, kind: str, now: float) -> tuple[str, dict[str, Family]]:
        """(resolved kind, families) of this cycle's exposition for `reader`. Raises SourceError."""
        with self._lock:
            if now != self._now or id(reader) in self._readers:
                self._now, self._readers, self._parsed = now, set(), {}
                try:
                    self._body = self.name_filter.fetch(self.fetcher.get, now)
                except SourceError as exc:
                    self._body = _copy(exc)
            self._readers.add(id(reader))
            if isinstance(self._body, SourceError):
                raise _copy(self._body)
            if kind == "auto":
                kind = detect_kind(self._body) or "auto"
            if kind not in self._parsed:
                try:
                    self._parsed[kind] = self._parse(kind, self._body)
                except SourceError as exc:
                    self._parsed[kind] = _copy(exc)
            parsed = self._parsed[kind]
        if isinstance(parsed, SourceError):
            raise _copy(parsed)
        return parsed

    def _parse(self, kind: str, body: bytes) -> tuple[str, dict[str, Family]]:
        if kind in ("trtllm", "auto") and trtllm.is_iteration_stats(body):
            if self._iteration_totals is None:
                self._iteration_totals = trtllm.IterationStatsTotals()
                self.name_filter.disable()
            self._iteration_totals.add(body)
            return "trtllm", self._iteration_totals.families()
        return parse_families(kind, body, self.max_series)


def _copy(exc: SourceError) -> SourceError:
    # A fresh exception per route: one object raised in several threads would share its traceback. Kept until the
    # next cycle, the original's traceback would also keep the failed call's frames alive, and with them what a
    # hostile engine sent: a body refused at the cap, the text of a refused exposition.
    return SourceError(exc.reason, str(exc))


_EndpointKey = tuple[str, float, int, HttpClientConfig, "int | None"]  # URL, timeout, caps, how to reach it


class _EndpointRegistry:
    """The SharedEndpoints in use, by URL, timeout, body and series caps and HTTP client settings (routes that reach one
    URL with different credentials fetch it separately); an endpoint closes with its last source."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._endpoints: dict[_EndpointKey, SharedEndpoint] = {}

    def acquire(
        self, url: str, timeout: float, max_body: int, client: HttpClientConfig, max_series: int | None = None
    ) -> SharedEndpoint:
        key = (url, timeout, max_body, client, max_series)
        with self._lock:
            endpoint = self._endpoints.get(key)
            if endpoint is None:
                endpoint = SharedEndpoint(url, HttpFetcher(timeout, max_body, client=client), max_series)
                self._endpoints[key] = endpoint
            endpoint.users += 1
            return endpoint

    def release(self, endpoint: SharedEndpoint) -> None:
        with self._lock:
            endpoint.users -= 1
            if endpoint.users > 0:
                return
            key = endpoint.key
            if self._endpoints.get(key) is endpoint:
                del self._endpoints[key]
        endpoint.fetcher.close()


ENDPOINTS = _EndpointRegistry()
# An engine that has speculated but not (yet) said with what is asked again this often.
METHOD_RETRY_SECONDS = 60.0
# Scrapes on which an engine's version is asked before its silence is taken as "unknown". A version read as
# "" is another baseline key: an engine too busy to answer /version must not look like a model change.
VERSION_ATTEMPTS = 3


class HttpEngineSource:
    """The EngineSource for one route: its endpoint's parsed /metrics, extracted with the route's filters;
    the engine version fetched rarely, through the route's own fetcher."""

    def __init__(self, route: RouteConfig, fetcher: HttpFetcher, endpoint: SharedEndpoint | None = None) -> None:
        self.route = route
        self.fetcher = fetcher
        # Without a registered endpoint (tests, one-off use) the route has its own, fetching with `fetcher`.
        self.endpoint = endpoint or SharedEndpoint(route.url, fetcher)
        self._registered = endpoint is not None
        self.kind = route.engine if route.engine != "auto" else ""
        self.version: str | None = None  # None: fetch on the next success
        self._told_version = ""  # the version samples carry: the last one told, also while it is asked again
        self._version_misses = 0  # scrapes in a row whose version request got no answer
        self.model_name = ""  # from the engine's info endpoint, where /metrics does not name the model
        self.speculative = ("", "")  # (method, drafter) from the engine's info endpoint, where it tells them
        self._method_asked: float | None = None
        self._last_identity: tuple | None = None
        # Where the exposition has no start time of its own (`_created`, process start): when this engine
        # started, as far as we can tell. A refused connection (or llama-server's 503 while loading) means the
        # process was gone or still starting, so what answers next is a new process: its counters started
        # from 0 even if they are already above the old ones.
        self._start: float | None = None
        self._gone = False

    def sample(self, now: float) -> EngineSample:
        try:
            kind, families = self.endpoint.families(self, self.kind or "auto", now)
            self.kind = kind
            extract = ENGINES[kind].extract
            version = self._told_version
            result = extract(families, self.route.match, self.route.engines, now, version, self.route.worker_label)
        except SourceError as exc:
            self.version = None  # a failure may be a restart or an upgrade: ask again after recovery
            self._gone = self._gone or _engine_gone(exc, self.kind)
            raise
        if self._start is None or self._gone:
            self._start, self._gone = now, False
            self.version = None
        if ENGINES[kind].observed_start:
            result = _with_start(result, self._start)
        if self._restarted(result):
            self.version = None
        if self.version is None:
            self.version = self._settle_version(result.engine_kind)
            self.model_name = self._fetch_model_name(result.engine_kind)
            self.speculative, self._method_asked = ("", ""), None
            if self._told_version != version:
                # Read again with the version: what some values mean depends on it (SGLang's acceptance rate).
                result = extract(
                    families,
                    self.route.match,
                    self.route.engines,
                    now,
                    self._told_version,
                    self.route.worker_label,
                )
                if ENGINES[kind].observed_start:
                    result = _with_start(result, self._start)
        if self._told_version:
            result = replace(result, engine_version=self._told_version)
        if self.model_name and not result.model_name:
            result = replace(result, model_name=self.model_name)
        if not self.speculative[0] and result.num_speculative_tokens and self._ask_method(now):
            self.speculative = self._fetch_speculative(result.engine_kind)
        return with_route_speculative(result, self.route, *self.speculative)

    def _restarted(self, sample: EngineSample) -> bool:
        """An engine restart (new `_created`, or counters going back) may come with an upgrade."""
        created = tuple(e.created for e in sample.engines)
        progress = sum((e.drafts or 0.0) + (e.generation_tokens or 0.0) for e in sample.engines)
        last, self._last_identity = self._last_identity, (created, progress)
        return last is not None and (last[0] != created or progress < last[1])

    def _settle_version(self, engine_kind: str) -> str | None:
        """The version this sample carries from now on, or None to ask again next scrape.

        An engine that does not answer keeps the version it told before; one never heard from makes the scrape
        fail (`timeout`) for up to VERSION_ATTEMPTS scrapes, and is then taken as unknown ("")."""
        fetched, unanswered = self._fetch_version(engine_kind)
        if fetched is not None:
            self._told_version, self._version_misses = fetched, 0
            return fetched
        self._version_misses += 1
        if self._version_misses >= VERSION_ATTEMPTS:
            log.warning(
                "route %s: the engine did not tell its version in %d scrapes (%s); taken as %s",
                self.route.name,
                VERSION_ATTEMPTS,
                unanswered,
                repr(self._told_version) if self._told_version else "unknown",
            )
            self._version_misses = 0
            return self._told_version
        if not self._told_version:
            raise SourceError(
                "timeout",
                f"engine version ({self._version_misses} of {VERSION_ATTEMPTS} tries): {unanswered}; "
                "its baseline is keyed by it",
            )
        return None

    def _fetch_version(self, engine_kind: str) -> tuple[str | None, str]:
        """The engine's version from its info endpoint ("" where it has none), or (None, why) when the engine did
        not answer (a timeout or a refused connection): that is asked again, not taken as "no version"."""
        endpoints = ENGINES["vllm" if engine_kind.startswith("vllm") else engine_kind].version_endpoints
        unanswered = ""
        for path, key in endpoints:
            url = self.route.version_url or _sibling_url(self.route.url, path)
            try:
                return self.fetcher.get_json_field(url, key), ""
            except SourceError as exc:
                log.debug("route %s: engine version from %s: %s", self.route.name, url, exc)
                if exc.reason in ("timeout", "connection"):
                    unanswered = f"GET {url}: {exc}"
            if self.route.version_url:
                break
        return (None, unanswered) if unanswered else ("", "")

    def _fetch_model_name(self, engine_kind: str) -> str:
        """The served model's name from the engine's info endpoint, where it has one; "" otherwise."""
        kind = ENGINES.get(engine_kind)
        if kind is None or kind.model_endpoint is None:
            return ""
        path, key = kind.model_endpoint
        url = _sibling_url(self.route.url, path)
        try:
            return self.fetcher.get_json_field(url, key)
        except SourceError as exc:
            log.debug("route %s: model name from %s: %s", self.route.name, url, exc)
            return ""

    def _ask_method(self, now: float) -> bool:
        """Whether to ask for the method now: at once, then at most every METHOD_RETRY_SECONDS until told."""
        kind = ENGINES.get(self.kind)
        if kind is None or kind.speculative_endpoint is None:
            return False
        if self._method_asked is not None and now - self._method_asked < METHOD_RETRY_SECONDS:
            return False
        self._method_asked = now
        return True

    def _fetch_speculative(self, engine_kind: str) -> tuple[str, str]:
        """(method, drafter) from the engine's info endpoint, where it tells them; "" for what it does not."""
        kind = ENGINES.get(engine_kind)
        if kind is None or kind.speculative_endpoint is None:
            return "", ""
        path, speculative_of = kind.speculative_endpoint
        url = _sibling_url(self.route.url, path)
        try:
            return speculative_of(self.fetcher.get_json(url))
        except SourceError as exc:
            log.debug("route %s: speculative method from %s: %s", self.route.name, url, exc)
            return "", ""

    def close(self) -> None:
        self.fetcher.close()
        if self._registered:
            self._registered = False  # close() is idempotent: release the endpoint once
            ENDPOINTS.release(self.endpoint)


def _engine_gone(exc: SourceError, kind: str) -> bool:
    """A failure that only a missing or starting engine gives: nothing listening, or llama-server's 503 while it
    loads the model (tools/server/server-http.cpp, "Loading model"). Other engines' 503 may be a proxy's or an
    overload's, so only llama.cpp's counts."""
    text = str(exc)
    return (exc.reason == "connection" and "ConnectionRefusedError" in text) or (
        kind == "llamacpp" and exc.reason == "http_status" and " HTTP 503" in text
    )


def _with_start(sample: EngineSample, start: float) -> EngineSample:
    """Engines without a start time of their own get the one seen from here (`created`); where any engine has
    its own (vLLM's `_created`), that is the one used."""
    if not sample.engines or any(e.created is not None for e in sample.engines):
        return sample
    engines = tuple(e if e.created is not None else replace(e, created=start) for e in sample.engines)
    return replace(sample, engines=engines)


def _sibling_url(metrics_url: str, path: str) -> str:
    """http://h:8000/metrics -> http://h:8000/version (the path replaced, query dropped)."""
    parts = urlsplit(metrics_url)
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def make_source(route: RouteConfig, config: Config) -> HttpEngineSource | SGLangRequestLogSource:
    """The daemon's factory: an HTTP source with the configured scrape timeout, body cap and HTTP client
    settings, sharing its /metrics fetch with every other route on the same URL reached the same way; SGLang's
    per-request files for engine `sglang_request_log`."""
    if route.engine == REQUEST_LOG:
        return SGLangRequestLogSource(route)
    endpoint = ENDPOINTS.acquire(
        route.url, config.scrape.timeout_seconds, config.scrape.max_body_bytes, route.http, config.scrape.max_series
    )
    fetcher = HttpFetcher(config.scrape.timeout_seconds, config.scrape.max_body_bytes, client=route.http)
    return HttpEngineSource(route, fetcher, endpoint)
