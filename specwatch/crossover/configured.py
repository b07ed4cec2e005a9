"""The route's configured crossover source, answered for the live acceptance and k: B* and the predicted speedup.

Not the live calibration (`livecal.py`, which refits the model to the route's own step times).

Three kinds, one per `crossover:` config form:
- `FixedCrossover` (`batch_size: N`): B* = N, no speedup prediction.
- `EstimatedCrossover` (`estimate: {...}`): the calibrated roofline re-solved for the live p_j and context.
- `SweptCrossover` (`sweep: FILE`): the measured spec/plain curve, rescaled by live tau / swept tau (a step
  takes as long whatever its drafts' fate; only the tokens it yields change).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from specwatch.crossover.band import Band
from specwatch.crossover.capacity import kv_capacity_batch, kv_capacity_tokens
from specwatch.crossover.estimate import EstimateInputs, estimate_band, with_kernel
from specwatch.crossover.kernel import AUTO, PACKED, UNKNOWN, UNPACKED, KernelAssumption, resolve
from specwatch.crossover.speedup import BYTES_PER_WEIGHT, MAX_BATCH, StepModel, interpolate_crossover, tau
from specwatch.crossover.sweepfile import speedup_points

DEFAULT_CONTEXT = 1024.0


@dataclass(frozen=True)
class LiveInputs:
    positions: tuple[float, ...]  # live p_1..p_k; empty when not yet known
    batch: float | None  # time-weighted running requests per engine
    kv_usage: float | None = None  # 0-1, mean over engines
    gpus_per_engine: int = 1
    engine_kind: str = ""  # vllm, sglang, ...; "" or auto: not detected yet


@dataclass(frozen=True)
class CrossoverAnswer:
    batch_size: float | None  # B*; None: no crossover (speculation wins at every batch) or unknown
    speedup: float | None  # predicted spec/plain throughput at the live batch
    known: bool = True  # False: not enough data yet to answer
    # The estimate's error band from the held-out validation (`band.py`); None on other sources. upper None
    # with a B*: no upper bound (the truth may be no crossover at all).
    lower: float | None = None
    upper: float | None = None
    banded: bool = False
    # The verify attention kernel the estimate assumed (kernel.py: packed, unpacked, or unknown, when the band
    # covers both) and the largest batch whose KV cache fits the route's GPUs at the live context; "" / None on
    # other sources.
    attention_kernel: str = ""
    kv_capacity_batch: float | None = None
    # True: the model's B* lies above `kv_capacity_batch`, so batch_size is None: no crossover below the
    # largest batch that fits.
    beyond_capacity: bool = False


class CrossoverSource(Protocol):
    name: str

    def answer(self, live: LiveInputs) -> CrossoverAnswer: ...


class FixedCrossover:
    name = "batch_size"

    def __init__(self, batch_size: float) -> None:
        self.batch_size = batch_size

    def answer(self, live: LiveInputs) -> CrossoverAnswer:
        return CrossoverAnswer(self.batch_size, None)


class EstimatedCrossover:
    name = "estimate"

    def __init__(
        self,
        model: StepModel,
        context: float | None,
        inputs: EstimateInputs | None = None,
        attention_kernel: str = AUTO,
    ) -> None:
        self.model = model  # as built: the GPU's calibrated efficiency, its own verify kernel
        self.context = context
        self.inputs = inputs if inputs is not None else EstimateInputs()
        self.setting = attention_kernel
        self.models = {k: with_kernel(model, k) for k in (PACKED, UNPACKED)}
        self._cache: dict[tuple, tuple[float | None, Band, bool]] = {}

    def assumption(self, engine_kind: str) -> KernelAssumption:
        return resolve(self.setting, engine_kind, self.model.hardware.name)

    def model_for(self, engine_kind: str) -> StepModel:
        """The step model of the kernel the route's engine runs (packed where unknown: the engines' default)."""
        kernel = self.assumption(engine_kind).kernel
        return self.models[UNPACKED if kernel == UNPACKED else PACKED]

    def live_context(self, live: LiveInputs) -> float:
        """Configured context, else KV usage x KV capacity / running requests (§8), else 1024."""
        if self.context is not None:
            return self.context
        if live.kv_usage is None or not live.batch:
            return DEFAULT_CONTEXT
        capacity_tokens = self._capacity_tokens(live)
        if capacity_tokens <= 0:
            return DEFAULT_CONTEXT
        return max(1.0, live.kv_usage * capacity_tokens / live.batch)

    def _capacity_tokens(self, live: LiveInputs) -> float:
        m = self.model
        return kv_capacity_tokens(m.shape, m.hardware, BYTES_PER_WEIGHT[m.dtype], live.gpus_per_engine)

    def capacity(self, live: LiveInputs, context: float) -> int | None:
        """The largest batch that fits at `context`; None when the weights alone do not fit (the GPU count or
        memory is misconfigured: no bound is better than a bound of 0)."""
        m = self.model
        batch = kv_capacity_batch(m.shape, m.hardware, BYTES_PER_WEIGHT[m.dtype], context, live.gpus_per_engine)
        return batch if batch >= 1 else None

    def answer(self, live: LiveInputs) -> CrossoverAnswer:
        if not live.positions:
            return CrossoverAnswer(None, None, known=False)
        context = self.live_context(live)
        assumption = self.assumption(live.engine_kind)
        kernels = (PACKED, UNPACKED) if assumption.kernel == UNKNOWN else (assumption.kernel,)
        # Round the inputs so a steady route hits the cache instead of re-solving every cycle.
        positions = tuple(round(p, 3) for p in live.positions)
        ctx = round(context, -1)
        capacity = self.capacity(live, ctx)
        limit = min(MAX_BATCH, capacity) if capacity is not None else MAX_BATCH
        solved = {}
        for kernel in kernels:
            key = (kernel, positions, ctx, limit)
            if key not in self._cache:
                if len(self._cache) > 256:
                    self._cache.clear()
                model = self.models[kernel]
                unbounded = model.crossover(positions, ctx)
                bstar = unbounded if unbounded is None or unbounded <= limit else None
                band = estimate_band(model, self.inputs, bstar, ctx, positions)
                self._cache[key] = (bstar, band, unbounded is not None and bstar is None)
            solved[kernel] = self._cache[key]
        bstar, band, beyond = solved[kernels[0]]
        lower, upper = band.lower, band.upper
        if len(kernels) > 1:  # unknown kernel: the band spans both kernels' bands; no upper side if either has none
            lowers = [b.lower for _, b, _ in solved.values() if b.lower is not None]
            lower = min(lowers) if lowers else None
            upper = (
                None
                if any(b.upper is None for _, b, _ in solved.values())
                else max(b.upper for _, b, _ in solved.values() if b.upper is not None)
            )
        speedup = self.models[kernels[0]].speedup(live.batch, positions, context) if live.batch else None
        return CrossoverAnswer(
            bstar,
            speedup,
            lower=lower,
            upper=upper,
            banded=True,
            attention_kernel=assumption.kernel,
            kv_capacity_batch=float(capacity) if capacity is not None else None,
            beyond_capacity=beyond,
        )


class SweptCrossover:
    name = "sweep"

    def __init__(self, sweep: dict) -> None:
        self.points = speedup_points(sweep["levels"])
        self.swept_tau = sweep.get("mean_acceptance_length")
        self.swept_k = sweep.get("num_speculative_tokens")
        if not self.points:
            raise ValueError("the sweep has no level where both servers produced tokens")

    def _scale(self, live: LiveInputs) -> float:
        if not live.positions or not self.swept_tau:
            return 1.0  # no live acceptance yet: the curve as measured
        return tau(live.positions) / float(self.swept_tau)

    def answer(self, live: LiveInputs) -> CrossoverAnswer:
        scale = self._scale(live)
        curve = [(b, s * scale) for b, s in self.points]
        return CrossoverAnswer(interpolate_crossover(curve, log_x=True), _at(curve, live.batch))


def _at(curve: Sequence[tuple[float, float]], batch: float | None) -> float | None:
    """Linear interpolation of the curve at `batch`, clamped to its ends."""
    if batch is None or not curve:
        return None
    if batch <= curve[0][0]:
        return curve[0][1]
    for (b0, s0), (b1, s1) in zip(curve, curve[1:]):
        if batch <= b1:
            return s0 + (s1 - s0) * (batch - b0) / (b1 - b0)
    return curve[-1][1]


def positions_from_rate(rate: float, k: int) -> tuple[float, ...]:
    """iid p_j = alpha^j whose mean over k positions equals the per-token rate (for sources with no
    per-position counters, e.g. SGLang)."""
    if k <= 0 or not 0.0 <= rate <= 1.0:
        return ()
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if sum(mid**j for j in range(1, k + 1)) / k < rate:
            lo = mid
        else:
            hi = mid
    alpha = (lo + hi) / 2
    return tuple(alpha**j for j in range(1, k + 1))
