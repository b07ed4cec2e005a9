"""SGLang /metrics -> EngineSample. The maps below are the whole contract with SGLang; comments give versions.

SGLang always renders in multiprocess mode. Scheduler gauges come per scheduler (`dp_rank`, and `tp_rank`
when --enable-metrics-for-all-schedulers duplicates them); tokenizer counters are server-wide, per request
label set (`is_streaming`, `priority`, custom labels such as `route`). Spec gauges are interval averages over
the last --decode-log-interval decode steps; counters exist from 0.5.13 (docs/engines.md §2).
"""

from __future__ import annotations

from typing import Mapping

from specwatch.snapshot import EngineCounters, EngineSample, StepTimes
from specwatch.sources.base import NoData, SourceError
from specwatch.sources.exposition import Family, Sample
from specwatch.sources.vllm import check_match_labels, gauge_value, label_sort_key, sum_into, sum_samples

# Scheduler-side gauges: exposed family -> EngineCounters field.
SCHEDULER_GAUGES: Mapping[str, str] = {
    "sglang:num_running_reqs": "running",  # 0.4.0+; the batch size, set at log ticks
    "sglang:num_queue_reqs": "waiting",  # 0.4.0+
    "sglang:token_usage": "kv_usage",  # 0.4.0+; max over the KV pools (full, SWA, mamba)
    "sglang:spec_accept_length": "spec_accept_length",  # 0.4.3+; includes the bonus token
    "sglang:spec_accept_rate": "spec_accept_rate",  # 0.5.4+; bonus included <=0.5.10, excluded >=0.5.13
    "sglang:spec_num_draft_tokens": "spec_num_draft_tokens",  # 0.5.13+; the active adaptive tier
    "sglang:spec_num_steps": "spec_num_steps",  # 0.5.13+; 0 = not drafting (adaptive step 0)
}
# Tokenizer-side counters (server-wide, summed over is_streaming and priority): family -> field.
TOKENIZER_COUNTERS: Mapping[str, str] = {
    "sglang:spec_verify_calls_total": "spec_verify_calls",  # 0.5.11-0.5.13+; grows at request completion
    "sglang:generation_tokens_total": "generation_tokens",  # 0.4.0+; `is_streaming` label (0.5.23)
}
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
SPEC_GAUGES = ("spec_accept_length", "spec_accept_rate", "spec_num_draft_tokens", "spec_num_steps")
# Labels that split one scheduler's gauge into copies or breakdowns rather than into other engines.
_PRIORITY, _TP_RANK, _PID = "priority", "tp_rank", "pid"
WANTED = frozenset(SCHEDULER_GAUGES) | frozenset(TOKENIZER_COUNTERS) | {STEP_TIME}


def extract(
    families: Mapping[str, Family], match: Mapping[str, str], engines: tuple[str, ...], ts: float, version: str = ""
) -> EngineSample:
    """Build the route's EngineSample from parsed families. Raises SourceError / NoData."""
    if not any(families.get(n) and families[n].samples for n in SCHEDULER_GAUGES):
        raise SourceError(
            "no_spec_metrics",
            "no SGLang scheduler families in the exposition (is the server started with --enable-metrics?)",
        )
    check_match_labels(families, match)
    selected = {name: fam.matching(match) for name, fam in families.items()}
    if not any(selected.values()):
        raise NoData(f"no SGLang series match {dict(match)}")
    model = next((s.labels["model_name"] for ss in selected.values() for s in ss if "model_name" in s.labels), "")

    per_rank: dict[str, dict] = {}
    for family, field_name in SCHEDULER_GAUGES.items():
        for dp_rank, sample in _one_per_scheduler(selected.get(family, [])).items():
            if not engines or dp_rank in engines:
                per_rank.setdefault(dp_rank, {})[field_name] = gauge_value(sample.value)
    if not per_rank:
        raise NoData(f"no SGLang scheduler matches engines={list(engines)}")
    for fields in per_rank.values():
        if fields.get("spec_num_steps") == 0:
            # Adaptive speculation at step 0 still runs a 1-token verify that pulls the gauges toward 1.0.
            fields.update(spec_accept_length=None, spec_accept_rate=None)

    server_wide: dict = {}
    for family, field_name in TOKENIZER_COUNTERS.items():
        for sample in selected.get(family, ()):
            sum_into(server_wide, field_name, sample)
    ranks = sorted(per_rank, key=label_sort_key)
    # The tokenizer counters are server-wide: they ride on the first engine so sums over engines are exact.
    per_rank[ranks[0]].update(server_wide)
    counters = tuple(EngineCounters(engine=rank, **per_rank[rank]) for rank in ranks)

    step_times = {}
    itl = _per_token_latency(selected.get(STEP_TIME, ()))
    if itl is not None:
        step_times[ranks[0]] = itl  # server-wide, like the tokenizer counters

    has_counters = "sglang:spec_verify_calls_total" in families or "sglang:spec_num_steps" in families
    draft_tokens = [c.spec_num_draft_tokens for c in counters if c.spec_num_draft_tokens]
    steps = [c.spec_num_steps for c in counters if c.spec_num_steps]
    enabled = bool(
        draft_tokens or steps or server_wide.get("spec_verify_calls") or any(c.spec_accept_length for c in counters)
    )
    k = int(max(draft_tokens)) - 1 if draft_tokens else (int(max(steps)) if steps else None)
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
    )


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


def _one_per_scheduler(samples: list[Sample]) -> dict[str, Sample]:
    """dp_rank -> the one sample that stands for that scheduler.

    Never sums over `priority` (0.5.23 puts the total under priority="" beside per-priority breakdowns);
    keeps tp_rank 0 when all TP ranks report (--enable-metrics-for-all-schedulers); ignores `pid`.
    """
    best: dict[str, tuple[tuple[int, float | str], Sample]] = {}
    for sample in samples:
        labels = sample.labels
        if labels.get(_PRIORITY, "") != "":
            continue
        rank = labels.get("dp_rank", "0")
        preference = (0, label_sort_key(labels.get(_TP_RANK, "0"))[1])
        if rank not in best or preference < best[rank][0]:
            best[rank] = (preference, sample)
    return {rank: sample for rank, (_, sample) in best.items()}
