"""Routing advice: per route, whether speculation pays now and how many requests fit before the crossover.

A gateway reads this (`GET /api/v1/advice`, or the same figures as metrics) to keep a speculative pool for
low-batch traffic and send what would push it past its crossover to a plain pool (docs/routing.md).

1. `route_advice` turns one RouteState into its advice: the flag the above-crossover evaluator keeps with
   hysteresis, inverted (`speculate`), the B* that flag judges against (the live-calibrated one once its band
   has settled, else the configured source's), and the headroom left before it.
2. `advice_document` is the versioned JSON: every route's advice plus the age of its evidence at `now`.

Reads the Snapshot only, like every exporter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specwatch.snapshot import RouteState, Snapshot

ADVICE_VERSION = 1


@dataclass(frozen=True)
class RouteAdvice:
    route: str
    up: bool
    # True: the batch is below the crossover (with hysteresis), so speculation pays; False: above it;
    # None: unknown (route down, no crossover configured or not yet computable)
    speculate: bool | None
    batch_per_engine: float | None  # time-weighted running requests per engine (the flag's batch)
    engines: int | None
    running_requests: float | None  # summed over the route's engines, at the last scrape
    crossover_batch_size: float | None  # B* the flag judges against
    crossover_lower: float | None  # the live calibration's band, or an estimate's validated band
    crossover_upper: float | None
    crossover_source: str  # "live" once the live calibration settled, else the configured source
    headroom_per_engine: float | None  # B* - batch per engine; negative above the crossover
    headroom_requests: float | None  # B* x engines - running: requests the route takes before its crossover
    predicted_speedup_ratio: float | None
    last_scrape_timestamp: float | None


def route_advice(r: RouteState) -> RouteAdvice:
    settled = bool(r.live_crossover_settled) and r.live_crossover_batch_size is not None
    b_star = r.live_crossover_batch_size if settled else r.crossover_batch_size
    source = "live" if settled else r.crossover_source
    lower, upper = (
        (r.live_crossover_lower, r.live_crossover_upper) if settled else (r.crossover_lower, r.crossover_upper)
    )
    if not settled and r.crossover_flag_source == "estimate":
        b_star = r.crossover_flag_batch_size  # an estimate's flag judges against its band's upper side
    b_star = _finite(b_star)
    batch = _finite(r.batch_size)
    running = _finite(r.running_requests)
    speculate = None if not r.up or r.above_crossover is None else not r.above_crossover
    per_engine = b_star - batch if b_star is not None and batch is not None and r.up else None
    route_headroom = None
    if b_star is not None and running is not None and r.engines and r.up:
        route_headroom = b_star * r.engines - running
    return RouteAdvice(
        route=r.name,
        up=r.up,
        speculate=speculate,
        batch_per_engine=batch,
        engines=r.engines,
        running_requests=running,
        crossover_batch_size=b_star,
        crossover_lower=_finite(lower),
        crossover_upper=_finite(upper),
        crossover_source=source if b_star is not None else "",
        headroom_per_engine=per_engine,
        headroom_requests=route_headroom,
        predicted_speedup_ratio=_finite(r.predicted_speedup_ratio) if r.up else None,
        last_scrape_timestamp=r.last_scrape_timestamp,
    )


def advice_document(snapshot: Snapshot, now: float) -> dict[str, Any]:
    """The /api/v1/advice JSON (schema in docs/routing.md). `now` is the wall-clock time of the request."""
    evaluated = snapshot.timestamp if snapshot.timestamp > 0 else None
    routes = []
    for r in snapshot.routes:
        a = route_advice(r)
        routes.append(
            {
                "route": a.route,
                "up": a.up,
                "speculate": a.speculate,
                "batch_per_engine": a.batch_per_engine,
                "engines": a.engines,
                "running_requests": a.running_requests,
                "crossover": {
                    "batch_size": a.crossover_batch_size,
                    "lower": a.crossover_lower,
                    "upper": a.crossover_upper,
                    "source": a.crossover_source,
                },
                "headroom": {"per_engine": a.headroom_per_engine, "requests": a.headroom_requests},
                "predicted_speedup_ratio": a.predicted_speedup_ratio,
                "evidence_age_seconds": {
                    "evaluation": _age(now, evaluated),
                    "scrape": _age(now, a.last_scrape_timestamp),
                },
            }
        )
    return {"version": ADVICE_VERSION, "generated": now, "evaluated": evaluated, "routes": routes}


def _age(now: float, then: float | None) -> float | None:
    return None if then is None else max(0.0, now - then)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
