"""The H200 reference table (Llama-3-8B-shaped target, EAGLE-style draft): loading and the speedups it implies.

Shipped as `specwatch/data/h200-crossover-llama3-8b.json`. Field meanings: `docs/reference/README.md`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from specwatch.crossover.speedup import expected_tokens, interpolate_crossover

FILE_NAME = "h200-crossover-llama3-8b.json"
_PACKAGED = Path(__file__).resolve().parent.parent / "data" / FILE_NAME


@dataclass(frozen=True)
class ReferenceRun:
    """One (shape, context) run: step times in seconds keyed by batch (and q for the target)."""

    shape: str
    context: int
    target_s: Mapping[tuple[int, int], float]  # (batch, q) -> seconds
    draft_s: Mapping[int, float]  # batch -> seconds of one draft step
    gpm_plain: Mapping[int, Mapping[str, float]]  # batch -> GPM readings in percent
    derived: Mapping[tuple[int, float], Mapping[int, float]]  # (gamma, alpha) -> batch -> stored speedup

    @property
    def batches(self) -> list[int]:
        return sorted(self.draft_s)

    def speedup(self, gamma: int, alpha: float) -> dict[int, float]:
        """E x T(B,1) / (T(B, gamma+1) + gamma x T_draft(B)), recomputed from the step times."""
        e = expected_tokens(alpha, gamma)
        return {
            b: e * self.target_s[(b, 1)] / (self.target_s[(b, gamma + 1)] + gamma * self.draft_s[b])
            for b in self.batches
        }

    def measured_crossover(self, gamma: int, alpha: float) -> float | None:
        """B* interpolated linearly between the grid points that bracket speedup = 1."""
        return interpolate_crossover(list(self.speedup(gamma, alpha).items()))


@dataclass(frozen=True)
class ReferenceTable:
    gpu: str
    runs: tuple[ReferenceRun, ...]

    def run(self, context: int) -> ReferenceRun:
        for r in self.runs:
            if r.context == context:
                return r
        raise KeyError(f"no reference run at context {context}; have {[r.context for r in self.runs]}")


def default_path() -> Path:
    return _PACKAGED


def load_reference(path: str | Path | None = None) -> ReferenceTable:
    """Parse the table. Raises ValueError naming the file on anything malformed."""
    path = Path(path) if path else default_path()
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return _parse(raw)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a usable crossover reference table: {exc}") from exc


def _parse(raw: Mapping[str, Any]) -> ReferenceTable:
    runs = []
    for r in raw["runs"]:
        target = {}
        for key, ms in r["target"].items():
            b, q = key.split("x")
            target[(int(b), int(q))] = float(ms) / 1000.0
        derived = {}
        for key, entry in r["derived"].items():
            parts = dict(kv.split("=") for kv in key.split(","))
            derived[(int(parts["gamma"]), float(parts["alpha"]))] = {
                int(b): float(s) for b, s in entry["speedup"].items()
            }
        runs.append(
            ReferenceRun(
                shape=str(r["shape"]),
                context=int(r["context"]),
                target_s=target,
                draft_s={int(b): float(ms) / 1000.0 for b, ms in r["draft"].items()},
                gpm_plain={int(b): {k: float(v) for k, v in g.items()} for b, g in r.get("gpm_plain", {}).items()},
                derived=derived,
            )
        )
    return ReferenceTable(gpu=str(raw["gpu"]), runs=tuple(runs))
