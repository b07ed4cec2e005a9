"""The live above-crossover flag: is this route's batch past the point where speculation costs throughput?

Per cycle: the batch is the time-weighted mean of running requests per engine over the last minute (or the
hold, if shorter); each DP engine schedules its own batch, so per engine is the unit B* is about. B* comes
from the route's crossover source re-solved for the live per-position acceptance. The flag enters above B*,
leaves below 0.9 B*, and keeps each state at least `crossover.hold` (10 minutes) so a batch hovering at B*
cannot flap it.
`compute_bound` reads the route's GPUs' GPM tensor activity and DRAM utilization.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter, deque
from typing import Any, Mapping, Sequence

from specwatch.config import CrossoverConfig, RouteConfig
from specwatch.crossover.estimate import build_step_model
from specwatch.crossover.configured import (
    CrossoverSource,
    EstimatedCrossover,
    FixedCrossover,
    LiveInputs,
    SweptCrossover,
    positions_from_rate,
)
from specwatch.crossover.kernel import PACKED, UNPACKED
from specwatch.crossover.livecal import LiveAnswer, LiveCalibration
from specwatch.crossover.speedup import tau
from specwatch.crossover.sweepfile import load_sweep
from specwatch.evaluators.base import EvaluatorContext
from specwatch.snapshot import GpuSample, RouteObservation, StepTimes

log = logging.getLogger(__name__)

BATCH_WINDOW_SECONDS = 60.0
ACCEPTANCE_WINDOW_SECONDS = 300.0
EXIT_FRACTION = 0.9

# GPM thresholds measured on an H200 (docs/crossover.md, `bench_crossover.py --gpm`): Llama-3-8B-shaped GEMMs
# read tensor 0.63 / DRAM 0.54 at 192 tokens per forward and 0.71 / 0.47 at 256, either side of the ~225-token
# roofline ridge; plain decode with attention never exceeded tensor 0.37 (DRAM >= 0.62) up to batch 256.
TENSOR_ACTIVE_MIN = 0.5
DRAM_UTILIZATION_MAX = 0.5
TENSOR_FIELD = "gpu_tensor_active_ratio"
DRAM_FIELD = "gpu_dram_bandwidth_utilization_ratio"


class TimeWeightedMean:
    """Mean of a sampled gauge over a trailing window; each sample stands for the interval that ended at it.

    Only the first interval (from samples[0], which may predate the window) can be cut by the window's start
    when the mean is taken at the newest sample, as the evaluator does each cycle; the others are kept summed
    as samples enter and leave, so that costs O(1) instead of a pass over the window.
    """

    def __init__(self, window_seconds: float) -> None:
        self.window = window_seconds
        self.samples: deque[tuple[float, float]] = deque()
        self._inner_total = self._inner_weight = 0.0  # Σ w·value and Σ w over every interval but the first

    def add(self, ts: float, value: float) -> None:
        samples = self.samples
        if samples and ts <= samples[-1][0]:
            self._clear()  # the clock went backwards: start over rather than weigh nonsense
        if len(samples) >= 2:
            w = ts - samples[-1][0]
            self._inner_total += w * value
            self._inner_weight += w
        samples.append((ts, value))
        while len(samples) > 1 and samples[1][0] <= ts - self.window:
            samples.popleft()
            if len(samples) >= 2:  # the interval ending at samples[1] is the first one now
                w = samples[1][0] - samples[0][0]
                self._inner_total -= w * samples[1][1]
                self._inner_weight -= w
        if len(samples) <= 2:
            self._inner_total = self._inner_weight = 0.0  # exact zeros, whatever rounding left

    def mean(self, now: float) -> float | None:
        """samples[0] may predate the window: it only bounds the interval of the sample after it."""
        samples = self.samples
        if not samples:
            return None
        if len(samples) == 1:
            return samples[0][1]
        start = now - self.window
        if now > samples[-1][0]:  # later than the newest sample: the window's start may cut any interval
            total = weight = 0.0
            for (t0, _), (t1, value) in zip(samples, itertools.islice(samples, 1, None)):
                w = t1 - max(t0, start)
                if w > 0:
                    total, weight = total + w * value, weight + w
        else:
            (t0, _), (t1, value) = samples[0], samples[1]
            w = max(0.0, t1 - max(t0, start))
            total, weight = self._inner_total + w * value, self._inner_weight + w
        return total / weight if weight > 0 else samples[-1][1]

    def _clear(self) -> None:
        self.samples.clear()
        self._inner_total = self._inner_weight = 0.0


class PositionWindow:
    """Per-position acceptance over a trailing window from per-cycle deltas: p_j = sum accepted_j / sum drafts.

    Running sums are kept as deltas enter and leave, so a cycle costs O(k) rather than a pass over the
    whole window. Deltas are token counts (integers in doubles), so adding and subtracting them is exact.
    """

    def __init__(self, window_seconds: float) -> None:
        self.window = window_seconds
        self.deltas: deque[tuple[float, tuple[float, ...], float]] = deque()
        self._accepted: list[float] = []  # per position, over the deltas in the window
        self._drafts = 0.0
        self._widths: Counter[int] = Counter()  # how many deltas in the window have each number of positions

    def add(self, ts: float, accepted_per_pos: Sequence[float], drafts: float) -> None:
        if drafts > 0 and accepted_per_pos:
            entry = (ts, tuple(accepted_per_pos), drafts)
            self.deltas.append(entry)
            self._count(entry, 1.0)
        while self.deltas and self.deltas[0][0] <= ts - self.window:
            self._count(self.deltas.popleft(), -1.0)
        if not self.deltas:
            self.clear()  # start again from exact zeros

    def _count(self, entry: tuple[float, tuple[float, ...], float], sign: float) -> None:
        _, accepted, drafts = entry
        if len(accepted) > len(self._accepted):
            self._accepted += [0.0] * (len(accepted) - len(self._accepted))
        for j, a in enumerate(accepted):
            self._accepted[j] += sign * a
        self._drafts += sign * drafts
        self._widths[len(accepted)] += int(sign)
        if not self._widths[len(accepted)]:
            del self._widths[len(accepted)]

    def clear(self) -> None:
        self.deltas.clear()
        self._accepted, self._drafts = [], 0.0
        self._widths.clear()

    def positions(self, k: int | None) -> tuple[float, ...]:
        width = k or max(self._widths, default=0)
        drafts = self._drafts
        if drafts <= 0 or width == 0:
            return ()
        sums = self._accepted[:width] + [0.0] * (width - len(self._accepted))
        return tuple(min(1.0, s / drafts) for s in sums)


class Hysteresis:
    """Enter at `value > threshold`, leave at `value < exit_fraction x threshold`, each state held >= `hold`."""

    def __init__(self, hold_seconds: float, exit_fraction: float = EXIT_FRACTION) -> None:
        self.hold = hold_seconds
        self.exit_fraction = exit_fraction
        self.state = False
        self.since: float | None = None  # None: never changed, so the first entry is immediate

    def update(self, now: float, value: float, threshold: float | None) -> bool:
        held = self.since is None or now - self.since >= self.hold
        if threshold is None:
            want = False  # no crossover: speculation wins at every batch
        elif self.state:
            want = not value < self.exit_fraction * threshold
        else:
            want = value > threshold
        if want != self.state and held:
            self.state, self.since = want, now
        return self.state


def compute_bound(gpus: Sequence[GpuSample], indexes: Sequence[int]) -> bool | None:
    """Mean GPM tensor activity and DRAM utilization of the route's GPUs; None without GPM readings."""
    chosen = [g for g in gpus if g.up and (not indexes or g.index in indexes)]
    tensor = [g.fields[TENSOR_FIELD] for g in chosen if TENSOR_FIELD in g.fields]
    dram = [g.fields[DRAM_FIELD] for g in chosen if DRAM_FIELD in g.fields]
    if not tensor or not dram:
        return None
    return sum(tensor) / len(tensor) >= TENSOR_ACTIVE_MIN and sum(dram) / len(dram) <= DRAM_UTILIZATION_MAX


class GpuTimeLedger:
    """GPU time speculation cost (above the crossover) or saved (below it), from the predicted speedup.

    Over a cycle of dt seconds on G GPUs, speculation delivers its tokens in G dt GPU-seconds; plain decoding
    at the same batch would have needed G dt S, S = predicted spec / plain throughput. The difference,
    G dt (1 - S), is lost when positive and saved when negative. Cycles longer than MAX_ACCOUNTED_GAP_SECONDS
    (a stalled daemon, an engine that was down) are not accounted: nothing is known about the gap.
    """

    MAX_ACCOUNTED_GAP_SECONDS = 60.0

    def __init__(self) -> None:
        self.lost_seconds = 0.0
        self.saved_seconds = 0.0
        self._last_ts: float | None = None

    def add(self, ts: float, speedup: float | None, gpus: int) -> None:
        last, self._last_ts = self._last_ts, ts
        if last is None or speedup is None or gpus <= 0:
            return
        dt = ts - last
        if not 0 < dt <= self.MAX_ACCOUNTED_GAP_SECONDS:
            return
        difference = gpus * dt * (1.0 - speedup)
        if difference > 0:
            self.lost_seconds += difference
        else:
            self.saved_seconds -= difference

    def gap(self) -> None:
        """The route was down: the next cycle starts a new interval."""
        self._last_ts = None

    def fields(self) -> dict[str, float]:
        return {
            "speculation_gpu_seconds_lost_total": self.lost_seconds,
            "speculation_gpu_seconds_saved_total": self.saved_seconds,
        }


class AboveCrossoverEvaluator:
    name = "above_crossover"

    def __init__(self, source: CrossoverSource | None, hold_seconds: float) -> None:
        self.source = source  # None: the configured source was unusable (logged at build)
        self.batches: dict[str, TimeWeightedMean] = {}
        self.acceptance = PositionWindow(ACCEPTANCE_WINDOW_SECONDS)
        self.flag = Hysteresis(hold_seconds)
        # Averaging longer than the hold would only delay the flag (and a short demo hold must stay short).
        self.batch_window = min(BATCH_WINDOW_SECONDS, hold_seconds)
        self.ledger = GpuTimeLedger()
        # Live calibration needs the route's roofline model: `estimate` sources only.
        self.live = LiveCalibration(source.model_for("")) if isinstance(source, EstimatedCrossover) else None
        self._context = 1024.0
        self._live_ts: float | None = None  # the previous cycle fed to live calibration

    def evaluate(self, obs: RouteObservation, gpus: Sequence[GpuSample]) -> Mapping[str, Any]:
        update = self._evaluate(obs, gpus)
        if update.get("predicted_speedup_ratio") is None or not update.get("batch_size"):
            self.ledger.gap()  # no prediction, or nothing running: nothing to account this cycle
        else:
            # The route's GPUs as mapped (config or process map); without a mapping, one GPU per engine.
            route_gpus = len(obs.gpus) or max(1, len(obs.running_per_engine))
            self.ledger.add(obs.ts, update["predicted_speedup_ratio"], route_gpus)
        if self.source is not None and self.source.name != "batch_size":
            update.update(self.ledger.fields())  # a fixed B* predicts no speedup: no ledger to show
        return update

    def _evaluate(self, obs: RouteObservation, gpus: Sequence[GpuSample]) -> dict[str, Any]:
        update: dict[str, Any] = {"compute_bound": compute_bound(gpus, obs.gpus)}
        if not obs.up:
            return {**update, "batch_size": None, "above_crossover": None, "predicted_speedup_ratio": None}
        if obs.reset:
            self.acceptance.clear()  # a restarted engine may run another draft model
        self.acceptance.add(obs.ts, obs.d_accepted_per_pos, obs.d_drafts)
        batch = self._batch(obs)
        update["batch_size"] = batch
        if self.source is None:
            return {
                **update,
                "crossover_source": "",
                "crossover_batch_size": None,
                "crossover_lower": None,
                "crossover_upper": None,
                "above_crossover": None,
                "predicted_speedup_ratio": None,
            }
        positions = self.acceptance.positions(obs.k)
        if not positions and obs.k and obs.window_acceptance.get("5m") is not None:
            positions = positions_from_rate(obs.window_acceptance["5m"], obs.k)
        engines = max(1, len(obs.running_per_engine))
        live = LiveInputs(
            positions=positions,
            batch=batch,
            kv_usage=obs.kv_usage,
            gpus_per_engine=max(1, len(obs.gpus) // engines),
            engine_kind=obs.engine_kind,
        )
        try:
            answer = self.source.answer(live)
            live_answer = self._live(obs, live) if self.live is not None else None
        except (ValueError, ArithmeticError) as exc:  # bad input never takes the daemon down
            log.warning("route %s: crossover %s failed: %s", obs.route, self.source.name, exc)
            return {
                **update,
                "crossover_source": self.source.name,
                "crossover_batch_size": None,
                "crossover_lower": None,
                "crossover_upper": None,
                "above_crossover": None,
                "predicted_speedup_ratio": None,
            }
        update.update(
            crossover_source=self.source.name,
            crossover_batch_size=answer.batch_size,
            crossover_lower=answer.lower,
            crossover_upper=answer.upper,
            predicted_speedup_ratio=answer.speedup,
            crossover_attention_kernel=answer.attention_kernel,
            crossover_kv_capacity_batch=answer.kv_capacity_batch,
            crossover_beyond_capacity=answer.beyond_capacity if answer.banded else None,
        )
        threshold, flag_source = answer.batch_size, self.source.name
        if answer.banded and answer.batch_size is not None:
            # An estimate flags on its band's conservative side: never advise turning speculation off while the
            # validated error still puts B* above the batch (no upper bound: never).
            threshold = answer.upper
        if live_answer is not None:
            update.update(
                live_crossover_batch_size=live_answer.batch_size,
                live_crossover_lower=live_answer.lower,
                live_crossover_upper=live_answer.upper,
                live_crossover_bins=live_answer.bins,
                live_crossover_attention_kernel=live_kernel(self.live),
            )
            update["live_crossover_settled"] = live_answer.settled
            if live_answer.settled:  # the route's own step times, once they pin B* down, beat the prior
                threshold, flag_source = live_answer.batch_size, "live"
                if batch and self.live is not None:
                    update["predicted_speedup_ratio"] = self.live.speedup(live.positions, self._context, batch)
        update.update(crossover_flag_source=flag_source, crossover_flag_batch_size=threshold)
        if batch is None or not answer.known:
            update["above_crossover"] = None
        else:
            update["above_crossover"] = self.flag.update(obs.ts, batch, threshold)
        return update

    def _live(self, obs: RouteObservation, live: LiveInputs) -> LiveAnswer | None:
        """Feed this cycle's per-engine step times to the live calibration; its answer for the live acceptance."""
        calibration, source = self.live, self.source
        assert calibration is not None and isinstance(source, EstimatedCrossover)  # only estimates calibrate live
        if obs.reset:
            calibration.clear()  # a restarted engine may run another draft or configuration
        calibration.use_model(source.model_for(obs.engine_kind))  # the verify kernel follows the detected engine
        dt = None if self._live_ts is None else obs.ts - self._live_ts
        self._live_ts = obs.ts
        for engine, times in obs.step_time_per_engine.items():
            if times.per_token:
                converted = _request_steps(times, live.positions, dt, max(1, len(obs.running_per_engine)))
                if converted is None:
                    continue
                times = converted
            batch = _cycle_batch(times, obs.running_per_engine.get(engine))
            if times.observations > 0 and batch:
                calibration.add(batch, times.seconds / times.observations, times.observations)
        if not live.positions:
            return None
        self._context = source.live_context(live)
        return calibration.answer(live.positions, self._context, obs.ts)

    def _batch(self, obs: RouteObservation) -> float | None:
        """The batch the flag judges: each engine's running requests averaged over the batch window."""
        running_per_engine = obs.running_per_engine
        for gone in [e for e in self.batches if e not in running_per_engine]:  # scaled down or filtered out
            del self.batches[gone]
        for engine, running in running_per_engine.items():
            if running is not None and running == running:  # skip NaN
                self.batches.setdefault(engine, TimeWeightedMean(self.batch_window)).add(obs.ts, float(running))
        means = [m for e in running_per_engine if e in self.batches if (m := self.batches[e].mean(obs.ts)) is not None]
        return sum(means) / len(means) if means else None

    def close(self) -> None:
        pass


def live_kernel(calibration: LiveCalibration | None) -> str:
    """The verify kernel the live refit's step model prices ("" without live calibration)."""
    if calibration is None:
        return ""
    return UNPACKED if calibration.model.efficiency.verify_reads_per_query_head else PACKED


def _request_steps(times: StepTimes, positions: Sequence[float], dt: float | None, engines: int) -> StepTimes | None:
    """A cycle's per-token latency totals (SGLang) as request-steps: Δcount tokens came tau = 1 + Σ p_j to a
    step, so Δcount / tau request-steps took Δsum seconds. Δsum is the decoding requests' time summed over
    requests, so Δsum / dt is the mean number decoding (over the server's engines), and each engine ran
    a batch of that over `engines`. None without an acceptance, a previous cycle or any decoding."""
    if not positions or not dt or dt <= 0 or times.seconds <= 0 or times.observations <= 0:
        return None
    request_steps = times.observations / tau(positions)
    batch = times.seconds / dt / engines
    return StepTimes(times.seconds, request_steps, request_steps / max(1.0, batch))


def _cycle_batch(times: StepTimes, running: float | None) -> float | None:
    """The decoding batch of the steps timed this cycle: step-time observations per engine step (one per
    decoding request per step), at least 1 (a request's prefill step times no decode and counts as a step).
    Without a step count, the running gauge at the cycle's end. Never the flag's windowed batch: a window
    longer than the cycle pairs a burst's step times with the idle before it."""
    if times.steps:
        return max(1.0, times.observations / times.steps)
    return running


def build_source(cfg: CrossoverConfig) -> CrossoverSource:
    """Raises ValueError with a message naming what is wrong (unreadable sweep, unknown GPU, ...)."""
    if cfg.kind == "batch_size" and cfg.batch_size is not None:
        return FixedCrossover(cfg.batch_size)
    if cfg.kind == "sweep":
        return SweptCrossover(load_sweep(cfg.sweep_file))
    if cfg.kind == "estimate" and cfg.estimate is not None:
        return EstimatedCrossover(
            build_step_model(cfg.estimate), cfg.estimate.context, cfg.estimate, cfg.attention_kernel
        )
    raise ValueError(f"crossover {cfg.kind!r} without its settings")


def build_evaluator(ctx: EvaluatorContext, route_cfg: RouteConfig) -> AboveCrossoverEvaluator | None:
    """None for routes without a `crossover:` section. A source that cannot be built still gives an
    evaluator (batch size and compute-bound are exported; B* and the flag are absent) and logs why."""
    cfg = route_cfg.crossover
    if cfg is None:
        return None
    try:
        return AboveCrossoverEvaluator(build_source(cfg), cfg.hold_seconds)
    except (ValueError, OSError) as exc:
        log.error("route %s: crossover %s unusable, flag disabled: %s", route_cfg.name, cfg.kind, exc)
        return AboveCrossoverEvaluator(None, cfg.hold_seconds)
