"""Scenarios: a simulated server's starting setup and its time-stamped events, from YAML or JSON.

```yaml
model_name: meta-llama/Llama-3.1-8B-Instruct
speculation: {k: 4, acceptance: 0.7}   # acceptance: one alpha for every position, or a list per position
load: 8                                # offered concurrency of the built-in load generator at t=0
events:                                # `at` is simulated time since start (5m = 300 s)
  - {at: 2m, type: acceptance, factor: 0.8}        # acceptance rate x 0.8 of the starting rate (or rate: 0.5)
  - {at: 5m, type: model_bump, model_name: llama-3.1-8b-v2, acceptance_factor: 0.8}  # restart, new name
  - {at: 3m, type: load, concurrency: 120, over: 4m}  # ramp offered concurrency linearly (over: 0 = a step)
  - {at: 9m, type: restart}                          # counters reset, requests in flight aborted
  - {at: 10m, type: outage, duration: 30s}           # every endpoint answers 503, then a restart
```

Parsing is strict, like the daemon's config: unknown keys are errors and every problem is reported at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from specwatch.config import parse_duration

EVENT_TYPES = ("acceptance", "model_bump", "load", "restart", "outage")
_EVENT_KEYS: Mapping[str, set[str]] = {
    "acceptance": {"factor", "rate"},
    "model_bump": {"model_name", "acceptance_factor"},
    "load": {"concurrency", "over"},
    "restart": set(),
    "outage": {"duration"},
}
_TOP_KEYS = {"model_name", "speculation", "load", "events", "description"}


class ScenarioError(ValueError):
    def __init__(self, problems: list[str], source: str = "") -> None:
        self.problems = problems
        head = f"{source}: " if source else ""
        super().__init__(head + "invalid scenario:\n" + "\n".join(f"  - {p}" for p in problems))


@dataclass(frozen=True)
class Event:
    at: float  # simulated seconds since start
    type: str
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Scenario:
    model_name: str | None = None
    k: int | None = None  # None: keep the command-line default
    acceptance: float | tuple[float, ...] | None = None
    load: float = 0.0
    events: tuple[Event, ...] = ()
    description: str = ""

    def concurrency_at(self, t: float) -> float:
        """Offered concurrency at simulated time t: piecewise linear through the `load` events."""
        level = self.load
        for ev in self.events:
            if ev.type != "load" or ev.at > t:
                continue
            target, over = ev.params["concurrency"], ev.params.get("over", 0.0)
            if over > 0 and t < ev.at + over:
                return level + (target - level) * (t - ev.at) / over
            level = target
        return level

    @property
    def end(self) -> float:
        """Simulated time of the last event's end."""
        ends = [ev.at + ev.params.get("over", 0.0) + ev.params.get("duration", 0.0) for ev in self.events]
        return max(ends, default=0.0)


def parse_scenario(raw: Any, source: str = "") -> Scenario:
    problems: list[str] = []
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ScenarioError([f"must be a mapping, got {type(raw).__name__}"], source)
    for key in raw:
        if key not in _TOP_KEYS:
            problems.append(f"{key}: unknown key (allowed: {', '.join(sorted(_TOP_KEYS))})")
    model = raw.get("model_name")
    if model is not None and (not isinstance(model, str) or not model):
        problems.append(f"model_name: must be a non-empty string, got {model!r}")
    k, acceptance = _speculation(raw.get("speculation"), problems)
    load = _number(raw.get("load", 0), "load", problems, lo=0)
    events: list[Event] = []
    raw_events = raw.get("events") or []
    if not isinstance(raw_events, list):
        problems.append("events: must be a list")
        raw_events = []
    for i, ev in enumerate(raw_events):
        parsed = _event(ev, f"events[{i}]", problems)
        if parsed is not None:
            events.append(parsed)
    if problems:
        raise ScenarioError(problems, source)
    events.sort(key=lambda e: e.at)  # stable: same-time events keep file order
    return Scenario(
        model_name=model,
        k=k,
        acceptance=acceptance,
        load=load or 0.0,
        events=tuple(events),
        description=str(raw.get("description", "")),
    )


def load_scenario(path: str | Path) -> Scenario:
    """Read a YAML (or JSON, a subset of YAML) scenario file. Raises ScenarioError."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ScenarioError([f"cannot read: {exc}"], str(path)) from exc
    return parse_scenario(raw, str(path))


def _speculation(raw: Any, problems: list[str]) -> tuple[int | None, float | tuple[float, ...] | None]:
    if raw is None:
        return None, None
    if not isinstance(raw, dict):
        problems.append("speculation: must be a mapping with k and acceptance")
        return None, None
    for key in raw:
        if key not in ("k", "acceptance"):
            problems.append(f"speculation.{key}: unknown key (allowed: acceptance, k)")
    k = _number(raw.get("k"), "speculation.k", problems, lo=0, integer=True)
    acc = raw.get("acceptance")
    if acc is None:
        return k, None
    if isinstance(acc, list):
        values = [_number(a, f"speculation.acceptance[{i}]", problems, lo=0, hi=1) for i, a in enumerate(acc)]
        if k is not None and len(acc) != k:
            problems.append(f"speculation.acceptance: lists {len(acc)} positions but k is {k}")
        return k, tuple(v for v in values if v is not None)
    return k, _number(acc, "speculation.acceptance", problems, lo=0, hi=1)


def _event(raw: Any, path: str, problems: list[str]) -> Event | None:
    if not isinstance(raw, dict):
        problems.append(f"{path}: must be a mapping with at and type")
        return None
    kind = raw.get("type")
    if kind not in EVENT_TYPES:
        problems.append(f"{path}.type: must be one of {', '.join(EVENT_TYPES)}, got {kind!r}")
        return None
    problems_before = len(problems)
    allowed = _EVENT_KEYS[kind] | {"at", "type"}
    for key in raw:
        if key not in allowed:
            problems.append(f"{path}.{key}: unknown key for a {kind} event (allowed: {', '.join(sorted(allowed))})")
    at = _duration(raw.get("at"), f"{path}.at", problems, required=True)
    params: dict[str, Any] = {}
    if kind == "acceptance":
        if ("factor" in raw) == ("rate" in raw):
            problems.append(f"{path}: give exactly one of factor, rate")
        elif "factor" in raw:
            params["factor"] = _number(raw["factor"], f"{path}.factor", problems, lo=0)
        else:
            params["rate"] = _number(raw["rate"], f"{path}.rate", problems, lo=0, hi=1)
    elif kind == "model_bump":
        name = raw.get("model_name")
        if not isinstance(name, str) or not name:
            problems.append(f"{path}.model_name: required, a non-empty string")
        params["model_name"] = name
        if "acceptance_factor" in raw:
            params["acceptance_factor"] = _number(raw["acceptance_factor"], f"{path}.acceptance_factor", problems, lo=0)
    elif kind == "load":
        if "concurrency" not in raw:
            problems.append(f"{path}.concurrency: required")
        params["concurrency"] = _number(raw.get("concurrency"), f"{path}.concurrency", problems, lo=0)
        params["over"] = _duration(raw.get("over"), f"{path}.over", problems) or 0.0
    elif kind == "outage":
        params["duration"] = _duration(raw.get("duration"), f"{path}.duration", problems, required=True)
    if at is None or len(problems) > problems_before:
        return None
    return Event(at=at, type=kind, params=params)


def _duration(value: Any, path: str, problems: list[str], required: bool = False) -> float | None:
    if value is None:
        if required:
            problems.append(f"{path}: required, a duration like 30s or 5m")
        return None
    seconds = parse_duration(value)
    if seconds is None or seconds < 0:
        problems.append(f"{path}: not a duration like 30s or 5m: {value!r}")
        return None
    return seconds


def _number(
    value: Any, path: str, problems: list[str], lo: float | None = None, hi: float | None = None, integer: bool = False
) -> Any:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        problems.append(f"{path}: must be a number, got {value!r}")
        return None
    if integer and value != int(value):
        problems.append(f"{path}: must be a whole number, got {value!r}")
        return None
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        low, high = lo if lo is not None else "-inf", hi if hi is not None else "inf"
        problems.append(f"{path}: must be within {low}..{high}, got {value!r}")
        return None
    return int(value) if integer else float(value)
