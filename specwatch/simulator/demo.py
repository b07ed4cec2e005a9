"""The demo plan: which simulated engines `specwatch demo` starts, and the daemon config that watches them.

Pure functions over the packaged `scenarios/demo.yaml`; `specwatch/commands/demo.py` does the running.
The generated config is tuned for a two-minute run. Learning a baseline takes minutes of real time (its
overdispersion needs several one-minute blocks), so each route's baseline is pinned in the config to the
acceptance its simulated engine really starts with; the drop must last 10 s instead of minutes; the
crossover flag holds 5 s; and each route's crossover is the simulated engine's own (computed from the same
step-time table and acceptance profile the engine runs on), so "above crossover" means what it says.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from specwatch.config import parse_duration
from specwatch.simulator.scenario import Scenario, ScenarioError, parse_scenario
from specwatch.simulator.simulation import ENGINE_KINDS, DEFAULT_MODEL, SimulationSpec
from specwatch.simulator.speculation import parse_profile
from specwatch.simulator.steptime import StepTimeModel, crossover_batch, load_table

DEMO_FILE = "demo.yaml"

# Detection settings for a demo measured in seconds, not the production defaults measured in minutes.
DEMO_DETECTION = {"min_drafted_tokens": 2_000, "min_duration": "10s", "confirm_window": "20s"}
DEMO_CROSSOVER_HOLD = "5s"
# Token-level overdispersion of the simulated traffic: a draft's tokens are accepted as a prefix, so they are
# correlated within a verify step (φ > 1) but independent across requests and steps.
DEMO_OVERDISPERSION = 2.0


@dataclass(frozen=True)
class DemoRoute:
    name: str
    engine: str
    dp: int
    scenario: Scenario


@dataclass(frozen=True)
class DemoPlan:
    time_scale: float
    interval_seconds: float
    routes: tuple[DemoRoute, ...]
    description: str = ""


def load_demo_plan(text: str | None = None) -> DemoPlan:
    """Parse the demo file (the packaged one when `text` is None). Raises ScenarioError."""
    if text is None:
        text = resources.files("specwatch").joinpath("simulator", "scenarios", DEMO_FILE).read_text("utf-8")
    raw = yaml.safe_load(text)
    problems: list[str] = []
    if not isinstance(raw, dict):
        raise ScenarioError(["the demo file must be a mapping"], DEMO_FILE)
    scale = raw.get("time_scale", 1)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale <= 0:
        problems.append(f"time_scale: must be a number > 0, got {scale!r}")
    interval = parse_duration(raw.get("interval", "2s"))
    if interval is None or interval <= 0:
        problems.append(f"interval: not a duration: {raw.get('interval')!r}")
        interval = 0.0
    routes = []
    for i, r in enumerate(raw.get("routes") or []):
        if not isinstance(r, dict) or set(r) - {"name", "engine", "dp", "scenario"}:
            problems.append(f"routes[{i}]: a mapping with name, engine, dp, scenario")
            continue
        if r.get("engine") not in ENGINE_KINDS:
            problems.append(f"routes[{i}].engine: must be one of {', '.join(ENGINE_KINDS)}")
            continue
        dp = r.get("dp", 1)
        if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
            problems.append(f"routes[{i}].dp: must be a whole number >= 1, got {dp!r}")
            continue
        try:
            scenario = parse_scenario(r.get("scenario"), f"routes[{i}].scenario")
        except ScenarioError as exc:
            problems.extend(exc.problems)
            continue
        routes.append(DemoRoute(str(r.get("name")), r["engine"], dp, scenario))
    if problems:
        raise ScenarioError(problems, DEMO_FILE)
    return DemoPlan(float(scale), float(interval), tuple(routes), str(raw.get("description", "")))


def simulation_spec(route: DemoRoute, time_scale: float, step_time: StepTimeModel | None = None,
                    seed: int | None = None) -> SimulationSpec:
    sc = route.scenario
    return SimulationSpec(engine_kind=route.engine, model_name=sc.model_name or DEFAULT_MODEL, dp=route.dp,
                          k=sc.k if sc.k is not None else 4,
                          acceptance=sc.acceptance if sc.acceptance is not None else 0.7,
                          step_time=step_time or load_table(), time_scale=time_scale, scenario=sc, seed=seed)


def route_crossover(spec: SimulationSpec) -> float | None:
    """The simulated engine's true crossover batch for its starting acceptance profile."""
    if not spec.k:
        return None
    profile = parse_profile(spec.acceptance, spec.k)
    return crossover_batch(spec.step_time or load_table(), spec.k, profile.mean_tokens_per_step())


def daemon_config(plan: DemoPlan, metrics_urls: dict[str, str], specs: dict[str, SimulationSpec],
                  state_dir: str) -> dict[str, Any]:
    """The daemon's config document (validated by the caller with `specwatch.config.parse_config`)."""
    routes = []
    for route in plan.routes:
        spec = specs[route.name]
        entry: dict[str, Any] = {"name": route.name, "engine": route.engine, "url": metrics_urls[route.name]}
        if spec.k:
            profile = parse_profile(spec.acceptance, spec.k)
            entry["baseline"] = {"acceptance_ratio": round(profile.acceptance_rate(), 4),
                                 "position_acceptance": [round(p, 4) for p in profile.survival()],
                                 "overdispersion": DEMO_OVERDISPERSION}
        b_star = route_crossover(spec)
        if b_star is not None:
            entry["crossover"] = {"batch_size": round(b_star, 1), "hold": DEMO_CROSSOVER_HOLD}
        routes.append(entry)
    return {"interval": f"{plan.interval_seconds:g}s", "state_dir": state_dir, "gpu": {"enabled": "false"},
            "scrape": {"timeout": f"{min(1.0, plan.interval_seconds / 2):g}s"},
            "detection": dict(DEMO_DETECTION), "routes": routes}
