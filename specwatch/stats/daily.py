"""A baseline that knows the time of day: r0(t) = mean + a·cos θ + b·sin θ, θ the UTC time of day as an angle.

A route's request mix moves through the day (code edits in working hours, chat in the evening), and its
acceptance with it: on issue 18's traces a ±20% daily swing of a class at 0.85× α moves the route's ratio
by about ±6%. A flat r0 learned at one hour then sits several percent off at another, and a 5% drift on top
of that lands past the middle of the 5-15% indifference zone for hours. One daily harmonic is the smallest
model of a daily pattern: three numbers, fitted by weighted least squares on the same intervals as r0
(weights: drafted tokens), so it is learned from most of one day and extends to the hours not yet seen.
A pattern sharper than a sinusoid leaves a residual that the zone must absorb, and a weekly one is not
modelled.

The fit runs over the route's blocks (those the dispersion learner and the CUSUM use), and it also gives the design
effect of what the profile leaves: the line φ0 + β·D of `stats/overdispersion.py`, fitted on the blocks'
deviations from the profile instead of from one mean. A test against the profile must weigh its blocks by that
line. The route's own φ (learned about one mean over the hours before the baseline pins) counts the part of the
daily swing those hours saw as noise: on a busy route, whose blocks hold about the same number of tokens, that
part grows with the block's size, and the line came out with an intercept near 1 and a slope of the swing (φ(D) ≈
1 + 0.0012·D at 2 req/s); a short block closed by an idle scrape then weighed five to seven times its evidence,
and one such block carried S past h on a 5% drift.

`DailyFit` keeps the normal equations and the second moments as running sums (21 floats to persist);
`DailyProfile` is a fit: its coefficients, its worst-hour standard error (φ-scaled: blocks of one route are
clustered), the χ² of its two harmonic terms against none, and the design effect of the blocks about it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specwatch.stats.overdispersion import (
    PHI_MAX,
    PHI_MIN,
    ClosedBlock,
    DispersionModel,
    dispersion_line,
    variance_inflation,
)

DAY_SECONDS = 86400.0
HOURS = 24  # the worst-hour standard error is taken over these times of day
# A profile is used only when its two harmonic terms are clearly there (χ² of two degrees of freedom at
# p = 0.001: a route without a daily pattern keeps its flat r0) and the traffic behind it covers the day well
# enough that its worst hour is known within MAX_SPREAD times the flat r0's standard error (an even day gives
# √3, the three coefficients sharing the data; a few hours of the day give a sinusoid that is free elsewhere).
# And it must be known to within MAX_RELATIVE_STDERR of r0 at that worst hour: r0 is lowered by two standard
# errors before testing, and a profile from one day of a quiet route (1 req/min: about 2.7%) would lower it by
# more than the daily swing it removes; such a route keeps its flat r0.
MIN_CHI2 = 13.8
MAX_SPREAD = 3.0
MAX_RELATIVE_STDERR = 0.01


def _angle(ts: float) -> float:
    return 2.0 * math.pi * (ts % DAY_SECONDS) / DAY_SECONDS


def _solve3(m: list[list[float]], y: list[float]) -> list[float] | None:
    """m x = y for a symmetric 3x3 m (Gaussian elimination with pivoting); None when singular."""
    a = [row[:] + [v] for row, v in zip(m, y)]
    scale = max(abs(v) for row in m for v in row) or 1.0
    for col in range(3):
        pivot = max(range(col, 3), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) <= 1e-12 * scale:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, 3):
            f = a[r][col] / a[col][col]
            for c in range(col, 4):
                a[r][c] -= f * a[col][c]
    x = [0.0, 0.0, 0.0]
    for r in (2, 1, 0):
        x[r] = (a[r][3] - sum(a[r][c] * x[c] for c in range(r + 1, 3))) / a[r][r]
    return x


def _inverse3(m: list[list[float]]) -> list[list[float]] | None:
    columns = [_solve3(m, [1.0 if i == j else 0.0 for i in range(3)]) for j in range(3)]
    if any(c is None for c in columns):
        return None
    return [[columns[j][i] for j in range(3)] for i in range(3)]  # type: ignore[index]


@dataclass(frozen=True)
class DailyProfile:
    """r0(t) = mean + cos·cos θ + sin·sin θ; `stderr` its largest standard error over the hours of the day;
    blocks deviate from it with the design effect dispersion_intercept + dispersion_slope·D."""

    mean: float
    cos: float
    sin: float
    stderr: float
    chi2: float  # of (cos, sin) against 0: how clearly the route's acceptance moves with the time of day
    spread: float  # stderr / the flat r0's standard error from the same traffic
    dispersion_intercept: float
    dispersion_slope: float = 0.0
    final: bool = False  # fitted on a whole day (`pin_duration`), or usable: no longer refitted

    @property
    def usable(self) -> bool:
        return self.chi2 >= MIN_CHI2 and self.spread <= MAX_SPREAD and self.stderr <= MAX_RELATIVE_STDERR * self.mean

    @property
    def dispersion(self) -> DispersionModel:
        return DispersionModel(self.dispersion_intercept, self.dispersion_slope)

    def at(self, ts: float) -> float:
        theta = _angle(ts)
        return self.mean + self.cos * math.cos(theta) + self.sin * math.sin(theta)

    def to_json(self) -> dict[str, float | bool]:
        return {
            "mean": self.mean,
            "cos": self.cos,
            "sin": self.sin,
            "stderr": self.stderr,
            "chi2": self.chi2,
            "spread": self.spread,
            "dispersion_intercept": self.dispersion_intercept,
            "dispersion_slope": self.dispersion_slope,
            "final": self.final,
        }

    @classmethod
    def from_json(cls, raw: dict) -> "DailyProfile":
        return cls(
            float(raw["mean"]),
            float(raw["cos"]),
            float(raw["sin"]),
            float(raw["stderr"]),
            float(raw["chi2"]),
            float(raw["spread"]),
            float(raw["dispersion_intercept"]),
            float(raw["dispersion_slope"]),
            bool(raw.get("final", False)),
        )


_PAIRS = ((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2))  # the six distinct entries of a symmetric 3x3


def _zeros(n: int) -> list[float]:
    return [0.0] * n


def _matrix(entries: list[float]) -> list[list[float]]:
    m = [[0.0] * 3 for _ in range(3)]
    for (i, j), v in zip(_PAIRS, entries):
        m[i][j] = m[j][i] = v
    return m


def _quadratic(m: list[list[float]], x: list[float]) -> float:
    return sum(x[i] * m[i][j] * x[j] for i in range(3) for j in range(3))


@dataclass
class DailyFit:
    """Running sums over a route's blocks, v = (1, cos θ, sin θ) at each block's middle: the normal equations of
    accepted ≈ drafted·(mean + a cos θ + b sin θ) weighted by drafted tokens (Σ D v vᵀ, Σ A v), and the moments
    that give the design effect of the deviations A - D·r0(θ) (Σ A²/D, Σ A², Σ A D v, Σ D² v vᵀ)."""

    blocks: int = 0
    dvv: list[float] = field(default_factory=lambda: _zeros(6))  # Σ D v_i v_j, over _PAIRS
    av: list[float] = field(default_factory=lambda: _zeros(3))  # Σ A v_i
    a2_over_d: float = 0.0  # Σ A² / D
    a2: float = 0.0  # Σ A²
    adv: list[float] = field(default_factory=lambda: _zeros(3))  # Σ A D v_i
    d2vv: list[float] = field(default_factory=lambda: _zeros(6))  # Σ D² v_i v_j

    def add(self, block: ClosedBlock) -> None:
        a, d = block.accepted, block.drafted
        if d <= 0:
            return
        theta = _angle((block.start + block.end) / 2.0)
        v = (1.0, math.cos(theta), math.sin(theta))
        self.blocks += 1
        for k, (i, j) in enumerate(_PAIRS):
            self.dvv[k] += d * v[i] * v[j]
            self.d2vv[k] += d * d * v[i] * v[j]
        for i in range(3):
            self.av[i] += a * v[i]
            self.adv[i] += a * d * v[i]
        self.a2_over_d += a * a / d
        self.a2 += a * a

    def fit(self, final: bool = False) -> DailyProfile | None:
        """The profile, its uncertainty and the design effect of the blocks about it; None when the blocks do not
        determine three coefficients (all at one time of day, too few, or no traffic)."""
        n, d, a = self.blocks, self.dvv[0], self.av[0]
        if n <= 4 or d <= 0 or not 0.0 < a < d:
            return None
        m = _matrix(self.dvv)
        beta = _solve3(m, self.av)
        inv = _inverse3(m)
        if beta is None or inv is None:
            return None
        r = a / d
        var = r * (1.0 - r)
        # y_t = D_t (r_t - r0(θ_t))² / var and y_t·D_t, summed over the blocks, from the moments
        dot = sum(b * x for b, x in zip(beta, self.av))
        s_y = (self.a2_over_d - 2.0 * dot + _quadratic(m, beta)) / var
        dot_d = sum(b * x for b, x in zip(beta, self.adv))
        s_yd = (self.a2 - 2.0 * dot_d + _quadratic(_matrix(self.d2vv), beta)) / var
        dof = n / (n - 3)  # three coefficients fitted on the same blocks
        phi = min(PHI_MAX, max(PHI_MIN, s_y / (n - 3)))
        inflate = variance_inflation(n)
        dispersion = dispersion_line(n, d, self.d2vv[0], s_y, s_yd, phi, inflate, dof)
        unit = min(PHI_MAX, phi * inflate) * var  # variance of one drafted token's acceptance, φ-scaled
        cov = [[unit * x for x in row] for row in inv]
        worst = 0.0
        for h in range(HOURS):
            theta = 2.0 * math.pi * h / HOURS
            v = (1.0, math.cos(theta), math.sin(theta))
            worst = max(worst, _quadratic(cov, list(v)))
        # χ² of the harmonic pair: βᵀ C⁻¹ β with C the pair's 2x2 covariance
        c11, c12, c22 = cov[1][1], cov[1][2], cov[2][2]
        det = c11 * c22 - c12 * c12
        b1, b2 = beta[1], beta[2]
        chi2 = (b1 * b1 * c22 - 2 * b1 * b2 * c12 + b2 * b2 * c11) / det if det > 0 else 0.0
        stderr = math.sqrt(max(0.0, worst))
        return DailyProfile(
            beta[0],
            beta[1],
            beta[2],
            stderr,
            chi2,
            stderr / math.sqrt(unit / d),
            dispersion.intercept,
            dispersion.slope,
            final,
        )

    def to_json(self) -> list[float]:
        return [float(self.blocks), *self.dvv, *self.av, self.a2_over_d, self.a2, *self.adv, *self.d2vv]

    @classmethod
    def from_json(cls, raw: list[float] | None) -> "DailyFit":
        """Learner state saved before the daily profile existed (or in another form) has none: the fit starts
        afresh."""
        if not raw or len(raw) != 21:
            return cls()
        x = [float(v) for v in raw]
        return cls(int(x[0]), x[1:7], x[7:10], x[10], x[11], x[12:15], x[15:21])
