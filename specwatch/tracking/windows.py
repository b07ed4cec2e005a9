"""Sliding windows over cumulative sums: a bounded ring of (ts, sums) points.

A window's value is the difference between the newest point and the point at or just before the window's
start, the way Prometheus' `increase()` treats counters but without extrapolation. Ratios are then taken
of those differences (Δaccepted / Δdraft_tokens), never averaged from per-cycle ratios.

When history is shorter than the window (the daemon started recently), the oldest point is used: a
ratio over a shorter span is still a true ratio, and the 1h window is not left empty for an hour.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, fields
from typing import Mapping

from specwatch.snapshot import WINDOW_SECONDS

# Beyond this many points the ring thins itself, so even a misconfigured 10 ms interval stays bounded.
MAX_POINTS = 4096


@dataclass(frozen=True)
class Sums:
    """Cumulative sums of one route since tracking started; every field only grows.

    Counter routes fill drafts/draft_tokens/accepted/per_pos. Gauge routes (SGLang interval gauges) fill
    the weights (running requests) and the weighted gauge values, so a window's mean is a batch-weighted
    mean: Σ(ratio x running) / Σ(running).
    """

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_pos: tuple[float, ...] = ()
    gauge_ratio_weight: float = 0.0
    gauge_ratio_weighted: float = 0.0
    gauge_length_weight: float = 0.0
    gauge_length_weighted: float = 0.0

    def plus(self, other: "Sums") -> "Sums":
        return _combine(self, other, 1.0)

    def minus(self, other: "Sums") -> "Sums":
        return _combine(self, other, -1.0)


def _combine(a: Sums, b: Sums, sign: float) -> Sums:
    return Sums(**{f.name: _add_positions(a.per_pos, b.per_pos, sign) if f.name == "per_pos"
                   else getattr(a, f.name) + sign * getattr(b, f.name) for f in fields(Sums)})


def _timestamp(point: tuple[float, "Sums"]) -> float:
    return point[0]


def _add_positions(a: tuple[float, ...], b: tuple[float, ...], sign: float) -> tuple[float, ...]:
    # k can grow (a reconfigured engine); a position not seen yet counts as 0.
    n = max(len(a), len(b))
    a = a + (0.0,) * (n - len(a))
    b = b + (0.0,) * (n - len(b))
    return tuple(x + sign * y for x, y in zip(a, b))


class WindowRing:
    """Cumulative `Sums` points over the longest window, with bounded memory."""

    def __init__(self, horizon_seconds: float = max(WINDOW_SECONDS.values()), max_points: int = MAX_POINTS) -> None:
        self.horizon_seconds = horizon_seconds
        self.max_points = max_points
        self._points: deque[tuple[float, Sums]] = deque()

    def __len__(self) -> int:
        return len(self._points)

    @property
    def latest(self) -> Sums:
        return self._points[-1][1] if self._points else Sums()

    def append(self, ts: float, sums: Sums) -> None:
        if self._points and ts <= self._points[-1][0]:
            # A clock step backwards (or a duplicate tick): replace rather than break time order.
            self._points[-1] = (self._points[-1][0], sums)
            return
        self._points.append((ts, sums))
        # Keep one point at or before the horizon's start: it is the base of the longest window.
        start = ts - self.horizon_seconds
        while len(self._points) >= 2 and self._points[1][0] <= start:
            self._points.popleft()
        if len(self._points) > self.max_points:
            self._thin()

    def _thin(self) -> None:
        # Drop every other point except the first and last; windows stay correct, only coarser at the base.
        pts = list(self._points)
        self._points = deque(pts[:1] + pts[1:-1:2] + pts[-1:])

    def delta(self, window_seconds: float) -> tuple[Sums, float] | None:
        """(newest - base, span in seconds) for a window ending at the newest point; None without two points."""
        if len(self._points) < 2:
            return None
        end_ts, end = self._points[-1]
        start = end_ts - window_seconds
        # Newest point at or before the window start (the oldest when history is shorter). Points are in strictly
        # increasing time order, so a binary search replaces a scan of up to an hour of points per window.
        base_ts, base = self._points[max(0, bisect_right(self._points, start, key=_timestamp) - 1)]
        if base_ts == end_ts:
            return None
        return end.minus(base), end_ts - base_ts

    def deltas(self, windows: Mapping[str, float] = WINDOW_SECONDS) -> dict[str, Sums]:
        out = {}
        for name, seconds in windows.items():
            d = self.delta(seconds)
            if d is not None:
                out[name] = d[0]
        return out
