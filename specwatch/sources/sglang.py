"""SGLang /metrics -> EngineSample. The maps below are the whole contract with SGLang; comments give versions.

SGLang always renders in multiprocess mode. Scheduler gauges come per scheduler (`dp_rank`, and `tp_rank`
when --enable-metrics-for-all-schedulers duplicates them); tokenizer counters are server-wide, per request
label set (`is_streaming`, `priority`, custom labels such as `route`). Spec gauges are interval averages over
the last --decode-log-interval decode steps; counters exist from 0.5.13 (docs/engines.md §2).

What the sample carries, in tracking's one meaning (`EngineCounters`):
- drafts: `spec_verify_calls_total`, the verify steps, with `verify_counts` (SGLang counts no draft or accepted
  tokens); draft_length: the draft tokens one verify step checks, as the algorithm defines them (`draft_shape`:
  the chain, the tree's nodes, the DSpark cap), 0 at an adaptive step 0; the sample names the basis it used;
- interval acceptance ratio: `spec_accept_rate` in today's definition (bonus token excluded), converted from
  the old one by version (`acceptance_ratio`); interval acceptance length: `spec_accept_length`.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Mapping, NamedTuple

from specwatch.snapshot import EngineCounters, EngineSample, StepTimes
from specwatch.sources.base import NoData, SourceError
from specwatch.sources.exposition import Family, Sample
from specwatch.sources.gateway import WORKER_LABEL, engine_id, worker_of
from specwatch.sources.vllm import (
    check_counter_types,
    check_match_labels,
    gauge_value,
    label_sort_key,
    sum_into,
    sum_samples,
)

# Scheduler-side gauges: exposed family -> the name it is read under here (the first three are EngineCounters
# fields as they are; the spec ones are turned into EngineCounters' by `_engine`).
SCHEDULER_GAUGES: Mapping[str, str] = {
    "sglang:num_running_reqs": "running",  # 0.4.0+; the batch size, set at log ticks
    "sglang:num_queue_reqs": "waiting",  # 0.4.0+
    "sglang:token_usage": "kv_usage",  # 0.4.0+; max over the KV pools (full, SWA, mamba)
    "sglang:spec_accept_length": "accept_length",  # 0.4.3+; includes the bonus token
    "sglang:spec_accept_rate": "accept_rate",  # 0.5.4+; bonus included <=0.5.10, excluded >=0.5.13
    "sglang:spec_num_draft_tokens": "num_draft_tokens",  # 0.5.13+; the active adaptive tier
    "sglang:spec_num_steps": "num_steps",  # 0.5.13+; 0 = not drafting (adaptive step 0)
    "sglang:spec_cap_length": "cap_length",  # 0.5.16+; DSpark's mean verify window incl. bonus, 0 = no cap
}
# Tokenizer-side counters (server-wide, summed over is_streaming and priority): family -> EngineCounters field.
TOKENIZER_COUNTERS: Mapping[str, str] = {
    "sglang:spec_verify_calls_total": "drafts",  # 0.5.13+; verify steps, grows at request completion
    "sglang:generation_tokens_total": "generation_tokens",  # 0.4.0+; `is_streaming` label (0.5.23)
}
# spec_accept_rate switched from counting the bonus token to excluding it between these releases.
NEW_RATE_SINCE = (0, 5, 11)
# Per-token decode latency (tokenizer side, server-wide, 0.4.0+). In 0.5.23 `TokenizerManager.collect_metrics`
# (srt/managers/tokenizer_manager.py:3249-3258) passes, per request and output batch, the time since that
# request's previous output and the tokens it brought; `observe_inter_token_latency`
# (srt/observability/metrics_collector.py:2161-2182) adds the interval to `_sum` once and `num_new_tokens` to the
# buckets, so `_count` counts tokens. Δ_sum / Δ_count is the time per output token; a speculative step yields tau
# tokens per request, so one step lasts Δ_sum x tau / Δ_count (docs/engines.md §2).
STEP_TIME = "sglang:inter_token_latency_seconds"
FILTER_EXTRA = frozenset((STEP_TIME + "_sum", STEP_TIME + "_count"))
# Finished requests, server-wide (tokenizer side, 0.4.0+; split by is_streaming and custom labels): canary
# probes' counter bracketing (probe/runner.py) reads it; the daemon's cycle does not fetch it.
FINISHED_REQUESTS = "sglang:num_requests_total"
# Labels that split one scheduler's gauge into copies or breakdowns rather than into other engines.
_PRIORITY, _TP_RANK, _PID = "priority", "tp_rank", "pid"
WANTED = frozenset(SCHEDULER_GAUGES) | frozenset(TOKENIZER_COUNTERS) | {STEP_TIME}
COUNTER_FAMILIES = frozenset(TOKENIZER_COUNTERS)  # their `# TYPE` is read and checked


# The server's arguments, flat, with `speculative_algorithm` and `speculative_draft_model_path` among them:
# `dataclasses.asdict(server_args)` in 0.4.x-0.5.10 (`entrypoints/http_server.py` `server_info`, server_args.py:493-494
# in the 0.5.10 wheel), `build_server_info` -> `ServerArgs.resolved_dict()` in 0.5.23 (utils/common.py:3584; the
# fields in arg_groups/fields/spec.py:31,36). Both releases answer `/get_server_info` (deprecated for `/server_info`).
SERVER_INFO_ENDPOINT = "/get_server_info"


def speculative_of_server_info(info: object) -> tuple[str, str]:
    """(method, drafter) from the server info: the algorithm as SGLang spells it (EAGLE3, NGRAM, DSPARK, ...) and
    the draft model's path; ("", "") for a server that does not speculate or does not say."""
    if not isinstance(info, dict):
        return "", ""
    algorithm, drafter = info.get("speculative_algorithm"), info.get("speculative_draft_model_path")
    if not isinstance(algorithm, str) or algorithm.strip().upper() in ("", "NONE"):
        return "", ""
    return algorithm.strip(), drafter.strip() if isinstance(drafter, str) else ""


def extract(
    families: Mapping[str, Family],
    match: Mapping[str, str],
    engines: tuple[str, ...],
    ts: float,
    version: str = "",
    worker_label: str = WORKER_LABEL,
) -> EngineSample:
    """Build the route's EngineSample from parsed families. Raises SourceError / NoData."""
    if not any(families.get(n) and families[n].samples for n in SCHEDULER_GAUGES):
        raise SourceError(
            "no_spec_metrics",
            "no SGLang scheduler families in the exposition (is the server started with --enable-metrics?)",
        )
    check_counter_types(families, COUNTER_FAMILIES)
    check_match_labels(families, match)
    selected = {name: fam.matching(match) for name, fam in families.items()}
    if not any(selected.values()):
        raise NoData(f"no SGLang series match {dict(match)}")
    model = next((s.labels["model_name"] for ss in selected.values() for s in ss if "model_name" in s.labels), "")

    per_rank: dict[str, dict] = {}
    worker_ranks: dict[str, list[str]] = {}  # worker -> its schedulers' engine ids (one worker: "")
    for family, field_name in SCHEDULER_GAUGES.items():
        for rank, sample in _one_per_scheduler(selected.get(family, []), worker_label).items():
            if not engines or sample.labels.get("dp_rank", "0") in engines:
                if rank not in per_rank:
                    per_rank[rank] = {}
                    worker_ranks.setdefault(worker_of(sample.labels, worker_label), []).append(rank)
                per_rank[rank][field_name] = gauge_value(sample.value)
    if not per_rank:
        raise NoData(f"no SGLang scheduler matches engines={list(engines)}")
    for fields in per_rank.values():
        if fields.get("num_steps") == 0:
            # Adaptive speculation at step 0 still runs a 1-token verify that pulls the gauges toward 1.0.
            fields.update(accept_length=None, accept_rate=None)

    # The tokenizer counters are server-wide (per worker behind a gateway): each rides on its server's first
    # engine, so that sums over engines are exact.
    server_wide: dict[str, dict] = {}
    for family, field_name in TOKENIZER_COUNTERS.items():
        for sample in selected.get(family, ()):
            sum_into(server_wide.setdefault(worker_of(sample.labels, worker_label), {}), field_name, sample)
    firsts = {worker: min(ranks, key=label_sort_key) for worker, ranks in worker_ranks.items()}
    for worker, totals in server_wide.items():
        if worker in firsts:
            per_rank[firsts[worker]].update(totals)
    ranks = sorted(per_rank, key=label_sort_key)

    step_times = {}
    for worker, samples in _by_worker(selected.get(STEP_TIME, ()), worker_label).items():
        itl = _per_token_latency(samples)
        if itl is not None and worker in firsts:
            step_times[firsts[worker]] = itl  # server-wide, like the tokenizer counters

    has_counters = "sglang:spec_verify_calls_total" in families or "sglang:spec_num_steps" in families
    raw = per_rank.values()
    shapes = [draft_shape(f.get("num_steps"), f.get("num_draft_tokens"), f.get("cap_length")) for f in raw]
    steps = [n for f in raw if (n := f.get("num_steps"))]
    verified = any(totals.get("drafts") for totals in server_wide.values())
    enabled = bool(any(shape.k for shape in shapes) or steps or verified or any(f.get("accept_length") for f in raw))
    known = [shape.k for shape in shapes if shape.k]
    k = max(known) if known else (int(max(steps)) if steps else None)
    route_k = k if enabled else None
    parsed_version = parse_version(version) if version else None
    counters = tuple(_engine(rank, per_rank[rank], route_k, parsed_version) for rank in ranks)
    return EngineSample(
        ts=ts,
        engine_kind="sglang",
        acceptance_source=("counter" if has_counters else "gauge") if enabled else "none",
        model_name=model,
        engine_version=version,
        speculation_enabled=enabled,
        num_speculative_tokens=k if enabled else None,
        engines=counters,
        step_time_totals=step_times,
        draft_length_basis=_route_basis(shapes) if enabled else "",
        draft_length_varies=enabled and any(shape.varies for shape in shapes),
    )


def _engine(rank: str, fields: dict, k: int | None, version: tuple[int, ...] | None) -> EngineCounters:
    """One scheduler's EngineCounters: the spec gauges in tracking's meaning (module docstring)."""
    n, steps = _finite(fields.pop("num_draft_tokens", None)), fields.pop("num_steps", None)
    cap = fields.pop("cap_length", None)
    rate, tau = fields.pop("accept_rate", None), fields.pop("accept_length", None)
    shape = draft_shape(steps, n, cap)
    # Adaptive speculation at step 0 verifies without drafting: no draft tokens, and gauges that say nothing.
    draft_length = shape.draft_length if shape.draft_length is not None else k
    drafting = steps is None or steps > 0
    ratio = acceptance_ratio(rate, tau, n, version, k) if drafting else None
    if ratio is not None and shape.basis == "dspark_cap" and n and draft_length:
        # spec_accept_rate divides by the whole block (n - 1 per verify); the cap verified fewer.
        ratio = _clamp01(ratio * (n - 1) / draft_length)
    return EngineCounters(
        engine=rank,
        verify_counts=True,
        draft_length=draft_length,
        interval_acceptance_ratio=ratio,
        interval_acceptance_length=_finite(tau) if drafting else None,
        **fields,
    )


class DraftShape(NamedTuple):
    """What one verify step of a scheduler checks, from its tier gauges (`draft_shape`)."""

    draft_length: float | None  # draft tokens verified per step (None: unknown)
    k: int | None  # the draft length the baseline is keyed by: the chain, or a tree's depth (None: unknown)
    basis: str  # what `draft_length` counts (DRAFT_LENGTH_BASES)
    varies: bool  # the draft tokens per verify step change from step to step (a cap, an adaptive tier)


# What `draft_length` counts, by the algorithm the tier gauges reveal (docs/engines.md §6.7). Every shape but the
# cap verifies spec_num_draft_tokens - 1 draft tokens per step, the denominator of SGLang's own spec_accept_rate
# (srt/managers/scheduler_components/metrics_reporter.py, 0.5.23: `draft_per_round`).
DRAFT_LENGTH_BASES = {
    "chain": "topk = 1 (EAGLE/EAGLE3/MTP/standalone): num_draft_tokens = num_steps + 1, the chain of num_steps",
    "tree": "EAGLE topk > 1: num_draft_tokens - 1 tree nodes verified, the baseline keyed by the depth num_steps",
    "block": "num_steps = 1 and more than one draft token: a DSpark/DFLASH block or an NGRAM tree (its default "
    "num_steps = num_draft_tokens // 10 = 1); num_draft_tokens - 1 verified either way",
    "dspark_cap": "DSpark with a scheduled cap: spec_cap_length - 1 (the mean verify window less the bonus slot)",
    "adaptive": "--speculative-adaptive at step 0: a 1-token verify, no draft tokens",
}


def draft_shape(steps: float | None, n: float | None, cap: float | None) -> DraftShape:
    """One scheduler's draft tokens per verify step and key length from `spec_num_steps` (steps),
    `spec_num_draft_tokens` (n, the verify width incl. the root/bonus slot) and `spec_cap_length` (cap).

    SGLang 0.5.23 sets n = steps + 1 for topk = 1 (arg_groups/speculative_hook.py:1256-1265); EAGLE topk > 1 keeps
    n tree nodes over steps levels; NGRAM sets topk = max BFS breadth (default 10), n = 12 and steps = n // topk
    (:1310-1330); DSpark and DFLASH force steps = 1 and n = block + 1 (:338-386, :758-838). DSpark's ragged verify
    schedules a window per request (`cap_lens` = the layout's verify_lens, incl. the bonus slot,
    speculative/dspark_components/dspark_worker_v2.py:1337); the gauge is their mean per verify step
    (metrics_reporter.py:983) and 0 without a cap.
    """
    steps, n, cap = _finite(steps), _finite(n), _finite(cap)
    if steps == 0:
        return DraftShape(0.0, None, "adaptive", True)
    if n is None or n <= 1:
        k = int(steps) if steps else None
        return DraftShape(None, k, "chain" if k else "", False)
    width, k = n - 1, int(n) - 1
    if cap is not None and cap > 1:
        return DraftShape(min(cap - 1, width), k, "dspark_cap", True)
    if steps is None or n <= steps + 1:
        return DraftShape(width, k, "chain", False)
    if steps > 1:
        return DraftShape(width, int(steps), "tree", False)
    return DraftShape(width, k, "block", False)


def _route_basis(shapes: list[DraftShape]) -> str:
    """The route's basis: its schedulers' one basis, or their bases joined where they differ (mid-switch)."""
    bases = sorted({shape.basis for shape in shapes if shape.basis})
    return "+".join(bases)


@functools.lru_cache(maxsize=64)  # a route's version string is the same cycle after cycle
def parse_version(text: str) -> tuple[int, ...] | None:
    """'0.5.10' -> (0, 5, 10); '0.5.13rc1' / 'v0.5.13.post2' -> (0, 5, 13); None when there are no digits."""
    m = re.match(r"^v?(\d+(?:\.\d+)*)", text.strip())
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def acceptance_ratio(
    rate: float | None,
    tau: float | None,
    n: float | None,
    version: tuple[int, ...] | None,
    k_hint: int | None,
) -> float | None:
    """Draft-token acceptance ratio (bonus token excluded) from SGLang's interval gauges `spec_accept_rate`,
    `spec_accept_length` (tau) and `spec_num_draft_tokens` (n = k + 1), or None.

    With tau = 1 + accepted / verify:
    - new definition (>= 0.5.13, recognised by the spec_num_draft_tokens gauge of the same release, or a
      known version >= 0.5.11): rate = accepted / (verify x (n - 1)) = (tau - 1) / k, used as is;
    - old definition (<= 0.5.10): rate_old = (accepted + verify) / (verify x n) = tau / n, converted with
      k from the route (server info) or, failing that, n = tau / rate_old;
    - no rate gauge (< 0.5.4): (tau - 1) / k when k is known.
    """
    n = _finite(n)
    k: float | None = (n - 1) if n is not None and n > 1 else (k_hint if k_hint else None)
    rate, tau = _finite(rate), _finite(tau)
    if rate is not None:
        if n is not None or (version is not None and version >= NEW_RATE_SINCE):
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
    return x if x is not None and math.isfinite(x) else None


def _per_token_latency(samples) -> StepTimes | None:
    """The ITL histogram's `_sum` and `_count` summed over its label sets (each observation lands in one), or
    None when absent or unusable."""
    fields: dict = {}
    for sample in samples:
        if sample.name.endswith("_sum"):
            sum_into(fields, "sum", sample)
        elif sample.name.endswith("_count"):
            sum_into(fields, "count", sample)
    seconds, tokens = fields.get("sum"), fields.get("count")
    if seconds is None or tokens is None:
        return None
    return StepTimes(seconds, tokens, None, per_token=True)


def finished_requests(
    families: Mapping[str, Family], match: Mapping[str, str], engines: tuple[str, ...] = ()
) -> float | None:
    """Requests the server has finished (server-wide, like the other tokenizer counters); None when absent."""
    fam = families.get(FINISHED_REQUESTS)
    samples = [s for s in fam.matching(match) if s.labels.get(_PRIORITY, "") == ""] if fam is not None else []
    return sum_samples(samples)


def _by_worker(samples, worker_label: str) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for sample in samples:
        out.setdefault(worker_of(sample.labels, worker_label), []).append(sample)
    return out


def _one_per_scheduler(samples: list[Sample], worker_label: str = WORKER_LABEL) -> dict[str, Sample]:
    """engine id (dp_rank, and the worker behind a gateway) -> the one sample that stands for that scheduler.

    Never sums over `priority` (0.5.23 puts the total under priority="" beside per-priority breakdowns);
    keeps tp_rank 0 when all TP ranks report (--enable-metrics-for-all-schedulers); ignores `pid`.
    """
    best: dict[str, tuple[tuple[int, float | str], Sample]] = {}
    for sample in samples:
        labels = sample.labels
        if labels.get(_PRIORITY, "") != "":
            continue
        rank = engine_id(labels, labels.get("dp_rank", "0"), worker_label)
        preference = (0, label_sort_key(labels.get(_TP_RANK, "0"))[1])
        if rank not in best or preference < best[rank][0]:
            best[rank] = (preference, sample)
    return {rank: sample for rank, (_, sample) in best.items()}
