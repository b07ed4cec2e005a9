"""The evaluator protocol: per route, per cycle, turn a RouteObservation into RouteState fields.

Detectors (acceptance drop) and the crossover flag implement it; the daemon builds one list per route with
`registry.build_route_evaluators()` and merges their outputs into the route's `RouteState`. Evaluators
never see other routes, sources or exporters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from specwatch.config import Config
from specwatch.snapshot import GpuSample, RouteObservation


class RouteEvaluator(Protocol):
    name: str  # the `evaluator` label of specwatch_evaluator_errors_total

    def evaluate(self, obs: RouteObservation, gpus: Sequence[GpuSample]) -> Mapping[str, Any]:
        """Return RouteState field updates (e.g. {"degraded": True, "baseline_ratio": 0.61})."""
        ...

    def close(self) -> None:
        """Flush and release resources (state store handles); called on reload and shutdown."""
        ...


@runtime_checkable
class ExcludesTokens(Protocol):
    """An evaluator that sends requests of its own (canary probes): the daemon takes their tokens out of the
    route's windows before tracking sees the next sample."""

    def take_read(self) -> list[Any]:
        """Acceptances (drafted, accepted, steps, per_position()) read since the last call."""
        ...


@dataclass
class EvaluatorContext:
    """What evaluator factories may use; `shared` lets them share one resource (e.g. the state store)."""

    config: Config
    clock: Callable[[], float]
    shared: dict[str, Any] = field(default_factory=dict)
    state_errors: list[str] = field(default_factory=list)  # appended to by evaluators; exported as a counter
