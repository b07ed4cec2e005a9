"""Offline replay: a JSONL trace of scrapes -> the daemon's RouteObservations -> the acceptance-drop evaluator.

Input, one JSON object per line, cumulative counters of one scrape of one route:
    {"ts": 1700000000, "route": "chat", "model_name": "m", "drafts": 10, "draft_tokens": 40,
     "accepted_tokens": 21, "accepted_per_pos": [8, 6, 4, 3], "running": 3}
(`engine_version` is optional.) Output: one `Transition` per alert state change, each with the detector's
predicted horizon then (the expected seconds to page a 20% drop at the evidence rate seen, the figure the daemon
exports as `specwatch_route_detection_horizon_seconds{detector="traffic"}`), and `Replayer.summaries()`: each
route's state and predicted horizon at the end of the trace, so a recorded trace scores the prediction against
when the page really came.

Counters go through `ResetSafeCounter` exactly as in the daemon, so restarts (a decrease) are handled the
same way; the evaluator is the daemon's, built by `build_evaluator` against an in-memory store, so replay
never touches a daemon's state. The clock is the trace's own timestamps: 30 days replay in seconds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from specwatch.config import Config, RouteConfig
from specwatch.evaluators.acceptance_drop import STORE_KEY, AcceptanceDropEvaluator, build_evaluator
from specwatch.evaluators.base import EvaluatorContext
from specwatch.snapshot import RouteObservation
from specwatch.state.store import StateStore
from specwatch.tracking.counters import ResetSafeCounter

ALERT = "acceptance_degraded"
_COUNTERS = ("drafts", "draft_tokens", "accepted_tokens")


class TraceError(ValueError):
    """A trace line that cannot be replayed; the message names the line."""


@dataclass(frozen=True)
class TraceSample:
    ts: float
    route: str
    model_name: str
    drafts: float
    draft_tokens: float
    accepted_tokens: float
    accepted_per_pos: tuple[float, ...] = ()
    running: float | None = None
    engine_version: str = ""

    def to_json(self) -> str:
        return json.dumps(
            {
                "ts": self.ts,
                "route": self.route,
                "model_name": self.model_name,
                "drafts": self.drafts,
                "draft_tokens": self.draft_tokens,
                "accepted_tokens": self.accepted_tokens,
                "accepted_per_pos": list(self.accepted_per_pos),
                "running": self.running,
            },
            separators=(",", ":"),
        )


@dataclass(frozen=True)
class Transition:
    ts: float
    route: str
    state: str  # "firing" | "resolved"
    baseline: float
    current: float
    alert: str = ALERT
    horizon_seconds: float | None = None  # predicted then; inf: no traffic to page on; None: no baseline yet

    def to_json(self) -> str:
        return json.dumps(
            {
                "ts": self.ts,
                "route": self.route,
                "alert": self.alert,
                "state": self.state,
                "baseline": round(self.baseline, 6),
                "current": round(self.current, 6),
                "predicted_horizon_seconds": _horizon_json(self.horizon_seconds),
            }
        )


@dataclass(frozen=True)
class RouteSummary:
    """A route at the end of the trace."""

    ts: float
    route: str
    degraded: bool
    horizon_seconds: float | None
    alert: str = ALERT

    def to_json(self) -> str:
        return json.dumps(
            {
                "ts": self.ts,
                "route": self.route,
                "alert": self.alert,
                "state": "end",
                "degraded": self.degraded,
                "predicted_horizon_seconds": _horizon_json(self.horizon_seconds),
            }
        )


def _horizon_json(seconds: float | None) -> float | str | None:
    """JSON has no infinity: a route with no traffic to page on says so."""
    if seconds is None:
        return None
    return "inf" if math.isinf(seconds) else round(seconds, 1)


def parse_line(line: str, lineno: int = 0) -> TraceSample | None:
    """One trace line -> TraceSample; None for a blank line. Raises TraceError naming the line."""
    line = line.strip()
    if not line:
        return None
    try:
        raw = json.loads(line)
        if not isinstance(raw, dict):
            raise TypeError("not a JSON object")
        per_pos = raw.get("accepted_per_pos") or []
        if not isinstance(per_pos, list):
            raise TypeError("accepted_per_pos must be a list")
        sample = TraceSample(
            ts=_number(raw["ts"]),
            route=str(raw["route"]),
            model_name=str(raw.get("model_name", "")),
            drafts=_number(raw["drafts"]),
            draft_tokens=_number(raw["draft_tokens"]),
            accepted_tokens=_number(raw["accepted_tokens"]),
            accepted_per_pos=tuple(_number(x) for x in per_pos),
            running=None if raw.get("running") is None else _number(raw["running"]),
            engine_version=str(raw.get("engine_version", "")),
        )
    except (ValueError, TypeError, KeyError) as exc:
        what = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise TraceError(f"line {lineno}: {what}") from None
    return sample


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"not a finite number: {value!r}")
    return float(value)


@dataclass
class ObservationBuilder:
    """One route's cumulative counters -> per-scrape RouteObservations, reset-safe like the daemon's tracker."""

    route: str
    counters: dict[str, ResetSafeCounter] = field(default_factory=dict)
    positions: list[ResetSafeCounter] = field(default_factory=list)

    def observe(self, s: TraceSample) -> RouteObservation:
        c = self.counters
        if not c:
            c.update({name: ResetSafeCounter() for name in _COUNTERS})
        resets = sum(x.resets for x in c.values()) + sum(p.resets for p in self.positions)
        d_drafts = c["drafts"].update(s.drafts)
        d_tokens = c["draft_tokens"].update(s.draft_tokens)
        d_accepted = c["accepted_tokens"].update(s.accepted_tokens)
        while len(self.positions) < len(s.accepted_per_pos):
            self.positions.append(ResetSafeCounter())
        d_pos = tuple(p.update(v) for p, v in zip(self.positions, s.accepted_per_pos))
        reset = sum(x.resets for x in c.values()) + sum(p.resets for p in self.positions) != resets
        return RouteObservation(
            route=self.route,
            ts=s.ts,
            up=True,
            model_name=s.model_name,
            engine_version=s.engine_version,
            engine_kind="replay",
            acceptance_source="counter",
            k=len(s.accepted_per_pos) or None,
            reset=reset,
            d_drafts=d_drafts,
            d_draft_tokens=d_tokens,
            d_accepted=d_accepted,
            d_accepted_per_pos=d_pos,
            running_per_engine={} if s.running is None else {"0": s.running},
        )


class Replayer:
    """Feeds samples of any number of routes through one evaluator per route; yields alert transitions."""

    def __init__(self, config: Config, store: StateStore | None = None) -> None:
        self.config = config
        self.now = 0.0
        self.ctx = EvaluatorContext(config=config, clock=lambda: self.now)
        self.ctx.shared[STORE_KEY] = store or StateStore(None, self.ctx.state_errors, clock=lambda: self.now)
        self._builders: dict[str, ObservationBuilder] = {}
        self._evaluators: dict[str, AcceptanceDropEvaluator] = {}
        self._degraded: dict[str, bool] = {}
        self._horizon: dict[str, float | None] = {}
        self._last_ts: dict[str, float] = {}

    def route_config(self, name: str) -> RouteConfig:
        return self.config.route(name) or RouteConfig(
            name=name, url="http://replay.invalid/", detection=self.config.detection
        )

    def evaluator(self, route: str) -> AcceptanceDropEvaluator:
        ev = self._evaluators.get(route)
        if ev is None:
            ev = self._evaluators[route] = build_evaluator(self.ctx, self.route_config(route))
            self._builders[route] = ObservationBuilder(route)
        return ev

    def feed(self, sample: TraceSample) -> Transition | None:
        self.now = sample.ts
        ev = self.evaluator(sample.route)
        fields = ev.evaluate(self._builders[sample.route].observe(sample), ())
        self._horizon[sample.route] = fields.get("traffic_horizon_seconds")
        self._last_ts[sample.route] = sample.ts
        degraded = bool(fields.get("degraded"))
        if degraded == self._degraded.get(sample.route, False):
            return None
        self._degraded[sample.route] = degraded
        baseline = fields.get("baseline_ratio") or 0.0
        drop = fields.get("drop_ratio")
        current = baseline * (1.0 - drop) if drop is not None else 0.0
        return Transition(
            ts=sample.ts,
            route=sample.route,
            state="firing" if degraded else "resolved",
            baseline=baseline,
            current=current,
            horizon_seconds=self._horizon[sample.route],
        )

    def summaries(self) -> list[RouteSummary]:
        """Each route seen, as of its last sample."""
        return [
            RouteSummary(self._last_ts[r], r, self._degraded.get(r, False), self._horizon.get(r))
            for r in sorted(self._last_ts)
        ]

    def close(self) -> None:
        for ev in self._evaluators.values():
            ev.close()
        self._evaluators.clear()


def replay(samples: Iterable[TraceSample], config: Config) -> Iterator[Transition]:
    replayer = Replayer(config)
    try:
        for sample in samples:
            t = replayer.feed(sample)
            if t is not None:
                yield t
    finally:
        replayer.close()


def read_trace(lines: Iterable[str]) -> Iterator[TraceSample]:
    for lineno, line in enumerate(lines, 1):
        sample = parse_line(line, lineno)
        if sample is not None:
            yield sample
