"""The demo plan: which simulated engines `specwatch demo` starts, and the daemon config that watches them.

Pure functions over the packaged `scenarios/demo.yaml`; `specwatch/commands/demo.py` does the running.
The generated config is tuned for a two-minute run. Learning a baseline takes minutes of real time (its
overdispersion needs several one-minute blocks), so each route's baseline is pinned in the config to the
acceptance its simulated engine really starts with; the drop must last 10 s instead of minutes; the
crossover flag holds 5 s; and each route's crossover is the simulated engine's own (computed from the same
step-time table and acceptance profile the engine runs on), so "above crossover" means what it says. It is
given as a sweep file of the engines' steady-state throughput with and without speculation, the curve
`specwatch sweep` measures, so the daemon also predicts the speedup and accounts the GPU time speculation
loses above the crossover and saves below it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from specwatch.config import parse_duration
from specwatch.simulator.scenario import Scenario, ScenarioError, parse_scenario
from specwatch.simulator.simulation import ENGINE_KINDS, DEFAULT_MODEL, SimulationSpec
from specwatch.simulator.speculation import parse_profile
from specwatch.crossover.sweepfile import FORMAT as SWEEP_FORMAT
from specwatch.simulator.steptime import StepTimeModel, crossover_batch, load_table, step_seconds

DEMO_FILE = "demo.yaml"

# Detection settings for a demo measured in seconds, not the production defaults measured in minutes.
DEMO_DETECTION = {"min_drafted_tokens": 2_000, "min_duration": "10s", "confirm_window": "20s"}
DEMO_CROSSOVER_HOLD = "5s"
# Token-level overdispersion of the simulated traffic: a draft's tokens are accepted as a prefix, so they are
# correlated within a verify step (φ > 1) but independent across requests and steps.
DEMO_OVERDISPERSION = 2.0
SWEEP_LEVELS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


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


def simulation_spec(
    route: DemoRoute, time_scale: float, step_time: StepTimeModel | None = None, seed: int | None = None
) -> SimulationSpec:
    sc = route.scenario
    return SimulationSpec(
        engine_kind=route.engine,
        model_name=sc.model_name or DEFAULT_MODEL,
        dp=route.dp,
        k=sc.k if sc.k is not None else 4,
        acceptance=sc.acceptance if sc.acceptance is not None else 0.7,
        step_time=step_time or load_table(),
        time_scale=time_scale,
        scenario=sc,
        seed=seed,
    )


def route_crossover(spec: SimulationSpec) -> float | None:
    """The simulated engine's true crossover batch for its starting acceptance profile."""
    if not spec.k:
        return None
    profile = parse_profile(spec.acceptance, spec.k)
    return crossover_batch(spec.step_time or load_table(), spec.k, profile.mean_tokens_per_step())


def engine_sweep(spec: SimulationSpec) -> dict[str, Any]:
    """A sweep document of the simulated engine pair: decode throughput per batch, plain and speculating, from
    the engine's own step times and acceptance (what a sweep of them measures, without prefill and HTTP)."""
    step_time = spec.step_time or load_table()
    tau = parse_profile(spec.acceptance, spec.k).mean_tokens_per_step()
    levels = [
        {
            "concurrency": b,
            "plain": {"output_tokens_per_s": b / step_seconds(step_time, b, 0)},
            "spec": {"output_tokens_per_s": b * tau / step_seconds(step_time, b, spec.k)},
        }
        for b in SWEEP_LEVELS
    ]
    return {
        "format": SWEEP_FORMAT,
        "model": spec.model_name,
        "num_speculative_tokens": spec.k,
        "mean_acceptance_length": tau,
        "complete": True,
        "levels": levels,
        "note": "derived from the SIMULATED engine's step-time table, not measured",
    }


def daemon_config(
    plan: DemoPlan, metrics_urls: dict[str, str], specs: dict[str, SimulationSpec], state_dir: str
) -> dict[str, Any]:
    """The daemon's config document (validated by the caller with `specwatch.config.parse_config`); writes each
    speculating route's sweep file into `state_dir`."""
    routes = []
    for route in plan.routes:
        spec = specs[route.name]
        entry: dict[str, Any] = {"name": route.name, "engine": route.engine, "url": metrics_urls[route.name]}
        if spec.k:
            profile = parse_profile(spec.acceptance, spec.k)
            entry["baseline"] = {
                "acceptance_ratio": round(profile.acceptance_rate(), 4),
                "position_acceptance": [round(p, 4) for p in profile.survival()],
                "overdispersion": DEMO_OVERDISPERSION,
            }
        if route_crossover(spec) is not None:
            sweep_file = Path(state_dir) / f"{route.name}-crossover.json"
            sweep_file.parent.mkdir(parents=True, exist_ok=True)
            sweep_file.write_text(json.dumps(engine_sweep(spec)), encoding="utf-8")
            entry["crossover"] = {"sweep": str(sweep_file), "hold": DEMO_CROSSOVER_HOLD}
        routes.append(entry)
    return {
        "interval": f"{plan.interval_seconds:g}s",
        "state_dir": state_dir,
        "gpu": {"enabled": "false"},
        "scrape": {"timeout": f"{min(1.0, plan.interval_seconds / 2):g}s"},
        "detection": dict(DEMO_DETECTION),
        "routes": routes,
    }
