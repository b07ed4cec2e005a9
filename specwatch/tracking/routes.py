"""Per-route tracking: engine samples in, a `RouteObservation` and the base `RouteState` fields out.

Pure and clock-free: every timestamp comes from the samples. One `RouteTracker` per route keeps a
`ResetSafeCounter` per engine and counter, sums increases over engines (never averages ratios), and keeps
a `WindowRing` of the summed increases for the 1m/5m/1h windows.

Three ways an engine reports acceptance (`EngineSample.acceptance_source`):

- "counter": vLLM V1 counters, or SGLang >= 0.5.13 where drafts = Δverify_calls, accepted =
  Δgeneration_tokens - Δverify_calls and draft tokens = Δverify_calls x (spec_num_draft_tokens - 1).
- "gauge": SGLang interval gauges, weighted by each engine's running requests. `spec_accept_rate` up to
  0.5.10 counted the bonus token, (accepted + 1) / num_draft_tokens per verify; it is converted to the
  current definition accepted / (num_draft_tokens - 1), see `sglang_acceptance_ratio`.
- "lifetime_gauge": vLLM V0's since-start acceptance gauge, exported as the ratio of every window (its
  counters are known-wrong and never read).

Exported totals start at the engines' own values when first seen (so they equal the engine sums) and grow
by reset-corrected increases, so they never go backwards. Windows use only the increases seen while
tracking, so an engine appearing mid-way does not pour its whole history into the 1m window.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from specwatch.snapshot import (WINDOW_SECONDS, EngineCounters, EngineSample, RouteObservation, RouteState,
                                build)
from specwatch.tracking.counters import ResetSafeCounter
from specwatch.tracking.windows import Sums, WindowRing

# Windows in which per-position ratios and the effective draft length are reported (catalog: over 5m).
DETAIL_WINDOW = "5m"
# spec_accept_rate switched from counting the bonus token to excluding it between these releases.
_SGLANG_NEW_RATE_SINCE = (0, 5, 11)


@functools.lru_cache(maxsize=64)  # a route's version string is the same cycle after cycle
def parse_version(text: str) -> tuple[int, ...] | None:
    """'0.5.10' -> (0, 5, 10); '0.5.13rc1' / 'v0.5.13.post2' -> (0, 5, 13); None when there are no digits."""
    m = re.match(r"^v?(\d+(?:\.\d+)*)", text.strip())
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def sglang_acceptance_ratio(e: EngineCounters, version: tuple[int, ...] | None, k_hint: int | None) -> float | None:
    """Draft-token acceptance ratio (bonus token excluded) from SGLang's interval gauges, or None.

    With n = num_draft_tokens (k + 1) and tau = spec_accept_length = 1 + accepted / verify:
    - new definition (>= 0.5.13, recognised by the spec_num_draft_tokens gauge of the same release, or a
      known version >= 0.5.11): rate = accepted / (verify x (n - 1)) = (tau - 1) / k, used as is;
    - old definition (<= 0.5.10): rate_old = (accepted + verify) / (verify x n) = tau / n, converted with
      k from the route (server info) or, failing that, n = tau / rate_old;
    - no rate gauge (< 0.5.4): (tau - 1) / k when k is known.
    """
    n = _finite(e.spec_num_draft_tokens)
    k: float | None = (n - 1) if n is not None and n > 1 else (k_hint if k_hint else None)
    rate, tau = _finite(e.spec_accept_rate), _finite(e.spec_accept_length)
    if rate is not None:
        if n is not None or (version is not None and version >= _SGLANG_NEW_RATE_SINCE):
            return _clamp01(rate)
        if k is None and tau is not None and rate > 0 and tau / rate > 1:
            k = tau / rate - 1
        return _clamp01((rate * (k + 1) - 1) / k) if k else None
    if tau is not None and k:
        return _clamp01((tau - 1) / k)
    return None


def _clamp01(x: float) -> float | None:
    return min(1.0, max(0.0, x)) if math.isfinite(x) else None


def _finite(x: float | None) -> float | None:
    """The value, or None for a missing, NaN or infinite one (which would poison every later sum)."""
    return x if x is not None and math.isfinite(x) else None


@dataclass
class _Engine:
    """Reset-safe counters of one engine, keyed by counter name ('drafts', 'pos:0', 'verify_calls', ...)."""

    counters: dict[str, ResetSafeCounter] = field(default_factory=dict)

    def update(self, key: str, value: float | None, created: float | None) -> tuple[float, float, bool]:
        """(increase, value adopted at first sight, reset seen) for one counter; zeros when value is None."""
        if _finite(value) is None:
            return 0.0, 0.0, False
        counter = self.counters.get(key)
        if counter is None:  # not setdefault(): that would build a throwaway counter on every call
            counter = self.counters[key] = ResetSafeCounter()
        first, resets = counter.last_value is None, counter.resets
        increase = counter.update(value, created)
        initial = counter.total if first and counter.last_value is not None else 0.0
        return increase, initial, counter.resets != resets


def _vllm_sums(eng: _Engine, e: EngineCounters) -> tuple[Sums, Sums, bool]:
    created = e.created
    d_drafts, i_drafts, r1 = eng.update("drafts", e.drafts, created)
    d_tokens, i_tokens, r2 = eng.update("draft_tokens", e.draft_tokens, created)
    d_accepted, i_accepted, r3 = eng.update("accepted", e.accepted_tokens, created)
    reset = r1 or r2 or r3
    inc_pos, init_pos = [], []
    for key, value in zip(_position_keys(len(e.accepted_per_pos)), e.accepted_per_pos):
        i, a, r = eng.update(key, value, created)
        inc_pos.append(i)
        init_pos.append(a)
        reset = reset or r
    return (Sums(d_drafts, d_tokens, d_accepted, tuple(inc_pos)),
            Sums(i_drafts, i_tokens, i_accepted, tuple(init_pos)),
            reset)


@functools.lru_cache(maxsize=None)
def _position_keys(k: int) -> tuple[str, ...]:
    """('pos:0', ..., 'pos:{k-1}'), built once per k rather than formatted per engine and cycle."""
    return tuple(f"pos:{j}" for j in range(k))


def _sglang_counter_sums(eng: _Engine, e: EngineCounters, k: float | None) -> tuple[Sums, Sums, bool]:
    d_verify, init_verify, r1 = eng.update("verify_calls", e.spec_verify_calls, e.created)
    d_gen, init_gen, r2 = eng.update("generation_tokens", e.generation_tokens, e.created)
    per_verify = k or 0.0  # draft tokens per verify call; unknown k leaves draft tokens (and the ratio) absent

    def derived(verify: float, gen: float) -> Sums:
        return Sums(drafts=verify, draft_tokens=verify * per_verify, accepted=max(0.0, gen - verify))

    return derived(d_verify, d_gen), derived(init_verify, init_gen), r1 or r2


def _gauge_sums(e: EngineCounters, version: tuple[int, ...] | None, k_hint: int | None) -> Sums:
    weight = _finite(e.running) or 0.0
    # An idle engine's interval gauges keep their last value, and an adaptive tier at step 0 runs a
    # 1-token verify that drags the length toward 1: neither says anything about acceptance.
    if weight <= 0 or (e.spec_num_steps is not None and e.spec_num_steps <= 0):
        return Sums()
    ratio = sglang_acceptance_ratio(e, version, k_hint)
    tau = _finite(e.spec_accept_length)
    return Sums(gauge_ratio_weight=weight if ratio is not None else 0.0,
                gauge_ratio_weighted=weight * ratio if ratio is not None else 0.0,
                gauge_length_weight=weight if tau is not None else 0.0,
                gauge_length_weighted=weight * tau if tau is not None else 0.0)


def _sum_present(values: list[float | None]) -> float | None:
    present = [v for v in values if _finite(v) is not None]
    return sum(present) if present else None


def _div(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


class RouteTracker:
    """Tracks one route across cycles. Call `observe()` with each successful sample, `observe_down()` on failure."""

    def __init__(self, name: str, window_seconds: dict[str, float] | None = None) -> None:
        self.name = name
        self.windows = dict(window_seconds or WINDOW_SECONDS)
        self._engines: dict[str, _Engine] = {}
        self._ring = WindowRing(horizon_seconds=max(self.windows.values()))
        self._observed = Sums()  # increases seen while tracking (windows)
        self._exported = Sums()  # engine values at first sight + increases (exported totals)
        self._last: EngineSample | None = None
        self._last_obs: RouteObservation | None = None
        self._lifetime_ratio: float | None = None

    # ------------------------------------------------------------------ updates
    def observe(self, sample: EngineSample, gpus: tuple[int, ...] = ()) -> RouteObservation:
        version = parse_version(sample.engine_version) if sample.engine_version else None
        k = self._k(sample)
        inc, init, reset = Sums(), Sums(), False
        gauge_now = Sums()
        self._lifetime_ratio = None
        if sample.acceptance_source == "counter":
            for e in sample.engines:
                eng = self._engines.setdefault(e.engine, _Engine())
                if sample.engine_kind == "sglang":
                    engine_k = (e.spec_num_draft_tokens - 1) if e.spec_num_draft_tokens else k
                    i, a, r = _sglang_counter_sums(eng, e, engine_k)
                else:
                    i, a, r = _vllm_sums(eng, e)
                inc, init, reset = inc.plus(i), init.plus(a), reset or r
        elif sample.acceptance_source == "gauge":
            for e in sample.engines:
                gauge_now = gauge_now.plus(_gauge_sums(e, version, k))
        elif sample.acceptance_source == "lifetime_gauge":
            rates = [r for r in (_finite(e.lifetime_acceptance_rate) for e in sample.engines) if r is not None]
            self._lifetime_ratio = _clamp01(sum(rates) / len(rates)) if rates else None

        # Only one of inc and gauge_now can be non-zero, and adding a zero Sums changes nothing (no field
        # here is ever -0.0: all start at +0.0), so one plus() does the work of two.
        self._observed = self._observed.plus(gauge_now if sample.acceptance_source == "gauge" else inc)
        self._exported = self._exported.plus(init).plus(inc)
        self._ring.append(sample.ts, self._observed)
        self._last = sample

        obs = build(RouteObservation, dict(
            route=self.name, ts=sample.ts, up=True, model_name=sample.model_name,
            engine_version=sample.engine_version, engine_kind=sample.engine_kind,
            acceptance_source=sample.acceptance_source, k=k, reset=reset,
            d_drafts=inc.drafts, d_draft_tokens=inc.draft_tokens, d_accepted=inc.accepted,
            d_accepted_per_pos=inc.per_pos,
            gauge_acceptance_ratio=(self._lifetime_ratio if sample.acceptance_source == "lifetime_gauge"
                                    else _div(gauge_now.gauge_ratio_weighted, gauge_now.gauge_ratio_weight)),
            running_per_engine={e.engine: e.running for e in sample.engines if _finite(e.running) is not None},
            kv_usage=self._kv_usage(sample),
            window_acceptance=self._window_acceptance(),
            gpus=gpus,
        ))
        self._last_obs = obs
        return obs

    def observe_down(self, ts: float, gpus: tuple[int, ...] = ()) -> RouteObservation:
        """A failed scrape: counters and windows are kept as they were; nothing new is observed."""
        last = self._last
        obs = RouteObservation(
            route=self.name, ts=ts, up=False,
            model_name=last.model_name if last else "", engine_version=last.engine_version if last else "",
            engine_kind=last.engine_kind if last else "",
            acceptance_source=last.acceptance_source if last else "none",
            k=self._last_obs.k if self._last_obs else None, gpus=gpus,
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
            name=self.name, up=up, error_reason="" if up else error_reason,
            engine_kind=last.engine_kind if last else "", model_name=last.model_name if last else "",
            engine_version=last.engine_version if last else "",
            acceptance_source=last.acceptance_source if last else "none",
            drafts_total=totals.drafts, draft_tokens_total=totals.draft_tokens,
            accepted_tokens_total=totals.accepted, gpus=obs.gpus if obs else (),
        )
        if not up or last is None:
            # Windowed values and gauges describe the present; while the source is down there is none.
            return base
        detail = self._ring.delta(self.windows[DETAIL_WINDOW]) if DETAIL_WINDOW in self.windows else None
        d5 = detail[0] if detail else None
        positions: tuple[float, ...] = ()
        if d5 is not None and d5.drafts > 0:
            positions = tuple(max(0.0, p) / d5.drafts for p in d5.per_pos)
        base.update(
            acceptance_ratio=obs.window_acceptance, mean_acceptance_length=self._windowed(self._mean_length),
            position_acceptance_ratio=positions,
            draft_length=_div(d5.draft_tokens, d5.drafts) if d5 is not None else None,
            running_requests=_sum_present([e.running for e in last.engines]),
            waiting_requests=_sum_present([e.waiting for e in last.engines]), kv_usage_ratio=obs.kv_usage,
        )
        return base

    # ------------------------------------------------------------------ helpers
    def _windowed(self, value_of: Callable[[Sums], float | None]) -> dict[str, float]:
        out = {}
        for window, seconds in self.windows.items():
            d = self._ring.delta(seconds)
            value = value_of(d[0]) if d else None
            if value is not None:
                out[window] = value
        return out

    def _window_acceptance(self) -> dict[str, float]:
        if self._last is not None and self._last.acceptance_source == "lifetime_gauge":
            # A since-start ratio is the best V0 offers for every window; acceptance_source says so.
            return {} if self._lifetime_ratio is None else {w: self._lifetime_ratio for w in self.windows}
        return self._windowed(self._ratio)

    def _ratio(self, d: Sums) -> float | None:
        source = self._last.acceptance_source if self._last else "none"
        if source == "gauge":
            return _div(d.gauge_ratio_weighted, d.gauge_ratio_weight)
        if source == "counter":
            r = _div(d.accepted, d.draft_tokens)
            return None if r is None else min(1.0, max(0.0, r))
        return None

    def _mean_length(self, d: Sums) -> float | None:
        source = self._last.acceptance_source if self._last else "none"
        if source == "gauge":
            return _div(d.gauge_length_weighted, d.gauge_length_weight)
        if source == "counter":
            per_draft = _div(d.accepted, d.drafts)
            return None if per_draft is None else 1.0 + max(0.0, per_draft)
        return None

    @staticmethod
    def _k(sample: EngineSample) -> int | None:
        if sample.num_speculative_tokens:
            return sample.num_speculative_tokens
        positions = max((len(e.accepted_per_pos) for e in sample.engines), default=0)
        if positions:
            return positions
        n = max((e.spec_num_draft_tokens or 0 for e in sample.engines), default=0)
        return int(n) - 1 if n > 1 else None

    @staticmethod
    def _kv_usage(sample: EngineSample) -> float | None:
        values = [e.kv_usage for e in sample.engines if _finite(e.kv_usage) is not None]
        return sum(values) / len(values) if values else None

