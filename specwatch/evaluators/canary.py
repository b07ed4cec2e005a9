"""Canary probe evaluator: schedules a route's probe rounds and judges each against its fingerprint.

Per route and cycle (docs/detection.md, "Canary probes"):

1. Schedule: a round is due every `every`; at once when the route is first seen and, with `on_change`, when
   the engine restarts or its model, engine version or k changes. No round starts while one runs (the runner
   owns one thread per route), while the engine queues requests (waiting > 0: saturated), or while the
   route is down; a failed or busy round is retried after a backoff that doubles up to 4 x `every`.
2. Exclude: each probe's own tokens are handed to tracking as soon as they are read, so the traffic
   detector never sees them (`take_read`, called by the daemon before tracking).
3. Judge: a finished round is compared prompt by prompt with the fingerprint of its (model, engine
   version, k, prompt set) key (probe/verdict.py). Two low rounds in a row page (`probe_degraded`); a clean
   round resolves. The first round of a key with no fingerprint and no earlier one becomes its fingerprint.
4. Model change: a key with no fingerprint of its own is judged against the previous key's fingerprint;
   after two rounds that are not low it adopts the latest round as its own, as the traffic detector adopts.
   A known key (a rollback) uses its own at once.

The runner's thread does HTTP only; every store access and every decision is here, on the tick thread.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any, Callable, Mapping, Sequence

from specwatch.config import Config, RouteConfig
from specwatch.evaluators.acceptance_drop import STORE_KEY
from specwatch.evaluators.base import EvaluatorContext
from specwatch.probe.prompts import PromptSet, PromptSetError, load_prompt_set
from specwatch.probe.responses import Acceptance
from specwatch.probe.runner import OUTCOMES, ProbeRunner, Round
from specwatch.probe.verdict import Comparison, compare
from specwatch.snapshot import GpuSample, RouteObservation
from specwatch.sources.engines import parse_bracket
from specwatch.sources.http import HttpFetcher
from specwatch.state.commands import CANARY_ACTIONS
from specwatch.state.baselines import BaselineKey
from specwatch.state.store import StateStore

log = logging.getLogger(__name__)

STATE_VERSION = 1
# Route name -> its latest runner, so that the runner a reload builds waits for its predecessor's round. Weak:
# a runner lives while its evaluator or its round's thread does, whatever the daemon does with its context.
_RUNNERS: "weakref.WeakValueDictionary[str, ProbeRunner]" = weakref.WeakValueDictionary()
BACKOFF_FIRST_SECONDS = 30.0
BACKOFF_MAX_FACTOR = 4.0  # x every
LOW_ROUNDS_TO_PAGE = 2
CLEAN_ROUNDS_TO_ADOPT = 2
ROUND_RESULTS = (*OUTCOMES, "skipped")


def build_evaluator(ctx: EvaluatorContext, route: RouteConfig) -> "CanaryEvaluator | None":
    if route.probe is None:
        return None
    try:
        prompt_set = load_prompt_set(route.probe.prompts)
    except PromptSetError as exc:  # the config check read it; the file changed since
        log.error("route %s: canary probes off: %s", route.name, exc)
        return None
    store = ctx.shared.get(STORE_KEY)
    if store is None or store.closed:
        store = StateStore.in_state_dir(ctx.config.state_dir, ctx.state_errors, clock=ctx.clock)
        ctx.shared[STORE_KEY] = store
    evaluator = CanaryEvaluator(route, store, prompt_set)
    evaluator.runner = _RUNNERS[route.name] = ProbeRunner(
        route,
        route.probe,
        prompt_set,
        engine_kind=lambda: evaluator.engine_kind,
        scrape=bracket_scraper(route, ctx.config),
        clock=ctx.clock,
        previous=_RUNNERS.get(route.name),
    )
    return evaluator


def bracket_scraper(route: RouteConfig, config: Config) -> Callable[[], Any]:
    """A full /metrics scrape of the route for counter bracketing, with a fetcher of the probe thread's own
    built from the route's HTTP client config as the daemon's are (the daemon's cycle fetches a filtered body
    without the finished-request counter). Raises SourceError."""
    fetcher = HttpFetcher(config.scrape.timeout_seconds, config.scrape.max_body_bytes, client=route.http)

    def scrape() -> Any:
        return parse_bracket(route.engine, fetcher.get(route.url), route, time.time())

    return scrape


class CanaryEvaluator:
    """RouteEvaluator for one route's canary probes (see module docstring)."""

    name = "canary"

    def __init__(
        self, route: RouteConfig, store: StateStore, prompt_set: PromptSet, runner: ProbeRunner | None = None
    ) -> None:
        assert route.probe is not None
        self.route = route.name
        self.cfg = route.probe
        self.drop = route.detection.drop
        self.store = store
        self.prompt_set = prompt_set
        self.prompt_hash = prompt_set.hash
        # Set here or, right after construction, by build_evaluator (which needs the evaluator to build it).
        self.runner: ProbeRunner = runner  # type: ignore[assignment]
        self.engine_kind = ""
        self.key: BaselineKey | None = None
        self.reference_key: BaselineKey | None = None  # whose fingerprint rounds are judged against
        self.round_key: BaselineKey | None = None  # the key when the running round started
        self.seen_seq = 0
        self.next_due: float | None = None
        self.change_pending = False
        self.adopt_pending = False  # an operator's adopt: the next good round becomes the key's fingerprint
        self.failures = 0
        self.low_rounds = 0
        self.clean_rounds = 0
        self.not_low_on_new_key = 0
        self.degraded = False
        self.rounds_total: dict[str, float] = dict.fromkeys(ROUND_RESULTS, 0.0)
        self.last: Round | None = None
        self.last_comparison: Comparison | None = None
        self.reference_ratio: float | None = None  # pooled acceptance of the reference fingerprint
        self.last_round_ts: float | None = None  # when the last round was started (obs time)
        self.method = ""
        store.acquire()
        self._restore()

    # ------------------------------------------------------------------ RouteEvaluator
    def evaluate(self, obs: RouteObservation, gpus: Sequence[GpuSample] = ()) -> Mapping[str, Any]:
        now = obs.ts
        if self.store.take_commands(self.route, CANARY_ACTIONS):
            log.info("route %s: operator adopt: the next canary round becomes the fingerprint", self.route)
            self.adopt_pending = self.change_pending = True  # a round now rather than at the next due time
        if obs.up:
            self.engine_kind = obs.engine_kind.split("-")[0]
            key = BaselineKey(obs.model_name, obs.engine_version, int(obs.k or 0), obs.drafter)
            if self.key is None:
                self.key = key
                if self.next_due is None:  # after a restart of specwatch the schedule goes on
                    self.next_due = now if self.last_round_ts is None else self.last_round_ts + self.cfg.every_seconds
            elif key != self.key or obs.reset:
                if key != self.key:
                    log.info("route %s: canary: model changed from %s to %s", self.route, self.key.label(), key.label())
                self.key = key
                self.runner.forget_method()
                if self.cfg.on_change:
                    self.change_pending = True
        latest = self.runner.latest
        if latest is not None and latest.seq > self.seen_seq:
            self.seen_seq = latest.seq
            self._judge(latest, now)
        if obs.up and not self.runner.running:
            self._maybe_start(obs, now)
        return self.fields()

    def take_read(self) -> list[Acceptance]:
        return self.runner.take_read()

    def close(self) -> None:
        self.store.release()

    # ------------------------------------------------------------------ scheduling
    def _maybe_start(self, obs: RouteObservation, now: float) -> None:
        due = self.change_pending or (self.next_due is not None and now >= self.next_due)
        if not due:
            return
        if obs.waiting_requests is not None and obs.waiting_requests > 0:  # saturated: leave it to the traffic
            self.rounds_total["skipped"] += 1
            self.next_due = now + self._backoff()
            self.failures += 1
            return
        reason = "change" if self.change_pending else "schedule"
        if self.runner.start(reason):
            self.change_pending = False
            self.round_key = self.key
            self.last_round_ts = now
            self.next_due = now + self.cfg.every_seconds

    def _backoff(self) -> float:
        return min(BACKOFF_FIRST_SECONDS * 2**self.failures, BACKOFF_MAX_FACTOR * self.cfg.every_seconds)

    # ------------------------------------------------------------------ judging
    def _judge(self, rnd: Round, now: float) -> None:
        self.last = rnd
        self.rounds_total[rnd.outcome] = self.rounds_total.get(rnd.outcome, 0.0) + 1
        if rnd.method:
            self.method = rnd.method
        if rnd.outcome != "ok":
            log.warning("route %s: canary round %s: %s", self.route, rnd.outcome, rnd.message)
            self.next_due = now + self._backoff()
            self.failures += 1
            return
        self.failures = 0
        key = self.round_key or self.key
        if key is None:
            return
        read = rnd.read()
        if self.adopt_pending:
            self.adopt_pending = False
            self._adopt(key, read)
            self._save()
            return
        own = self._fingerprint(key)
        if own:
            if self.reference_key is not None and self.reference_key != key:
                log.info("route %s: canary: %s has its own fingerprint", self.route, key.label())
                self._reset_verdict()
            self.reference_key = key
            reference = own
        elif self.reference_key is not None and (previous := self._fingerprint(self.reference_key)):
            reference = previous
        else:
            self._adopt(key, read)
            self._save()
            return
        comparison = compare(read, reference, self.drop)
        self.last_comparison = comparison
        self.reference_ratio = comparison.reference_ratio if comparison is not None else _pooled(reference)
        if comparison is not None:
            self._verdict(comparison)
            if self.reference_key != key:  # a new key on probation against the previous fingerprint
                self.not_low_on_new_key = 0 if comparison.low else self.not_low_on_new_key + 1
                if self.not_low_on_new_key >= CLEAN_ROUNDS_TO_ADOPT and not self.degraded:
                    self._adopt(key, read)
        self._save()

    def _verdict(self, c: Comparison) -> None:
        if c.low:
            self.low_rounds += 1
            self.clean_rounds = 0
        else:
            self.low_rounds = 0
            self.clean_rounds = self.clean_rounds + 1 if c.clean else 0
        if not self.degraded and self.low_rounds >= LOW_ROUNDS_TO_PAGE:
            self.degraded = True
            log.warning(
                "route %s: canary acceptance %.3f is %.0f%% below the fingerprint's %.3f over %d prompts",
                self.route,
                c.round_ratio,
                100 * c.drop,
                c.reference_ratio,
                c.paired,
            )
        elif self.degraded and c.clean:
            self.degraded = False
            log.info("route %s: canary acceptance back to its fingerprint", self.route)

    def _adopt(self, key: BaselineKey, read: Mapping[str, Acceptance]) -> None:
        usable = {pid: (a.drafted, a.accepted, a.steps) for pid, a in read.items() if a.drafted > 0}
        if not usable:
            return
        self.store.put_fingerprint(self.route, key, self.prompt_hash, usable)
        self.reference_ratio = _pooled({pid: Acceptance(*v) for pid, v in usable.items()})
        log.info("route %s: canary fingerprint for %s adopted (%d prompts)", self.route, key.label(), len(usable))
        self.reference_key = key
        self._reset_verdict()

    def _reset_verdict(self) -> None:
        self.low_rounds = self.clean_rounds = self.not_low_on_new_key = 0
        self.degraded = False

    def _fingerprint(self, key: BaselineKey) -> dict[str, Acceptance]:
        return {
            pid: Acceptance(d, a, s)
            for pid, (d, a, s) in self.store.fingerprint(self.route, key, self.prompt_hash).items()
        }

    # ------------------------------------------------------------------ output
    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"probe_rounds_total": dict(self.rounds_total), "probe_method": self.method}
        rnd = self.last
        if rnd is not None:
            out["probe_success"] = rnd.outcome == "ok"
            out["probe_duration_seconds"] = rnd.duration_seconds
            totals = rnd.totals()
            if rnd.outcome == "ok" and totals.ratio is not None:
                out["probe_acceptance_ratio"] = totals.ratio
        if self.reference_key is not None:
            out["probe_baseline_ratio"] = self.reference_ratio
            out["probe_degraded"] = self.degraded
        return out

    # ------------------------------------------------------------------ persistence
    def _save(self) -> None:
        ref = self.reference_key
        self.store.put_probe_state(
            self.route,
            {
                "version": STATE_VERSION,
                "prompt_set": self.prompt_hash,
                "reference_key": ref.to_json() if ref is not None else None,
                "low_rounds": self.low_rounds,
                "clean_rounds": self.clean_rounds,
                "degraded": self.degraded,
                "not_low_on_new_key": self.not_low_on_new_key,
                "last_round": self.last_round_ts,
            },
        )

    def _restore(self) -> None:
        state = self.store.probe_state(self.route)
        if not state or state.get("version") != STATE_VERSION or state.get("prompt_set") != self.prompt_hash:
            return
        try:
            ref = state["reference_key"]
            self.reference_key = BaselineKey.from_json(ref) if ref else None
            self.low_rounds, self.clean_rounds = int(state["low_rounds"]), int(state["clean_rounds"])
            self.degraded = bool(state["degraded"])
            self.not_low_on_new_key = int(state.get("not_low_on_new_key", 0))
            last = state.get("last_round")
            self.last_round_ts = None if last is None else float(last)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            log.error("route %s: unreadable canary state (%r); starting afresh", self.route, exc)
            self.reference_key = None
            return
        if self.reference_key is not None:
            self.reference_ratio = _pooled(self._fingerprint(self.reference_key))


def _pooled(prompts: Mapping[str, Acceptance]) -> float | None:
    drafted = sum(a.drafted for a in prompts.values())
    return sum(a.accepted for a in prompts.values()) / drafted if drafted > 0 else None
