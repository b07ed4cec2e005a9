"""Sliding windows over cumulative sums: a bounded ring of (ts, sums) points in flat numeric arrays.

A window's value is the difference between the newest point and the point at or just before the window's
start, the way Prometheus' `increase()` treats counters but without extrapolation. Ratios are then taken
of those differences (Δaccepted / Δdraft_tokens), never averaged from per-cycle ratios.

When history is shorter than the window (the daemon started recently), the oldest point is used: a
ratio over a shorter span is still a true ratio, and the 1h window is not left empty for an hour.

Points are stored as rows of C doubles (`array('d')`), not as one `Sums` object each, and only the last
5 minutes keep every point: older points are kept at least `COARSE_STEP_SECONDS` apart. So the 1m and 5m
windows are exact at the scrape resolution, while the 1h window's base may be up to 15 s older than an
hour (its span, and so its ratio, stays true: Δ over the real span). An hour of 5 s points for one route
is about 25 KB instead of about 480 KB as `Sums` objects (docs/benchmarks.md, Overhead).
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from typing import Mapping, NamedTuple, Sequence

from specwatch.snapshot import WINDOW_SECONDS

# Beyond this many points the ring thins itself, so even a misconfigured 10 ms interval stays bounded.
MAX_POINTS = 4096
# Points younger than this are all kept (the 1m and 5m windows are exact); older ones this far apart.
EXACT_SECONDS = WINDOW_SECONDS["5m"]
COARSE_STEP_SECONDS = 15.0
# Dropped rows are removed from the front of the arrays in batches of at least this many (one memmove).
_COMPACT_ROWS = 64


class Sums(NamedTuple):
    """Cumulative sums of one route since tracking started; every field only grows.

    Counter routes fill drafts/draft_tokens/accepted/per_pos. Gauge routes (SGLang interval gauges) fill
    the weights (running requests) and the weighted gauge values, so a window's mean is a batch-weighted
    mean: Σ(ratio x running) / Σ(running).

    A NamedTuple: immutable, and cheap to build (tracking builds a few dozen per route and cycle).
    """

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_pos: tuple[float, ...] = ()
    gauge_ratio_weight: float = 0.0
    gauge_ratio_weighted: float = 0.0
    gauge_length_weight: float = 0.0
    gauge_length_weighted: float = 0.0
    generation_tokens: float = 0.0  # tokens the route generated: with no drafts, speculation was inactive

    def plus(self, other: "Sums") -> "Sums":
        return _combine(self, other, 1.0)

    def minus(self, other: "Sums") -> "Sums":
        return _combine(self, other, -1.0)


# The scalar fields in row order; a row is these followed by the per-position sums.
_SCALARS = (
    "drafts",
    "draft_tokens",
    "accepted",
    "gauge_ratio_weight",
    "gauge_ratio_weighted",
    "gauge_length_weight",
    "gauge_length_weighted",
    "generation_tokens",
)
_NS = len(_SCALARS)


def _sums_of(row: Sequence[float], positions: int) -> Sums:
    """The Sums a stored row holds (the inverse of `append`'s layout: the scalars, then the positions)."""
    return Sums(**dict(zip(_SCALARS, row)), per_pos=tuple(row[_NS : _NS + positions]))


def _combine(a: Sums, b: Sums, sign: float) -> Sums:
    return Sums(
        drafts=a.drafts + sign * b.drafts,
        draft_tokens=a.draft_tokens + sign * b.draft_tokens,
        accepted=a.accepted + sign * b.accepted,
        per_pos=_add_positions(a.per_pos, b.per_pos, sign),
        gauge_ratio_weight=a.gauge_ratio_weight + sign * b.gauge_ratio_weight,
        gauge_ratio_weighted=a.gauge_ratio_weighted + sign * b.gauge_ratio_weighted,
        gauge_length_weight=a.gauge_length_weight + sign * b.gauge_length_weight,
        gauge_length_weighted=a.gauge_length_weighted + sign * b.gauge_length_weighted,
        generation_tokens=a.generation_tokens + sign * b.generation_tokens,
    )


def _add_positions(a: tuple[float, ...], b: tuple[float, ...], sign: float) -> tuple[float, ...]:
    if not b:
        return a
    # k can grow (a reconfigured engine); a position not seen yet counts as 0.
    n = max(len(a), len(b))
    a = a + (0.0,) * (n - len(a))
    b = b + (0.0,) * (n - len(b))
    return tuple(x + sign * y for x, y in zip(a, b))


class WindowRing:
    """Cumulative `Sums` points over the longest window, with bounded memory.

    Rows live in three flat arrays: timestamps, values (`_NS` scalars then `_width - _NS` positions, a
    position a point did not have stored as 0) and each point's own number of positions, so a point reads
    back exactly as it was appended. Rows before `_first` have left the horizon and are dropped in batches.
    """

    def __init__(
        self,
        horizon_seconds: float = max(WINDOW_SECONDS.values()),
        max_points: int = MAX_POINTS,
        exact_seconds: float = EXACT_SECONDS,
        coarse_step_seconds: float = COARSE_STEP_SECONDS,
    ) -> None:
        self.horizon_seconds = horizon_seconds
        self.max_points = max_points
        self.exact_seconds = exact_seconds
        self.coarse_step = coarse_step_seconds
        self._exact_from = 0  # first row of the exact region: the base of an `exact_seconds` window
        self._ts = array("d")
        self._values = array("d")
        self._npos = array("H")
        self._width = _NS
        self._first = 0
        self._cache: dict[float, tuple[Sums, float] | None] = {}  # window -> delta, until the next append

    def __len__(self) -> int:
        return len(self._ts) - self._first

    @property
    def latest(self) -> Sums:
        return self._row(len(self._ts) - 1) if len(self) else Sums()

    def append(self, ts: float, sums: Sums) -> None:
        self._cache.clear()
        if len(sums.per_pos) > self._width - _NS:
            self._widen(len(sums.per_pos))
        row = [*(getattr(sums, name) for name in _SCALARS), *sums.per_pos]
        row += (0.0,) * (self._width - len(row))
        if len(self._ts) > self._first and ts <= self._ts[-1]:
            # A clock step backwards (or a duplicate tick): replace rather than break time order.
            self._values[-self._width :] = array("d", row)
            self._npos[-1] = len(sums.per_pos)
            return
        self._ts.append(ts)
        self._values.extend(row)
        self._npos.append(len(sums.per_pos))
        # Keep one point at or before the horizon's start: it is the base of the longest window.
        start = ts - self.horizon_seconds
        ts_col, last = self._ts, len(self._ts) - 1
        while self._first < last and ts_col[self._first + 1] <= start:
            self._first += 1
        self._coarsen(ts)
        points = len(ts_col) - self._first
        if points > self.max_points:
            self._thin()
        elif self._first >= _COMPACT_ROWS and self._first >= points // 8:
            self._compact()

    def _coarsen(self, end_ts: float) -> None:
        """Rows leaving the exact region are kept only `coarse_step` after the previous kept one."""
        ts_col, w = self._ts, self._width
        self._exact_from = max(self._exact_from, self._first)
        boundary = end_ts - self.exact_seconds
        while self._exact_from + 1 < len(ts_col) and ts_col[self._exact_from + 1] <= boundary:
            r = self._exact_from  # no longer the base of any exact window
            if r > self._first and ts_col[r] - ts_col[r - 1] < self.coarse_step:
                del ts_col[r]
                del self._values[r * w : (r + 1) * w]
                del self._npos[r]
            else:
                self._exact_from += 1

    def _widen(self, positions: int) -> None:
        old, width = self._width, _NS + positions
        values = array("d")
        for r in range(len(self._ts)):
            values.extend(self._values[r * old : (r + 1) * old])
            values.extend((0.0,) * (width - old))
        self._values, self._width = values, width

    def _compact(self) -> None:
        n = self._first
        del self._ts[:n]
        del self._values[: n * self._width]
        del self._npos[:n]
        self._first = 0
        self._exact_from -= n

    def _thin(self) -> None:
        # Drop every other point except the first and last; windows stay correct, only coarser at the base.
        self._compact()
        n, w = len(self._ts), self._width
        keep = [0, *range(1, n - 1, 2), n - 1]
        self._ts = array("d", (self._ts[r] for r in keep))
        self._npos = array("H", (self._npos[r] for r in keep))
        values = array("d")
        for r in keep:
            values.extend(self._values[r * w : (r + 1) * w])
        self._values = values
        self._exact_from = 0  # rows re-enter the exact region check from the start on the next append

    def _row(self, r: int) -> Sums:
        w = self._width
        return _sums_of(self._values[r * w : (r + 1) * w], self._npos[r])

    def delta(self, window_seconds: float) -> tuple[Sums, float] | None:
        """(newest - base, span in seconds) for a window ending at the newest point; None without two points."""
        if window_seconds not in self._cache:  # None is a valid delta, so membership, not a None check
            self._cache[window_seconds] = self._delta(window_seconds)
        return self._cache[window_seconds]

    def _delta(self, window_seconds: float) -> tuple[Sums, float] | None:
        ts, first = self._ts, self._first
        end = len(ts) - 1
        if end <= first:  # fewer than two points
            return None
        end_ts = ts[end]
        # Newest point at or before the window start (the oldest when history is shorter). Timestamps are
        # strictly increasing, so a binary search replaces a scan of up to an hour of points per window.
        base = bisect_right(ts, end_ts - window_seconds, first, end + 1) - 1
        if base < first:
            base = first
        base_ts = ts[base]
        if base_ts == end_ts:
            return None
        w, vals = self._width, self._values
        diff = [x - y for x, y in zip(vals[end * w : (end + 1) * w], vals[base * w : (base + 1) * w])]
        return _sums_of(diff, max(self._npos[end], self._npos[base])), end_ts - base_ts

    def deltas(self, windows: Mapping[str, float] = WINDOW_SECONDS) -> dict[str, Sums]:
        out = {}
        for name, seconds in windows.items():
            d = self.delta(seconds)
            if d is not None:
                out[name] = d[0]
        return out
