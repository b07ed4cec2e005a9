"""TensorRT-LLM /prometheus/metrics (or its JSON /metrics) -> EngineSample. The maps below are the whole
contract with TensorRT-LLM; comments give where each name comes from (docs/engines.md has the citations).

Names, types and labels are those of `MetricsCollector` in `tensorrt_llm/metrics/collector.py`
(NVIDIA/TensorRT-LLM, checked at commit 050f80def8df, a 2026 main): prefix `trtllm_`, labels `model_name`
and `engine_type` on every series. trtllm-serve mounts prometheus_client's app at `/prometheus/metrics`.

- The spec-decode counters are fed from iteration stats (`log_iteration_stats`, `specDecodingStats`),
  which trtllm-serve drains when a request completes: they move in lumps, at request completion.
- The per-position counters are fed per request when it finishes (`log_request_metrics_dict`, needs
  `return_perf_metrics: true`), label `token_position`, and only positions that drafted a token exist: a
  missing position is 0, not unknown. `drafted[0]` counts the steps that drafted at all (every draft
  proposes position 0), so it is the drafts denominator; no drafts counter exists otherwise. Where they
  exist, every count of the route comes from them (one clock, see `extract`); without them the iteration
  counters give the acceptance rate but no mean length.
- There is no engine index label: one collector per server.

NVIDIA Dynamo passes the same registry through on its worker /metrics with the `trtllm_` names
(`components/src/dynamo/common/utils/prometheus.py`, `add_prefix="trtllm_"`); older Dynamo docs spell the
prefix `trtllm:`. A prefix-stripped spelling with a `backend="trtllm"` label (Dynamo's OpenTelemetry bridge)
is accepted too but was not found in Dynamo's source: unconfirmed.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

from specwatch.snapshot import EngineCounters, EngineSample
from specwatch.sources.base import NoData, SourceError
from specwatch.sources.gateway import WORKER_LABEL
from specwatch.sources.exposition import Family, Sample
from specwatch.sources.vllm import (
    check_counter_types,
    check_match_labels,
    counter_value,
    gauge_value,
    label_sort_key,
    sum_into,
)

# Spellings of one family, tried in order: trtllm-serve and Dynamo's pass-through; older Dynamo docs;
# prefix-stripped with backend="trtllm" (unconfirmed, see above).
PREFIXES = ("trtllm_", "trtllm:", "")
BARE_BACKEND_LABEL = ("backend", "trtllm")  # what a prefix-stripped series must carry to be TensorRT-LLM's

# Counters: family (without prefix) -> EngineCounters field. Declared with `_total` in the collector.
COUNTERS: Mapping[str, str] = {
    "spec_decode_num_draft_tokens_total": "draft_tokens",  # from specDecodingStats.numDraftTokens
    "spec_decode_num_accepted_tokens_total": "accepted_tokens",  # numAcceptedTokens; bonus token excluded
    "generation_tokens_total": "generation_tokens",  # per request at finish
}
# Per-position counters (label `token_position`), per request at finish.
PER_POSITION: Mapping[str, str] = {
    "spec_decode_accepted_tokens_total": "accepted",
    "spec_decode_drafted_tokens_total": "drafted",
}
POSITION_LABEL = "token_position"
GAUGES: Mapping[str, str] = {
    "num_requests_running": "running",  # numActiveRequests of the last iteration stats
    "num_requests_waiting": "waiting",  # numQueuedRequests
    "kv_cache_utilization": "kv_usage",  # usedNumBlocks / maxNumBlocks, 0-1
    # inflightBatchingStats.numGenRequests of the last iteration stats: the requests decoding, where
    # num_requests_running counts context (prefill) requests too (collector.py, log_iteration_stats)
    "num_generation_requests": "decode_batch",
}
# Info gauge set once at startup: `MetricsCollector.log_config_info(speculative_config=...)` sets
# `trtllm_speculative_config_info` to 1 with the given dict's keys as labels (tensorrt_llm/metrics/collector.py, a
# 2026 main newer than 050f80def8df). The label names are those of the collector's own test
# (tests/unittest/metrics/test_collector.py @795ccdf7860d, `test_speculative_config_info`: spec_enabled,
# spec_method, spec_num_tokens, spec_draft_model); the server code that fills the dict was not read here.
SPEC_CONFIG_INFO = "speculative_config_info"
SPEC_ENABLED_LABEL, SPEC_TOKENS_LABEL = "spec_enabled", "spec_num_tokens"
SPEC_METHOD_LABEL, SPEC_DRAFTER_LABEL = "spec_method", "spec_draft_model"  # the method and drafter: the key's

# prometheus_client's creation time of the generation counter (single-process mode): a new value is a new
# server, whatever its counters read.
CREATED = "generation_tokens_created"

_LOGICAL = (*COUNTERS, *PER_POSITION, *GAUGES, SPEC_CONFIG_INFO, CREATED)
WANTED = frozenset(prefix + name for prefix in PREFIXES for name in _LOGICAL)
_SPEC = (*(n for n in COUNTERS if n.startswith("spec_decode_")), *PER_POSITION)
# Every spelling of a family summed as a counter, checked against its `# TYPE`. PR #12545 (NVIDIA/TensorRT-LLM,
# merged 2026-03) describes its own change of the draft and accepted token families "from Gauge to Counter to
# enable rate()": a gauge there holds one iteration's count.
COUNTER_FAMILIES = frozenset(prefix + name for prefix in PREFIXES for name in (*COUNTERS, *PER_POSITION))
_GAUGE_HINT = " (TensorRT-LLM's draft and accepted token families are counters since PR #12545)"

# JSON iteration stats (trtllm-serve GET /metrics with `enable_iter_perf_stats: true`), keys as
# `log_iteration_stats` reads them. The drafts count is in the JSON only.
JSON_SPEC = "specDecodingStats"
JSON_COUNTERS: Mapping[str, str] = {
    "numDraftTokens": "spec_decode_num_draft_tokens_total",
    "numAcceptedTokens": "spec_decode_num_accepted_tokens_total",
    "numRequestsWithDraftTokens": "specDecodingStats.numRequestsWithDraftTokens",  # no Prometheus name
}
JSON_DRAFTS = JSON_COUNTERS["numRequestsWithDraftTokens"]


def extract(
    families: Mapping[str, Family],
    match: Mapping[str, str],
    engines: tuple[str, ...],
    ts: float,
    version: str = "",
    worker_label: str = WORKER_LABEL,
) -> EngineSample:
    """Build the route's EngineSample from parsed families. Raises SourceError / NoData."""
    resolved = _resolve(families)
    if not any(resolved.get(n) for n in (*COUNTERS, *PER_POSITION, *GAUGES, SPEC_CONFIG_INFO, JSON_DRAFTS)):
        raise SourceError(
            "no_spec_metrics",
            "no TensorRT-LLM families in the exposition (trtllm-serve's Prometheus text is at /prometheus/metrics)",
        )
    if engines and "0" not in engines:
        raise NoData(f'TensorRT-LLM has one engine per server ("0"), not engines={list(engines)}')
    check_counter_types(families, COUNTER_FAMILIES, _GAUGE_HINT)
    check_match_labels(families, match)
    selected = {name: _matching(samples, match) for name, samples in resolved.items()}
    if not any(selected.values()):
        raise NoData(f"no TensorRT-LLM series match {dict(match)}")
    model = next((s.labels["model_name"] for ss in selected.values() for s in ss if "model_name" in s.labels), "")

    fields: dict[str, Any] = {}
    for name, field_name in COUNTERS.items():
        for sample in selected.get(name, ()):
            sum_into(fields, field_name, sample)
    for sample in selected.get(JSON_DRAFTS, []):
        sum_into(fields, "drafts", sample)
    for name, field_name in GAUGES.items():
        values = [gauge_value(s.value) for s in selected.get(name, [])]
        if values:
            fields[field_name] = values[-1]
    created = [c for s in selected.get(CREATED, []) if (c := gauge_value(s.value)) is not None]
    if created:
        fields["created"] = max(created)
    accepted, drafted = (_positions(selected.get(name, [])) for name in PER_POSITION)
    if accepted is not None and drafted is not None:
        width = max(len(accepted), len(drafted))
        fields["accepted_per_pos"] = accepted + (0.0,) * (width - len(accepted))  # an absent position is 0
        fields["drafted_per_pos"] = drafted + (0.0,) * (width - len(drafted))
        if width and "drafts" not in fields:
            # One clock for every count: the per-position counters move when a request finishes, the
            # iteration counters when the stats loop drains (also at request completion, but not the same
            # requests), so a window mixing them could pair one's tokens with the other's drafts. Their
            # sums are the same tokens: Σ drafted = draft tokens, Σ accepted = accepted tokens.
            fields["drafts"] = fields["drafted_per_pos"][0]
            fields["draft_tokens"] = sum(fields["drafted_per_pos"])
            fields["accepted_tokens"] = sum(fields["accepted_per_pos"])

    config = next(iter(selected.get(SPEC_CONFIG_INFO, [])), None)
    configured = _configured(config)
    enabled = configured if configured is not None else any(selected.get(n) for n in (*_SPEC, JSON_DRAFTS))
    k = _configured_k(config) or (len(fields.get("accepted_per_pos", ())) or None)
    return EngineSample(
        ts=ts,
        engine_kind="trtllm",
        acceptance_source="counter" if enabled else "none",
        model_name=model,
        engine_version=version,
        speculation_enabled=enabled,
        num_speculative_tokens=k if enabled else None,
        spec_method=config.labels.get(SPEC_METHOD_LABEL, "") if config is not None else "",
        spec_drafter=config.labels.get(SPEC_DRAFTER_LABEL, "") if config is not None else "",
        engines=(EngineCounters(engine="0", **fields),),
    )


def _resolve(families: Mapping[str, Family]) -> dict[str, list[Sample]]:
    """Logical family name -> its samples, under the first spelling present."""
    out: dict[str, list[Sample]] = {}
    if families.get(JSON_DRAFTS) is not None and families[JSON_DRAFTS].samples:
        out[JSON_DRAFTS] = families[JSON_DRAFTS].samples
    for name in _LOGICAL:
        for prefix in PREFIXES:
            family = families.get(prefix + name)
            if family is None or not family.samples:
                continue
            samples = family.samples
            if not prefix:
                key, value = BARE_BACKEND_LABEL
                samples = [s for s in samples if s.labels.get(key) == value]
            if samples:
                out[name] = samples
                break
    return out


def _matching(samples: list[Sample], match: Mapping[str, str]) -> list[Sample]:
    return Family("", samples=samples).matching(match)


def _positions(samples: list[Sample]) -> tuple[float, ...] | None:
    """Per-position counter values (positions 0..max, absent ones 0); None when one is unusable."""
    by_position: dict[str, Any] = {}
    for sample in samples:
        position = sample.labels.get(POSITION_LABEL)
        if position is not None:
            sum_into(by_position, position, sample)
    if any(v is None for v in by_position.values()):
        return None
    numeric = {int(p): v for p, v in by_position.items() if label_sort_key(p)[0] == 0 and float(p).is_integer()}
    if not numeric:
        return ()
    return tuple(numeric.get(j, 0.0) for j in range(max(numeric) + 1))


def _configured(config: Sample | None) -> bool | None:
    if config is None or SPEC_ENABLED_LABEL not in config.labels:
        return None
    return config.labels[SPEC_ENABLED_LABEL].strip().lower() in ("true", "1", "yes")


def _configured_k(config: Sample | None) -> int | None:
    if config is None:
        return None
    try:
        k = int(config.labels.get(SPEC_TOKENS_LABEL, ""))
    except ValueError:
        return None
    return k if k > 0 else None


# ----------------------------------------------------------------------------- JSON iteration stats
def is_iteration_stats(body: bytes) -> bool:
    """A JSON list (trtllm-serve's /metrics) rather than Prometheus text."""
    return body.lstrip()[:1] == b"["


class IterationStatsTotals:
    """Cumulative counters built from trtllm-serve's JSON iteration stats, one per endpoint.

    GET /metrics returns the iteration stats gathered since the previous GET (older releases hand out and
    drop them; newer ones serve a buffer the Prometheus loop fills), each once per `iter`: summing the
    `specDecodingStats` of iterations not seen before gives counters. A lower `iter` than any seen means
    the server restarted; its iterations count from there. Gauges are the last iteration's.
    """

    def __init__(self) -> None:
        self.totals: dict[str, float] = dict.fromkeys(JSON_COUNTERS.values(), 0.0)
        self.last_iter: int | None = None
        self.latest: dict[str, float] = {}
        self.spec_seen = False  # specDecodingStats appear only on a server that speculates

    def add(self, body: bytes) -> None:
        try:
            stats = json.loads(body)
        except ValueError as exc:
            raise SourceError("parse", f"invalid TensorRT-LLM iteration stats JSON: {exc}") from None
        if not isinstance(stats, list) or not all(isinstance(s, dict) for s in stats):
            raise SourceError("parse", "TensorRT-LLM iteration stats: expected a JSON list of objects")
        ordered = sorted(stats, key=lambda s: s.get("iter", -1) if isinstance(s.get("iter"), int) else -1)
        if ordered and self.last_iter is not None and _iter(ordered[-1]) < self.last_iter:
            self.last_iter = None  # restarted: every iteration of this body is new
        for stat in ordered:
            it = _iter(stat)
            if self.last_iter is not None and it <= self.last_iter:
                continue
            self.last_iter = it
            spec = stat.get(JSON_SPEC)
            if isinstance(spec, dict):
                self.spec_seen = True
                for key, name in JSON_COUNTERS.items():
                    value = spec.get(key)
                    if isinstance(value, (int, float)) and counter_value(float(value)) is not None:
                        self.totals[name] += float(value)
            self.latest = _gauges(stat)

    def families(self) -> dict[str, Family]:
        """The totals and the last gauges as families of the Prometheus spelling (JSON_DRAFTS aside)."""
        out: dict[str, Family] = {}
        if self.spec_seen:
            out = {
                "trtllm_" + name if name != JSON_DRAFTS else name: Family(
                    name, "counter", samples=[Sample(name, {}, value)]
                )
                for name, value in self.totals.items()
            }
        for name, value in self.latest.items():
            out["trtllm_" + name] = Family(name, "gauge", samples=[Sample(name, {}, value)])
        return out


def _iter(stat: dict) -> int:
    value = stat.get("iter")
    return value if isinstance(value, int) else -1


def _gauges(stat: dict) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, name in (("numActiveRequests", "num_requests_running"), ("numQueuedRequests", "num_requests_waiting")):
        value = stat.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[name] = float(value)
    ifb = stat.get("inflightBatchingStats")
    generating = ifb.get("numGenRequests") if isinstance(ifb, dict) else None
    if isinstance(generating, (int, float)) and math.isfinite(generating):
        out["num_generation_requests"] = float(generating)
    kv = stat.get("kvCacheStats")
    if isinstance(kv, dict) and isinstance(kv.get("maxNumBlocks"), (int, float)) and kv["maxNumBlocks"] > 0:
        used = kv.get("usedNumBlocks")
        if isinstance(used, (int, float)):
            out["kv_cache_utilization"] = float(used) / float(kv["maxNumBlocks"])
    return out
