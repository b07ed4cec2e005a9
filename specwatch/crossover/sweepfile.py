"""The `crossover.json` format written by `specwatch sweep` and read by the daemon, `recommend` and `estimate`.

    {"format": "specwatch-crossover/1", "plain_url", "spec_url", "model", "max_tokens", "prompts",
     "context_tokens", "num_speculative_tokens", "complete", "failure",
     "crossover_concurrency": float | null,
     "mean_acceptance_length", "position_acceptance": [p_1, ...],
     "levels": [{"concurrency", "duration_s", "speedup",
                 "plain": {"requests", "failed", "output_tokens", "output_tokens_per_s" (Little's law),
                           "wall_output_tokens_per_s", "requests_per_s",
                           "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
                           "latency_per_token_mean_s", "latency_per_token_sd_s", "latency_per_token_n"},
                 "spec":  {... the same, + "acceptance_ratio", "mean_acceptance_length",
                           "position_acceptance", "draft_length"}}, ...]}

Leaf module (json only) so the daemon can read sweeps without the load generator's imports.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specwatch.crossover.speedup import interpolate_crossover

FORMAT = "specwatch-crossover/1"


def load_sweep(path: str | Path) -> dict[str, Any]:
    """Read and check a sweep file. Raises ValueError naming the file and the problem."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read sweep file: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ValueError(f"{path}: not a specwatch sweep file (format {FORMAT!r} expected)")
    levels = raw.get("levels")
    if not isinstance(levels, list):
        raise ValueError(f"{path}: 'levels' must be a list")
    for i, level in enumerate(levels):
        if not isinstance(level, dict) or not isinstance(level.get("concurrency"), (int, float)):
            raise ValueError(f"{path}: levels[{i}] has no numeric concurrency")
    return raw


def speedup_points(levels: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(concurrency, spec/plain output tokens/s) for every level where both servers produced tokens."""
    points = []
    for level in levels:
        plain = (level.get("plain") or {}).get("output_tokens_per_s")
        spec = (level.get("spec") or {}).get("output_tokens_per_s")
        if plain and spec is not None and plain > 0:
            points.append((float(level["concurrency"]), float(spec) / float(plain)))
    return sorted(points)


def crossover_concurrency(levels: list[dict[str, Any]]) -> float | None:
    """Where spec throughput falls below plain, interpolated in log concurrency between the bracketing
    levels (levels are spaced geometrically and plotted on a log axis)."""
    return interpolate_crossover(speedup_points(levels), log_x=True)
