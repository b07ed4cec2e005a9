"""A new key's baseline from the fleet: the median, over the nodes that have one, of the baseline they export.

A node with no baseline for its (route, model, engine version, k) (`detection.seed_from`) asks Prometheus
for every node's `specwatch_route_acceptance_baseline_ratio` (and `..._overdispersion`) whose
`specwatch_route_acceptance_baseline_info` names the same key, and takes the medians when at least
`min_nodes` answer. The node itself has no baseline for that key, so it is not among them. Anything short of
that (Prometheus unreachable, an error, too few nodes) raises `SeedError` saying why; the caller learns from
its own traffic instead and says so.

One instant query per metric, through a `requests.Session` built from the `seed_from` HTTP client keys
(`sources/http.py`'s `client_session`: the same auth and TLS rules as a route's), bounded by `timeout`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable

import requests

from specwatch.config import SeedFrom
from specwatch.sources.http import client_session
from specwatch.state.baselines import BaselineKey

RATIO = "specwatch_route_acceptance_baseline_ratio"
DISPERSION = "specwatch_route_acceptance_baseline_overdispersion"
INFO = "specwatch_route_acceptance_baseline_info"


class SeedError(Exception):
    """The fleet gave no baseline; the message says why."""


@dataclass(frozen=True)
class FleetBaseline:
    acceptance_ratio: float
    overdispersion: float
    nodes: int


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def queries(route: str, key: BaselineKey, selector: str) -> tuple[str, str]:
    """The PromQL of the fleet's ratio and overdispersion for `key`, one sample per node."""
    extra = f",{selector}" if selector.strip() else ""
    base = f"route={_quote(route)}{extra}"
    info = (
        f"{INFO}{{{base},model_name={_quote(key.model_name)},engine_version={_quote(key.engine_version)},"
        f"draft_length={_quote(str(key.k) if key.k else '')}}}"
    )
    join = " * on(job, instance, route) group_left() "
    return f"{RATIO}{{{base}}}{join}{info}", f"{DISPERSION}{{{base}}}{join}{info}"


def fleet_baseline(
    route: str,
    key: BaselineKey,
    seed: SeedFrom,
    session_factory: Callable[[], requests.Session] | None = None,
) -> FleetBaseline:
    """The fleet's median baseline for (route, key); raises SeedError."""
    ratio_query, dispersion_query = queries(route, key, seed.query_selector)
    try:
        session = (session_factory or (lambda: client_session(seed.http)))()
    except OSError as exc:  # the TLS context is built here: a CA, certificate or key it cannot read or load
        tls = seed.http.tls_config
        files = ", ".join(f for f in (tls.ca_file, tls.cert_file, tls.key_file) if f)
        raise SeedError(f"{seed.prometheus}: cannot load tls_config ({files}): {exc}") from None
    try:
        ratios = _values(session, seed, ratio_query)
        if len(ratios) < seed.min_nodes:
            raise SeedError(
                f"{len(ratios)} node(s) in {seed.prometheus} have a baseline for {key.label()}, "
                f"fewer than min_nodes {seed.min_nodes}"
            )
        dispersions = [d for d in _values(session, seed, dispersion_query) if d >= 1.0]
    finally:
        session.close()
    ratios = [r for r in ratios if 0.0 < r < 1.0]
    if len(ratios) < seed.min_nodes:
        raise SeedError(f"fewer than min_nodes {seed.min_nodes} usable ratios for {key.label()}")
    # a node that exports no φ makes the seed none the worse: φ is then the others' (1.0 if none has one)
    phi = statistics.median(dispersions) if dispersions else 1.0
    return FleetBaseline(statistics.median(ratios), phi, len(ratios))


def _values(session: requests.Session, seed: SeedFrom, query: str) -> list[float]:
    url = seed.prometheus.rstrip("/") + "/api/v1/query"
    try:
        response = session.get(url, params={"query": query}, timeout=seed.timeout_seconds)
    except requests.RequestException as exc:
        raise SeedError(f"{seed.prometheus} unreachable: {type(exc).__name__}: {exc}") from None
    try:
        body: Any = response.json()
    except ValueError:
        raise SeedError(f"{seed.prometheus} answered {response.status_code} with no JSON") from None
    if response.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error", "") if isinstance(body, dict) else ""
        raise SeedError(f"{seed.prometheus} answered {response.status_code}: {error or 'not a success'}")
    try:
        result = body["data"]["result"]
        return [float(sample["value"][1]) for sample in result]
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise SeedError(f"{seed.prometheus}: unexpected answer ({exc!r})") from None
