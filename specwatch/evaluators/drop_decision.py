"""The drop decision: given the reference baseline r0, has a route's acceptance fallen to (1 - drop) x r0?

`DropDecision` owns the evidence and the verdict, not the baseline (evaluators/baseline_selection.py chooses that):

1. Hypotheses (`DropHypotheses`): r_ok = (1 - drop/3) r0 and r_bad = (1 - drop) r0 (0.95 and 0.85 for drop 0.15),
   r0 first lowered by two of its own standard errors, so that a baseline learned from little traffic cannot page
   on its own noise; by time of day when the baseline has a usable daily profile (stats/daily.py), lowered by 1%
   and two of its standard errors.
2. Evidence: a one-sided Bernoulli CUSUM between r_ok and r_bad, each block's log-likelihood ratio divided by its
   design effect φ0 + β·D (one request weighs as one request however long); after a model change a Wald SPRT on
   the same ratio judges the new model against the old baseline.
3. Page (`degraded`) when S >= h (h lowered on quiet routes so that false alarms per hour, not per token, stay
   those of a busy route, but against a flat r0 never below a driftless CUSUM's reach over a misfit stretch), the
   excursion has lasted `min_duration` and holds `min_drafted_tokens`, or the SPRT says "regressed"; and the
   short-window Wilson upper bound is below r_ok (the drop is still going on).
4. Resolve when the short-window Wilson lower bound is above (1 - 2 drop/3) r0 (0.90 r0); S restarts at 0.

`CollapseCheck` is the baseline-free check beside it: a broken drafter pages at once.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

from specwatch.config import DetectionConfig
from specwatch.state.baselines import Baseline
from specwatch.stats.cusum import Cusum, LogLikelihoodRatio, Sprt
from specwatch.stats.daily import DailyProfile
from specwatch.stats.evidence import (
    MIN_ADAPTED_THRESHOLD,
    OpenBlock,
    ShortWindow,
    TrafficRate,
    adapted_threshold,
    misfit_threshold,
)
from specwatch.stats.horizon import NEVER_SECONDS, traffic_horizon
from specwatch.stats.overdispersion import DispersionModel
from specwatch.stats.wilson import wilson_bounds

log = logging.getLogger(__name__)

BASELINE_STDERR_DISCOUNT = 2.0  # r0 is lowered by this many standard errors before testing
CUSUM_CAP_FACTOR = 2.0  # S is capped at this x h so that it drains quickly after a recovery
# The confirmation window stretches back until it holds this many effective (drafted / φ) tokens, so that
# on a quiet route it has the power to confirm a real drop instead of vetoing it on noise.
CONFIRM_MIN_EFFECTIVE_TOKENS = 300.0
# A broken drafter (reports of 0-2% after a model or port change, vllm#55605): acceptance at or below this over
# the confirmation window pages with or without a baseline; it clears above COLLAPSE_RESOLVE_RATIO. No working
# drafter of the shared note's profiles comes near it: their worst requests (κ 10) accept about 10x more.
COLLAPSE_RATIO = 0.05
COLLAPSE_RESOLVE_RATIO = 0.10
CONFIRM_MIN_GAUGE_READINGS = 3  # readings with requests running that a gauge route's collapse needs
# One harmonic is a model of the day, not the day: r0(t) is lowered by this share beside its standard errors, so a
# 5% drift stays inside the zone where the real pattern departs from the sinusoid by up to a percent.
PROFILE_MISFIT = 0.01
HORIZON_MAX_SECONDS = NEVER_SECONDS
HORIZON_TRAFFIC_SECONDS = 3600.0  # the detection horizon is quoted at the drafted-token rate of about the last hour


@dataclass(frozen=True)
class DropHypotheses:
    """The hypotheses derived from one reference baseline: r_ok = (1 - drop/3) r0', r_bad = (1 - drop) r0' and
    r_resolve = (1 - 2 drop/3) r0', r0' the baseline lowered by its standard errors; by time of day when the
    baseline has a usable daily profile."""

    llr_flat: LogLikelihoodRatio
    r0: float  # r0' of the flat baseline
    drop: float
    dispersion: DispersionModel
    daily: DailyProfile | None = None  # used when set: r0'(t) = profile(t) - discount

    def reference(self, ts: float) -> float:
        """r0' at `ts`."""
        d = self.daily
        if d is None:
            return self.r0
        r = d.at(ts)
        return max(0.5 * r, r * (1.0 - PROFILE_MISFIT) - BASELINE_STDERR_DISCOUNT * d.stderr)

    def r_ok(self, ts: float) -> float:
        return (1.0 - self.drop / 3.0) * self.reference(ts)

    def r_resolve(self, ts: float) -> float:
        return (1.0 - 2.0 * self.drop / 3.0) * self.reference(ts)

    def llr(self, accepted: float, drafted: float, ts: float) -> float:
        if self.daily is None:
            return self.llr_flat(accepted, drafted)
        r0 = self.reference(ts)
        r_ok, r_bad = (1.0 - self.drop / 3.0) * r0, (1.0 - self.drop) * r0
        if not 0.0 < r_bad < r_ok < 1.0:
            return self.llr_flat(accepted, drafted)
        return LogLikelihoodRatio.between(r_ok, r_bad, self.dispersion)(accepted, drafted)

    def effective_tokens(self, window: ShortWindow) -> float:
        """Independent-token equivalent of the window: (Σ D)² / Σ D·φ(D), the n of its Wilson bounds."""
        m = self.dispersion
        weighted = m.intercept * window.drafted + m.slope * window.drafted_sq
        return window.drafted * window.drafted / weighted if weighted > 0 else 0.0


class CollapseCheck:
    """Has the drafter broken (acceptance <= COLLAPSE_RATIO)? Needs no baseline, so it pages from the first window.

    Counters: the confirmation window stretched back to `min_tokens` drafted tokens. Gauges: the readings of the
    confirmation window taken with requests running, at least CONFIRM_MIN_GAUGE_READINGS of them.
    """

    def __init__(self, seconds: float, min_tokens: float) -> None:
        self.seconds = seconds
        self.window = ShortWindow(seconds, min_tokens)
        self.readings: deque[tuple[float, float, float]] = deque()
        self.collapsed = False

    def add_counts(self, now: float, accepted: float, drafted: float) -> bool:
        w = self.window
        w.add(now, accepted, drafted)
        if w.drafted > 0 and w.drafted >= w.min_tokens:
            self._judge(w.accepted / w.drafted)
        return self.collapsed

    def add_gauge(self, now: float, reading: float | None, weight: float) -> bool:
        r = self.readings
        if reading is not None and weight > 0:
            r.append((now, reading, weight))
        while r and now - r[0][0] > self.seconds:
            r.popleft()
        if len(r) >= CONFIRM_MIN_GAUGE_READINGS:
            self._judge(sum(x * w for _, x, w in r) / sum(w for _, _, w in r))
        return self.collapsed

    def _judge(self, ratio: float) -> None:
        if not self.collapsed and ratio <= COLLAPSE_RATIO:
            self.collapsed = True
        elif self.collapsed and ratio > COLLAPSE_RESOLVE_RATIO:
            self.collapsed = False

    def clear(self) -> None:
        self.window.clear()
        self.readings.clear()


class DropDecision:
    """The CUSUM/SPRT verdict of one counter route against the baseline it is given (see module docstring)."""

    def __init__(self, route: str, cfg: DetectionConfig) -> None:
        self.route = route
        self.cfg = cfg
        self.reference: Baseline | None = None  # the baseline under test
        self.hypotheses: DropHypotheses | None = None  # None: no baseline, or one too close to 1 to test
        self.cusum = Cusum(cap=CUSUM_CAP_FACTOR * cfg.cusum_threshold)
        self.sprt: Sprt | None = None  # running while a changed model is judged against the old baseline
        self.degraded = False
        self.window = ShortWindow(cfg.confirm_window_seconds, cfg.min_drafted_tokens)
        self.traffic = TrafficRate()
        # the evidence rate the detection horizon is quoted at: the last hour, not the day h is adapted to
        self.recent_traffic = TrafficRate(HORIZON_TRAFFIC_SECONDS)
        self.recent_evidence = TrafficRate(HORIZON_TRAFFIC_SECONDS)  # Σ D / φ(D) of the closed blocks
        self.block = OpenBlock(cfg.block_seconds)

    # ------------------------------------------------------------------ the baseline under test
    def use(self, baseline: Baseline, keep_evidence: bool = False) -> None:
        """Test against `baseline` from now on; S restarts at 0 unless `keep_evidence` (the same baseline refined)."""
        self.reference = baseline
        r0 = baseline.acceptance_ratio * max(0.5, 1.0 - BASELINE_STDERR_DISCOUNT * baseline.relative_stderr())
        drop = self.cfg.drop
        r_ok, r_bad = r0 * (1.0 - drop / 3.0), r0 * (1.0 - drop)
        if not 0.0 < r_bad < r_ok < 1.0:
            log.warning(
                "route %s: baseline %.4f leaves no room to test a drop; detection is off",
                self.route,
                baseline.acceptance_ratio,
            )
            self.hypotheses = None
            return
        phi = max(1.0, baseline.overdispersion)
        self.window.min_tokens = max(self.cfg.min_drafted_tokens, CONFIRM_MIN_EFFECTIVE_TOKENS * phi)
        model = baseline.dispersion_model()
        daily = baseline.daily if baseline.daily is not None and baseline.daily.usable else None
        llr_flat = LogLikelihoodRatio.between(r_ok, r_bad, model)
        # against the profile, blocks are weighed by the design effect of their deviations from it (stats/daily.py)
        self.hypotheses = DropHypotheses(llr_flat, r0, drop, model if daily is None else daily.dispersion, daily)
        if not keep_evidence:
            self.cusum.reset()

    def forget(self) -> None:
        """No baseline any more (an operator reset or accept): every piece of evidence goes with it."""
        self.reference, self.hypotheses, self.sprt, self.degraded = None, None, None, False
        self.cusum.reset()
        self.clear_windows()

    def clear_windows(self) -> None:
        """A new model: the confirmation window and the open block held the old one's traffic."""
        self.window.clear()
        self.block.clear()

    def baseline_ratio(self, ts: float | None) -> float:
        """The reference's r0 at `ts`: by time of day when its daily profile is in use."""
        ref = self.reference
        assert ref is not None
        daily = self.hypotheses.daily if self.hypotheses is not None else None
        return ref.acceptance_ratio if daily is None or ts is None else daily.at(ts)

    # ------------------------------------------------------------------ the cycle
    def add(self, now: float, accepted: float, drafted: float) -> None:
        """One interval's counts into the confirmation window and the traffic rate."""
        self.window.add(now, accepted, drafted)
        self.traffic.add(now, drafted)
        self.recent_traffic.add(now, drafted)

    def weigh(self, block: tuple[float, float, float] | None) -> None:
        """Evidence is weighed per block, the unit its design effect was fitted on."""
        if block is None or self.hypotheses is None:
            return
        block_start, block_accepted, block_drafted = block
        llr = self.hypotheses.llr(block_accepted, block_drafted, block_start)
        self.recent_evidence.add(block_start, block_drafted / self.hypotheses.dispersion.at(block_drafted))
        self.cusum.update(llr, block_drafted, block_start)
        if self.sprt is not None:
            self.sprt.update(llr, block_drafted)

    def threshold(self, now: float) -> float:
        """h for this route now: the configured h, lowered on a quiet route (see `adapted_threshold`), but against a
        flat r0 never below a driftless CUSUM's reach over a misfit stretch (`misfit_threshold`)."""
        rate = self.traffic.per_second(now, self.cfg.warmup_seconds)
        if rate is None or self.reference is None:
            return self.cfg.cusum_threshold
        effective = rate / max(1.0, self.reference.overdispersion)
        test = self.hypotheses
        floor = MIN_ADAPTED_THRESHOLD
        if test is not None and test.daily is None:
            floor = max(floor, misfit_threshold(test.llr_flat.neutral_spread(), effective))
        return adapted_threshold(self.cfg.cusum_threshold, effective, floor)

    def quiet(self, threshold: float) -> bool:
        """No hint of a drop: not degraded and S below half of h."""
        return not self.degraded and self.cusum.statistic < threshold / 2

    def decide(self, now: float, threshold: float) -> None:
        window, reference, test = self.window, self.reference, self.hypotheses
        assert reference is not None and test is not None
        n_eff = test.effective_tokens(window)
        lower, upper = wilson_bounds(n_eff * window.accepted / window.drafted if window.drafted > 0 else 0.0, n_eff)
        if not self.degraded:
            c, cfg = self.cusum, self.cfg
            by_cusum = (
                c.statistic >= threshold
                and c.excursion_seconds(now) >= cfg.min_duration_seconds
                and c.excursion_tokens >= cfg.min_drafted_tokens
            )
            by_sprt = (
                self.sprt is not None
                and self.sprt.verdict == "regressed"
                and self.sprt.tokens >= cfg.min_drafted_tokens
            )
            if (by_cusum or by_sprt) and upper < test.r_ok(now):
                self.degraded = True
                log.warning(
                    "route %s: acceptance dropped: %.3f over the short window vs baseline %.3f (%s)",
                    self.route,
                    self.window.ratio() or 0.0,
                    reference.acceptance_ratio,
                    "CUSUM" if by_cusum else "SPRT after a model change",
                )
        elif lower > test.r_resolve(now):
            self.degraded = False
            self.cusum.reset()
            if self.sprt is not None:
                self.sprt = Sprt()  # judge the recovered model afresh before adopting it
            log.info(
                "route %s: acceptance back to baseline (%.3f vs %.3f)",
                self.route,
                self.window.ratio() or 0.0,
                reference.acceptance_ratio,
            )

    def horizon_inputs(self, now: float) -> dict[str, Any] | None:
        """The arguments of `traffic_horizon` for this route now; None before the rate is known."""
        test = self.hypotheses
        rate = self.recent_traffic.per_second(now, 0.0)
        if test is None or rate is None:
            return None
        cfg = self.cfg
        return {
            "r0": self.baseline_ratio(now),
            "r0_tested": test.reference(now),
            "drop": test.drop,
            "dispersion": test.dispersion,
            "threshold": self.threshold(now),
            "drafted_per_second": rate,
            "effective_per_second": self.recent_evidence.per_second(now, 0.0),
            "block_seconds": cfg.block_seconds,
            "min_duration_seconds": cfg.min_duration_seconds,
            "confirm_window_seconds": cfg.confirm_window_seconds,
            "window_min_tokens": self.window.min_tokens,
        }

    def horizon(self, now: float) -> float | None:
        """Expected seconds to page a HORIZON_DROP drop at the last hour's evidence rate (stats/horizon.py); None
        before the rate is known. Capped at a year: an exported value is finite, and "never" reads as a year."""
        inputs = self.horizon_inputs(now)
        return None if inputs is None else min(traffic_horizon(**inputs), HORIZON_MAX_SECONDS)

    def fields(self, ts: float | None) -> dict[str, Any]:
        current = self.window.ratio()
        r0 = self.baseline_ratio(ts)
        reference = self.reference
        key = reference.key if reference is not None else None
        return {
            "baseline_ratio": r0,
            "baseline_model": key.model_name if key is not None else "",
            "baseline_engine_version": key.engine_version if key is not None else "",
            "baseline_draft_length": key.k if key is not None else None,
            "baseline_drafter": key.drafter if key is not None else "",
            "baseline_source": reference.source if reference is not None else "",
            "baseline_overdispersion": reference.overdispersion if reference is not None else None,
            "degraded": self.degraded,
            "cusum_statistic": self.cusum.statistic,
            "drop_ratio": None if current is None else 1.0 - current / r0,
            "traffic_horizon_seconds": None if ts is None else self.horizon(ts),
        }
