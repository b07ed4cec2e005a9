"""The detection bound of bench/bench_detection_bound.py on a GPU (or torch's CPU): the same model, the same
likelihood ratio and CUSUM, with whole batches of routes drawn and weighed as [routes, requests] tensors.

numpy spends about 9 CPU-s on one set of 60 route-days at 0.2 req/s (a million requests through a 64-point
integral, four times); calibrating h on 1,000 sets at two κ is then hours of CPU. Here a batch of sets is a few
tensor operations. The draws follow `bench_detection_bound.draw_requests` distribution for distribution (torch's
random streams, not numpy's, so a set's numbers differ while their distribution does not), and `llr` is
`bench_detection_bound.Llr` term for term in float64 (`check` compares the two on the same requests).

Routes of one batch have different request counts: each row is padded with requests that are not kept, whose
ℓ is 0, which leaves the CUSUM's path and maximum unchanged.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from specwatch.offline.tracegen import BETA_MEAN, DAY, LENGTH_SIGMA, MAX_ALPHA, conditional_alphas, drop_scale

F64 = torch.float64


class TorchLlr:
    """`bench_detection_bound.Llr` on tensors: ln L(20% drop) - ln L(5% drift) per request."""

    def __init__(self, llr, device: torch.device) -> None:  # llr: a bench_detection_bound.Llr
        self.mu = llr.mu
        self.fixed_share = llr.fixed_share
        self.log_w = torch.as_tensor(llr.log_w, dtype=F64, device=device)
        self.tables = {
            name: tuple(
                (torch.as_tensor(table, dtype=F64, device=device), torch.as_tensor(per_step, dtype=F64, device=device))
                for table, per_step in pair
            )
            for name, pair in llr.tables.items()
        }

    def __call__(self, share: torch.Tensor, hist: torch.Tensor) -> torch.Tensor:
        """share: [n], hist: [n, k+1] (float64, every row with at least one step)."""
        if self.fixed_share is not None and bool((share > 0).any()):
            share = torch.full_like(share, self.fixed_share)
        out = torch.zeros(hist.shape[0], dtype=F64, device=hist.device)
        log_steps = torch.log(hist.sum(dim=1))[:, None]
        log_first, log_second = torch.log1p(-share), torch.log(share)
        for name, sign in (("bad", 1.0), ("ok", -1.0)):
            lik = []
            for table, log_per_step in self.tables[name]:
                ll = hist @ table.T - (log_steps + log_per_step[None, :] - self.mu) ** 2 / (2 * LENGTH_SIGMA**2)
                ll += self.log_w
                lik.append(torch.logsumexp(ll, dim=1))
            mixed = torch.logaddexp(log_first + lik[0], log_second + lik[1]) if bool((share > 0).any()) else lik[0]
            out += sign * mixed
        return out


def draw_batch(
    spec, duration: torch.Tensor, factor_of, gen: torch.Generator, route_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(arrival seconds [R, N], class share [R, N], step histograms [R, N, k+1], kept [R, N]) for R routes of
    `duration[r]` seconds, as `draw_requests`; `factor_of(t)` gives the drops' factor on α at each arrival and
    `route_scale` [R] each route's own (its baseline error)."""
    device = duration.device
    peak = spec.rate * (1 + abs(spec.diurnal))
    counts = torch.poisson(peak * duration, generator=gen)
    n = max(1, int(counts.max().item()))
    rows = duration.shape[0]
    t = torch.rand(rows, n, dtype=F64, device=device, generator=gen) * duration[:, None]
    slots = torch.arange(n, device=device)[None, :]
    t = torch.where(slots < counts[:, None], t, torch.full_like(t, math.inf))
    t, _ = torch.sort(t, dim=1)
    finite = torch.isfinite(t)
    t_safe = torch.where(finite, t, torch.zeros_like(t))
    rate_now = spec.rate * (1 + spec.diurnal * torch.sin(2 * math.pi * t_safe / DAY))
    kept = finite & (torch.rand(rows, n, dtype=F64, device=device, generator=gen) * peak <= rate_now)
    if spec.mix_share:
        share = spec.mix_share + spec.mix_swing * torch.sin(2 * math.pi * t_safe / DAY + spec.mix_phase)
    else:
        share = torch.zeros_like(t_safe)
    factor = factor_of(t_safe)
    if route_scale is not None:
        factor = factor * route_scale[:, None]
    second = torch.rand(rows, n, dtype=F64, device=device, generator=gen) < share
    factor = torch.where(second, factor * spec.mix_scale, factor)
    a, b = spec.kappa * BETA_MEAN, spec.kappa * (1 - BETA_MEAN)
    ga = torch._standard_gamma(torch.full((rows, n), a, dtype=F64, device=device), generator=gen)
    gb = torch._standard_gamma(torch.full((rows, n), b, dtype=F64, device=device), generator=gen)
    u = ga / (ga + gb)
    alphas = torch.tensor(conditional_alphas(spec.profile, spec.k), dtype=F64, device=device)
    cond = torch.clamp(alphas * (u / BETA_MEAN * factor)[..., None], 0.0, MAX_ALPHA)
    p = torch.cumprod(cond, dim=-1)
    mu = math.log(spec.mean_tokens) - LENGTH_SIGMA**2 / 2
    normal = torch.randn(rows, n, dtype=F64, device=device, generator=gen)
    tokens = torch.clamp(torch.exp(mu + LENGTH_SIGMA * normal), 8, 8192)
    steps = torch.clamp(torch.round(tokens / (1 + p.sum(dim=-1))), min=1)
    reach = [steps]
    for j in range(spec.k):  # prefix acceptance: position j is tried only where j - 1 was accepted
        reach.append(torch.binomial(reach[-1], cond[..., j], generator=gen))
    r = torch.stack(reach, dim=-1)
    hist = torch.cat([r[..., :-1] - r[..., 1:], r[..., -1:]], dim=-1)
    return t_safe, share, hist, kept


def cusum_rows(llr: torch.Tensor) -> torch.Tensor:
    """S along each row: C_n - min(0, min_{m<=n} C_m)."""
    c = torch.cumsum(llr, dim=1)
    low = torch.cummin(c, dim=1).values
    return c - torch.clamp(low, max=0.0)


def row_llr(torch_llr: TorchLlr, share: torch.Tensor, hist: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """ℓ of every kept request of [R, N]; 0 where not kept."""
    out = torch.zeros(kept.shape, dtype=F64, device=kept.device)
    idx = kept.nonzero(as_tuple=True)
    out[idx] = torch_llr(share[idx], hist[idx])
    return out


def _route_scale(model, rows: int, device: torch.device, gen: torch.Generator) -> torch.Tensor | None:
    """Each route's factor on α from its baseline error (`Model.baseline_error`); None when the baseline is exact."""
    if model.baseline_error <= 0:
        return None
    return torch.exp(torch.randn(rows, dtype=F64, device=device, generator=gen) * model.baseline_error)


def _drop_factor(starts: torch.Tensor, ends: torch.Tensor, scale: torch.Tensor):
    """factor_of(t) for one drop per row: its start, end and factor on α, tensors [R]."""

    def factor_of(t: torch.Tensor) -> torch.Tensor:
        inside = (t >= starts[:, None]) & (t < ends[:, None])
        return torch.where(inside, scale[:, None].expand_as(t), torch.ones_like(t))

    return factor_of


def set_maxima(bound, model, first: int, count: int, device: torch.device, per_batch: int) -> list[float]:
    """The highest statistic of each of sets first .. first + count - 1 (each 6 clean + 6 5%-drift routes of 5
    days, as bench_detection_bound.set_maximum)."""
    spec = model.spec
    tl = TorchLlr(bound.Llr(model), device)
    drift_scale = drop_scale(spec.profile, spec.k, spec.kappa, bound.DRIFT)
    out: list[float] = []
    for lo in range(first, first + count, per_batch):
        sets = min(per_batch, first + count - lo)
        gen = torch.Generator(device=device)
        gen.manual_seed(1_000_003 * lo + 7)
        rows = sets * bound.ROUTES * 2
        duration = torch.full((rows,), bound.ROUTE_DAYS * DAY, dtype=F64, device=device)
        drift = torch.tensor([i % 2 == 1 for i in range(rows)], device=device)
        scale = torch.where(drift, drift_scale, 1.0).to(F64)
        starts = torch.where(drift, DAY, math.inf).to(F64)
        ends = torch.full((rows,), math.inf, dtype=F64, device=device)
        route_scale = _route_scale(model, rows, device, gen)
        t, share, hist, kept = draw_batch(spec, duration, _drop_factor(starts, ends, scale), gen, route_scale)
        s = cusum_rows(row_llr(tl, share, hist, kept))
        top = s.max(dim=1).values.reshape(sets, bound.ROUTES * 2).max(dim=1).values
        out += [max(0.0, float(x)) for x in top.tolist()]
        del t, share, hist, kept, s
    return out


def detection_minutes(bound, model, drops: int, thresholds: list[float], device: torch.device, seed: int = 11):
    """Per injected 20% drop (placed as bench_detection_bound.detection_minutes), minutes to the first S >= h
    per h (inf: missed within the drop)."""
    spec = model.spec
    tl = TorchLlr(bound.Llr(model), device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    start = bound.WARM_SECONDS + torch.rand(drops, dtype=F64, device=device, generator=gen) * 4 * 3600.0
    end = start + bound.DROP_SECONDS
    scale = torch.full((drops,), drop_scale(spec.profile, spec.k, spec.kappa, bound.DROP), dtype=F64, device=device)
    route_scale = _route_scale(model, drops, device, gen)
    t, share, hist, kept = draw_batch(spec, end, _drop_factor(start, end, scale), gen, route_scale)
    s = cusum_rows(row_llr(tl, share, hist, kept))
    after = kept & (t >= start[:, None])
    out = [[] for _ in range(drops)]
    for h in thresholds:
        hit = after & (s >= h)
        any_hit = hit.any(dim=1)
        first = torch.argmax(hit.to(torch.int8), dim=1)
        when = (t.gather(1, first[:, None])[:, 0] - start) / 60
        for i, (ok, m) in enumerate(zip(any_hit.tolist(), when.tolist())):
            out[i].append(m if ok else math.inf)
    return out


def check(bound, model, device: torch.device) -> float:
    """Largest |ℓ_numpy - ℓ_torch| over one numpy-drawn route of 5 days (the two likelihoods agree)."""
    spec = bound._route_spec(model, duration=bound.ROUTE_DAYS * DAY)
    _, share, hist = bound.draw_requests(spec, np.random.default_rng(5))
    ref = bound.Llr(model)(share, hist)
    ours = TorchLlr(bound.Llr(model), device)(
        torch.as_tensor(share, dtype=F64, device=device), torch.as_tensor(hist, dtype=F64, device=device)
    )
    return float(np.abs(ours.cpu().numpy() - ref).max())
