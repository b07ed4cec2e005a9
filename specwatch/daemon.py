"""The composition root: one evaluation cycle (`tick`) from engine and GPU samples to a published Snapshot.

Per cycle, every route's source and the GPU source are sampled in a `ScrapePool` (a stock thread pool with a
thread for every call that can be in flight), each call wrapped by `run_source()`, the one
place that turns source failures into data. A route's outcome goes through its `RouteTracker` and then its evaluators
(detectors, crossover); the resulting `RouteState`s form an immutable `Snapshot` that is published by
swapping one reference, so exporters never see a half-built cycle and never need a lock.

A hung or hostile source costs only its own route: the cycle waits for it at most 1.5 x the scrape timeout, a
source whose previous call is still running is not called again (so hung calls never pile up threads), and no
call ever queues behind another.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, TypeVar

from specwatch.config import Config, GpuConfig, RouteConfig
from specwatch.evaluators.base import EvaluatorContext, ExcludesTokens, RouteEvaluator
from specwatch.evaluators.registry import build_route_evaluators
from specwatch.scrape_pool import ScrapePool
from specwatch.snapshot import EMPTY_SNAPSHOT, EngineSample, GpuSample, RouteState, Snapshot
from specwatch.sources import engines, nvml
from specwatch.stats.horizon import probe_horizon
from specwatch.sources.base import ERROR_REASONS, EngineSource, NoData, SourceError
from specwatch.tracking.routes import RouteTracker

log = logging.getLogger(__name__)

# How long a cycle waits for a source, relative to the scrape timeout the source itself enforces.
DEADLINE_FACTOR = 1.5
_ROUTE_STATE_FIELDS = frozenset(f.name for f in dataclasses.fields(RouteState))


class GpuSource(Protocol):
    def sample(self, now: float) -> tuple[bool | None, tuple[GpuSample, ...]]: ...

    def route_gpus(self, route_cfg: RouteConfig) -> tuple[int, ...]: ...

    def close(self) -> None: ...


T = TypeVar("T")
SourceFactory = Callable[[RouteConfig, Config], EngineSource]
GpuSourceFactory = Callable[[GpuConfig], "GpuSource | None"]


# --------------------------------------------------------------------------------------------- sources
@dataclass(frozen=True)
class ScrapeOutcome:
    """What one source call produced: a sample, or the reason (one of ERROR_REASONS) it failed."""

    sample: Any = None
    reason: str = ""
    message: str = ""
    duration_seconds: float = 0.0
    exc_info: BaseException | None = None  # kept for unexpected errors, so their traceback is logged once

    @property
    def ok(self) -> bool:
        return not self.reason


def run_source(call: Callable[[], Any]) -> ScrapeOutcome:
    """Call a source and time it. The only place source errors are caught; never raises."""
    begin = time.perf_counter()
    try:
        sample = call()
    except SourceError as exc:  # NoData included
        return ScrapeOutcome(
            reason=exc.reason,
            message=str(exc),
            duration_seconds=time.perf_counter() - begin,
            exc_info=exc if isinstance(exc, NoData) else None,
        )
    except Exception as exc:  # noqa: BLE001 - a source bug must cost its route, never the loop
        return ScrapeOutcome(
            reason="internal",
            message=f"{type(exc).__name__}: {exc}",
            duration_seconds=time.perf_counter() - begin,
            exc_info=exc,
        )
    return ScrapeOutcome(sample=sample, duration_seconds=time.perf_counter() - begin)


def _default_source_factory(route_cfg: RouteConfig, config: Config) -> EngineSource:
    return engines.make_source(route_cfg, config)


def _default_gpu_source_factory(gpu_cfg: GpuConfig) -> GpuSource | None:
    return nvml.make_gpu_source(gpu_cfg)


# --------------------------------------------------------------------------------------------- routes
class _Route:
    """One route's moving parts: its source (built lazily, so a failing build is just a failed scrape),
    tracker, evaluators and error bookkeeping."""

    def __init__(self, cfg: RouteConfig, config: Config, source_factory: SourceFactory) -> None:
        self.cfg = cfg
        self.tracker = RouteTracker(cfg.name)
        self.evaluators = []
        self.errors_total: dict[str, float] = dict.fromkeys(ERROR_REASONS, 0.0)
        self.last_reason: str | None = None  # None: never scraped; "": up
        self.scrape_duration: float | None = None
        self.last_ok_ts: float | None = None  # the last successful scrape's sample time
        self.inflight: Future | None = None
        self.failing_evaluators: set[int] = set()
        # evaluator name (or "build") -> failures; kept across reloads, so the counter never goes back
        self.evaluator_errors: dict[str, float] = {}
        self.warned_no_gpus = False  # the GPU auto-mapping found nothing for a serving engine (logged once)
        self._config = config
        self._source_factory = source_factory
        self._source: EngineSource | None = None

    @property
    def evaluators(self) -> list[RouteEvaluator]:
        return self._evaluators

    @evaluators.setter
    def evaluators(self, evaluators: list[RouteEvaluator]) -> None:
        self._evaluators = evaluators
        # Sorted out once: isinstance against a runtime-checkable Protocol costs tens of microseconds a call.
        self.token_excluders = [e for e in evaluators if isinstance(e, ExcludesTokens)]

    def sample(self, now: float) -> EngineSample:
        if self._source is None:
            self._source = self._source_factory(self.cfg, self._config)
        sample = self._source.sample(now)
        if not isinstance(sample, EngineSample):
            raise TypeError(f"source returned {type(sample).__name__}, not an EngineSample")
        return sample

    def rebuild(self, cfg: RouteConfig, config: Config) -> None:
        """New settings for the same route (name and URL): new source and evaluators, same counters."""
        self.close_source()
        self.cfg, self._config = cfg, config

    def record(self, outcome: ScrapeOutcome) -> None:
        """Count and log an outcome; a message is logged only when the route's state changes."""
        self.scrape_duration = outcome.duration_seconds
        name = self.cfg.name
        if outcome.ok:
            if self.last_reason:
                log.info("route %s: scrape of %s works again", name, self.cfg.url)
            self.last_reason = ""
            return
        self.errors_total[outcome.reason] = self.errors_total.get(outcome.reason, 0.0) + 1
        if outcome.reason == self.last_reason:
            log.debug("route %s: still failing (%s): %s", name, outcome.reason, outcome.message)
        elif isinstance(outcome.exc_info, NoData):
            log.debug("route %s: no data: %s", name, outcome.message)
        elif outcome.reason == "internal" and outcome.exc_info is not None:
            log.error("route %s: scrape failed unexpectedly: %s", name, outcome.message, exc_info=outcome.exc_info)
        else:
            log.warning("route %s: scrape of %s failed (%s): %s", name, self.cfg.url, outcome.reason, outcome.message)
        self.last_reason = outcome.reason

    def close_source(self) -> None:
        if self._source is not None:
            try:
                self._source.close()
            except Exception:  # noqa: BLE001
                log.exception("route %s: closing its source failed", self.cfg.name)
            self._source = None

    def close_evaluators(self) -> None:
        for evaluator in self.evaluators:
            try:
                evaluator.close()
            except Exception:  # noqa: BLE001
                log.exception("route %s: closing evaluator %s failed", self.cfg.name, type(evaluator).__name__)
        self.evaluators = []
        self.failing_evaluators.clear()

    def close(self) -> None:
        self.close_evaluators()
        self.close_source()


@dataclass(frozen=True)
class LiveRoute:
    """A route's live parts as an operator action sees them between two cycles (`Daemon.with_route`)."""

    cfg: RouteConfig
    evaluators: tuple[RouteEvaluator, ...]
    now: float
    last_reason: str | None  # None: never scraped; "": its last scrape worked; else why it failed


# --------------------------------------------------------------------------------------------- daemon
class Daemon:
    """Owns the routes, the GPU source and the published Snapshot. `tick()` and `reload()` are serialized."""

    def __init__(
        self,
        config: Config,
        *,
        source_factory: SourceFactory | None = None,
        gpu_source_factory: GpuSourceFactory | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self._clock = clock
        self._source_factory = source_factory or _default_source_factory
        self._gpu_source_factory = gpu_source_factory or _default_gpu_source_factory
        self._lock = threading.RLock()
        self._ctx = EvaluatorContext(config=config, clock=clock)
        self._routes: list[_Route] = []
        self._gpu_source: GpuSource | None = None
        self._gpu_inflight: Future | None = None
        self._gpu_failing = False
        self._pool = ScrapePool()
        self._overruns = 0.0
        self._state_errors = 0.0
        self._reload_ok = True
        self._reload_success_ts = clock()
        self._snapshot: Snapshot = EMPTY_SNAPSHOT
        self._build_gpu_source()
        for cfg in config.routes:
            self._routes.append(self._new_route(cfg))
        self._snapshot = dataclasses.replace(EMPTY_SNAPSHOT, **self._control_fields())

    # ------------------------------------------------------------------ published state
    @property
    def snapshot(self) -> Snapshot:
        """The last published Snapshot (EMPTY_SNAPSHOT's timestamp 0 until the first tick completes)."""
        return self._snapshot

    def _publish(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot  # one reference assignment: readers see the old or the new, never a mix

    def _control_fields(self) -> dict[str, Any]:
        return {
            "config_last_reload_successful": self._reload_ok,
            "config_last_reload_success_timestamp": self._reload_success_ts,
            "evaluation_overruns_total": self._overruns,
        }

    # ------------------------------------------------------------------ the cycle
    def tick(self, now: float | None = None) -> Snapshot:
        """Sample every source, track, evaluate, publish and return the new Snapshot. Never raises."""
        with self._lock:
            begin = time.perf_counter()
            now = self._clock() if now is None else now
            deadline = time.monotonic() + DEADLINE_FACTOR * self.config.scrape.timeout_seconds
            pool = self._executor()
            futures = {id(route): self._submit(pool, route, now) for route in self._routes}
            gpu_future = self._submit_gpu(pool, now)
            # One wait for every call (rather than one per route) wakes this thread once, not up to 65 times.
            wait(
                [f for f in (gpu_future, *futures.values()) if f is not None],
                timeout=max(0.0, deadline - time.monotonic()),
            )

            nvml_up, gpus = self._gpu_result(gpu_future, deadline)
            by_index = {g.index: g for g in gpus}
            states = []
            for route in self._routes:
                outcome = self._result(futures[id(route)], deadline)
                states.append(self._evaluate_route(route, outcome, now, by_index))
            self._drain_state_errors()
            snapshot = Snapshot(
                timestamp=now,
                routes=tuple(states),
                gpus=gpus,
                nvml_up=nvml_up,
                evaluation_duration_seconds=time.perf_counter() - begin,
                state_errors_total=self._state_errors,
                **self._control_fields(),
            )
            self._publish(snapshot)
            return snapshot

    def _submit(self, pool: ScrapePool, route: _Route, now: float) -> Future | None:
        if route.inflight is not None and not route.inflight.done():
            return None  # the previous call is still hanging: do not stack another thread on it
        route.inflight = pool.submit(f"route {route.cfg.name}", run_source, lambda: route.sample(now))
        return route.inflight

    def _result(self, future: Future | None, deadline: float) -> ScrapeOutcome:
        timeout = self.config.scrape.timeout_seconds
        if future is None:
            return ScrapeOutcome(reason="timeout", message="the previous scrape has still not returned")
        try:
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            return ScrapeOutcome(
                reason="timeout",
                message=f"no answer within {DEADLINE_FACTOR * timeout:g}s",
                duration_seconds=DEADLINE_FACTOR * timeout,
            )

    def _submit_gpu(self, pool: ScrapePool, now: float) -> Future | None:
        source = self._gpu_source
        if source is None or (self._gpu_inflight is not None and not self._gpu_inflight.done()):
            return None
        self._gpu_inflight = pool.submit("GPU", run_source, lambda: source.sample(now))
        return self._gpu_inflight

    def _gpu_result(self, future: Future | None, deadline: float) -> tuple[bool | None, tuple[GpuSample, ...]]:
        if self._gpu_source is None:
            return None, ()
        outcome = self._result(future, deadline)
        result: tuple[bool | None, tuple[GpuSample, ...]] = (False, ())
        problem = "" if outcome.ok else f"GPU sampling failed ({outcome.reason}): {outcome.message}"
        if outcome.ok:
            try:
                nvml_up, gpus = outcome.sample
                result = (nvml_up, tuple(g for g in gpus if isinstance(g, GpuSample)))
            except (TypeError, ValueError):
                problem = f"GPU source returned a {type(outcome.sample).__name__}, not (nvml_up, gpus)"
        if problem and not self._gpu_failing:
            log.warning("%s; exporting specwatch_nvml_up 0", problem)
        elif not problem and self._gpu_failing:
            log.info("GPU sampling works again")
        self._gpu_failing = bool(problem)
        return result

    def _route_gpus(self, route: _Route, serving: bool, gpus_seen: bool) -> tuple[int, ...]:
        """`gpus:` from the config, else the auto-mapping's answer. A serving engine on a host whose GPUs answer
        but which maps to none is logged once per route: the mapping reads the processes behind the port, which
        a dedicated user (the unit's `specwatch`) sees only for engines of its own user, never in containers."""
        if route.cfg.gpus is not None:
            return tuple(route.cfg.gpus)
        if self._gpu_source is None:
            return ()
        try:
            gpus = tuple(self._gpu_source.route_gpus(route.cfg))
        except Exception:  # noqa: BLE001
            log.exception("route %s: GPU mapping failed", route.cfg.name)
            return ()
        if not gpus and serving and gpus_seen and not route.warned_no_gpus:
            route.warned_no_gpus = True
            log.warning(
                "route %s: GPU auto-mapping found no GPU for the engine behind %s (it sees only processes of "
                "specwatch's own user, and none inside containers); set gpus: on the route",
                route.cfg.name,
                route.cfg.url,
            )
        return gpus

    def _evaluate_route(
        self, route: _Route, outcome: ScrapeOutcome, now: float, gpus_by_index: dict[int, GpuSample]
    ) -> RouteState:
        route.record(outcome)
        gpu_indexes = self._route_gpus(route, serving=outcome.ok, gpus_seen=bool(gpus_by_index))
        self._exclude_probe_tokens(route)
        try:
            if outcome.ok:
                obs = route.tracker.observe(outcome.sample, gpus=gpu_indexes)
            else:
                obs = route.tracker.observe_down(now, gpus=gpu_indexes)
            base = route.tracker.state_fields(error_reason=route.last_reason or "")
        except Exception as exc:  # noqa: BLE001 - odd values from a source must not stop the other routes
            log.exception("route %s: tracking failed on this sample", route.cfg.name)
            route.record(ScrapeOutcome(reason="internal", message=f"tracking: {exc}"))
            obs = route.tracker.observe_down(now, gpus=gpu_indexes)
            base = route.tracker.state_fields(error_reason="internal")
        # Every field is gathered first and the RouteState built once.
        if obs.up:
            route.last_ok_ts = obs.ts
        fields: dict[str, Any] = {
            "scrape_duration_seconds": route.scrape_duration,
            "engines": len(obs.running_per_engine) if obs.up and obs.running_per_engine else None,
            "last_scrape_timestamp": route.last_ok_ts,
            "errors_total": dict(route.errors_total),
            "gpus": gpu_indexes,
        }
        errors = route.evaluator_errors
        route_gpus: Sequence[GpuSample] = [gpus_by_index[i] for i in gpu_indexes if i in gpus_by_index]
        for i, evaluator in enumerate(route.evaluators):
            try:
                updates = evaluator.evaluate(obs, route_gpus) or {}
                if not _ROUTE_STATE_FIELDS.issuperset(updates.keys()):
                    raise TypeError(f"not RouteState fields: {sorted(updates.keys() - _ROUTE_STATE_FIELDS)}")
                fields.update(updates)
            except Exception:  # noqa: BLE001 - a detector bug costs its fields, not the route
                errors[evaluator.name] = errors.get(evaluator.name, 0.0) + 1
                if i not in route.failing_evaluators:
                    log.exception(
                        "route %s: evaluator %s failed; its fields are left out",
                        route.cfg.name,
                        type(evaluator).__name__,
                    )
                route.failing_evaluators.add(i)
            else:
                if i in route.failing_evaluators:
                    log.info("route %s: evaluator %s works again", route.cfg.name, type(evaluator).__name__)
                route.failing_evaluators.discard(i)
        fields["evaluator_errors_total"] = dict(errors)
        if fields.get("baseline_ratio") is not None:
            fields["acceptance_threshold_ratio"] = fields["baseline_ratio"] * (1.0 - route.cfg.detection.drop)
        if fields.get("traffic_horizon_seconds") is not None:
            fields["horizon_budget_seconds"] = route.cfg.detection.horizon_budget_seconds
        if route.cfg.probe is not None:
            fields["probe_horizon_seconds"] = probe_horizon(route.cfg.probe.every_seconds)
        base.update(fields)
        return RouteState(**base)

    @staticmethod
    def _exclude_probe_tokens(route: _Route) -> None:
        """Canary probes' own tokens never reach the route's windows or its traffic detector."""
        for evaluator in route.token_excluders:
            try:
                for a in evaluator.take_read():
                    route.tracker.exclude(a.steps, a.drafted, a.accepted, a.per_position())
            except Exception:  # noqa: BLE001 - a probe bug must not stop tracking
                log.exception("route %s: taking canary probe tokens out failed", route.cfg.name)

    def _drain_state_errors(self) -> None:
        errors, self._ctx.state_errors[:] = list(self._ctx.state_errors), []
        for message in errors:
            log.debug("state store error: %s", message)
        self._state_errors += len(errors)

    # ------------------------------------------------------------------ operator actions
    def with_route(self, name: str, fn: Callable[[LiveRoute], T]) -> T:
        """`fn` on route `name`'s live parts, between two cycles (under the loop's lock): an operator action
        decided on what the loop knows now, not on state flushed a minute ago. KeyError for an unknown route."""
        with self._lock:
            for route in self._routes:
                if route.cfg.name == name:
                    return fn(LiveRoute(route.cfg, tuple(route.evaluators), self._clock(), route.last_reason))
        raise KeyError(name)

    # ------------------------------------------------------------------ pool, routes, GPUs
    def _executor(self) -> ScrapePool:
        # Each route and the GPU source may call once this cycle.
        self._pool.reserve(len(self._routes) + 1)
        return self._pool

    def _new_route(self, cfg: RouteConfig) -> _Route:
        route = _Route(cfg, self.config, self._source_factory)
        self._build_evaluators(route)
        return route

    def _build_evaluators(self, route: _Route) -> None:
        try:
            route.evaluators = build_route_evaluators(self._ctx, route.cfg)
        except Exception:  # noqa: BLE001
            log.exception("route %s: building its detectors failed; exporting it without them", route.cfg.name)
            route.evaluators = []
            route.evaluator_errors["build"] = route.evaluator_errors.get("build", 0.0) + 1
        for evaluator in route.evaluators:  # exported from 0, so the first failure is an increase
            route.evaluator_errors.setdefault(evaluator.name, 0.0)

    def _build_gpu_source(self) -> None:
        try:
            self._gpu_source = self._gpu_source_factory(self.config.gpu)
        except Exception:  # noqa: BLE001
            log.exception("GPU source could not be built; GPU metrics off")
            self._gpu_source = None

    def _close_gpu_source(self) -> None:
        if self._gpu_source is not None:
            try:
                self._gpu_source.close()
            except Exception:  # noqa: BLE001
                log.exception("closing the GPU source failed")
            self._gpu_source = None
            self._gpu_inflight = None

    # ------------------------------------------------------------------ lifecycle
    def reload(self, new: Config) -> None:
        """Adopt a validated config. Routes with the same name and URL keep their counters and windows;
        changed settings rebuild their source and evaluators (which flush and reload their state)."""
        with self._lock:
            old, self.config = self.config, new
            rebuild_all = (old.scrape, old.state_dir) != (new.scrape, new.state_dir)
            by_key = {(r.cfg.name, r.cfg.url): r for r in self._routes}
            kept = [by_key.pop((cfg.name, cfg.url), None) for cfg in new.routes]
            for route in by_key.values():
                route.close()
                log.info("reload: route %s removed", route.cfg.name)
            # Close every evaluator to be replaced before building any: each flushes its state first, and
            # shared resources (the state store) close with their last user, so rebuilding starts clean.
            changed = [r for r, cfg in zip(kept, new.routes) if r is not None and (r.cfg != cfg or rebuild_all)]
            for route in changed:
                route.close_evaluators()
            if not any(r.evaluators for r in kept if r is not None):
                self._ctx = EvaluatorContext(config=new, clock=self._clock)
            self._ctx.config = new
            routes: list[_Route] = []
            for entry, cfg in zip(kept, new.routes):
                if entry is None:
                    entry = self._new_route(cfg)
                    log.info("reload: route %s added (%s)", cfg.name, cfg.url)
                elif entry in changed:
                    entry.rebuild(cfg, new)
                    self._build_evaluators(entry)
                    log.info("reload: route %s updated", cfg.name)
                routes.append(entry)
            self._routes = routes
            if old.gpu != new.gpu:
                self._close_gpu_source()
                self._build_gpu_source()
            self._reload_ok, self._reload_success_ts = True, self._clock()
            self._publish(dataclasses.replace(self._snapshot, **self._control_fields()))

    def reload_failed(self) -> None:
        """A rejected config: the old one keeps running; only the reload metric changes."""
        with self._lock:
            self._reload_ok = False
            self._publish(dataclasses.replace(self._snapshot, **self._control_fields()))

    def count_overrun(self) -> None:
        with self._lock:
            self._overruns += 1
            self._publish(dataclasses.replace(self._snapshot, **self._control_fields()))

    def close(self) -> None:
        """Close evaluators (flushing their state) and sources. Idempotent."""
        with self._lock:
            for route in self._routes:
                route.close()
            self._close_gpu_source()
            self._pool.shutdown()

    def calls_running(self, timeout: float = 0.0) -> list[str]:
        """The sources ("route NAME", "GPU") whose calls are still running after waiting up to `timeout`
        seconds for them: calls hung in a socket or in NVML, which no thread can interrupt."""
        return self._pool.running(timeout)
