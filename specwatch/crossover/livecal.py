"""Live calibration: the crossover re-fitted to the route's own engine step times, with a confidence band.

A speculating vLLM engine reports its step period (`vllm:inter_token_latency_seconds`: one observation per
decoding request per step, so Δsum / Δcount over a cycle is the mean step time) beside its running batch; SGLang
reports time per output token (its histogram's count counts tokens), which the evaluator turns into steps with
the live tokens per step (`above_crossover._request_steps`).
Those are *speculative* step times, T_spec(B) = T(B, k+1) + k·T_draft(B), at the batches the route actually
runs. They are binned by batch; the route's roofline model (`estimate:` config) has its memory, compute,
verify-attention efficiencies, the verify kernel's per-key cost and one fixed cost (per layer or per forward,
whichever the hardware row's prior puts first) re-fitted to the bins; the refitted model predicts the plain
step time, which the engine never shows while it speculates, and B* is re-solved from it.

On a GPU whose kernels were measured (`gpus.CALIBRATED`) the kernel-level model is held and only the engine's
own cost is fitted (`overhead.py`: a per-step and a per-token term, least squares on the bins, shrunk toward
zero): what the engine adds to the kernels is what differs from the calibration there, and two parameters
fitted in closed form do not wander as the efficiencies do. Elsewhere (another GPU, a CPU build) the model
itself is unknown and the efficiencies are refitted as above.

The band is a jackknife over batch bins: B* refitted with each bin left out in turn; its lowest and highest
values bound the estimate. One or two bins cannot separate the efficiencies (the band spans the calibrated
GPU's B* and the refit's); it narrows as more distinct batches are observed. A bin keeps the mean of its
observations weighted by their count, capped so an hour at one batch does not drown the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from specwatch.crossover.calibrate import BOUNDS, StepPoint, fit_models, predict
from specwatch.crossover.gpus import CALIBRATED
from specwatch.crossover.inputs import EngineOverhead
from specwatch.crossover.overhead import fit_overhead
from specwatch.crossover.speedup import StepModel

BINS_PER_DOUBLING = 4  # batch bins: 2^(i/4), so neighbouring bins differ by ~19%
MAX_BIN_WEIGHT = 5000.0  # observations; older weight is scaled down past this
MIN_BINS = 3  # fewer cannot separate the efficiencies: the band stays wide
# Step observations a bin needs before it is fitted: every bin weighs the same in the fit, and a few steps
# caught around a stall (a CPU engine's cycle at a passing batch) would pull it as hard as an hour's worth.
MIN_BIN_OBSERVATIONS = 100
# One fixed cost only: spec steps alone cannot split a fixed cost between per forward and per layer (a verify
# and k draft forwards pay 4 and 7 of them at k = 3 with a one-layer drafter on a 4-layer target, against the
# plain step's 1 and 4), and the plain step's share is what B* needs. The split comes from the route's
# hardware row: the larger of its two fixed costs is refitted, the other kept. A calibrated GPU's is per layer
# (kernel boundaries inside CUDA graphs), an eager CPU build's per forward (Python around every forward).
FIT_PARAMETERS = ("memory", "compute", "verify_attention", "verify_key_s")
FIT_TOLERANCE = 5e-3
# With the kernel model held, the fit can only add an engine's overhead: it cannot make an engine that runs
# faster than the model, or whose steps grow otherwise than the model's plus an overhead, fit. Past this RMS log
# error on the bins the live answer does not settle, and the flag stays on the configured estimate's band.
MAX_OVERHEAD_RMS = 0.10
REFIT_SECONDS = 60.0


@dataclass(frozen=True)
class LiveAnswer:
    batch_size: float | None  # live B*; None: no crossover up to 4096, or nothing observed yet
    lower: float | None
    upper: float | None
    bins: int  # distinct batch bins observed
    rms: float | None  # RMS log error of the refit on the observed step times
    overhead_only: bool = False  # the kernel model was held and only the engine's overhead fitted

    @property
    def settled(self) -> bool:
        """Enough batches seen and a band within ±25% of B*: good enough to drive the flag. With the kernel
        model held, the fitted steps must also match the engine's within MAX_OVERHEAD_RMS."""
        if self.batch_size is None or self.lower is None or self.upper is None or self.bins < MIN_BINS:
            return False
        if self.overhead_only and (self.rms is None or self.rms > MAX_OVERHEAD_RMS):
            return False
        return self.upper - self.lower <= 0.5 * self.batch_size


class LiveCalibration:
    def __init__(self, model: StepModel) -> None:
        self.model = model
        self._bins: dict[int, list[float]] = {}  # bin index -> [weight, weighted batch sum, weighted seconds sum]
        self._cache: tuple | None = None

    def add(self, batch: float, step_seconds: float, observations: float) -> None:
        """One engine's cycle: its mean running batch, the mean step time over `observations` steps."""
        if not (batch >= 1 and step_seconds > 0 and observations > 0) or not math.isfinite(step_seconds):
            return
        index = round(math.log2(batch) * BINS_PER_DOUBLING)
        entry = self._bins.setdefault(index, [0.0, 0.0, 0.0])
        entry[0] += observations
        entry[1] += observations * batch
        entry[2] += observations * step_seconds
        if entry[0] > MAX_BIN_WEIGHT:
            scale = MAX_BIN_WEIGHT / entry[0]
            entry[:] = [v * scale for v in entry]

    def use_model(self, model: StepModel) -> None:
        """Refit from `model` from now on (the route's engine was detected and runs another verify kernel); the
        observed bins stay: they are the engine's step times whatever the model."""
        if model != self.model:
            self.model = model
            self._cache = None

    def clear(self) -> None:
        """An engine restart (possibly another draft or config): start over."""
        self._bins.clear()
        self._cache = None

    def points(self, k: int, context: float, min_observations: float = 0.0) -> list[StepPoint]:
        """Each bin's mean batch and step time, in batch order; bins with fewer observations left out."""
        return [
            StepPoint(batch, k + 1, context, seconds, kind="spec")
            for batch, seconds, observations in self.observed()
            if observations >= min_observations
        ]

    def answer(self, positions: Sequence[float], context: float, now: float) -> LiveAnswer:
        """B* and its band; refitted when a batch bin appears, the acceptance or context moves, or
        REFIT_SECONDS passed (a refit with its jackknife is n + 1 small fits)."""
        k = len(positions)
        ready = tuple(i for i in sorted(self._bins) if self._bins[i][0] >= MIN_BIN_OBSERVATIONS)
        if not k or not ready:
            return LiveAnswer(None, None, None, len(ready), None)
        key = (tuple(round(p, 2) for p in positions), round(context, -1), ready)
        if self._cache is not None and self._cache[0] == key and now - self._cache[1] < REFIT_SECONDS:
            return self._cache[2]
        points = self.points(k, context, MIN_BIN_OBSERVATIONS)
        model, rms = self._fit(points)
        b_star = model.crossover(positions, context)
        estimates = [b_star]
        if len(points) >= MIN_BINS:
            for i in range(len(points)):
                refit, _ = self._fit(points[:i] + points[i + 1 :])
                estimates.append(refit.crossover(positions, context))
        else:  # too few batches to separate the efficiencies: the calibrated GPU is as likely
            estimates.append(self.model.crossover(positions, context))
        known = [b for b in estimates if b is not None]
        lower = min(known) if known else None
        upper = None if any(b is None for b in estimates) else max(known, default=None)
        result = LiveAnswer(b_star, lower, upper, len(points), rms, self.fits_overhead)
        self._cache = (key, now, result, model)
        return result

    def speedup(self, positions: Sequence[float], context: float, batch: float) -> float | None:
        """Predicted spec / plain throughput at `batch` from the last refit (None before any)."""
        if self._cache is None or not positions:
            return None
        return self._cache[3].speedup(batch, positions, context)

    def observed(self) -> list[tuple[float, float, float]]:
        """(mean batch, mean step seconds, observations) of every bin, in batch order."""
        return [(bsum / w, ssum / w, w) for w, bsum, ssum in (self._bins[i] for i in sorted(self._bins))]

    def fitted_model(self) -> StepModel | None:
        """The model of the last refit (None before any)."""
        return None if self._cache is None else self._cache[3]

    @property
    def fits_overhead(self) -> bool:
        """True: the model's GPU is calibrated, so only the engine's overhead is fitted (module docstring)."""
        return self.model.hardware.name in CALIBRATED

    def _fit(self, points: list[StepPoint]) -> tuple[StepModel, float]:
        if self.fits_overhead:
            return self._fit_overhead(points)
        return self._fit_efficiency(points)

    def _fit_overhead(self, points: list[StepPoint]) -> tuple[StepModel, float]:
        prior = replace(self.model, overhead=EngineOverhead())
        predicted = [predict(prior, p) for p in points]
        overhead = fit_overhead([(p.batch, p.q, p.seconds) for p in points], predicted)
        fitted = replace(prior, overhead=overhead)
        errors = [math.log((m + overhead.seconds(p.batch, p.q)) / p.seconds) for p, m in zip(points, predicted)]
        return fitted, math.sqrt(sum(e * e for e in errors) / len(errors))

    def _fit_efficiency(self, points: list[StepPoint]) -> tuple[StepModel, float]:
        # A fixed cost cannot exceed the fastest observed step: searching up to it lets a slow engine (a CPU
        # build's framework costs milliseconds a layer) fit without changing a GPU's search range.
        fastest = min(p.seconds for p in points)
        prior = self.model.efficiency
        if prior.step_overhead_s > prior.layer_overhead_s * self.model.shape.layers:
            fixed, most = "step_overhead_s", fastest
        else:
            fixed, most = "layer_overhead_s", fastest / self.model.shape.layers
        eff, rms = fit_models(
            [(self.model, points)],
            "live",
            FIT_PARAMETERS + (fixed,),
            tolerance=FIT_TOLERANCE,
            tie_decode_attention=False,
            bounds={fixed: (0.0, max(BOUNDS[fixed][1], most))},
        )
        eff = replace(eff, source=f"live: fitted to {len(points)} batch bins of the engine's step times")
        return self.model.with_efficiency(eff), rms
