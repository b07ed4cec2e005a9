"""The compact window ring: 1m/5m exact at the scrape resolution, the 1h window at most a step coarser."""

from __future__ import annotations

import math
import random

import pytest

from specwatch.tracking.windows import COARSE_STEP_SECONDS, Sums, WindowRing


def feed(rings, steps, seed=7):
    rng = random.Random(seed)
    ts, total, k = 1_700_000_000.0, Sums(), 3
    for i in range(steps):
        ts += rng.choice([5.0, 5.0, 5.0, 4.9, 5.2, 1.0, 12.0, 60.0])
        if i == steps // 2:
            k = 4  # the engine's k grows mid-way: old points read back with their own width
        inc = Sums(
            drafts=float(rng.randint(0, 50)),
            draft_tokens=float(rng.randint(0, 200)),
            accepted=float(rng.randint(0, 150)),
            per_pos=tuple(float(rng.randint(0, 40)) for _ in range(k)),
        )
        total = total.plus(inc)
        for ring in rings:
            ring.append(ts, total)
        yield ts


def test_short_windows_are_exact_and_the_hour_at_most_one_step_coarser():
    compact, full = WindowRing(3600), WindowRing(3600, exact_seconds=math.inf)
    for n, _ in enumerate(feed([compact, full], 3000)):
        if n % 37:
            continue
        for window in (60.0, 300.0):
            assert compact.delta(window) == full.delta(window)
        got, want = compact.delta(3600.0), full.delta(3600.0)
        if want is None:
            assert got is None
            continue
        assert got[1] >= want[1] and got[1] <= want[1] + COARSE_STEP_SECONDS + 60.0
        assert got[0].drafts >= want[0].drafts  # a longer span only adds counts
    assert compact.latest == full.latest
    assert len(compact) < len(full) / 2


def test_an_hour_of_5s_points_is_about_280_rows():
    ring = WindowRing(3600)
    for i in range(2000):
        ring.append(i * 5.0, Sums(drafts=float(i), per_pos=(float(i),) * 4))
    assert 60 + 3300 / COARSE_STEP_SECONDS <= len(ring) <= 60 + 3300 / COARSE_STEP_SECONDS + 3
    d, span = ring.delta(3600.0)
    assert span == pytest.approx(3600.0, abs=COARSE_STEP_SECONDS) and d.drafts == span / 5.0
    d, span = ring.delta(300.0)
    assert span == 300.0 and d.drafts == 60.0 and d.per_pos == (60.0,) * 4
