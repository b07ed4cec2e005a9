"""Per-route tracking: engine samples in, a `RouteObservation` and the base `RouteState` fields out.

Pure and clock-free: every timestamp comes from the samples. One `RouteTracker` per route keeps a
`ResetSafeCounter` per engine and counter, sums increases over engines (never averages ratios), and keeps
a `WindowRing` of the summed increases for the 1m/5m/1h windows.

Three ways an engine reports acceptance (`EngineSample.acceptance_source`), each already in one meaning
(the sources translate every engine's names, versions and definitions; `EngineCounters` says what each field
means):

- "counter": cumulative drafts, draft tokens, accepted tokens and per-position counts; or, for engines that
  count only verify steps and generated tokens (`verify_counts`), accepted = Δgeneration - Δdrafts and draft
  tokens = Δdrafts x the engine's current draft length.
- "gauge": interval acceptance ratios and lengths computed by the engine, weighted by each engine's running
  requests.
- "lifetime_gauge": a since-start acceptance ratio, exported as the ratio of every window.

Exported totals start at the engines' own values when first seen (so they equal the engine sums) and grow
by reset-corrected increases, so they never go backwards. Windows use only the increases seen while
tracking, so an engine appearing mid-way does not pour its whole history into the 1m window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from specwatch.snapshot import (
    WINDOW_SECONDS,
    EngineCounters,
    EngineSample,
    RouteObservation,
    RouteState,
    StepTimes,
)
from specwatch.tracking.counters import REJECT_REASONS, ResetSafeCounter
from specwatch.tracking.windows import Sums, WindowRing

# Windows in which per-position ratios and the effective draft length are reported (catalog: over 5m).
DETAIL_WINDOW = "5m"
# Below this many draft tokens per generated token over the window, speculation counts as inactive: a real vLLM
# in a K=0 band of its batch-size schedule still drafts for the odd step whose batch dips at request boundaries
# (3 draft tokens against ~1000 generated in tests/test_real_vllm_schedule.py), and those strays must not mask a
# drafter that is off. Any step that drafts proposes at least one token per generated 1 + accepted, so a route
# drafting on even a few percent of its steps stays well above it.
MIN_ACTIVE_DRAFT_SHARE = 0.01


def _clamp01(x: float) -> float | None:
    return min(1.0, max(0.0, x)) if math.isfinite(x) else None


def _finite(x: float | None) -> float | None:
    """The value, or None for a missing, NaN or infinite one (which would poison every later sum)."""
    return x if x is not None and math.isfinite(x) else None


@dataclass
class _Engine:
    """Reset-safe counters of one engine, keyed by counter name ('drafts', 'pos:0', 'verify_calls', ...)."""

    counters: dict[str, ResetSafeCounter] = field(default_factory=dict)
    seen: bool = False  # sampled in an earlier cycle
    rejected: dict[str, float] = field(default_factory=dict)  # reason -> samples rejected (the route's, shared)

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0.0) + 1.0

    def update(
        self,
        keys: tuple[str, ...],
        values: tuple[float | None, ...],
        created: float | None,
        ts: float | None = None,
        inconsistent: str | None = None,
        main: bool = True,
    ) -> tuple[list[float], list[float] | None, bool]:
        """Several counters in one call (a vLLM engine has 4 + k each cycle): their increases, the values
        adopted at first sight (None when no counter was new, the steady state) and whether any was reset.
        A missing value counts as no increase. A sample with any value that cannot be true
        (`ResetSafeCounter.check`) is rejected whole and counted: no counter moves, so that the next good
        sample's increases span both intervals and the counters stay consistent with each other.

        A counter that appears on an engine already being sampled started from 0 in between: the engines
        create a labelled series on its first increment (TensorRT-LLM's and llama.cpp's per-position
        counters, any counter before the first request), so its whole value is new. Only the counters of an
        engine seen for the first time are adopted as history that predates us.

        `inconsistent`: the reason the caller found the values impossible together, rejected after their own.
        `main` marks the engine's speculative counters, whose restart also restarts the engine's counters
        absent from this call; a side set (step times) read after them passes False."""
        counters = self.counters
        # A restart is engine-wide: one counter going back (or a new start marker) means every counter of the
        # engine started again from 0, those that came back higher included.
        reset = any(
            (counter := counters.get(key)) is not None and value is not None and counter.went_back(value, created)
            for key, value in zip(keys, values)
        )
        for key, value in zip(keys, values):
            if (
                value is not None
                and (reason := counters.get(key, _UNSEEN).check(value, created, ts, reset)) is not None
            ):
                break
        else:
            reason = inconsistent
        if reason is not None:
            self.reject(reason)
            return [0.0] * len(keys), None, False
        increases: list[float] = []
        initials: list[float] | None = None
        known, self.seen = self.seen, True
        if reset and main:
            for key, counter in counters.items():
                if key not in keys and counter.last_value is not None:
                    counter.last_value, counter.last_created = 0.0, created  # absent now: it restarts from 0
        for j, (key, value) in enumerate(zip(keys, values)):
            if value is None:
                increases.append(0.0)
                continue
            counter = counters.get(key)
            if counter is None:  # not setdefault(): that would build a throwaway counter on every call
                counter = counters[key] = ResetSafeCounter()
                if known:
                    counter.update(0.0, created)
            if counter.last_value is None:
                increases.append(counter.update(value, created, ts))
                if counter.last_value is not None:  # adopted: its history predates us
                    if initials is None:
                        initials = [0.0] * len(keys)
                    initials[j] = counter.total
                continue
            increases.append(counter.update(value, created, ts, restarted=reset))
        return increases, initials, reset


_UNSEEN = ResetSafeCounter()  # checks a counter's first value (never updated)


def _accepted_over_drafted(e: EngineCounters) -> bool:
    """More draft tokens accepted than drafted, in the engine's own totals: an engine counts drafted tokens
    before it verifies them, so no true sample shows this."""
    accepted, drafted = e.accepted_tokens, e.draft_tokens
    return accepted is not None and drafted is not None and accepted > drafted


_VLLM_KEYS = ("drafts", "draft_tokens", "accepted", "generation")


def _vllm_sums(eng: _Engine, e: EngineCounters, ts: float) -> tuple[Sums, Sums | None, bool, tuple[float, ...]]:
    """(increases, values adopted at first sight or None, reset seen, drafted-per-position increases) of one
    engine's counters: vLLM's, and TensorRT-LLM's and llama.cpp's, which share its layout."""
    per_pos, drafted_pos = e.accepted_per_pos, e.drafted_per_pos
    k = len(per_pos)
    increases, initials, reset = eng.update(
        _vllm_keys(k, len(drafted_pos)),
        (e.drafts, e.draft_tokens, e.accepted_tokens, e.generation_tokens, *per_pos, *drafted_pos),
        e.created,
        ts,
        "accepted_over_drafted" if _accepted_over_drafted(e) else None,
    )
    inc = _counter_sums(increases, k)
    drafted = tuple(increases[4 + k :]) if drafted_pos else ()
    if initials is None:
        return inc, None, reset, drafted
    return inc, _counter_sums(initials, k), reset, drafted


def _counter_sums(values: list[float], k: int) -> Sums:
    """Sums of (drafts, draft_tokens, accepted, generation, *per_pos, ...), the order of `_vllm_keys`."""
    return Sums(
        drafts=values[0],
        draft_tokens=values[1],
        accepted=values[2],
        per_pos=tuple(values[4 : 4 + k]),
        generation_tokens=values[3],
    )


def _vllm_keys(k: int, drafted_positions: int = 0) -> tuple[str, ...]:
    """('drafts', 'draft_tokens', 'accepted', 'generation', 'pos:0', ..., 'pos:{k-1}', 'dpos:0', ...)."""
    return _VLLM_KEYS + tuple(f"pos:{j}" for j in range(k)) + tuple(f"dpos:{j}" for j in range(drafted_positions))


_STEP_TIME_KEYS = ("itl_sum", "itl_count", "steps")


def _step_time(eng: _Engine, totals: StepTimes, ts: float) -> StepTimes:
    """What the engine's step-time totals grew by since the last cycle (steps None where it has none)."""
    (seconds, count, steps), _, _ = eng.update(_STEP_TIME_KEYS, totals, None, ts, main=False)
    return StepTimes(seconds, count, None if totals.steps is None else steps, totals.per_token)


_VERIFY_KEYS = ("verify_steps", "generation_tokens")


def _verify_sums(eng: _Engine, e: EngineCounters, ts: float) -> tuple[Sums, Sums | None, bool]:
    """`_vllm_sums` for an engine that counts verify steps and generated tokens only (`verify_counts`): each
    step emits its accepted tokens and one more, and proposed the engine's current draft length."""
    increases, initials, reset = eng.update(_VERIFY_KEYS, (e.drafts, e.generation_tokens), e.created, ts)
    per_verify = e.draft_length or 0.0  # unknown leaves draft tokens (and the ratio) absent

    def derived(verify: float, gen: float) -> Sums:
        return Sums(
            drafts=verify, draft_tokens=verify * per_verify, accepted=max(0.0, gen - verify), generation_tokens=gen
        )

    return derived(*increases), (None if initials is None else derived(*initials)), reset


def _gauge_sums(e: EngineCounters) -> Sums:
    weight = _finite(e.running) or 0.0
    # An idle engine's interval averages keep their last value: they say nothing about acceptance now.
    if weight <= 0:
        return Sums()
    ratio = _clamp01(e.interval_acceptance_ratio) if e.interval_acceptance_ratio is not None else None
    tau = _finite(e.interval_acceptance_length)
    return Sums(
        gauge_ratio_weight=weight if ratio is not None else 0.0,
        gauge_ratio_weighted=weight * ratio if ratio is not None else 0.0,
        gauge_length_weight=weight if tau is not None else 0.0,
        gauge_length_weighted=weight * tau if tau is not None else 0.0,
    )


def _add_vectors(a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, ...]:
    """Element-wise sum; a position one side lacks counts as 0."""
    n = max(len(a), len(b))
    return tuple((a[j] if j < len(a) else 0.0) + (b[j] if j < len(b) else 0.0) for j in range(n))


def _sum_present(values: list[float | None]) -> float | None:
    present = [x for v in values if (x := _finite(v)) is not None]
    return sum(present) if present else None


def _div(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _positions_comparable(d: Sums, last: EngineSample) -> bool:
    """Whether per-position counts per draft (p_j = accepted at j / drafts) read as the acceptance at j: only
    when every draft of the window proposed all k positions. A draft shorter than k (a batch-size band's K,
    grammar-invalidated drafts, a verify cap, a drafter with nothing to propose past its match) adds to the
    drafts but can never be accepted at the positions it did not draft, so p_j there mixes "not drafted" with
    "rejected". Seen as fewer draft tokens than k per draft, or told by the engine (`draft_length_varies`)."""
    if last.draft_length_varies:
        return False
    k = len(d.per_pos)
    # Counts are whole tokens: half a token of slack keeps float sums of whole numbers from tipping it.
    return d.draft_tokens + 0.5 >= k * d.drafts


class RouteTracker:
    """Tracks one route across cycles. Call `observe()` with each successful sample, `observe_down()` on failure."""

    def __init__(self, name: str, window_seconds: dict[str, float] | None = None) -> None:
        self.name = name
        self.windows = dict(window_seconds or WINDOW_SECONDS)
        self._engines: dict[str, _Engine] = {}
        self._ring = WindowRing(horizon_seconds=max(self.windows.values()))
        # Drafted tokens per position (TensorRT-LLM), in `per_pos` of a ring of their own: only engines that
        # export them pay for it.
        self._drafted_ring: WindowRing | None = None
        self._drafted = Sums()
        self._observed = Sums()  # increases seen while tracking (windows)
        self._exported = Sums()  # engine values at first sight + increases (exported totals)
        self._last: EngineSample | None = None
        self._last_obs: RouteObservation | None = None
        # The drafter last told: kept while the engine tells none (llama.cpp before a restarted server's first
        # request), since not telling is not a change.
        self._drafter = ""
        self._lifetime_ratio: float | None = None
        self._mean_lengths: dict[str, float] = {}  # by window, as of the last observe()
        self._excluded = Sums()  # canary probe tokens still to be taken out of the next increases
        self._rejected: dict[str, float] = dict.fromkeys(REJECT_REASONS, 0.0)  # counter samples that cannot be true
        self._decode_totals: dict[str, tuple[float, float]] = {}  # engine -> (decode steps, requests over them)

    def exclude(self, drafts: float, draft_tokens: float, accepted: float, per_pos: tuple[float, ...] = ()) -> None:
        """Leave these tokens (a canary probe's own) out of the windows and detector deltas: they are taken out
        of the next increases, as far as those reach, the rest carried over. Exported totals keep them: those
        are the engine's own counters."""
        self._excluded = self._excluded.plus(Sums(drafts, draft_tokens, accepted, per_pos))

    # ------------------------------------------------------------------ updates
    def observe(self, sample: EngineSample, gpus: tuple[int, ...] = ()) -> RouteObservation:
        k = self._k(sample)
        source = sample.acceptance_source
        inc = gauge_now = Sums()
        init: Sums | None = None  # values adopted at first sight: only in a counter's first cycle
        reset = False
        drafted_inc: tuple[float, ...] = ()
        self._lifetime_ratio = None
        step_times: dict[str, StepTimes] = {}
        if source == "counter":
            for e in sample.engines:
                eng = self._engines.get(e.engine)
                if eng is None:
                    eng = self._engines[e.engine] = _Engine(rejected=self._rejected)
                if e.verify_counts:
                    i, a, r = _verify_sums(eng, e, sample.ts)
                else:
                    i, a, r, d = _vllm_sums(eng, e, sample.ts)
                    if d:
                        drafted_inc = _add_vectors(drafted_inc, d)
                inc = inc.plus(i)
                if a is not None:
                    init = a if init is None else init.plus(a)
                reset = reset or r
            for engine, totals in sample.step_time_totals.items():
                eng = self._engines.get(engine)
                if eng is not None:
                    step_times[engine] = _step_time(eng, totals, sample.ts)
        elif source == "gauge":
            for e in sample.engines:
                gauge_now = gauge_now.plus(_gauge_sums(e))
        elif source == "none":
            # Engines whose spec counters appear only once they count (llama.cpp before its first drafted
            # request finished) are being sampled already: what then appears started from 0.
            for e in sample.engines:
                eng = self._engines.get(e.engine)
                if eng is None:
                    eng = self._engines[e.engine] = _Engine(rejected=self._rejected)
                eng.seen = True
        elif source == "lifetime_gauge":
            rates = [r for r in (_finite(e.lifetime_acceptance_ratio) for e in sample.engines) if r is not None]
            self._lifetime_ratio = _clamp01(sum(rates) / len(rates)) if rates else None

        engine_inc = inc
        if source == "counter" and self._excluded != Sums():
            inc = self._take_excluded(inc)
        # Only one of inc and gauge_now can be non-zero, and adding a zero Sums changes nothing (no field
        # here is ever -0.0: all start at +0.0), so one plus() does the work of two.
        self._observed = self._observed.plus(gauge_now if source == "gauge" else inc)
        if init is not None:
            self._exported = self._exported.plus(init)
        self._exported = self._exported.plus(engine_inc)
        self._ring.append(sample.ts, self._observed)
        if drafted_inc or self._drafted_ring is not None:
            if self._drafted_ring is None:
                self._drafted_ring = WindowRing(horizon_seconds=max(self.windows.values()))
            self._drafted = Sums(per_pos=_add_vectors(self._drafted.per_pos, drafted_inc))
            self._drafted_ring.append(sample.ts, self._drafted)
        self._last = sample
        self._drafter = sample.drafter or self._drafter
        window_acceptance, self._mean_lengths = self._window_values()

        obs = RouteObservation(
            route=self.name,
            ts=sample.ts,
            up=True,
            model_name=sample.model_name,
            engine_version=sample.engine_version,
            engine_kind=sample.engine_kind,
            acceptance_source=sample.acceptance_source,
            k=k,
            drafter=self._drafter,
            reset=reset,
            d_drafts=inc.drafts,
            d_draft_tokens=inc.draft_tokens,
            d_accepted=inc.accepted,
            d_accepted_per_pos=inc.per_pos,
            d_generation_tokens=inc.generation_tokens,
            gauge_acceptance_ratio=(
                self._lifetime_ratio
                if sample.acceptance_source == "lifetime_gauge"
                else _div(gauge_now.gauge_ratio_weighted, gauge_now.gauge_ratio_weight)
            ),
            running_per_engine={e.engine: batch for e in sample.engines if (batch := self._batch(e)) is not None},
            waiting_requests=_sum_present([e.waiting for e in sample.engines]),
            kv_usage=self._kv_usage(sample),
            window_acceptance=window_acceptance,
            gpus=gpus,
            step_time_per_engine=step_times,
        )
        self._last_obs = obs
        return obs

    def observe_down(self, ts: float, gpus: tuple[int, ...] = ()) -> RouteObservation:
        """A failed scrape: counters and windows are kept as they were; nothing new is observed."""
        last = self._last
        obs = RouteObservation(
            route=self.name,
            ts=ts,
            up=False,
            model_name=last.model_name if last else "",
            engine_version=last.engine_version if last else "",
            engine_kind=last.engine_kind if last else "",
            acceptance_source=last.acceptance_source if last else "none",
            k=self._last_obs.k if self._last_obs else None,
            drafter=self._drafter,
            gpus=gpus,
        )
        self._last_obs = obs
        return obs

    # ------------------------------------------------------------------ results
    def state(self, error_reason: str = "") -> RouteState:
        """The base RouteState (tracking fields) as of the last observe()/observe_down()."""
        return RouteState(**self.state_fields(error_reason))

    def state_fields(self, error_reason: str = "") -> dict[str, Any]:
        """`state()` as RouteState keyword arguments, for a caller that adds fields of its own: building
        the RouteState once with all of them costs 40% of building it and then `replace()`-ing them in."""
        obs, last = self._last_obs, self._last
        up = bool(obs and obs.up)
        totals = self._exported
        base = dict(
            name=self.name,
            up=up,
            error_reason="" if up else error_reason,
            engine_kind=last.engine_kind if last else "",
            model_name=last.model_name if last else "",
            engine_version=last.engine_version if last else "",
            drafter=self._drafter,
            acceptance_source=last.acceptance_source if last else "none",
            drafts_total=totals.drafts,
            draft_tokens_total=totals.draft_tokens,
            accepted_tokens_total=totals.accepted,
            rejected_samples_total=dict(self._rejected),
            gpus=obs.gpus if obs else (),
        )
        if not up or last is None or obs is None:
            # Windowed values and gauges describe the present; while the source is down there is none.
            return base
        # The windowed series come from one ring and stand or fall together: a sample that cannot carry
        # counters (speculation off, or a gauge-only engine) shows none of the per-position ones either.
        detail = (
            self._ring.delta(self.windows[DETAIL_WINDOW])
            if DETAIL_WINDOW in self.windows and last.acceptance_source == "counter"
            else None
        )
        d5 = detail[0] if detail else None
        positions: tuple[float, ...] = ()
        comparable: bool | None = None
        drafted = (
            self._drafted_ring.delta(self.windows[DETAIL_WINDOW])
            if (self._drafted_ring is not None and detail is not None)
            else None
        )
        if d5 is not None and drafted is not None:
            # Per-position denominators: p_j = accepted at j / drafted at j, true however k varied.
            positions = tuple(max(0.0, p) / n for p, n in zip(d5.per_pos, drafted[0].per_pos) if n > 0)
            comparable = True if positions else None
        elif d5 is not None and d5.drafts > 0:
            positions = tuple(max(0.0, p) / d5.drafts for p in d5.per_pos)
            comparable = _positions_comparable(d5, last) if positions else None
        base.update(
            acceptance_ratio=obs.window_acceptance,
            mean_acceptance_length=self._mean_lengths,
            position_acceptance_ratio=positions,
            position_acceptance_comparable=comparable,
            draft_length_basis=last.draft_length_basis,
            draft_length=_div(d5.draft_tokens, d5.drafts) if d5 is not None else None,
            speculation_active=self._speculation_active(d5, last),
            running_requests=_sum_present([e.running for e in last.engines]),
            waiting_requests=_sum_present([e.waiting for e in last.engines]),
            kv_usage_ratio=obs.kv_usage,
        )
        return base

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _speculation_active(d5: Sums | None, last: EngineSample) -> bool | None:
        """Drafts proposed over the detail window: True; tokens generated with (next to) none on a route whose
        engine has speculation configured: False (vLLM's K=0 schedule bands, SGLang's adaptive step 0, a
        drafter switched off by the engine's own gate); otherwise (idle, speculation off, gauge-only) None."""
        if d5 is None or last.acceptance_source != "counter" or not last.speculation_enabled:
            return None
        if d5.generation_tokens > 0:
            return d5.draft_tokens >= MIN_ACTIVE_DRAFT_SHARE * d5.generation_tokens
        return True if d5.draft_tokens > 0 else None

    def _take_excluded(self, inc: Sums) -> Sums:
        """`inc` less the excluded tokens it can hold (never below 0); what it cannot hold is kept for later."""
        ex = self._excluded
        take = Sums(
            min(inc.drafts, ex.drafts),
            min(inc.draft_tokens, ex.draft_tokens),
            min(inc.accepted, ex.accepted),
            tuple(min(inc.per_pos[j], ex.per_pos[j]) if j < len(ex.per_pos) else 0.0 for j in range(len(inc.per_pos))),
        )
        self._excluded = Sums(
            ex.drafts - take.drafts,
            ex.draft_tokens - take.draft_tokens,
            ex.accepted - take.accepted,
            tuple(ex.per_pos[j] - (take.per_pos[j] if j < len(take.per_pos) else 0.0) for j in range(len(ex.per_pos))),
        )
        return inc.minus(take)

    def _window_values(self) -> tuple[dict[str, float], dict[str, float]]:
        """(acceptance ratio, mean acceptance length) by window, both from one pass over the ring's deltas."""
        source = self._last.acceptance_source if self._last is not None else "none"
        ratios: dict[str, float] = {}
        lengths: dict[str, float] = {}
        if source == "lifetime_gauge":
            # A since-start ratio is the best V0 offers for every window; acceptance_source says so.
            if self._lifetime_ratio is not None:
                ratios = dict.fromkeys(self.windows, self._lifetime_ratio)
            return ratios, lengths
        if source != "counter" and source != "gauge":
            return ratios, lengths
        for window, seconds in self.windows.items():
            delta = self._ring.delta(seconds)
            if delta is None:
                continue
            d = delta[0]
            if source == "counter":
                if d.draft_tokens > 0:
                    ratios[window] = min(1.0, max(0.0, d.accepted / d.draft_tokens))
                if d.drafts > 0:
                    lengths[window] = 1.0 + max(0.0, d.accepted / d.drafts)
            else:  # batch-weighted means of the interval gauges
                if d.gauge_ratio_weight > 0:
                    ratios[window] = d.gauge_ratio_weighted / d.gauge_ratio_weight
                if d.gauge_length_weight > 0:
                    lengths[window] = d.gauge_length_weighted / d.gauge_length_weight
        return ratios, lengths

    def _batch(self, e: EngineCounters) -> float | None:
        """The engine's batch for the crossover: the mean over this cycle's decode steps where the engine counts
        them, else its decode batch gauge, else its running requests. Counts that went back (a restart) or did
        not move (no step) give no mean this cycle."""
        steps, requests = _finite(e.decode_steps), _finite(e.decode_step_requests)
        if steps is not None and requests is not None:
            last = self._decode_totals.get(e.engine)
            self._decode_totals[e.engine] = (steps, requests)
            if last is not None and steps > last[0] and requests >= last[1]:
                return (requests - last[1]) / (steps - last[0])
        batch = _finite(e.decode_batch)
        return batch if batch is not None else _finite(e.running)

    @staticmethod
    def _k(sample: EngineSample) -> int | None:
        if sample.num_speculative_tokens:
            return sample.num_speculative_tokens
        positions = max((len(e.accepted_per_pos) for e in sample.engines), default=0)
        return positions or None

    @staticmethod
    def _kv_usage(sample: EngineSample) -> float | None:
        values = [x for e in sample.engines if (x := _finite(e.kv_usage)) is not None]
        return sum(values) / len(values) if values else None
