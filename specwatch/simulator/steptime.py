"""How long one simulated engine step takes, for a batch of B sequences each adding q tokens.

Two models share one small interface:
- `TableStepTime`: a measured table such as the packaged H200 reference (`specwatch/data/`), interpolated
  linearly in batch and in tokens per sequence, so a simulated spec/plain pair crosses where the table says.
- `AnalyticStepTime`: a roofline-shaped formula, a memory-bound floor (streaming the weights), a compute
  slope once B x q tokens outrun it, and a per-sequence KV-read term that grows with the context.

Times are in seconds. A speculative step costs `target(B, k + 1) + k * draft(B)`; a plain step `target(B, 1)`.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from specwatch.crossover.speedup import crossover_batch as last_crossing

REFERENCE_TABLE = "h200-crossover-llama3-8b.json"


class StepTimeModel(Protocol):
    def target_seconds(self, batch: float, tokens_per_seq: int) -> float:
        """One full target forward over `batch` sequences with `tokens_per_seq` new tokens each."""
        ...

    def draft_seconds(self, batch: float) -> float:
        """One draft step (one proposed token per sequence) at `batch`."""
        ...


def step_seconds(model: StepTimeModel, batch: int, k: int) -> float:
    """One decode step: plain when k == 0, else k draft steps plus the (k + 1)-token verify pass."""
    if batch <= 0:
        return 0.0
    if k <= 0:
        return model.target_seconds(batch, 1)
    return model.target_seconds(batch, k + 1) + k * model.draft_seconds(batch)


@dataclass(frozen=True)
class AnalyticStepTime:
    """t(B, q) = max(floor, compute x B x q) + kv x B x context / 1024, defaults shaped like an 8B model on an H200."""

    floor_seconds: float = 4.9e-3  # streaming ~15 GB of bf16 weights at ~3.1 TB/s
    compute_seconds_per_token: float = 5.2e-5  # slope of the verify pass once compute-bound
    kv_seconds_per_seq: float = 3.5e-5  # KV reads per sequence at 1024 tokens of context
    context: int = 1024
    draft_floor_seconds: float = 2.2e-4
    draft_seconds_per_seq: float = 1.5e-6

    def target_seconds(self, batch: float, tokens_per_seq: int) -> float:
        compute = self.compute_seconds_per_token * batch * tokens_per_seq
        return max(self.floor_seconds, compute) + self.kv_seconds_per_seq * batch * self.context / 1024

    def draft_seconds(self, batch: float) -> float:
        return self.draft_floor_seconds + self.draft_seconds_per_seq * batch


class TableStepTime:
    """A measured step-time table: `target[(B, q)]` and `draft[B]` in seconds on a grid of batch sizes.

    Between grid points times are interpolated linearly; past the largest batch they are extrapolated from
    the last two points (a compute-bound step grows linearly in B); below the smallest, the smallest is used.
    Tokens per sequence are interpolated between the measured q values the same way.
    """

    def __init__(
        self, target: dict[tuple[int, int], float], draft: dict[int, float], *, context: int, name: str = "table"
    ) -> None:
        self.context = context
        self.name = name
        self._batches = sorted({b for b, _ in target})
        self._qs = sorted({q for _, q in target})
        missing = [(b, q) for b in self._batches for q in self._qs if (b, q) not in target]
        if missing or not self._batches:
            raise ValueError(f"step-time table {name}: incomplete grid, missing (batch, q) {missing[:5]}")
        if sorted(draft) != self._batches:
            raise ValueError(f"step-time table {name}: draft batches {sorted(draft)} differ from target batches")
        self._target = dict(target)
        self._draft = dict(draft)

    @property
    def batches(self) -> tuple[int, ...]:
        return tuple(self._batches)

    def target_seconds(self, batch: float, tokens_per_seq: int) -> float:
        return _interp(self._qs, [self._target_at_q(batch, q) for q in self._qs], tokens_per_seq)

    def draft_seconds(self, batch: float) -> float:
        return _interp(self._batches, [self._draft[b] for b in self._batches], batch)

    def _target_at_q(self, batch: float, q: int) -> float:
        return _interp(self._batches, [self._target[(b, q)] for b in self._batches], batch)

    @classmethod
    def from_reference(cls, data: dict[str, Any], context: int = 1024, name: str = "") -> "TableStepTime":
        """Build from the reference JSON format (`runs[i].target["BxQ"]`, `runs[i].draft["B"]`, both in ms),
        taking the run whose context is nearest to `context`."""
        runs = data.get("runs") or []
        if not runs:
            raise ValueError(f"step-time table {name}: no runs")
        run = min(runs, key=lambda r: abs(int(r["context"]) - context))
        target = {}
        for key, ms in run["target"].items():
            b, q = key.split("x")
            target[(int(b), int(q))] = float(ms) / 1000.0
        draft = {int(b): float(ms) / 1000.0 for b, ms in run["draft"].items()}
        label = name or f"{data.get('gpu', 'table')} {run.get('shape', '')} context {run['context']}".strip()
        return cls(target, draft, context=int(run["context"]), name=label)


def load_table(path: str | Path | None = None, context: int = 1024) -> TableStepTime:
    """Load a step-time table in the reference format; None loads the packaged H200 / Llama-3-8B table."""
    return TableStepTime.from_reference(load_reference(path), context=context)


def load_reference(path: str | Path | None = None) -> dict[str, Any]:
    """The raw reference JSON; None reads the copy packaged in `specwatch/data/`."""
    try:
        if path is None:
            text = resources.files("specwatch").joinpath("data", REFERENCE_TABLE).read_text(encoding="utf-8")
        else:
            text = Path(path).read_text(encoding="utf-8")
        return json.loads(text)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot load step-time table {path or REFERENCE_TABLE}: {exc}") from exc


def _interp(xs: list[int], ys: list[float], x: float) -> float:
    if len(xs) == 1 or x <= xs[0]:
        return ys[0]
    i = bisect.bisect_left(xs, x)
    if i >= len(xs):  # extrapolate along the last segment
        i = len(xs) - 1
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def crossover_batch(model: StepTimeModel, k: int, tokens_per_step: float, max_batch: float = 1024.0) -> float | None:
    """The batch above which speculation stops paying for good: the last batch where tokens_per_step x
    t(B, 1) = t_spec(B) (`crossover.speedup.crossover_batch`, the estimator's own search, on this table's steps).

    `tokens_per_step` is the expected tokens one verify step emits (1 + E[accepted]). None when speculation
    still wins at `max_batch`; 1.0 when it never wins.
    """

    def speedup(batch: float) -> float:
        return (
            tokens_per_step
            * model.target_seconds(batch, 1)
            / (model.target_seconds(batch, k + 1) + k * model.draft_seconds(batch))
        )

    if k <= 0:
        return None
    return last_crossing(speedup, max_batch, tolerance=1e-12)
