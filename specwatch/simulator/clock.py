"""Simulated time: seconds since the simulator started, running `time_scale` times faster than real time."""

from __future__ import annotations

import time
from typing import Callable


class SimClock:
    def __init__(self, time_scale: float = 1.0, monotonic: Callable[[], float] = time.monotonic) -> None:
        if not time_scale > 0:
            raise ValueError(f"time scale must be > 0, got {time_scale!r}")
        self.time_scale = float(time_scale)
        self._monotonic = monotonic
        self._start = monotonic()

    def now(self) -> float:
        """Simulated seconds since start."""
        return (self._monotonic() - self._start) * self.time_scale

    def real_seconds(self, sim_seconds: float) -> float:
        """How long `sim_seconds` of simulated time take in real time."""
        return sim_seconds / self.time_scale
