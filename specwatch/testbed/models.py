"""The testbed's tiny models, built through the engine venv (`tiny_models.py`) and cached on disk."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specwatch.testbed.engine_env import REPO_ROOT, EngineEnv, EngineEnvError

DEFAULT_CACHE = REPO_ROOT / ".venv-vllm" / "models"
# Relative weight noise of the drafters the tests and the demo use, and the acceptance each gives against the
# target with 3 draft tokens under greedy decoding (measured by vLLM's own counters, docs/benchmarks.md,
# "Real engine"): more noise, less acceptance.
GOOD_DRAFTER_NOISE = 0.03
WORSE_DRAFTER_NOISE = 0.06


@dataclass(frozen=True)
class TinyModels:
    target: Path
    drafters: dict[float, Path]
    unrelated: Path

    def drafter(self, noise: float) -> Path:
        return self.drafters[noise]


def build_tiny_models(env: EngineEnv, noises: tuple[float, ...] = (0.0, GOOD_DRAFTER_NOISE, WORSE_DRAFTER_NOISE),
                      dest: Path = DEFAULT_CACHE) -> TinyModels:
    """Build (or reuse) the target, one drafter per noise level and an unrelated drafter. Deterministic."""
    args = ["-m", "specwatch.testbed.tiny_models", str(dest), "--unrelated"]
    for noise in noises:
        args += ["--drafter-noise", f"{noise:g}"]
    result = env.run_python(*args)
    if result.returncode != 0:
        raise EngineEnvError(f"building the tiny models failed:\n{result.stderr[-4000:]}")
    built = json.loads(result.stdout.strip().splitlines()[-1])
    return TinyModels(target=Path(built["target"]),
                      drafters={float(k): Path(v) for k, v in built["drafters"].items()},
                      unrelated=Path(built["unrelated"]))
