"""The acceptance gate's verdict: a candidate server's probe round against a reference, with a confidence
interval on the drop, before a model or drafter bump ships (`specwatch gate`).

The drop is D = 1 - R_c / R_r, where R_c and R_r are the candidate's and the reference's pooled acceptance
(Σ accepted / Σ drafted) over the prompts read in both. At temperature 0 each prompt's acceptance repeats from
run to run, so the prompts are the units of noise: R_c and R_r are ratio estimators over the same prompts, and
the variance of R_c / R_r comes from the per-prompt residuals (a_i - R d_i) of both, their covariance included
(the delta method for a ratio of two ratio estimators, clustered by prompt). The interval is two-sided at
`confidence`, with Student's t on n - 1 degrees of freedom.

- pass (exit 0): the interval's upper end is below the threshold: the drop, if any, is smaller than the one the
  daemon would page on. Never a pass on thin evidence: a wide interval is not a pass.
- fail (exit 1): the drop's estimate is at or beyond the threshold and the interval excludes no drop at all.
- inconclusive (exit 2): anything else: fewer than `min_paired` prompts read in both, fewer than
  `min_drafted` draft tokens, or an interval that straddles the threshold.

`judge_against_ratio` judges against the fleet's traffic baseline instead (one ratio, no prompts behind it:
fail or inconclusive only), and `judge_speedup` the optional two-point sweep's low-batch speedup with an
interval from the sweep's requests (`speedup_interval`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Mapping, Sequence

from specwatch.probe.responses import Acceptance

VERDICT_EXIT = {"pass": 0, "fail": 1, "inconclusive": 2}
MIN_PAIRED_PROMPTS = 8
MIN_DRAFTED_TOKENS = 500.0


def t_quantile(p: float, dof: int) -> float:
    """Student's t quantile, from the normal one by Hill's expansion (ACM Algorithm 396): within 1e-3 of the
    exact value for dof >= 5 at the quantiles a gate uses."""
    z = NormalDist().inv_cdf(p)
    v = float(dof)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4)
    )


@dataclass(frozen=True)
class GateVerdict:
    verdict: str  # pass | fail | inconclusive
    reason: str
    threshold: float
    confidence: float
    paired: int = 0
    drafted: float = 0.0  # the candidate's draft tokens over the paired prompts
    candidate_ratio: float | None = None
    reference_ratio: float | None = None
    drop: float | None = None
    drop_low: float | None = None
    drop_high: float | None = None
    per_prompt: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # id -> (candidate, reference)

    @property
    def exit_code(self) -> int:
        return VERDICT_EXIT[self.verdict]


def judge(
    candidate: Mapping[str, Acceptance],
    reference: Mapping[str, Acceptance],
    threshold: float,
    confidence: float = 0.95,
    min_paired: int = MIN_PAIRED_PROMPTS,
    min_drafted: float = MIN_DRAFTED_TOKENS,
) -> GateVerdict:
    """The verdict on a candidate's per-prompt acceptance against the reference's (module docstring)."""
    pairs = [
        (pid, c, reference[pid])
        for pid, c in sorted(candidate.items())
        if pid in reference and c.drafted > 0 and reference[pid].drafted > 0
    ]
    base = GateVerdict("inconclusive", "", threshold, confidence, paired=len(pairs))
    if len(pairs) < min_paired:
        return replace(
            base, reason=f"{len(pairs)} prompts read in both the candidate and the reference, want {min_paired}"
        )
    drafted_c = sum(c.drafted for _, c, _ in pairs)
    drafted_r = sum(r.drafted for _, _, r in pairs)
    per_prompt = {pid: (c.accepted / c.drafted, r.accepted / r.drafted) for pid, c, r in pairs}
    if drafted_c < min_drafted:
        return replace(
            base,
            drafted=drafted_c,
            per_prompt=per_prompt,
            reason=f"the candidate drafted {drafted_c:.0f} tokens over the paired prompts, want {min_drafted:.0f}",
        )
    rc = sum(c.accepted for _, c, _ in pairs) / drafted_c
    rr = sum(r.accepted for _, _, r in pairs) / drafted_r
    if rr <= 0:
        return replace(base, drafted=drafted_c, per_prompt=per_prompt, reason="the reference accepted no draft token")
    n = len(pairs)
    u = [(c.accepted - rc * c.drafted) / drafted_c for _, c, _ in pairs]  # R_c's linearised residuals
    w = [(r.accepted - rr * r.drafted) / drafted_r for _, _, r in pairs]
    scale = n / (n - 1)
    var_c = scale * sum(x * x for x in u)
    var_r = scale * sum(y * y for y in w)
    cov = scale * sum(x * y for x, y in zip(u, w))
    quotient = rc / rr
    var_q = var_c / rr**2 + quotient**2 * var_r / rr**2 - 2 * quotient * cov / rr**2
    half = t_quantile(0.5 + confidence / 2, n - 1) * math.sqrt(max(var_q, 0.0))
    drop = 1.0 - quotient
    low, high = drop - half, drop + half
    measured = replace(
        base,
        drafted=drafted_c,
        candidate_ratio=rc,
        reference_ratio=rr,
        drop=drop,
        drop_low=low,
        drop_high=high,
        per_prompt=per_prompt,
    )
    interval = f"drop {drop:+.1%} ({confidence:.0%} interval {low:+.1%} to {high:+.1%}) over {n} prompts"
    if high < threshold:
        return replace(measured, verdict="pass", reason=f"{interval}: below the {threshold:.0%} threshold")
    if drop >= threshold and low > 0:
        return replace(measured, verdict="fail", reason=f"{interval}: at or beyond the {threshold:.0%} threshold")
    return replace(measured, reason=f"{interval}: too wide to decide against the {threshold:.0%} threshold")


def judge_against_ratio(
    candidate: Mapping[str, Acceptance],
    reference_ratio: float,
    threshold: float,
    confidence: float = 0.95,
    min_prompts: int = MIN_PAIRED_PROMPTS,
    min_drafted: float = MIN_DRAFTED_TOKENS,
) -> GateVerdict:
    """The verdict on a candidate's pooled probe acceptance against one ratio with no prompts behind it: the
    fleet's traffic baseline (`--reference-prometheus`).

    R_c's interval is the ratio estimator's over the candidate's prompts (residuals a_i - R_c d_i, Student's
    t); the reference is taken as exact. It measured a traffic mix, not these prompts, so the two differ by an
    unknown factor even for the same drafter, in either direction. Hence no pass: a probe set that accepts more
    easily than the traffic would pass a real drop. A fail needs the whole interval at or beyond the
    threshold. Everything else is inconclusive, and the reason says to record a fingerprint for a pass."""
    read = sorted((pid, a) for pid, a in candidate.items() if a.drafted > 0)
    base = GateVerdict(
        "inconclusive", "", threshold, confidence, paired=len(read), reference_ratio=reference_ratio, per_prompt={}
    )
    if len(read) < min_prompts:
        return replace(base, reason=f"{len(read)} prompts read from the candidate, want {min_prompts}")
    drafted = sum(a.drafted for _, a in read)
    if drafted < min_drafted:
        return replace(
            base, drafted=drafted, reason=f"the candidate drafted {drafted:.0f} tokens, want {min_drafted:.0f}"
        )
    if not 0 < reference_ratio <= 1:
        return replace(base, drafted=drafted, reason=f"the reference ratio {reference_ratio!r} is not in (0, 1]")
    n = len(read)
    rc = sum(a.accepted for _, a in read) / drafted
    var = n / (n - 1) * sum(((a.accepted - rc * a.drafted) / drafted) ** 2 for _, a in read)
    half = t_quantile(0.5 + confidence / 2, n - 1) * math.sqrt(var)
    drop = 1.0 - rc / reference_ratio
    low, high = 1.0 - (rc + half) / reference_ratio, 1.0 - (rc - half) / reference_ratio
    measured = replace(base, drafted=drafted, candidate_ratio=rc, drop=drop, drop_low=low, drop_high=high)
    interval = (
        f"probe acceptance {rc:.3f} against the fleet's traffic baseline {reference_ratio:.3f}: drop {drop:+.1%} "
        f"({confidence:.0%} interval {low:+.1%} to {high:+.1%}) over {n} prompts"
    )
    if low >= threshold:
        return replace(measured, verdict="fail", reason=f"{interval}: beyond the {threshold:.0%} threshold")
    return replace(
        measured,
        reason=f"{interval}: not a fail, and a traffic baseline cannot pass a probe set "
        "(record a fingerprint with `specwatch gate record` for a pass)",
    )


MIN_SWEEP_REQUESTS = 6  # per server at the low concurrency: t on >= 5 degrees of freedom


@dataclass(frozen=True)
class SpeedupPoint:
    """One sweep level: spec/plain output tokens/s and its interval (None: too few requests to say)."""

    concurrency: int
    speedup: float | None
    low: float | None = None
    high: float | None = None


def speedup_interval(
    speedup: float,
    plain: tuple[float, float, int],
    spec: tuple[float, float, int],
    confidence: float = 0.95,
    min_requests: int = MIN_SWEEP_REQUESTS,
) -> tuple[float, float] | None:
    """The interval of a level's speedup from each server's requests: (mean, sd, n) of a request's latency over
    its tokens. The speedup is a ratio of the two means, so its log's variance is the sum of their relative
    variances (delta method); Student's t with Welch's degrees of freedom. None below `min_requests` a server."""
    (m_p, sd_p, n_p), (m_s, sd_s, n_s) = plain, spec
    if min(n_p, n_s) < min_requests or m_p <= 0 or m_s <= 0 or speedup <= 0:
        return None
    v_p, v_s = sd_p**2 / (n_p * m_p**2), sd_s**2 / (n_s * m_s**2)
    if v_p + v_s == 0:
        return speedup, speedup
    dof = (v_p + v_s) ** 2 / (v_p**2 / (n_p - 1) + v_s**2 / (n_s - 1))
    half = t_quantile(0.5 + confidence / 2, max(1, math.floor(dof))) * math.sqrt(v_p + v_s)
    return speedup * math.exp(-half), speedup * math.exp(half)


@dataclass(frozen=True)
class SpeedupVerdict:
    """Whether speculation still speeds up low-batch traffic: the interval of the spec/plain throughput at the
    lowest of the sweep's concurrencies against `min_speedup`, as the acceptance's: a pass needs the whole
    interval at or above it, a fail the whole interval below it."""

    verdict: str  # pass | fail | inconclusive
    reason: str
    min_speedup: float
    required: bool  # whether the verdict gates the exit code (`--require-speedup`)
    points: tuple[SpeedupPoint, ...] = ()  # by concurrency

    @property
    def exit_code(self) -> int:
        return VERDICT_EXIT[self.verdict] if self.required else 0


def judge_speedup(
    points: Sequence[SpeedupPoint], min_speedup: float = 1.0, required: bool = False, failure: str = ""
) -> SpeedupVerdict:
    """The throughput verdict on a two-point sweep (SpeedupVerdict); `failure`: why the sweep stopped, if it did."""
    ordered = tuple(sorted(points, key=lambda p: p.concurrency))
    base = SpeedupVerdict("inconclusive", "", min_speedup, required, ordered)
    if failure:
        return replace(base, reason=f"the sweep stopped: {failure}")
    if not ordered or ordered[0].speedup is None:
        return replace(base, reason="the sweep measured no speedup at its lowest concurrency")
    first = ordered[0]
    shape = ", ".join(f"{p.speedup:.2f}x at {p.concurrency}" for p in ordered if p.speedup is not None)
    if first.low is None or first.high is None:
        return replace(
            base, reason=f"{shape}: fewer than {MIN_SWEEP_REQUESTS} requests a server at {first.concurrency}"
        )
    measured = f"{shape} (interval {first.low:.2f}x to {first.high:.2f}x at {first.concurrency})"
    if first.low >= min_speedup:
        return replace(base, verdict="pass", reason=f"speculation speeds up low-batch traffic: {measured}")
    if first.high < min_speedup:
        return replace(
            base,
            verdict="fail",
            reason=f"speculation no longer speeds up low-batch traffic: {measured}, want {min_speedup:.2f}x",
        )
    return replace(base, reason=f"{measured}: too wide to decide against {min_speedup:.2f}x")


def combined_exit(*codes: int) -> int:
    """A fail anywhere fails (1); else any inconclusive (2); else pass (0)."""
    return 1 if 1 in codes else (2 if 2 in codes else 0)
