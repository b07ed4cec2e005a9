"""The testbed's tiny models, built through the engine venv (`make_models.py`) and cached on disk."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from testbed.cache import digest, exclusive
from testbed.engine_env import DEFAULT_VENV, EngineEnv, EngineEnvError
from testbed.make_models import HEAVY_LAYERS

_MODEL_SOURCES = [Path(__file__).with_name(name) for name in ("make_models.py", "successor.py")]
# Beside the engine venv that builds them, keyed by the code that makes them: a changed recipe builds afresh.
DEFAULT_CACHE = DEFAULT_VENV / f"models-{digest(path.read_bytes() for path in _MODEL_SOURCES)}"
# Relative weight noise of the drafters the tests and the demo use, and the acceptance each gives against the
# target with 3 draft tokens under greedy decoding (measured by vLLM's own counters, docs/benchmarks.md,
# "Real engine"): more noise, less acceptance.
GOOD_DRAFTER_NOISE = 0.03
WORSE_DRAFTER_NOISE = 0.06
# Wrong fractions of the successor drafters (successor.py): the base one, and those whose acceptance over
# successor.prompts(795, 32) with k = 3 and 32 tokens a request is 0.95x and 0.80x the base's (0.6706): 177 and
# 234 wrong tokens of 795 against 159 (successor.expected_ratio gives 0.9502x and 0.7994x).
SUCCESSOR_BASE = 0.2
SUCCESSOR_DRIFT_5 = 0.2226
SUCCESSOR_DROP_20 = 0.2943


@dataclass(frozen=True)
class TinyModels:
    target: Path
    drafters: dict[float, Path]
    unrelated: Path
    successor_target: Path
    successor_drafters: dict[float, Path]

    def drafter(self, noise: float) -> Path:
        return self.drafters[noise]

    def successor_drafter(self, wrong_fraction: float) -> Path:
        return self.successor_drafters[wrong_fraction]


def build_tiny_models(
    env: EngineEnv,
    noises: tuple[float, ...] = (0.0, GOOD_DRAFTER_NOISE, WORSE_DRAFTER_NOISE),
    successor_fractions: tuple[float, ...] = (SUCCESSOR_BASE, SUCCESSOR_DRIFT_5, SUCCESSOR_DROP_20),
    dest: Path = DEFAULT_CACHE,
) -> TinyModels:
    """Build (or reuse) the target, one drafter per noise level, an unrelated drafter, and the successor target
    and drafters. Deterministic."""
    args = ["--unrelated"]
    for noise in noises:
        args += ["--drafter-noise", f"{noise:g}"]
    for fraction in successor_fractions:
        args += ["--successor-drafter", f"{fraction:g}"]
    built = _build(env, dest, args)
    return TinyModels(
        target=Path(built["target"]),
        drafters={float(k): Path(v) for k, v in built["drafters"].items()},
        unrelated=Path(built["unrelated"]),
        successor_target=Path(built["successor"]["target"]),
        successor_drafters={float(k): Path(v) for k, v in built["successor"]["drafters"].items()},
    )


def build_heavy_successor(
    env: EngineEnv, wrong_fraction: float, target_layers: int = HEAVY_LAYERS, dest: Path = DEFAULT_CACHE
) -> tuple[Path, Path]:
    """Build (or reuse) the heavy successor target with `target_layers` and its one-layer drafter with
    `wrong_fraction` (docs/testbed.md, "Heavy successor models"): (target, drafter)."""
    args = ["--heavy-target-layers", str(target_layers), "--heavy-successor-drafter", f"{wrong_fraction:g}"]
    built = _build(env, dest, args)["heavy_successor"]
    return Path(built["target"]), Path(built["drafters"][f"{wrong_fraction:g}"])


def _build(env: EngineEnv, dest: Path, args: list[str]) -> dict:
    """Run `make_models.py` in the engine venv; what it built, as it prints it. One builder at a time per machine:
    a model it finds complete is reused, never rewritten."""
    with exclusive(f"models-{dest.parent.name}-{dest.name}"):
        result = env.run_python("-m", "testbed.make_models", str(dest), *args)
    if result.returncode != 0:
        raise EngineEnvError(f"building the tiny models failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])
