"""The evaluators every route gets, in order. Imported directly: a detector missing from the installation is
an import error at start-up, never a silently smaller set of checks."""

from __future__ import annotations

from typing import Callable

from specwatch.config import RouteConfig
from specwatch.evaluators import above_crossover, acceptance_drop, canary
from specwatch.evaluators.base import EvaluatorContext, RouteEvaluator

EvaluatorFactory = Callable[[EvaluatorContext, RouteConfig], "RouteEvaluator | None"]

# A factory returns None for a route it does not apply to (above_crossover without a `crossover:` section,
# canary without a `probe:` section).
EVALUATOR_FACTORIES: tuple[EvaluatorFactory, ...] = (
    acceptance_drop.build_evaluator,
    above_crossover.build_evaluator,
    canary.build_evaluator,
)


def build_route_evaluators(ctx: EvaluatorContext, route: RouteConfig) -> list[RouteEvaluator]:
    built = (factory(ctx, route) for factory in EVALUATOR_FACTORIES)
    return [evaluator for evaluator in built if evaluator is not None]
