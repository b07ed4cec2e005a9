"""Acceptance-drop detector: has a route's draft acceptance fallen to (1 - drop) x its baseline?

One evaluator per route wires two parts, each with one job (docs/detection.md has the reasoning and tuning):

1. `BaselineSelection` (evaluators/baseline_selection.py) chooses the reference r0: warm-up, pin, daily
   profile, model changes and adoption, the configured baseline.
2. `DropDecision` (evaluators/drop_decision.py) decides the drop against it: CUSUM (and SPRT after a model
   change) on per-block evidence, confirmed and resolved on the short window's Wilson bounds.
3. A broken drafter (acceptance <= COLLAPSE_RATIO over the confirmation window) pages at once, with or without
   a baseline (`CollapseCheck`).
4. Gauge-only sources (SGLang < 0.5.13, vLLM V0) go to `GaugeDrop`, a lower-power detector on the readings.
5. Operator commands (`specwatch baseline reset/accept` through the state file's queue) and the state saved
   for a restart.
6. Operator actions decided on the live state (the baselines API, between two cycles): `accept` adopts the
   current key's baseline only where the route runs the expected key and has evidence for it
   (evaluators/accept.py); `reset` forgets the route's baselines.

Cost per cycle: a few float operations; the store writes only on learning events and every persist period.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping, Sequence

from specwatch.config import DetectionConfig, PinnedBaseline, RouteConfig
from specwatch.evaluators.accept import (
    ADOPTED,
    ALREADY,
    REFUSED,
    WOULD_ADOPT,
    AcceptOutcome,
    Expected,
    baseline_document,
    gauge_document,
)
from specwatch.evaluators.base import EvaluatorContext
from specwatch.evaluators.baseline_selection import BaselineSelection
from specwatch.evaluators.drop_decision import HORIZON_TRAFFIC_SECONDS, CollapseCheck, DropDecision
from specwatch.evaluators.gauge_drop import GAUGE_SOURCES, GaugeDrop
from specwatch.snapshot import GpuSample, RouteObservation
from specwatch.state.baselines import Baseline, BaselineKey, BaselineLearner
from specwatch.state.store import StateStore
from specwatch.stats.cusum import Cusum, Sprt
from specwatch.stats.gauge import GAUGE_MIN_BLOCKS
from specwatch.stats.evidence import TrafficRate

log = logging.getLogger(__name__)

STORE_KEY = "baseline_store"
STATE_VERSION = 1


def build_evaluator(ctx: EvaluatorContext, route: RouteConfig) -> "AcceptanceDropEvaluator":
    store = ctx.shared.get(STORE_KEY)
    if store is None or store.closed:  # closed: every evaluator of a previous config was closed
        store = StateStore.in_state_dir(ctx.config.state_dir, ctx.state_errors, clock=ctx.clock)
        ctx.shared[STORE_KEY] = store
    return AcceptanceDropEvaluator(route, store)


class AcceptanceDropEvaluator:
    """RouteEvaluator for one route (see module docstring). Not thread-safe: the daemon loop owns it."""

    name = "acceptance_drop"

    def __init__(self, route: RouteConfig, store: StateStore) -> None:
        self.route = route.name
        self.cfg: DetectionConfig = route.detection
        self.pinned: PinnedBaseline | None = route.baseline
        self.store = store
        self.selection = BaselineSelection(self.route, self.cfg, self.pinned, store)
        self.decision = DropDecision(self.route, self.cfg)
        self.model_changes_total = 0
        self.last_model_change: float | None = None
        self.collapse = CollapseCheck(self.cfg.confirm_window_seconds, self.cfg.min_drafted_tokens)
        self.gauge = GaugeDrop(self.route, self.cfg)
        self._last_scrape: float | None = None  # the start of the next interval
        self._gauge_route = False  # the source reports acceptance only as a gauge
        self._restore()
        store.register(self.route, self.persisted_state)

    # ------------------------------------------------------------------ the parts, as tests and tools read them
    @property
    def key(self) -> BaselineKey | None:
        return self.selection.key

    @property
    def reference(self) -> Baseline | None:
        return self.selection.reference

    @property
    def learner(self) -> BaselineLearner:
        return self.selection.learner

    @property
    def cusum(self) -> Cusum:
        return self.decision.cusum

    @property
    def traffic(self) -> TrafficRate:
        return self.decision.traffic

    def threshold(self, now: float) -> float:
        return self.decision.threshold(now)

    def baseline_ratio(self, ts: float | None) -> float:
        return self.decision.baseline_ratio(ts)

    @property
    def sprt_verdict(self) -> str:
        sprt = self.decision.sprt
        return sprt.verdict if sprt is not None else ""

    # ------------------------------------------------------------------ RouteEvaluator
    def evaluate(self, obs: RouteObservation, gpus: Sequence[GpuSample] = ()) -> Mapping[str, Any]:
        now = obs.ts
        self.store.tick(now)
        for action in self.store.take_commands(self.route):
            self._apply_command(action)
        if obs.up:
            key = BaselineKey(obs.model_name, obs.engine_version, int(obs.k or 0), obs.drafter)
            if self.selection.key is not None and not key.drafter:  # not told (yet): no change
                key = dataclasses.replace(key, drafter=self.selection.key.drafter)
            if self.selection.key is None:
                self._use(self.selection.enter_key(key))
            elif key != self.selection.key and not self.selection.schedule_driven(key, obs):
                self._model_changed(key, now)
            elif key.drafter != self.selection.key.drafter:
                self.selection.tell_drafter(key)
            elif obs.reset:
                self._count_change(now)  # a restart may have swapped weights under the same name
            self._take_seed(now)
            self._gauge_route = obs.acceptance_source in GAUGE_SOURCES
            if self._gauge_route:
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

    def _take_seed(self, now: float) -> None:
        """The fleet's baseline, once its answer has come, judges from now on (as a stored one would)."""
        seeded = self.selection.take_seed(now)
        if seeded is not None:
            self.decision.sprt = None
            self.decision.degraded = False
            self._use(seeded)

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model_changes_total": float(self.model_changes_total),
            "last_model_change_timestamp": self.last_model_change,
        }
        if self.selection.seed_errors:
            out["seed_errors_total"] = dict(self.selection.seed_errors)
        if self.gauge.reference is not None:
            out.update(self.gauge.fields())
        elif self.decision.reference is not None and self.decision.hypotheses is not None:
            out.update(self.decision.fields(self._last_scrape))
        if self.collapse.collapsed:
            out["degraded"] = True  # a broken drafter pages with or without a baseline
        return out

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
        selection, decision = self.selection, self.decision
        decision.add(now, accepted, drafted)
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
                selection.learn(now, 0.0, 0.0, 0.0, (), idle=True, start=start)
                if decision.hypotheses is not None:
                    self._weigh(decision.block.add(now, 0.0, 0.0, idle=True, start=start), now)
            return
        if selection.reference is None:
            selection.learn(now, accepted, drafted, drafts, per_pos, idle, start)
            self._use(selection.first_reference(now))
            return
        if decision.hypotheses is None:  # a baseline too close to 1 to test a drop against: only learn
            selection.learn(now, accepted, drafted, drafts, per_pos, idle, start)
            return
        self._weigh(decision.block.add(now, accepted, drafted, idle, start), now)
        own_key = selection.own_key
        threshold = decision.threshold(now)  # once per cycle: it weighs the traffic rate (two exponentials)
        # Only traffic with no hint of a drop refines the route's own baseline (no sliding baseline);
        # after a model change the new key learns from everything, since that is what `accept` adopts.
        if not own_key or decision.quiet(threshold):
            selection.learn(now, accepted, drafted, drafts, per_pos, idle, start)
        decision.decide(now, threshold)
        if own_key:
            self._use(selection.relearn_dispersion(now), keep_evidence=True)
            self._use(selection.refine(now), keep_evidence=True)
            self._use(selection.learn_daily(now), keep_evidence=True)
            return
        sprt = decision.sprt
        adopted = selection.adopt(now, sprt is not None and sprt.verdict == "no_regression" and not decision.degraded)
        if adopted is not None:
            self._use(adopted)
            decision.sprt = None

    def _weigh(self, block: tuple[float, float, float] | None, now: float) -> None:
        """A block closed at `now` (start, accepted, drafted) goes to the decision as evidence."""
        self.decision.weigh(block)

    def _use(self, baseline: Baseline | None, keep_evidence: bool = False) -> None:
        """A new reference from the selection goes to the decision; S restarts unless it is the same one refined."""
        if baseline is not None:
            self.decision.use(baseline, keep_evidence)

    # ------------------------------------------------------------------ model changes
    def _count_change(self, now: float) -> None:
        self.model_changes_total += 1
        self.last_model_change = now

    def _model_changed(self, key: BaselineKey, now: float) -> None:
        self._count_change(now)
        stored = self.selection.change_key(key, now)
        self.decision.clear_windows()
        self.collapse.clear()
        self.gauge.model_changed(now)
        if stored is not None:  # a known key (e.g. a rollback): its own baseline applies at once
            self.decision.sprt = None
            self.decision.degraded = False
            self._use(stored)
        elif self.selection.reference is None:
            self.decision.forget()  # a configured baseline that names the new key waits for the warm-up's φ
        elif self.selection.pin_for(key) is None:
            self.decision.sprt = Sprt()  # the old baseline stays the reference until the new model earns its own

    # ------------------------------------------------------------------ operator commands
    def _apply_command(self, action: str) -> None:
        log.info("route %s: operator %s", self.route, action)
        self.selection.forget()
        self.decision.forget()
        self.collapse = CollapseCheck(self.cfg.confirm_window_seconds, self.cfg.min_drafted_tokens)
        self.gauge.reset()
        key = self.selection.key
        if action == "accept" and key is not None:
            self._use(self.selection.enter_key(key))  # the CLI has written the accepted baseline for the current key
        # "reset": the CLI deleted the route's baselines; learn again from scratch

    # ------------------------------------------------------------------ operator actions, decided live
    def accept(self, expected: Expected, now: float, dry_run: bool = False) -> AcceptOutcome:
        """An operator's accept of a deliberate bump (evaluators/accept.py), on this detector's live state. The
        caller holds the daemon loop's lock. Refused, changing nothing, unless the route runs `expected`."""
        key = self.selection.key
        before = self.reference_document()

        def refuse(reason: str) -> AcceptOutcome:
            return AcceptOutcome(REFUSED, f"route {self.route}: {reason}", before, before)

        if key is None or self._last_scrape is None:
            return refuse("its engine has not answered since the daemon started; retry after its next cycle")
        wrong = expected.mismatch(key)
        if wrong:
            return refuse(f"{wrong}; its baseline is kept")
        if self.collapse.collapsed:
            return refuse("its draft acceptance has collapsed (a broken drafter?): nothing to adopt")
        if self._gauge_route:
            return self._accept_gauge(key, now, dry_run, before, refuse)
        ref, selection = self.selection.reference, self.selection
        if ref is not None and ref.key == key:
            return AcceptOutcome(
                ALREADY,
                f"route {self.route}: {key.label()} has its own baseline {ref.acceptance_ratio:.4f} ({ref.source})",
                before,
                before,
            )
        if selection.pin_for(key) is not None:
            return refuse(f"the configured baseline applies to {key.label()}; it takes effect after the warm-up")
        if not selection.has_evidence(now):
            return refuse(
                f"no evidence for {key.label()} yet: {selection.learner.drafted:.0f} of "
                f"{self.cfg.warmup_drafted_tokens:.0f} drafted tokens with a dispersion estimate"
            )
        candidate = selection.accepted(now)
        what = (
            f"{candidate.acceptance_ratio:.4f} for {key.label()} from {candidate.drafted_tokens:.0f} drafted tokens"
            + (f" (the reference was {ref.acceptance_ratio:.4f} for {ref.key.label()})" if ref is not None else "")
        )
        if dry_run:
            return AcceptOutcome(
                WOULD_ADOPT, f"route {self.route}: would adopt {what}", before, baseline_document(candidate)
            )
        written = selection.accept(candidate)
        self.decision.sprt = None
        self.decision.degraded = False
        self._use(candidate)
        written = self.store.save(self.route) and written  # a restart must not bring the old reference back
        message = f"route {self.route}: adopted {what}"
        if not written:
            message += "; the state file could not be written: it is held in memory and written with the next flush"
        log.info("%s", message)
        return AcceptOutcome(ADOPTED, message, before, baseline_document(candidate))

    def _accept_gauge(
        self, key: BaselineKey, now: float, dry_run: bool, before: dict[str, Any] | None, refuse: Any
    ) -> AcceptOutcome:
        gauge = self.gauge
        if gauge.reference is not None and gauge.change_ts is None:
            return AcceptOutcome(
                ALREADY,
                f"route {self.route}: {key.label()} has its own gauge baseline {gauge.reference.r0:.4f}",
                before,
                before,
            )
        r0 = gauge.acceptable(now)
        if r0 is None:
            return refuse(
                f"no evidence for {key.label()} yet: {gauge.learner.blocks} of {GAUGE_MIN_BLOCKS} blocks of readings"
            )
        after = gauge_document(self.route, key, r0, pinned=False)
        if dry_run:
            return AcceptOutcome(
                WOULD_ADOPT, f"route {self.route}: would adopt gauge baseline {r0:.4f} for {key.label()}", before, after
            )
        gauge.accept(now)
        self.store.save(self.route)  # the gauge baseline lives in the detector state
        message = f"route {self.route}: adopted gauge baseline {r0:.4f} for {key.label()}"
        log.info("%s", message)
        return AcceptOutcome(ADOPTED, message, before, after)

    def reference_document(self) -> dict[str, Any] | None:
        if self._gauge_route:
            ref = self.gauge.reference
            own = self.gauge.change_ts is None
            return gauge_document(
                self.route, self.key if own else None, ref.r0 if ref else None, bool(ref and ref.pinned)
            )
        return baseline_document(self.selection.reference)

    def reset(self) -> tuple[bool, list[dict[str, Any]]]:
        """An operator's reset, named as such: the route's stored baselines and detector state go and it learns
        from scratch; (the file written, what was deleted). The caller holds the daemon loop's lock."""
        deleted = [d for d in (baseline_document(b) for b in self.store.baselines(self.route)) if d is not None]
        if self._gauge_route and self.gauge.reference is not None:
            deleted.append(self.reference_document() or {})
        ok = self.store.delete_route(self.route)
        self._apply_command("reset")
        return ok and self.store.save(self.route), deleted

    # ------------------------------------------------------------------ persistence
    def persisted_state(self) -> dict[str, Any]:
        c, s, selection = self.decision.cusum, self.decision.sprt, self.selection
        return {
            "version": STATE_VERSION,
            "key": _key_json(selection.key),
            "reference_key": _key_json(selection.reference.key) if selection.reference is not None else None,
            "learner": selection.learner.to_json(),
            "cusum": [c.statistic, c.excursion_start, c.excursion_tokens],
            "sprt": [s.llr, s.tokens, s.verdict] if s is not None else None,
            "change_ts": selection.change_ts,
            "degraded": self.decision.degraded,
            "traffic": self.decision.traffic.to_json(),
            "recent_traffic": self.decision.recent_traffic.to_json(),
            "recent_evidence": self.decision.recent_evidence.to_json(),
            "model_changes_total": self.model_changes_total,
            "last_model_change": self.last_model_change,
            "gauge": self.gauge.to_json(),
            "collapsed": self.collapse.collapsed,
            "seed_errors": self.selection.seed_errors,
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
            recent = TrafficRate(HORIZON_TRAFFIC_SECONDS)
            if state.get("recent_traffic") is not None:  # absent in state saved before the horizon was exported
                recent.restore(state["recent_traffic"])
            evidence = TrafficRate(HORIZON_TRAFFIC_SECONDS)
            if state.get("recent_evidence") is not None:
                evidence.restore(state["recent_evidence"])
            gauge = GaugeDrop(self.route, self.cfg)
            if state.get("gauge") is not None:  # absent in state saved before gauge routes were judged
                gauge.restore(state["gauge"])
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            self.store.errors.append(f"route {self.route}: unreadable detector state ({exc!r}); starting afresh")
            log.error("route %s: unreadable detector state (%r); starting afresh", self.route, exc)
            return
        self.model_changes_total, self.last_model_change = changes, last_change
        self.decision.traffic, self.decision.recent_traffic, self.gauge = traffic, recent, gauge
        self.decision.recent_evidence = evidence
        self.collapse.collapsed = bool(state.get("collapsed", False))
        seed_errors = state.get("seed_errors")
        if self.selection.seed_errors and isinstance(seed_errors, dict):  # counters carry on across restarts
            for reason, count in seed_errors.items():
                if reason in self.selection.seed_errors and isinstance(count, (int, float)) and count >= 0:
                    self.selection.seed_errors[reason] = float(count)
        self._use(self.selection.restore(key, ref_key, learner, change_ts))
        decision = self.decision
        if decision.hypotheses is not None:
            decision.cusum.statistic = min(float(statistic), decision.cusum.cap)
            decision.cusum.excursion_start, decision.cusum.excursion_tokens = start, float(tokens)
            decision.sprt, decision.degraded = sprt, degraded


def _idle(obs: RouteObservation) -> bool:
    """Nothing running or waiting at this scrape (False when the source does not say)."""
    running = obs.running_per_engine
    return bool(running) and sum(running.values()) <= 0 and not obs.waiting_requests


def stored_horizon(store: StateStore, route: RouteConfig) -> tuple[float, float] | None:
    """(traffic horizon, drafted tokens/s) of `route` as its daemon last saved it, from a read-only `store`; None
    when the state holds no baseline or no recent traffic for it. For `specwatch check-config`'s advice."""
    state = store.route_state(route.name)
    if not state or state.get("version") != STATE_VERSION or state.get("recent_traffic") is None:
        return None
    try:
        ref_key = _key_from(state["reference_key"])
        decision = DropDecision(route.name, route.detection)
        decision.recent_traffic.restore(state["recent_traffic"])
        if state.get("recent_evidence") is not None:
            decision.recent_evidence.restore(state["recent_evidence"])
        if state.get("traffic") is not None:
            decision.traffic.restore(state["traffic"])
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    baseline = store.get(route.name, ref_key) if ref_key is not None else None
    now = decision.recent_traffic.last
    if baseline is None or now is None:
        return None
    decision.use(baseline)
    horizon, rate = decision.horizon(now), decision.recent_traffic.per_second(now, 0.0)
    return None if horizon is None or rate is None else (horizon, rate)


def _key_json(key: BaselineKey | None) -> list[Any] | None:
    return None if key is None else key.to_json()


def _key_from(raw: Any) -> BaselineKey | None:
    return None if raw is None else BaselineKey.from_json(raw)
