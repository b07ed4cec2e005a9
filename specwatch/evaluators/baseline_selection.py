"""Baseline selection: which baseline is a route's reference, and learning the ones it does not have yet.

Per route (docs/detection.md has the reasoning), `BaselineSelection` owns the key, the reference and the learner:

1. Warm-up: the first `warmup` tokens of a (model, engine version, k, drafter) key give a provisional baseline r0
   with its overdispersion φ. A baseline pinned in the config is used as is for the keys it names (all keys when it
   names none), from the first cycle when it gives φ (else φ is learned from the warm-up); a key it does not name
   learns its own, as if none were configured. With `seed_from`, a key with neither a pin nor a stored baseline
   asks for the fleet's median from Prometheus (evaluators/fleet_seed.py) rather than learn its own, possibly
   degraded, traffic. The question runs on a thread of its own (`seed`); a later cycle picks up the answer
   (`take_seed`) and uses it only if the route's drop detector could page against it: values in range, and the
   route's own traffic so far not so far above it that a full drop of that traffic would stay unconfirmed.
   Anything else is a counted seed error (`seed_errors`, one of SEED_ERROR_REASONS), said once per change,
   and the key learns. A stored baseline with values not finite or out of range is never used
   (`stored_invalid`): the key seeds or learns again.
2. Pin: the provisional baseline keeps refining on quiet traffic until `pin_drafted_tokens` (and PIN_MIN_BLOCKS
   blocks) or `pin_duration`, then it is pinned. A stored baseline learned on blocks of another length re-learns φ.
3. Daily profile: once the key's traffic spans half a day, r0 by time of day is fitted (stats/daily.py).
4. Model change (new model, engine version, or k with an engine restart; a k that moves without one is the
   engine's own schedule and changes nothing): the old baseline stays the reference, the new key learns its own,
   adopted after `adopt_after` once the drop decision's SPRT says "no_regression"; a key with a stored baseline
   (a rollback) uses it at once.

Each step that changes the reference returns the new baseline, so that the caller hands it to the drop decision.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Sequence

from specwatch.config import DetectionConfig, PinnedBaseline
from specwatch.evaluators.drop_decision import DropDecision
from specwatch.evaluators.fleet_seed import (
    SEED_ERROR_REASONS,
    FleetBaseline,
    SeedAttempt,
    SeedError,
    start_attempt,
    usable_phi,
    usable_ratio,
)
from specwatch.snapshot import RouteObservation
from specwatch.state.baselines import Baseline, BaselineKey, BaselineLearner
from specwatch.state.store import StateStore
from specwatch.stats.overdispersion import DispersionEstimator
from specwatch.stats.wilson import wilson_bounds

log = logging.getLogger(__name__)

REFRESH_GROWTH = 1.25  # a provisional baseline is recomputed when its sample has grown by this factor
# φ is a variance estimate with heavy tails: pinning on tokens alone needs this many 1-minute blocks too
PIN_MIN_BLOCKS = 240
# r0 by time of day (stats/daily.py): fitted once the learner spans half a day, refitted hourly on quiet traffic
# until it spans `pin_duration`, then fixed like r0.
PROFILE_MIN_SPAN_SECONDS = 12 * 3600.0
PROFILE_REFIT_SECONDS = 3600.0
# A key still learning asks the fleet again this often (a fleet that had too few nodes may have more now).
SEED_RETRY_SECONDS = 300.0
# Baselines that are decisions rather than this node's own learning: never refined, nor given a daily profile.
DECIDED_SOURCES = ("config", "fleet")


class BaselineSelection:
    """The reference baseline of one route and the learner of its current key (see module docstring)."""

    def __init__(self, route: str, cfg: DetectionConfig, pinned: PinnedBaseline | None, store: StateStore) -> None:
        self.route = route
        self.cfg = cfg
        self.pinned = pinned
        self.store = store
        self.key: BaselineKey | None = None
        self.reference: Baseline | None = None
        self.learner = self.new_learner()  # the current key's traffic
        self.change_ts: float | None = None  # the last model change, while the new key is judged
        self._relearn_dispersion = False  # the reference's φ was learned on blocks of another length
        self._daily_fitted: float | None = None  # when the daily profile was last fitted
        self._unpinned_logged: set[BaselineKey] = set()
        self._seed_asked: dict[BaselineKey, float] = {}  # when the fleet was last asked for a key
        self._seed_attempt: SeedAttempt | None = None  # the question not yet picked up
        self._seed_said: tuple[BaselineKey, str] | None = None  # the last seed error logged: said once per change
        # reason -> failed seeds; exported (from 0) only where seed_from is configured
        self.seed_errors: dict[str, float] = dict.fromkeys(SEED_ERROR_REASONS, 0.0) if cfg.seed_from else {}
        self._operator_keys: set[BaselineKey] = set()  # an operator's accept/reset: these keys learn their own

    def pin_for(self, key: BaselineKey | None) -> PinnedBaseline | None:
        """The configured baseline if it applies to `key` (said once per key when it does not)."""
        pinned = self.pinned
        if pinned is None or key is None:
            return pinned
        if pinned.applies_to(key.model_name, key.engine_version, key.k, key.drafter):
            return pinned
        if key not in self._unpinned_logged:
            self._unpinned_logged.add(key)
            log.warning(
                "route %s: the configured baseline (model %s, engine version %s, k=%s, drafter %s) does not apply "
                "to %s: that key learns its own",
                self.route,
                pinned.model or "any",
                pinned.engine_version or "any",
                pinned.draft_length or "any",
                pinned.drafter or "any",
                key.label(),
            )
        return None

    def new_learner(self) -> BaselineLearner:
        """A learner whose dispersion blocks are the CUSUM's: the route's `block` length."""
        return BaselineLearner(dispersion=DispersionEstimator(block_seconds=self.cfg.block_seconds))

    def learn(
        self,
        now: float,
        accepted: float,
        drafted: float,
        drafts: float,
        per_pos: Sequence[float],
        idle: bool = False,
        start: float | None = None,
    ) -> None:
        self.learner.add(now, accepted, drafted, drafts, per_pos, idle, start)

    @property
    def own_key(self) -> bool:
        """The reference is the current key's own baseline (not the old one after a model change)."""
        return self.reference is not None and self.reference.key == self.key

    def _set(self, baseline: Baseline, persist: bool) -> Baseline:
        self.reference = baseline
        self._relearn_dispersion = (
            baseline.source != "config" and baseline.dispersion_block_seconds != self.cfg.block_seconds
        )
        if persist:
            self.store.put(baseline)
        return baseline

    # ------------------------------------------------------------------ learning
    def first_reference(self, now: float) -> Baseline | None:
        """The configured baseline, or the learned one once the warm-up has enough traffic."""
        cfg, key = self.cfg, self.key
        assert key is not None
        pinned = self.pin_for(key)
        if pinned is not None:
            phi, model = pinned.overdispersion, None
            if phi is None:
                if not self.learner.has(now, cfg.warmup_drafted_tokens, cfg.warmup_seconds):
                    return None
                phi = self.learner.dispersion.conservative_estimate() or 1.0
                model = self.learner.dispersion.model()
            return self._set(
                Baseline(
                    route=self.route,
                    key=key,
                    acceptance_ratio=pinned.acceptance_ratio,
                    position_acceptance=pinned.position_acceptance,
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
        self.seed(now)
        if not self.learner.has(now, cfg.warmup_drafted_tokens, cfg.warmup_seconds):
            return None
        learned = self._set(self._learned(now, "learned", created=None), persist=True)
        log.info(
            "route %s: learned baseline %.3f (φ %.1f) for %s",
            self.route,
            learned.acceptance_ratio,
            learned.overdispersion,
            key.label(),
        )
        return learned

    def seed(self, now: float) -> None:
        """Ask the fleet for the current key's baseline (`seed_from`), on a thread of its own: unless not
        configured, decided by an operator here, asked too recently, or a question is still out."""
        seed, key = self.cfg.seed_from, self.key
        if seed is None or key is None or key in self._operator_keys or self._seed_attempt is not None:
            return
        asked = self._seed_asked.get(key)
        if asked is not None and 0 <= now - asked < SEED_RETRY_SECONDS:
            return
        attempt = start_attempt(self.route, key, seed)
        if attempt is not None:  # None: the route's question about another key still runs; asked again later
            self._seed_asked[key] = now
            self._seed_attempt = attempt

    @property
    def seed_attempt(self) -> SeedAttempt | None:
        """The question to the fleet not yet picked up (tests wait on it)."""
        return self._seed_attempt

    def take_seed(self, now: float) -> Baseline | None:
        """The fleet's answer, once it has come, as the current key's reference (stored); None until then, for
        an answer no longer wanted (another key, an operator's decision, a reference of its own meanwhile), and
        for an answer refused (counted and said)."""
        attempt, key = self._seed_attempt, self.key
        if attempt is None or not attempt.done:
            return None
        self._seed_attempt = None
        outcome = attempt.outcome
        if (
            attempt.key != key
            or key is None
            or key in self._operator_keys
            or self.own_key
            or self.pin_for(key) is not None
        ):
            return None
        if isinstance(outcome, SeedError) or outcome is None:
            self._seed_error(key, outcome or SeedError("internal", "the attempt left no outcome"))
            return None
        seeded = Baseline(
            route=self.route,
            key=key,
            acceptance_ratio=outcome.acceptance_ratio,
            overdispersion=outcome.overdispersion,
            dispersion_block_seconds=self.cfg.block_seconds,
            source="fleet",
            created=now,
            updated=now,
        )
        try:
            self._check_seed(seeded, now)
        except SeedError as exc:
            self._seed_error(key, exc)
            return None
        self._seed_said = None
        self._set(seeded, persist=True)
        log.info(
            "route %s: baseline %.3f (φ %.1f) for %s from the fleet's median over %d node(s)%s",
            self.route,
            seeded.acceptance_ratio,
            seeded.overdispersion,
            key.label(),
            outcome.nodes,
            _left_out(outcome),
        )
        return seeded

    def _check_seed(self, seeded: Baseline, now: float) -> None:
        """Raise SeedError for a seed the route's drop detector could not page against (module docstring)."""
        r0, phi = seeded.acceptance_ratio, seeded.overdispersion
        if not usable_ratio(r0) or not usable_phi(phi):  # fleet_seed keeps only usable nodes: a safety net
            raise SeedError("out_of_range", f"the fleet's median (ratio {r0!r}, φ {phi!r}) is out of range")
        decision = DropDecision(self.route, self.cfg)
        decision.use(seeded)
        test, drop = decision.hypotheses, self.cfg.drop
        if test is None:
            raise SeedError("cannot_page", f"a baseline of {r0:.4f} leaves no room to test a {drop:g} drop")
        block = 1000.0  # drafted tokens of a block accepted at r_bad: it must be evidence of the drop
        llr = test.llr((1.0 - drop) * test.r0 * block, block, now)
        if not (math.isfinite(llr) and llr > 0.0 and math.isfinite(decision.window.min_tokens)):
            raise SeedError("cannot_page", f"a baseline of {r0:.4f} (φ {phi:.1f}) weighs no evidence of a drop")
        learner = self.learner
        if learner.drafted >= self.cfg.min_drafted_tokens and 0.0 < learner.accepted < learner.drafted:
            n_eff = learner.drafted / phi
            own_lower = wilson_bounds(n_eff * learner.accepted / learner.drafted, n_eff)[0]
            # this traffic fallen by the whole drop would still be above r_ok: the drop could never be confirmed
            if (1.0 - drop) * own_lower >= test.r_ok(now):
                raise SeedError(
                    "below_own_traffic",
                    f"the fleet's {r0:.3f} is below this node's own {learner.accepted / learner.drafted:.3f} "
                    f"(over {learner.drafted:.0f} drafted tokens) by more than the {drop:g} drop: a drop of this "
                    "node's traffic would not page",
                )

    def _seed_error(self, key: BaselineKey, exc: SeedError) -> None:
        if self.seed_errors:
            self.seed_errors[exc.reason] = self.seed_errors.get(exc.reason, 0.0) + 1
        if self._seed_said != (key, exc.reason):
            self._seed_said = (key, exc.reason)
            log.warning(
                "route %s: no fleet baseline for %s (%s: %s): learning from this node's traffic",
                self.route,
                key.label(),
                exc.reason,
                exc,
            )
        else:
            log.debug("route %s: still no fleet baseline for %s (%s: %s)", self.route, key.label(), exc.reason, exc)

    def stored(self, key: BaselineKey) -> Baseline | None:
        """The stored baseline of `key`, unless its values could not judge anything (not finite, out of range;
        a fleet seed: out of the seed's range): such a one is counted, said and not used."""
        stored = self.store.get(self.route, key)
        if stored is None or _usable(stored):
            return stored
        message = (
            f"route {self.route}: the stored {stored.source} baseline for {key.label()} (ratio "
            f"{stored.acceptance_ratio!r}, φ {stored.overdispersion!r}) is not usable; it is not used"
        )
        log.error("%s", message)
        if stored.source == "fleet" and self.seed_errors:
            self.seed_errors["stored_invalid"] += 1
        else:
            self.store.errors.append(message)
        return None

    def _learned(self, now: float, source: str, created: float | None) -> Baseline:
        assert self.key is not None
        return self.learner.baseline(self.route, self.key, now, source, self._pin_due(now), created)

    def _pin_due(self, now: float) -> bool:
        learner = self.learner
        return learner.seconds(now) >= self.cfg.pin_seconds or (
            learner.drafted >= self.cfg.pin_drafted_tokens and learner.dispersion.blocks >= PIN_MIN_BLOCKS
        )

    def relearn_dispersion(self, now: float) -> Baseline | None:
        """A stored baseline whose φ was learned on blocks of another length keeps its r0, and takes the φ of the
        route's own blocks once the warm-up has learned it (a design effect depends on what a block holds)."""
        ref, cfg = self.reference, self.cfg
        if (
            not self._relearn_dispersion
            or ref is None
            or not self.learner.has(now, cfg.warmup_drafted_tokens, cfg.warmup_seconds)
        ):
            return None
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
        self._set(relearned, persist=True)
        log.info(
            "route %s: φ %.1f re-learned on %.0f s blocks (was %.1f on %.0f s)",
            self.route,
            relearned.overdispersion,
            cfg.block_seconds,
            ref.overdispersion,
            ref.dispersion_block_seconds,
        )
        return relearned

    def refine(self, now: float) -> Baseline | None:
        """A provisional baseline recomputed as its sample grows, pinned once `_pin_due`."""
        ref = self.reference
        if ref is None or ref.pinned or ref.source in DECIDED_SOURCES:
            return None
        if self.learner.drafted < REFRESH_GROWTH * ref.drafted_tokens and not self._pin_due(now):
            return None
        refined = self._set(
            dataclasses.replace(self._learned(now, ref.source, created=ref.created), daily=ref.daily), persist=True
        )
        if refined.pinned:
            log.info(
                "route %s: baseline %.3f pinned for %s after %.0f drafted tokens",
                self.route,
                refined.acceptance_ratio,
                refined.key.label(),
                refined.drafted_tokens,
            )
        return refined

    def learn_daily(self, now: float) -> Baseline | None:
        """Fit r0 by time of day once the key's quiet traffic spans half a day, hourly until it spans
        `pin_duration`; then the profile is final. r0 and φ stay as learned (or pinned)."""
        ref, span = self.reference, self.learner.seconds(now)
        if (
            ref is None
            or ref.source in DECIDED_SOURCES
            or (ref.daily is not None and ref.daily.final)
            or span < PROFILE_MIN_SPAN_SECONDS
        ):
            return None
        final = span >= self.cfg.pin_seconds
        if not final and self._daily_fitted is not None and now - self._daily_fitted < PROFILE_REFIT_SECONDS:
            return None
        self._daily_fitted = now
        profile = self.learner.daily_profile(final)
        if profile is None:
            return None
        if profile.usable:  # fixed at once: later refits would learn a drop at those hours as the daily pattern
            profile = dataclasses.replace(profile, final=True)
            final = True
        updated = self._set(dataclasses.replace(ref, daily=profile, updated=now), persist=True)
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
        return updated

    # ------------------------------------------------------------------ model changes
    def schedule_driven(self, key: BaselineKey, obs: RouteObservation) -> bool:
        """A draft length that moved without an engine restart, on the same model, version and drafter: the
        engine's own schedule (SGLang's adaptive tiers, a k that follows the batch) rather than a new deployment,
        since changing the configured k takes a restart. The baseline learned at the old key stays. A drafter
        not told on one side is no change; told on both and different, it is (a config reload names another)."""
        current = self.key
        return (
            current is not None
            and not obs.reset
            and key.model_name == current.model_name
            and key.engine_version == current.engine_version
            and (key.drafter == current.drafter or not key.drafter or not current.drafter)
        )

    def tell_drafter(self, key: BaselineKey) -> None:
        """The engine told the drafter of the key it runs for the first time (llama.cpp does after a request):
        the current key gains it, with no model change, since nothing changed but what we know."""
        if self.key is not None and not self.key.drafter and key.drafter:
            log.info("route %s: the engine runs drafter %s", self.route, key.drafter)
            self.key = dataclasses.replace(self.key, drafter=key.drafter)

    def enter_key(self, key: BaselineKey) -> Baseline | None:
        """Start on `key`: its stored baseline (if any, and none is configured) is the reference at once."""
        self.key = key
        self.learner = self.new_learner()
        if self.pin_for(key) is None:
            stored = self.stored(key)
            if stored is None and key.drafter:
                # Stored before the drafter was told (an engine restart, an older specwatch): the same key, as
                # a drafter told for the first time is no change.
                stored = self.stored(dataclasses.replace(key, drafter=""))
                stored = dataclasses.replace(stored, key=key) if stored is not None else None
            if stored is not None:
                return self._set(stored, persist=False)
        return None

    def change_key(self, key: BaselineKey, now: float) -> Baseline | None:
        """A new model: the new key learns afresh; returns its stored baseline when it has one (e.g. a rollback),
        which is the reference at once. Otherwise the old reference stays until the new key earns its own."""
        old_key = self.key
        self.change_ts = now
        self.key = key
        self.learner = self.new_learner()
        log.info("route %s: model changed from %s to %s", self.route, old_key.label() if old_key else "-", key.label())
        if self.pin_for(key) is None:
            stored = self.stored(key)
            if stored is not None:
                return self._set(stored, persist=False)
            self.seed(now)  # picked up by `take_seed`; the old reference stays until then
            return None
        if self.reference is None or self.reference.source != "config":
            # the configured baseline names the new key and not the old one: it is the reference from now on
            self.reference = None
            return self.first_reference(now)
        return None

    def adopt(self, now: float, no_regression: bool) -> Baseline | None:
        """After a model change judged `no_regression` (and not degraded), the new key's learned baseline
        becomes the reference once `adopt_after` has passed and the warm-up has enough traffic."""
        cfg = self.cfg
        if (
            not no_regression
            or self.change_ts is None
            or now - self.change_ts < cfg.adopt_after_seconds
            or not self.learner.has(now, cfg.warmup_drafted_tokens, cfg.warmup_seconds)
        ):
            return None
        old = self.reference
        adopted = self._set(self._learned(now, "adopted", created=None), persist=True)
        log.info(
            "route %s: adopted the baseline %.3f of %s after a clean period (was %.3f for %s)",
            self.route,
            adopted.acceptance_ratio,
            adopted.key.label(),
            old.acceptance_ratio if old else 0.0,
            old.key.label() if old else "-",
        )
        return adopted

    # ------------------------------------------------------------------ operator commands and restarts
    def has_evidence(self, now: float) -> bool:
        """The current key's traffic is enough for a baseline of its own (what an operator's accept adopts)."""
        return self.learner.has(now, self.cfg.warmup_drafted_tokens, 0.0)

    def accepted(self, now: float) -> Baseline:
        """The baseline an operator's accept would adopt for the current key: its traffic since it started."""
        assert self.key is not None
        return self.learner.baseline(self.route, self.key, now, "accepted", pinned=False)

    def accept(self, baseline: Baseline) -> bool:
        """Make `baseline` (from `accepted`) the reference and store it; False when the file write failed (it
        holds in memory and is written again with the next flush that reaches the file)."""
        assert self.key is not None
        self._operator_keys.add(self.key)
        self.change_ts = None
        self.reference = baseline
        self._relearn_dispersion = False
        return self.store.put(baseline)

    def forget(self) -> None:
        """No reference and a fresh learner (an operator reset, or accept before re-entering the key). The
        operator decided about this node's current key: it learns its own, never the fleet's."""
        if self.key is not None:
            self._operator_keys.add(self.key)
        self.reference = None
        self.learner = self.new_learner()

    def restore(
        self, key: BaselineKey | None, ref_key: BaselineKey | None, learner: BaselineLearner, change_ts: float | None
    ) -> Baseline | None:
        """Carry on from saved state; returns the stored reference it names (unless one is configured)."""
        self.key, self.learner, self.change_ts = key, learner, change_ts
        if self.pin_for(key) is None and ref_key is not None:
            ref = self.stored(ref_key)
            if ref is not None:
                return self._set(ref, persist=False)
        return None


def _usable(b: Baseline) -> bool:
    if b.source == "fleet":
        return usable_ratio(b.acceptance_ratio) and usable_phi(b.overdispersion)
    numbers = (b.acceptance_ratio, b.overdispersion, b.dispersion_slope, b.dispersion_intercept or 1.0)
    return all(math.isfinite(x) for x in numbers) and 0.0 < b.acceptance_ratio < 1.0 and b.overdispersion > 0.0


def _left_out(fleet: FleetBaseline) -> str:
    return f" ({fleet.left_out} node(s) with values not finite or out of range left out)" if fleet.left_out else ""
