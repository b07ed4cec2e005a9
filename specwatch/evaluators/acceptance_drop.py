"""Acceptance-drop detector: has a route's draft acceptance fallen to (1 - drop) x its baseline?

Per route and cycle (docs/detection.md has the reasoning and the tuning guide):

1. Learn: the first `warmup` tokens of a (model, engine version, k) key give a provisional baseline r0 with
   its overdispersion φ. It keeps refining on quiet traffic until `pin_drafted_tokens` or `pin_duration`,
   then it is pinned. A baseline pinned in the config is used as is.
2. Evidence: a one-sided Bernoulli CUSUM between r_ok = (1 - drop/3) r0 and r_bad = (1 - drop) r0 (0.95 and
   0.85 for drop 0.15), each 1-minute block's log-likelihood ratio divided by its design effect φ0 + β·D
   (one request weighs as one request however long). r0 is first lowered by two of its own standard errors, so a
   baseline learned from little traffic cannot page on its own noise. Once the first day's traffic knows the
   route's daily pattern, r0 follows the time of day (stats/daily.py), lowered by 1% and two of its standard
   errors, and blocks are weighed by their design effect about that profile.
3. Page (`degraded`) when S >= h (h lowered on quiet routes so that false alarms per hour, not per token,
   stay those of a busy route), the excursion has lasted `min_duration` and holds `min_drafted_tokens`,
   and the short-window Wilson upper bound is below r_ok (the drop is still going on).
4. Resolve when the short-window Wilson lower bound is above (1 - 2 drop/3) r0 (0.90 r0); S restarts at 0.
   A broken drafter (acceptance <= COLLAPSE_RATIO over the confirmation window) pages at once, with or
   without a baseline (`CollapseCheck`).
5. Model change (new model, engine version, or k with an engine restart; a k that moves without one is the
   engine's own schedule and changes nothing): the old baseline stays the reference, a Wald SPRT on the
   same likelihood ratio gives a verdict ("regressed" pages like the CUSUM), the new key learns its own
   baseline, adopted after `adopt_after` with a "no_regression" verdict and no page.
6. Gauge-only sources (SGLang < 0.5.13, vLLM V0) go to `GaugeDrop`, a lower-power detector on the readings.

Cost per cycle: a few float operations; the store writes only on learning events and every persist period.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from specwatch.config import DetectionConfig, PinnedBaseline, RouteConfig
from specwatch.stats.cusum import Cusum, LogLikelihoodRatio, Sprt
from specwatch.stats.daily import DailyProfile
from specwatch.stats.evidence import OpenBlock, ShortWindow, TrafficRate, adapted_threshold
from specwatch.stats.overdispersion import DispersionEstimator, DispersionModel
from specwatch.stats.wilson import wilson_bounds
from specwatch.evaluators.base import EvaluatorContext
from specwatch.evaluators.gauge_drop import GAUGE_SOURCES, GaugeDrop
from specwatch.snapshot import GpuSample, RouteObservation
from specwatch.state.baselines import Baseline, BaselineKey, BaselineLearner
from specwatch.state.store import StateStore

log = logging.getLogger(__name__)

STORE_KEY = "baseline_store"
STATE_VERSION = 1
BASELINE_STDERR_DISCOUNT = 2.0  # r0 is lowered by this many standard errors before testing
CUSUM_CAP_FACTOR = 2.0  # S is capped at this x h so that it drains quickly after a recovery
REFRESH_GROWTH = 1.25  # a provisional baseline is recomputed when its sample has grown by this factor
# φ is a variance estimate with heavy tails: pinning on tokens alone needs this many 1-minute blocks too
PIN_MIN_BLOCKS = 240
# The confirmation window stretches back until it holds this many effective (drafted / φ) tokens, so that
# on a quiet route it has the power to confirm a real drop instead of vetoing it on noise.
CONFIRM_MIN_EFFECTIVE_TOKENS = 300.0
# A broken drafter (reports of 0-2% after a model or port change, vllm#55605): acceptance at or below this over
# the confirmation window pages with or without a baseline; it clears above COLLAPSE_RESOLVE_RATIO. No working
# drafter of the shared note's profiles comes near it: their worst requests (κ 10) accept about 10x more.
COLLAPSE_RATIO = 0.05
COLLAPSE_RESOLVE_RATIO = 0.10
CONFIRM_MIN_GAUGE_READINGS = 3  # readings with requests running that a gauge route's collapse needs
# r0 by time of day (stats/daily.py): fitted once the learner spans half a day, refitted hourly on quiet traffic
# until it spans `pin_duration`, then fixed like r0.
PROFILE_MIN_SPAN_SECONDS = 12 * 3600.0
PROFILE_REFIT_SECONDS = 3600.0
# One harmonic is a model of the day, not the day: r0(t) is lowered by this share beside its standard errors, so a
# 5% drift stays inside the zone where the real pattern departs from the sinusoid by up to a percent.
PROFILE_MISFIT = 0.01


def build_evaluator(ctx: EvaluatorContext, route: RouteConfig) -> "AcceptanceDropEvaluator":
    store = ctx.shared.get(STORE_KEY)
    if store is None or store.closed:  # closed: every evaluator of a previous config was closed
        store = StateStore.in_state_dir(ctx.config.state_dir, ctx.state_errors, clock=ctx.clock)
        ctx.shared[STORE_KEY] = store
    return AcceptanceDropEvaluator(route, store)


@dataclass(frozen=True)
class _Test:
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

    def effective_tokens(self, window: "ShortWindow") -> float:
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


class AcceptanceDropEvaluator:
    """RouteEvaluator for one route (see module docstring). Not thread-safe: the daemon loop owns it."""

    name = "acceptance_drop"

    def __init__(self, route: RouteConfig, store: StateStore) -> None:
        self.route = route.name
        self.cfg: DetectionConfig = route.detection
        self.pinned: PinnedBaseline | None = route.baseline
        self.store = store
        self.key: BaselineKey | None = None
        self.reference: Baseline | None = None
        self.learner = self._new_learner()  # the current key's traffic
        self.cusum = Cusum(cap=CUSUM_CAP_FACTOR * self.cfg.cusum_threshold)
        self.sprt: Sprt | None = None  # running while a changed model is judged against the old baseline
        self.change_ts: float | None = None
        self.degraded = False
        self.model_changes_total = 0
        self.last_model_change: float | None = None
        self.window = ShortWindow(self.cfg.confirm_window_seconds, self.cfg.min_drafted_tokens)
        self.traffic = TrafficRate()
        self.block = OpenBlock(self.cfg.block_seconds)
        self.collapse = CollapseCheck(self.cfg.confirm_window_seconds, self.cfg.min_drafted_tokens)
        self.gauge = GaugeDrop(self.route, self.cfg)
        self._test: _Test | None = None
        self._last_scrape: float | None = None  # the start of the next interval
        self._relearn_dispersion = False  # the reference's φ was learned on blocks of another length
        self._daily_fitted: float | None = None  # when the daily profile was last fitted
        self._restore()
        store.register(self.route, self.persisted_state)

    # ------------------------------------------------------------------ RouteEvaluator
    def evaluate(self, obs: RouteObservation, gpus: Sequence[GpuSample] = ()) -> Mapping[str, Any]:
        now = obs.ts
        self.store.tick(now)
        for action in self.store.take_commands(self.route):
            self._apply_command(action)
        if obs.up:
            key = BaselineKey(obs.model_name, obs.engine_version, int(obs.k or 0))
            if self.key is None:
                self._enter_key(key)
            elif key != self.key and not self._schedule_driven(key, obs):
                self._model_changed(key, now)
            elif obs.reset:
                self._count_change(now)  # a restart may have swapped weights under the same name
            if obs.acceptance_source in GAUGE_SOURCES:
                self._observe_gauge(obs)
            else:
                self._observe(
                    now,
                    obs.d_accepted,
                    obs.d_draft_tokens,
                    obs.d_drafts,
                    obs.d_accepted_per_pos,
                    _idle(obs),
                    self._last_scrape,
                )
            self._last_scrape = now
        return self.fields()

    def close(self) -> None:
        self.store.unregister(self.route)

    def fields(self) -> dict[str, Any]:
        ref = self.reference
        out: dict[str, Any] = {
            "model_changes_total": float(self.model_changes_total),
            "last_model_change_timestamp": self.last_model_change,
        }
        if self.gauge.reference is not None:
            out.update(self.gauge.fields())
        elif ref is not None and self._test is not None:
            current = self.window.ratio()
            r0 = self.baseline_ratio(self._last_scrape)
            out.update(
                baseline_ratio=r0,
                degraded=self.degraded,
                cusum_statistic=self.cusum.statistic,
                drop_ratio=None if current is None else 1.0 - current / r0,
            )
        if self.collapse.collapsed:
            out["degraded"] = True  # a broken drafter pages with or without a baseline
        return out

    def baseline_ratio(self, ts: float | None) -> float:
        """The reference's r0 at `ts`: by time of day when its daily profile is in use."""
        ref = self.reference
        assert ref is not None
        daily = self._test.daily if self._test is not None else None
        return ref.acceptance_ratio if daily is None or ts is None else daily.at(ts)

    @property
    def sprt_verdict(self) -> str:
        return self.sprt.verdict if self.sprt is not None else ""

    # ------------------------------------------------------------------ the cycle
    def _observe_gauge(self, obs: RouteObservation) -> None:
        running = sum(obs.running_per_engine.values()) if obs.running_per_engine else None
        reading = obs.gauge_acceptance_ratio
        lifetime = obs.acceptance_source == "lifetime_gauge"
        if lifetime:  # a since-start ratio says something new only while requests run
            weight = 1.0 if running is None or running > 0 else 0.0
        else:  # the tracker gives the reading only with requests running, weighted by them
            weight = running if running else 1.0
        was = self.collapse.collapsed
        if self.collapse.add_gauge(obs.ts, reading, weight if reading is not None else 0.0):
            if not was:
                log.warning(
                    "route %s: draft acceptance collapsed (gauge %.3f): broken drafter?", self.route, reading or 0.0
                )
            return  # a collapsed drafter teaches nothing about its baseline
        self.gauge.observe(obs.ts, reading, weight, lifetime)

    def _observe(
        self,
        now: float,
        accepted: float,
        drafted: float,
        drafts: float,
        per_pos: Sequence[float],
        idle: bool = False,
        start: float | None = None,
    ) -> None:
        """One interval's deltas, (start, now]; `start` is the previous scrape (None: not known)."""
        self.window.add(now, accepted, drafted)
        self.traffic.add(now, drafted)
        was = self.collapse.collapsed
        if self.collapse.add_counts(now, accepted, drafted):
            if not was:
                log.warning(
                    "route %s: draft acceptance collapsed to %.3f over %.0f drafted tokens: broken drafter?",
                    self.route,
                    self.collapse.window.ratio() or 0.0,
                    self.collapse.window.drafted,
                )
            return  # a collapsed drafter teaches nothing about its baseline, and it already pages
        if drafted <= 0:
            if idle:  # the requests of the open block have all finished: weigh it now
                self.learner.add(now, 0.0, 0.0, 0.0, (), idle=True, start=start)
                if self._test is not None:
                    self._weigh(self.block.add(now, 0.0, 0.0, idle=True, start=start), now)
            return
        if self.reference is None:
            self.learner.add(now, accepted, drafted, drafts, per_pos, idle, start)
            self._maybe_set_first_reference(now)
            return
        if self._test is None:  # a baseline too close to 1 to test a drop against: only learn
            self.learner.add(now, accepted, drafted, drafts, per_pos, idle, start)
            return
        test = self._test
        self._weigh(self.block.add(now, accepted, drafted, idle, start), now)
        own_key = self.reference.key == self.key
        threshold = self.threshold(now)  # once per cycle: it weighs the traffic rate (two exponentials)
        # Only traffic with no hint of a drop refines the route's own baseline (no sliding baseline);
        # after a model change the new key learns from everything, since that is what `accept` adopts.
        if not own_key or (not self.degraded and self.cusum.statistic < threshold / 2):
            self.learner.add(now, accepted, drafted, drafts, per_pos, idle, start)
        self._decide(now, test, threshold)
        if own_key:
            self._maybe_relearn_dispersion(now)
            self._maybe_refine(now)
            self._maybe_learn_daily(now)
        else:
            self._maybe_adopt(now)

    def _weigh(self, block: tuple[float, float, float] | None, now: float) -> None:
        """Evidence is weighed per block, the unit its design effect was fitted on."""
        if block is None or self._test is None:
            return
        block_start, block_accepted, block_drafted = block
        llr = self._test.llr(block_accepted, block_drafted, block_start)
        self.cusum.update(llr, block_drafted, block_start)
        if self.sprt is not None:
            self.sprt.update(llr, block_drafted)

    def threshold(self, now: float) -> float:
        """h for this route now: the configured h, lowered on a quiet route (see `adapted_threshold`)."""
        rate = self.traffic.per_second(now, self.cfg.warmup_seconds)
        if rate is None or self.reference is None:
            return self.cfg.cusum_threshold
        return adapted_threshold(self.cfg.cusum_threshold, rate / max(1.0, self.reference.overdispersion))

    def _decide(self, now: float, test: _Test, threshold: float) -> None:
        window, reference = self.window, self.reference
        assert reference is not None  # `test` was derived from it
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

    # ------------------------------------------------------------------ baselines
    def _maybe_set_first_reference(self, now: float) -> None:
        cfg, key = self.cfg, self.key
        assert key is not None
        if self.pinned is not None:
            phi, model = self.pinned.overdispersion, None
            if phi is None:
                if not self.learner.has(now, cfg.warmup_drafted_tokens, cfg.warmup_seconds):
                    return
                phi = self.learner.dispersion.conservative_estimate() or 1.0
                model = self.learner.dispersion.model()
            self._set_reference(
                Baseline(
                    route=self.route,
                    key=key,
                    acceptance_ratio=self.pinned.acceptance_ratio,
                    position_acceptance=self.pinned.position_acceptance,
                    overdispersion=phi,
                    dispersion_intercept=model.intercept if model else None,
                    dispersion_slope=model.slope if model else 0.0,
                    dispersion_block_seconds=cfg.block_seconds,
                    source="config",
                    created=now,
                    updated=now,
                ),
                persist=False,
            )
        elif self.learner.has(now, cfg.warmup_drafted_tokens, cfg.warmup_seconds):
            learned = self._learned(now, "learned", created=None)
            self._set_reference(learned, persist=True)
            log.info(
                "route %s: learned baseline %.3f (φ %.1f) for %s",
                self.route,
                learned.acceptance_ratio,
                learned.overdispersion,
                key.label(),
            )

    def _learned(self, now: float, source: str, created: float | None) -> Baseline:
        assert self.key is not None
        return self.learner.baseline(self.route, self.key, now, source, self._pin_due(now), created)

    def _pin_due(self, now: float) -> bool:
        learner = self.learner
        return learner.seconds(now) >= self.cfg.pin_seconds or (
            learner.drafted >= self.cfg.pin_drafted_tokens and learner.dispersion.blocks >= PIN_MIN_BLOCKS
        )

    def _maybe_relearn_dispersion(self, now: float) -> None:
        """A stored baseline whose φ was learned on blocks of another length keeps its r0, and takes the φ of the
        route's own blocks once the warm-up has learned it (a design effect depends on what a block holds)."""
        ref, cfg = self.reference, self.cfg
        if (
            not self._relearn_dispersion
            or ref is None
            or not self.learner.has(now, cfg.warmup_drafted_tokens, cfg.warmup_seconds)
        ):
            return
        dispersion = self.learner.dispersion
        model = dispersion.model()
        relearned = dataclasses.replace(
            ref,
            overdispersion=dispersion.conservative_estimate() or ref.overdispersion,
            dispersion_intercept=model.intercept if model else None,
            dispersion_slope=model.slope if model else 0.0,
            dispersion_block_seconds=cfg.block_seconds,
            updated=now,
        )
        self._set_reference(relearned, persist=True, keep_evidence=True)
        log.info(
            "route %s: φ %.1f re-learned on %.0f s blocks (was %.1f on %.0f s)",
            self.route,
            relearned.overdispersion,
            cfg.block_seconds,
            ref.overdispersion,
            ref.dispersion_block_seconds,
        )

    def _maybe_refine(self, now: float) -> None:
        ref = self.reference
        if ref is None or ref.pinned or ref.source == "config":
            return
        if self.learner.drafted < REFRESH_GROWTH * ref.drafted_tokens and not self._pin_due(now):
            return
        refined = dataclasses.replace(self._learned(now, ref.source, created=ref.created), daily=ref.daily)
        self._set_reference(refined, persist=True, keep_evidence=True)
        if refined.pinned:
            log.info(
                "route %s: baseline %.3f pinned for %s after %.0f drafted tokens",
                self.route,
                refined.acceptance_ratio,
                refined.key.label(),
                refined.drafted_tokens,
            )

    def _maybe_learn_daily(self, now: float) -> None:
        """Fit r0 by time of day once the key's quiet traffic spans half a day, hourly until it spans
        `pin_duration`; then the profile is final. r0 and φ stay as learned (or pinned)."""
        ref, span = self.reference, self.learner.seconds(now)
        if (
            ref is None
            or ref.source == "config"
            or (ref.daily is not None and ref.daily.final)
            or span < PROFILE_MIN_SPAN_SECONDS
        ):
            return
        final = span >= self.cfg.pin_seconds
        if not final and self._daily_fitted is not None and now - self._daily_fitted < PROFILE_REFIT_SECONDS:
            return
        self._daily_fitted = now
        profile = self.learner.daily_profile(final)
        if profile is None:
            return
        if profile.usable:  # fixed at once: later refits would learn a drop at those hours as the daily pattern
            profile = dataclasses.replace(profile, final=True)
            final = True
        self._set_reference(dataclasses.replace(ref, daily=profile, updated=now), persist=True, keep_evidence=True)
        if final:
            log.info(
                "route %s: daily profile %s: %.3f + %.3f cos + %.3f sin (χ² %.1f, ±%.3f)",
                self.route,
                "in use" if profile.usable else "not used",
                profile.mean,
                profile.cos,
                profile.sin,
                profile.chi2,
                profile.stderr,
            )

    def _maybe_adopt(self, now: float) -> None:
        cfg = self.cfg
        if (
            self.sprt is None
            or self.sprt.verdict != "no_regression"
            or self.degraded
            or self.change_ts is None
            or now - self.change_ts < cfg.adopt_after_seconds
            or not self.learner.has(now, cfg.warmup_drafted_tokens, cfg.warmup_seconds)
        ):
            return
        old = self.reference
        adopted = self._learned(now, "adopted", created=None)
        self._set_reference(adopted, persist=True)
        self.sprt = None
        log.info(
            "route %s: adopted the baseline %.3f of %s after a clean period (was %.3f for %s)",
            self.route,
            adopted.acceptance_ratio,
            adopted.key.label(),
            old.acceptance_ratio if old else 0.0,
            old.key.label() if old else "-",
        )

    def _set_reference(self, baseline: Baseline, persist: bool, keep_evidence: bool = False) -> None:
        self.reference = baseline
        self._relearn_dispersion = (
            baseline.source != "config" and baseline.dispersion_block_seconds != self.cfg.block_seconds
        )
        if persist:
            self.store.put(baseline)
        r0 = baseline.acceptance_ratio * max(0.5, 1.0 - BASELINE_STDERR_DISCOUNT * baseline.relative_stderr())
        drop = self.cfg.drop
        r_ok, r_bad = r0 * (1.0 - drop / 3.0), r0 * (1.0 - drop)
        if not 0.0 < r_bad < r_ok < 1.0:
            log.warning(
                "route %s: baseline %.4f leaves no room to test a drop; detection is off",
                self.route,
                baseline.acceptance_ratio,
            )
            self._test = None
            return
        phi = max(1.0, baseline.overdispersion)
        self.window.min_tokens = max(self.cfg.min_drafted_tokens, CONFIRM_MIN_EFFECTIVE_TOKENS * phi)
        model = baseline.dispersion_model()
        daily = baseline.daily if baseline.daily is not None and baseline.daily.usable else None
        llr_flat = LogLikelihoodRatio.between(r_ok, r_bad, model)
        # against the profile, blocks are weighed by the design effect of their deviations from it (stats/daily.py)
        self._test = _Test(llr_flat, r0, drop, model if daily is None else daily.dispersion, daily)
        if not keep_evidence:
            self.cusum.reset()

    # ------------------------------------------------------------------ model changes
    def _new_learner(self) -> BaselineLearner:
        """A learner whose dispersion blocks are the CUSUM's: the route's `block` length."""
        return BaselineLearner(dispersion=DispersionEstimator(block_seconds=self.cfg.block_seconds))

    def _schedule_driven(self, key: BaselineKey, obs: RouteObservation) -> bool:
        """A draft length that moved without an engine restart, on the same model and version: the engine's
        own schedule (SGLang's adaptive tiers, a k that follows the batch) rather than a new deployment,
        since changing the configured k takes a restart. The baseline learned at the old key stays."""
        current = self.key
        return (
            current is not None
            and not obs.reset
            and key.model_name == current.model_name
            and key.engine_version == current.engine_version
        )

    def _count_change(self, now: float) -> None:
        self.model_changes_total += 1
        self.last_model_change = now

    def _enter_key(self, key: BaselineKey) -> None:
        self.key = key
        self.learner = self._new_learner()
        if self.pinned is None:
            stored = self.store.get(self.route, key)
            if stored is not None:
                self._set_reference(stored, persist=False)

    def _model_changed(self, key: BaselineKey, now: float) -> None:
        old_key = self.key
        self._count_change(now)
        self.change_ts = now
        self.key = key
        self.learner = self._new_learner()
        self.window.clear()
        self.block.clear()
        self.collapse.clear()
        self.gauge.model_changed(now)
        stored = self.store.get(self.route, key) if self.pinned is None else None
        log.info("route %s: model changed from %s to %s", self.route, old_key.label() if old_key else "-", key.label())
        if stored is not None:  # a known key (e.g. a rollback): its own baseline applies at once
            self.sprt = None
            self.degraded = False
            self._set_reference(stored, persist=False)
        elif self.reference is not None and self.pinned is None:
            self.sprt = Sprt()  # the old baseline stays the reference until the new model earns its own

    # ------------------------------------------------------------------ operator commands
    def _apply_command(self, action: str) -> None:
        log.info("route %s: operator %s", self.route, action)
        self.reference, self._test, self.sprt, self.degraded = None, None, None, False
        self.cusum.reset()
        self.window.clear()
        self.block.clear()
        self.collapse = CollapseCheck(self.cfg.confirm_window_seconds, self.cfg.min_drafted_tokens)
        self.gauge.reset()
        self.learner = self._new_learner()
        if action == "accept" and self.key is not None:
            self._enter_key(self.key)  # the CLI has written the accepted baseline for the current key
        # "reset": the CLI deleted the route's baselines; learn again from scratch

    # ------------------------------------------------------------------ persistence
    def persisted_state(self) -> dict[str, Any]:
        c, s = self.cusum, self.sprt
        return {
            "version": STATE_VERSION,
            "key": _key_json(self.key),
            "reference_key": _key_json(self.reference.key) if self.reference is not None else None,
            "learner": self.learner.to_json(),
            "cusum": [c.statistic, c.excursion_start, c.excursion_tokens],
            "sprt": [s.llr, s.tokens, s.verdict] if s is not None else None,
            "change_ts": self.change_ts,
            "degraded": self.degraded,
            "traffic": self.traffic.to_json(),
            "model_changes_total": self.model_changes_total,
            "last_model_change": self.last_model_change,
            "gauge": self.gauge.to_json(),
            "collapsed": self.collapse.collapsed,
        }

    def _restore(self) -> None:
        state = self.store.route_state(self.route)
        if not state or state.get("version") != STATE_VERSION:
            return
        try:
            key = _key_from(state["key"])
            ref_key = _key_from(state["reference_key"])
            learner = BaselineLearner.from_json(state["learner"], self.cfg.block_seconds)
            statistic, start, tokens = state["cusum"]
            sprt = (
                Sprt(float(state["sprt"][0]), float(state["sprt"][1]), str(state["sprt"][2])) if state["sprt"] else None
            )
            changes, last_change = int(state["model_changes_total"]), state["last_model_change"]
            degraded, change_ts = bool(state["degraded"]), state["change_ts"]
            traffic = TrafficRate()
            if state.get("traffic") is not None:  # absent in state saved before h adapted to traffic
                traffic.restore(state["traffic"])
            gauge = GaugeDrop(self.route, self.cfg)
            if state.get("gauge") is not None:  # absent in state saved before gauge routes were judged
                gauge.restore(state["gauge"])
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            self.store.errors.append(f"route {self.route}: unreadable detector state ({exc!r}); starting afresh")
            log.error("route %s: unreadable detector state (%r); starting afresh", self.route, exc)
            return
        self.key = key
        self.model_changes_total, self.last_model_change, self.change_ts = changes, last_change, change_ts
        self.learner, self.traffic, self.gauge = learner, traffic, gauge
        self.collapse.collapsed = bool(state.get("collapsed", False))
        if self.pinned is None and ref_key is not None:
            ref = self.store.get(self.route, ref_key)
            if ref is not None:
                self._set_reference(ref, persist=False)
        if self._test is not None:
            self.cusum.statistic = min(float(statistic), self.cusum.cap)
            self.cusum.excursion_start, self.cusum.excursion_tokens = start, float(tokens)
            self.sprt, self.degraded = sprt, degraded


def _idle(obs: RouteObservation) -> bool:
    """Nothing running or waiting at this scrape (False when the source does not say)."""
    running = obs.running_per_engine
    return bool(running) and sum(running.values()) <= 0 and not obs.waiting_requests


def _key_json(key: BaselineKey | None) -> list[Any] | None:
    return None if key is None else [key.model_name, key.engine_version, key.k]


def _key_from(raw: Any) -> BaselineKey | None:
    if raw is None:
        return None
    model, version, k = raw
    return BaselineKey(str(model), str(version), int(k))
