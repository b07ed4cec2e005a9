"""A new key's baseline from the fleet: the median, over the nodes that have one, of the baseline they export.

A node with no baseline for its (route, model, engine version, k, drafter) (`detection.seed_from`) asks Prometheus
for every node's `specwatch_route_acceptance_baseline_ratio` (and `..._overdispersion`) whose
`specwatch_route_acceptance_baseline_info` names the same key. The node itself has no baseline for that key, so
it is not among them.

1. `queries`: the PromQL of both instant queries.
2. `fetch_answers`: both queries through one `HttpFetcher` built from the `seed_from` HTTP client keys (the same
   auth and TLS rules as a route's), under one wall-clock deadline for the whole exchange (connecting and every
   byte of both answers: a server that trickles is cut at the deadline, not per read) and a cap on each
   answer's bytes (read in pieces, refused past the cap).
3. `fleet_from_answers`: the per-node values. A node whose ratio is not finite or outside (RATIO_MIN, 1), or
   whose φ is not finite or outside [1, PHI_MAX], is left out; the medians are taken when at least `min_nodes`
   nodes remain.
4. `SeedAttempt`: steps 2 and 3 on a thread of their own, so that the evaluation cycle never waits for
   Prometheus; the cycle picks up a finished attempt. At most one attempt runs per (Prometheus, route): a
   route whose attempt still runs (a reload rebuilt its evaluator meanwhile) joins it instead of starting
   another. Daemon threads: the process never waits for one at exit.

Anything short of a baseline raises (or, from an attempt, returns) `SeedError` with one of SEED_ERROR_REASONS;
the caller learns from its own traffic instead, and counts and says so.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlencode

from specwatch.config import SeedFrom
from specwatch.sources.base import SourceError
from specwatch.sources.http import HttpFetcher
from specwatch.state.baselines import BaselineKey

log = logging.getLogger(__name__)

RATIO = "specwatch_route_acceptance_baseline_ratio"
DISPERSION = "specwatch_route_acceptance_baseline_overdispersion"
INFO = "specwatch_route_acceptance_baseline_info"

# A usable seed: acceptance in (RATIO_MIN, 1) and φ in [1, PHI_MAX]. At or below 5% a drafter is broken
# (drop_decision.COLLAPSE_RATIO pages there without a baseline), so a baseline that low judges nothing. φ is
# 30-45 on realistic traffic and about 60 on the quietest profiled route (docs/detection.md); a drop is paged
# after about h·φ/KL drafted tokens, so a φ above 100 would leave a seeded node judging more slowly than any
# node measured, on a number it did not measure. A node whose own φ is that high learns it from its traffic.
RATIO_MIN = 0.05
PHI_MAX = 100.0

# Reasons exported in specwatch_route_seed_errors_total{reason}: a closed set.
SEED_ERROR_REASONS = (
    "connection",  # Prometheus unreachable (refused, DNS, TLS), or a tls/secret file unreadable
    "timeout",  # the exchange was not complete within `timeout`
    "too_large",  # an answer over `max_body_bytes`
    "invalid_answer",  # an HTTP error, not JSON, not a success, or not an instant vector
    "too_few_nodes",  # fewer than `min_nodes` nodes have a baseline for the key
    "not_finite",  # too few usable nodes once those with NaN or infinite values are left out
    "out_of_range",  # too few usable nodes once those with values out of range are left out
    "cannot_page",  # the route's drop detector could not page against the seed
    "below_own_traffic",  # the route's own traffic is above the seed by more than the drop: a drop would hide
    "stored_invalid",  # a stored fleet baseline with values not finite or out of range (not used)
    "internal",  # a bug in seeding
)


class SeedError(Exception):
    """The fleet gave no baseline; `reason` is one of SEED_ERROR_REASONS, the message says why."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason if reason in SEED_ERROR_REASONS else "internal"
        super().__init__(message)


@dataclass(frozen=True)
class FleetBaseline:
    acceptance_ratio: float
    overdispersion: float
    nodes: int
    left_out: int = 0  # nodes whose values were not finite or out of range


def usable_ratio(r: float) -> bool:
    return math.isfinite(r) and RATIO_MIN < r < 1.0


def usable_phi(phi: float) -> bool:
    return math.isfinite(phi) and 1.0 <= phi <= PHI_MAX


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def queries(route: str, key: BaselineKey, selector: str) -> tuple[str, str]:
    """The PromQL of the fleet's ratio and overdispersion for `key`, one sample per node."""
    extra = f",{selector}" if selector.strip() else ""
    base = f"route={_quote(route)}{extra}"
    info = (
        f"{INFO}{{{base},model_name={_quote(key.model_name)},engine_version={_quote(key.engine_version)},"
        f"draft_length={_quote(str(key.k) if key.k else '')},drafter={_quote(key.drafter)}}}"
    )
    join = " * on(job, instance, route) group_left() "
    return f"{RATIO}{{{base}}}{join}{info}", f"{DISPERSION}{{{base}}}{join}{info}"


# ------------------------------------------------------------------ one exchange
def fetch_answers(
    route: str, key: BaselineKey, seed: SeedFrom, clock: Callable[[], float] = time.monotonic
) -> tuple[bytes, bytes]:
    """The raw answers to both queries, complete within `seed.timeout_seconds` of the call; raises SeedError."""
    deadline = clock() + seed.timeout_seconds
    tls = seed.http.tls_config
    files = [f for f in (tls.ca_file, tls.cert_file, tls.key_file) if f]
    for name in files:  # named before connecting: a refused connection would hide them
        try:
            with open(name, "rb"):
                pass
        except OSError as exc:
            message = f"{seed.prometheus}: cannot load tls_config ({', '.join(files)}): {exc}"
            raise SeedError("connection", message) from None
    fetcher = HttpFetcher(seed.timeout_seconds, seed.max_body_bytes, clock=clock, client=seed.http)
    base = seed.prometheus.rstrip("/") + "/api/v1/query"
    answers = []
    try:
        for query in queries(route, key, seed.query_selector):
            url = f"{base}?{urlencode({'query': query})}"
            answers.append(fetcher.get(url, accept="application/json", deadline=deadline))
    except SourceError as exc:
        reason = {"timeout": "timeout", "too_large": "too_large", "connection": "connection"}.get(
            exc.reason, "invalid_answer"
        )
        # the query string is long and says nothing the route and key in the caller's message do not
        raise SeedError(reason, str(exc).replace(url, base)) from None
    finally:
        fetcher.close()
    return answers[0], answers[1]


def _vector(prometheus: str, answer: bytes) -> dict[tuple[tuple[str, str], ...], float]:
    """labels -> value of an instant-vector answer; values Prometheus spells NaN, +Inf or -Inf included."""
    try:
        body: Any = json.loads(answer)
    except (ValueError, UnicodeDecodeError):
        raise SeedError("invalid_answer", f"{prometheus}: the answer is not JSON") from None
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error", "") if isinstance(body, dict) else ""
        raise SeedError("invalid_answer", f"{prometheus}: not a success: {str(error)[:200] or 'no status'}")
    try:
        result = body["data"]["result"]
        return {
            tuple(sorted((str(k), str(v)) for k, v in sample["metric"].items())): float(sample["value"][1])
            for sample in result
        }
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise SeedError("invalid_answer", f"{prometheus}: unexpected answer ({exc!r})") from None


def fleet_from_answers(key: BaselineKey, seed: SeedFrom, ratio_answer: bytes, phi_answer: bytes) -> FleetBaseline:
    """The medians over the nodes whose values are usable (module docstring, step 3); raises SeedError."""
    ratios = _vector(seed.prometheus, ratio_answer)
    phis = _vector(seed.prometheus, phi_answer)
    if len(ratios) < seed.min_nodes:
        raise SeedError(
            "too_few_nodes",
            f"{len(ratios)} node(s) in {seed.prometheus} have a baseline for {key.label()}, "
            f"fewer than min_nodes {seed.min_nodes}",
        )
    kept_ratios, kept_phis, not_finite, out_of_range = [], [], 0, 0
    for node, r in ratios.items():
        phi = phis.get(node)  # a node that exports no φ: the others' is used
        values = (r,) if phi is None else (r, phi)
        if not all(math.isfinite(v) for v in values):
            not_finite += 1
        elif not usable_ratio(r) or (phi is not None and not usable_phi(phi)):
            out_of_range += 1
        else:
            kept_ratios.append(r)
            if phi is not None:
                kept_phis.append(phi)
    left_out = not_finite + out_of_range
    if len(kept_ratios) < seed.min_nodes:
        reason = "not_finite" if not_finite >= out_of_range else "out_of_range"
        raise SeedError(
            reason,
            f"{len(kept_ratios)} of {len(ratios)} node(s) in {seed.prometheus} have a usable baseline for "
            f"{key.label()} ({not_finite} not finite, {out_of_range} with a ratio outside ({RATIO_MIN:g}, 1) or "
            f"φ outside [1, {PHI_MAX:g}]), fewer than min_nodes {seed.min_nodes}",
        )
    phi = statistics.median(kept_phis) if kept_phis else 1.0
    return FleetBaseline(statistics.median(kept_ratios), phi, len(kept_ratios), left_out)


def fleet_baseline(
    route: str, key: BaselineKey, seed: SeedFrom, clock: Callable[[], float] = time.monotonic
) -> FleetBaseline:
    """The fleet's median baseline for (route, key), on the calling thread; raises SeedError."""
    return fleet_from_answers(key, seed, *fetch_answers(route, key, seed, clock))


# ------------------------------------------------------------------ off the evaluation thread
class SeedAttempt:
    """One `fleet_baseline` call on a daemon thread of its own; `outcome` once `done`."""

    def __init__(self, route: str, key: BaselineKey, seed: SeedFrom) -> None:
        self.route, self.key, self.seed = route, key, seed
        self.outcome: FleetBaseline | SeedError | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"specwatch-seed {route}", daemon=True)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float) -> bool:
        """For tests and tools: whether the attempt finished within `timeout` seconds."""
        return self._done.wait(timeout)

    def _run(self) -> None:
        try:
            self.outcome = fleet_baseline(self.route, self.key, self.seed)
        except SeedError as exc:
            self.outcome = exc
        except Exception as exc:  # noqa: BLE001 - a seeding bug costs the seed, never the thread's silence
            log.exception("route %s: asking the fleet for a baseline failed unexpectedly", self.route)
            self.outcome = SeedError("internal", f"{type(exc).__name__}: {exc}")
        finally:
            with _LOCK:
                if _RUNNING.get((self.seed.prometheus, self.route)) is self:
                    del _RUNNING[(self.seed.prometheus, self.route)]
            self._done.set()


_LOCK = threading.Lock()
_RUNNING: dict[tuple[str, str], SeedAttempt] = {}  # (Prometheus, route) -> its attempt still running


def start_attempt(route: str, key: BaselineKey, seed: SeedFrom) -> SeedAttempt | None:
    """A new attempt for (route, key), or the one still running for the same question; None while another
    question's attempt for the route at that Prometheus still runs (ask again later)."""
    with _LOCK:
        running = _RUNNING.get((seed.prometheus, route))
        if running is not None:
            return running if (running.key, running.seed) == (key, seed) else None
        attempt = _RUNNING[(seed.prometheus, route)] = SeedAttempt(route, key, seed)
    attempt._thread.start()
    return attempt
