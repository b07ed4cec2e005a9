"""The engine's own per-step cost, fitted from its live step times against the step model's prediction.

The step model prices the kernels of an idealised forward (the measured tables' CUDA graphs). A serving engine
adds costs the tables lack: scheduling, sampling and rejection, launches outside the graph. They are why
measured engine crossovers lie below the kernel-level ones (docs/crossover.md). Each live batch bin gives an
observed speculative step time T_i at batch B_i with q = k + 1 tokens a sequence, and the model predicts m_i for
it. The residual is fitted as

    T_i - m_i = step_s + token_s x B_i x q

by least squares on the relative residual (every bin weighs the same whatever its step time), shrunk toward
zero by a prior that weighs as much as `PRIOR_BINS` bins (one or two bins barely move it), and bounded:
neither term negative (a model slower than the engine is left as it is), step_s at most the fastest observed
step, token_s at most the smallest observed step per token. It has two parameters and a closed form, so it is
deterministic and a jackknife over bins is cheap.
"""

from __future__ import annotations


from typing import Sequence

from specwatch.crossover.inputs import EngineOverhead

# The zero-overhead prior weighs as much as this many bins of relative residual.
PRIOR_BINS = 0.25


def fit_overhead(
    observed: Sequence[tuple[float, int, float]], predicted: Sequence[float], prior_bins: float = PRIOR_BINS
) -> EngineOverhead:
    """`observed`: (batch, q, seconds) per bin; `predicted`: the model's seconds for each. Zero without data."""
    rows = [(b, q, t, m) for (b, q, t), m in zip(observed, predicted) if t > 0 and m > 0 and b > 0]
    if not rows:
        return EngineOverhead()
    # Relative residual y = (T - m) / m against features 1/m (step_s) and B q / m (token_s).
    ys = [(t - m) / m for _, _, t, m in rows]
    xs = [(1.0 / m, b * q / m) for b, q, _, m in rows]
    n = len(rows)
    # The prior: each term's typical relative effect, squared, times prior_bins (a ridge in the features' units).
    scale = [sum(x[j] for x in xs) / n for j in (0, 1)]
    ridge = [prior_bins * s * s for s in scale]
    upper = (min(t for _, _, t, _ in rows), min(t / (b * q) for b, q, t, _ in rows))
    best: tuple[float, tuple[float, float]] | None = None
    for free in ((0, 1), (0,), (1,), ()):  # active sets: the bounded optimum is the best feasible one
        theta = _solve(xs, ys, ridge, free)
        if any(theta[j] < 0 or theta[j] > upper[j] for j in free):
            theta = (min(max(theta[0], 0.0), upper[0]), min(max(theta[1], 0.0), upper[1]))
        cost = sum((y - theta[0] * x[0] - theta[1] * x[1]) ** 2 for x, y in zip(xs, ys))
        cost += ridge[0] * theta[0] ** 2 + ridge[1] * theta[1] ** 2
        if best is None or cost < best[0] - 1e-18:
            best = (cost, theta)
    assert best is not None
    return EngineOverhead(step_s=best[1][0], token_s=best[1][1])


def _solve(
    xs: Sequence[tuple[float, float]], ys: Sequence[float], ridge: Sequence[float], free: tuple[int, ...]
) -> tuple[float, float]:
    """Ridge least squares over the `free` features (the others held at 0)."""
    theta = [0.0, 0.0]
    if not free:
        return (0.0, 0.0)
    a = [[sum(x[i] * x[j] for x in xs) + (ridge[i] if i == j else 0.0) for j in free] for i in free]
    rhs = [sum(x[i] * y for x, y in zip(xs, ys)) for i in free]
    if len(free) == 1:
        if a[0][0] > 0:
            theta[free[0]] = rhs[0] / a[0][0]
        return (theta[0], theta[1])
    det = a[0][0] * a[1][1] - a[0][1] * a[1][0]
    if det <= 0:
        return (0.0, 0.0)
    theta[0] = (rhs[0] * a[1][1] - a[0][1] * rhs[1]) / det
    theta[1] = (a[0][0] * rhs[1] - a[1][0] * rhs[0]) / det
    return (theta[0], theta[1])


def leave_one_out(
    observed: Sequence[tuple[float, int, float]], predicted: Sequence[float], prior_bins: float = PRIOR_BINS
) -> list[EngineOverhead]:
    """The fit with each bin left out in turn (the live band's jackknife)."""
    pairs = list(zip(observed, predicted))
    return [
        fit_overhead([o for o, _ in rest], [m for _, m in rest], prior_bins)
        for rest in (pairs[:i] + pairs[i + 1 :] for i in range(len(pairs)))
    ]
