"""A baseline that knows the time of day: r0(t) = mean + a·cos θ + b·sin θ, θ the UTC time of day as an angle.

A route's request mix moves through the day (code edits in working hours, chat in the evening), and its
acceptance with it: on issue 18's traces a ±20% daily swing of a class at 0.85× α moves the route's ratio
by about ±6%. A flat r0 learned at one hour then sits several percent off at another, and a 5% drift on top
of that lands past the middle of the 5-15% indifference zone for hours. One daily harmonic is the smallest
model of a daily pattern: three numbers, fitted by weighted least squares on the same intervals as r0
(weights: drafted tokens), so it is learned from most of one day and extends to the hours not yet seen.
A pattern sharper than a sinusoid leaves a residual that the zone must absorb, and a weekly one is not
modelled.

`DailyFit` keeps the normal equations as running sums (nine floats to persist); `DailyProfile` is a fit:
its coefficients, its worst-hour standard error (φ-scaled: intervals of one route are clustered like its
blocks) and the χ² of its two harmonic terms against none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
    """r0(t) = mean + cos·cos θ + sin·sin θ; `stderr` its largest standard error over the hours of the day."""

    mean: float
    cos: float
    sin: float
    stderr: float
    chi2: float  # of (cos, sin) against 0: how clearly the route's acceptance moves with the time of day
    spread: float  # stderr / the flat r0's standard error from the same traffic
    final: bool = False  # fitted on a whole day (`pin_duration`): no longer refitted

    @property
    def usable(self) -> bool:
        return self.chi2 >= MIN_CHI2 and self.spread <= MAX_SPREAD and self.stderr <= MAX_RELATIVE_STDERR * self.mean

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
            bool(raw.get("final", False)),
        )


@dataclass
class DailyFit:
    """Running normal equations of accepted ≈ drafted·(mean + a cos θ + b sin θ) over a route's intervals."""

    d: float = 0.0  # Σ D
    dc: float = 0.0  # Σ D cos θ
    ds: float = 0.0
    dcc: float = 0.0
    dcs: float = 0.0
    dss: float = 0.0
    a: float = 0.0  # Σ A
    ac: float = 0.0  # Σ A cos θ
    as_: float = 0.0  # Σ A sin θ

    def add(self, ts: float, accepted: float, drafted: float) -> None:
        if drafted <= 0:
            return
        theta = _angle(ts)
        c, s = math.cos(theta), math.sin(theta)
        self.d += drafted
        self.dc += drafted * c
        self.ds += drafted * s
        self.dcc += drafted * c * c
        self.dcs += drafted * c * s
        self.dss += drafted * s * s
        self.a += accepted
        self.ac += accepted * c
        self.as_ += accepted * s

    def fit(self, phi: float, final: bool = False) -> DailyProfile | None:
        """The profile and its uncertainty, with each drafted token worth 1/φ of an independent one; None when
        the intervals do not determine three coefficients (all at one time of day, or no traffic)."""
        if self.d <= 0 or not 0.0 < self.a < self.d:
            return None
        m = [[self.d, self.dc, self.ds], [self.dc, self.dcc, self.dcs], [self.ds, self.dcs, self.dss]]
        beta = _solve3(m, [self.a, self.ac, self.as_])
        inv = _inverse3(m)
        if beta is None or inv is None:
            return None
        r = self.a / self.d
        unit = max(1.0, phi) * r * (1.0 - r)  # variance of one drafted token's acceptance, φ-scaled
        cov = [[unit * v for v in row] for row in inv]
        worst = 0.0
        for h in range(HOURS):
            theta = 2.0 * math.pi * h / HOURS
            v = (1.0, math.cos(theta), math.sin(theta))
            worst = max(worst, sum(v[i] * cov[i][j] * v[j] for i in range(3) for j in range(3)))
        # χ² of the harmonic pair: βᵀ C⁻¹ β with C the pair's 2x2 covariance
        c11, c12, c22 = cov[1][1], cov[1][2], cov[2][2]
        det = c11 * c22 - c12 * c12
        b1, b2 = beta[1], beta[2]
        chi2 = (b1 * b1 * c22 - 2 * b1 * b2 * c12 + b2 * b2 * c11) / det if det > 0 else 0.0
        stderr = math.sqrt(max(0.0, worst))
        return DailyProfile(beta[0], beta[1], beta[2], stderr, chi2, stderr / math.sqrt(unit / self.d), final)

    def to_json(self) -> list[float]:
        return [self.d, self.dc, self.ds, self.dcc, self.dcs, self.dss, self.a, self.ac, self.as_]

    @classmethod
    def from_json(cls, raw: list[float] | None) -> "DailyFit":
        """Learner state saved before the daily profile existed has none: the fit starts afresh."""
        if not raw:
            return cls()
        return cls(*(float(x) for x in raw))
