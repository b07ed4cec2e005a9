"""The acceptance-drop detector of a route that reports acceptance only as a gauge (docs/detection.md §2.8).

SGLang before 0.5.13 (interval gauges, `acceptance_source` "gauge") and vLLM V0 (a lifetime gauge, "lifetime_gauge")
carry no token counts, so `AcceptanceDropEvaluator` hands such routes to this class. It learns r0 and the spread of
1-minute block means (stats/gauge.py), runs a Gaussian CUSUM with the same indifference zone, and pages when S
>= h (twice `cusum_threshold`), the excursion has lasted `min_duration` and the confirmation window's mean reading
is below r_ok; it resolves when that mean is back above (1 - 2 drop/3) r0.

A model change keeps the old baseline as the reference (a regression that came with it pages through the
CUSUM) and adopts the new key's own after `adopt_after` without a page. Baselines live in the route's
persisted detector state, not in the baseline table: `specwatch baseline` does not list them.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from specwatch.config import DetectionConfig
from specwatch.stats.cusum import Cusum
from specwatch.stats.gauge import GaugeBlocks, GaugeLearner, GaugeLlr, GaugeReference

log = logging.getLogger(__name__)

GAUGE_SOURCES = frozenset({"gauge", "lifetime_gauge"})
CONFIRM_MIN_READINGS = 3  # the confirmation window stretches back until it holds this many readings
# h of a gauge route, as a multiple of `cusum_threshold`. A block mean carries much evidence at once (gap/σ ≈ 2
# at 0.5 req/s) but its tails are heavier than a Gaussian's, and a route has 1,440 blocks a day: at 1x, 5%
# drifts paged within two days at 0.5 req/s; at 2x a 20% drop still takes only a few blocks more.
GAUGE_THRESHOLD_FACTOR = 2.0


class GaugeDrop:
    """One route's gauge path: blocks -> learner / CUSUM -> degraded. Not thread-safe (the daemon loop owns it)."""

    def __init__(self, route: str, cfg: DetectionConfig) -> None:
        self.route, self.cfg = route, cfg
        self.blocks = GaugeBlocks()
        self.learner = GaugeLearner()
        self.reference: GaugeReference | None = None
        self.cusum = Cusum(cap=2.0 * GAUGE_THRESHOLD_FACTOR * cfg.cusum_threshold)
        self.degraded = False
        self.change_ts: float | None = None
        self.window: deque[tuple[float, float, float]] = deque()  # (ts, reading, weight) with traffic

    # ------------------------------------------------------------------ the cycle
    def observe(self, now: float, reading: float | None, weight: float, lifetime: bool) -> None:
        if reading is None or weight <= 0:
            return
        self._add_to_window(now, reading, weight)
        closed = self.blocks.add(now, reading, weight)
        if closed is None:
            return
        block_start, block_mean = closed
        ref = self.reference
        if ref is None:
            self.learner.add(now, block_mean)
            if self.learner.has(now, self.cfg.warmup_seconds):
                self._learn(now, lifetime)
            return
        r_ok, r_bad, r_resolve = self._levels(ref)
        self.cusum.update(GaugeLlr(r_ok, r_bad, ref.sd)(block_mean), 0.0, block_start)
        threshold = GAUGE_THRESHOLD_FACTOR * self.cfg.cusum_threshold
        own = self.change_ts is None
        if not own or (not self.degraded and self.cusum.statistic < threshold / 2):
            self.learner.add(now, block_mean)
        current = self.window_mean()
        if not self.degraded:
            if (
                self.cusum.statistic >= threshold
                and self.cusum.excursion_seconds(now) >= self.cfg.min_duration_seconds
                and current is not None
                and current < r_ok
            ):
                self.degraded = True
                log.warning("route %s: acceptance gauge dropped: %.3f vs baseline %.3f", self.route, current, ref.r0)
        elif current is not None and current > r_resolve:
            self.degraded = False
            self.cusum.reset()
        if own and not ref.pinned:
            self._learn(now, lifetime)  # refine on quiet traffic until pinned
        elif not own and self._adoptable(now):
            self.change_ts = None
            self._adopt(now, lifetime)

    def _learn(self, now: float, lifetime: bool) -> None:
        r0, sd = self.learner.baseline(lifetime)
        pinned = self.learner.seconds(now) >= self.cfg.pin_seconds
        first = self.reference is None
        self.reference = GaugeReference(r0, sd, pinned, lifetime)
        if first:
            log.info("route %s: learned gauge baseline %.3f (sd %.3f per block)", self.route, r0, sd)

    def _adopt(self, now: float, lifetime: bool) -> None:
        self.reference = None
        self._learn(now, lifetime)
        self.cusum.reset()
        if self.reference is not None:
            log.info("route %s: adopted the changed model's gauge baseline %.3f", self.route, self.reference.r0)

    def _adoptable(self, now: float) -> bool:
        return (
            not self.degraded
            and self.change_ts is not None
            and now - self.change_ts >= self.cfg.adopt_after_seconds
            and self.learner.has(now, self.cfg.warmup_seconds)
        )

    def model_changed(self, now: float) -> None:
        """A new model, engine version or k: the old baseline stays the reference; the new key learns its own."""
        self.learner = GaugeLearner()
        self.blocks.clear()
        self.window.clear()
        self.change_ts = now if self.reference is not None else None

    def acceptable(self, now: float) -> float | None:
        """The r0 an operator's accept would adopt from the current key's blocks; None without enough of them."""
        if not self.learner.has(now, 0.0):
            return None
        return self.learner.baseline(self.reference.lifetime if self.reference else False)[0]

    def accept(self, now: float) -> None:
        """An operator's accept: the current key's learned r0 is the reference from now on, nothing pending."""
        lifetime = self.reference.lifetime if self.reference else False
        self.change_ts = None
        self.degraded = False
        self._adopt(now, lifetime)

    def reset(self) -> None:
        """Operator reset / accept: forget everything and learn again."""
        self.__init__(self.route, self.cfg)  # type: ignore[misc]

    # ------------------------------------------------------------------ results
    def _levels(self, ref: GaugeReference) -> tuple[float, float, float]:
        drop = self.cfg.drop
        return ref.r0 * (1.0 - drop / 3.0), ref.r0 * (1.0 - drop), ref.r0 * (1.0 - 2.0 * drop / 3.0)

    def _add_to_window(self, now: float, reading: float, weight: float) -> None:
        w = self.window
        w.append((now, reading, weight))
        while len(w) > CONFIRM_MIN_READINGS and now - w[0][0] > self.cfg.confirm_window_seconds:
            w.popleft()

    def window_mean(self) -> float | None:
        """The confirmation window's weighted mean reading (a lifetime gauge: its latest reading)."""
        if len(self.window) < CONFIRM_MIN_READINGS:
            return None
        if self.reference is not None and self.reference.lifetime:
            return self.window[-1][1]
        weight = sum(w for _, _, w in self.window)
        return sum(x * w for _, x, w in self.window) / weight

    def fields(self) -> dict[str, Any]:
        ref = self.reference
        if ref is None:
            return {}
        current = self.window_mean()
        return {
            "baseline_ratio": ref.r0,
            "degraded": self.degraded,
            "cusum_statistic": self.cusum.statistic,
            "drop_ratio": None if current is None else 1.0 - current / ref.r0,
        }

    # ------------------------------------------------------------------ persistence
    def to_json(self) -> dict[str, Any]:
        c = self.cusum
        return {
            "reference": self.reference.to_json() if self.reference else None,
            "learner": self.learner.to_json(),
            "cusum": [c.statistic, c.excursion_start],
            "degraded": self.degraded,
            "change_ts": self.change_ts,
        }

    def restore(self, raw: dict[str, Any]) -> None:
        self.reference = GaugeReference.from_json(raw["reference"]) if raw["reference"] else None
        self.learner = GaugeLearner.from_json(raw["learner"])
        statistic, start = raw["cusum"]
        self.cusum.statistic, self.cusum.excursion_start = min(float(statistic), self.cusum.cap), start
        self.degraded, self.change_ts = bool(raw["degraded"]), raw["change_ts"]
