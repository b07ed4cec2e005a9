"""llama.cpp `llama-server --metrics` /metrics -> EngineSample. The maps below are the whole contract with
llama.cpp; comments give where each name comes from (docs/engines.md has the citations).

Checked against llama.cpp commit 0c1e57098bba (the tree vendored in llama-cpp-python 0.3.36).
llama-server writes its exposition by hand (`server_task_result_metrics::to_metrics()` in
tools/server/server-task.cpp): `llamacpp:` names, no labels at all (one model, one engine per server), no
`_created`. The speculative counters are server-lifetime sums that a slot adds its own counts to when it
resets after its request (`metrics_on_prediction`, tools/server/server-context.cpp), so they move in lumps
at request completion, never mid-request: a 1m window on a route with long requests can hold none of them.
Counters are written as doubles with the C++ stream's default 6 significant digits, so values above 999999
are rounded (1.23457e+06): ratios of large deltas stay right, small deltas on a large counter are
quantised. The per-position counter is a uint64 and printed exactly.
"""

from __future__ import annotations

from typing import Any, Mapping

from specwatch.snapshot import EngineCounters, EngineSample
from specwatch.sources.base import NoData, SourceError
from specwatch.sources.gateway import WORKER_LABEL
from specwatch.sources.exposition import Family
from specwatch.sources.vllm import check_counter_types, check_match_labels, gauge_value, label_sort_key, sum_into

COUNTERS: Mapping[str, str] = {
    "llamacpp:spec_decode_num_drafts_total": "drafts",  # verification steps (n_draft_verif_steps)
    "llamacpp:spec_decode_num_draft_tokens_total": "draft_tokens",  # draft tokens generated
    "llamacpp:spec_decode_num_accepted_tokens_total": "accepted_tokens",  # bonus token excluded
    "llamacpp:tokens_predicted_total": "generation_tokens",  # tokens generated, added at request finish
}
# Accepted tokens per draft position, label `position` = 0..n_max-1 (the configured maximum draft length):
# a step accepting n tokens counts positions 0..n-1, so p_j = per_pos[j] / drafts. Present once a request
# that drafted has finished.
PER_POSITION = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
GAUGES: Mapping[str, str] = {
    "llamacpp:requests_processing": "running",  # slots processing a request
    "llamacpp:requests_deferred": "waiting",  # requests waiting for a free slot
}
# The decode batch (b11434, tools/server/server-context.cpp `metrics_post_decode`): every llama_decode() call of
# the main loop adds 1 to `n_decode` and the number of slots processing (prefill or decode) to `n_busy_slots`,
# both since the server started (never reset by /metrics?reset_bucket); tools/server/server-task.cpp writes
# n_decode as a counter and n_busy_slots / max(n_decode, 1) as a gauge. Their product gives the busy-slot count
# back, so the increases over a cycle give the mean slots per decode of that cycle's calls (6 significant
# digits each, so small increases on large totals are quantised).
DECODES = "llamacpp:n_decode_total"
BUSY_SLOTS_PER_DECODE = "llamacpp:n_busy_slots_per_decode"
SPEC_FAMILIES = frozenset(COUNTERS) - {"llamacpp:tokens_predicted_total"} | {PER_POSITION}
# /props (tools/server/server-context.cpp, get_res_props): `build_info` is "b<build>-<commit>"; `model_path` is
# the file served (`model_alias` is --alias, else the file name). Neither is on /metrics, whose series have no
# labels at all, and nothing there or in /props tells when the server started.
VERSION_ENDPOINTS = (("/props", "build_info"),)
MODEL_ENDPOINT = ("/props", "model_alias")
# The speculative method (b11434): `/slots` (on unless --no-slots) lists each slot with `params`, the params of
# its last task (tools/server/server-context.cpp `server_slot::to_json`), whose "speculative.types" is the
# server's `--spec-type` (tools/server/server-schema.cpp: a task's speculative params start as the server's),
# comma-joined names of common/speculative.cpp `common_speculative_type_to_str` ("draft-simple", "ngram-simple",
# "draft-eagle3", ...). `--spec-type` appends to the default ["none"] (common/arg.cpp), so a server started with
# `--spec-type draft-simple` says "none,draft-simple": "none" is dropped here. A slot has `params` only once it
# has run a request. /props has the same key, built from the sampling params alone: it reads "none" whatever the
# server runs. Nothing the server answers names the draft model file (`--spec-draft-model`): a route's config
# says it.
METHOD_ENDPOINT = "/slots"


def speculative_of_slots(slots: Any) -> tuple[str, str]:
    """(method, drafter) from a /slots answer: llama.cpp names no draft model file there."""
    return method_of_slots(slots), ""


def method_of_slots(slots: Any) -> str:
    """The speculative method from a /slots answer: the first slot that has run a request; "" before any has."""
    for slot in slots if isinstance(slots, list) else ():
        params = slot.get("params") if isinstance(slot, dict) else None
        types = params.get("speculative.types") if isinstance(params, dict) else None
        if isinstance(types, str) and types:
            return ",".join(t for t in types.split(",") if t and t != "none") or "none"
    return ""


WANTED = frozenset(COUNTERS) | {PER_POSITION, DECODES, BUSY_SLOTS_PER_DECODE} | frozenset(GAUGES)
COUNTER_FAMILIES = frozenset(COUNTERS) | {PER_POSITION, DECODES}  # their `# TYPE` is read and checked


def extract(
    families: Mapping[str, Family],
    match: Mapping[str, str],
    engines: tuple[str, ...],
    ts: float,
    version: str = "",
    worker_label: str = WORKER_LABEL,
) -> EngineSample:
    """Build the route's EngineSample from parsed families. Raises SourceError / NoData."""
    if not any(families.get(n) and families[n].samples for n in WANTED):
        raise SourceError(
            "no_spec_metrics", "no llama.cpp families in the exposition (is llama-server started with --metrics?)"
        )
    if engines and "0" not in engines:
        raise NoData(f'llama.cpp has one engine per server ("0"), not engines={list(engines)}')
    check_counter_types(families, COUNTER_FAMILIES)
    check_match_labels(families, match)
    selected = {name: fam.matching(match) for name, fam in families.items()}

    fields: dict[str, Any] = {}
    for name, field_name in COUNTERS.items():
        for sample in selected.get(name, ()):
            sum_into(fields, field_name, sample)
    for name, field_name in GAUGES.items():
        values = [gauge_value(s.value) for s in selected.get(name, ())]
        if values:
            fields[field_name] = values[-1]
    per_pos: dict[str, Any] = {}
    for sample in selected.get(PER_POSITION, ()):
        position = sample.labels.get("position")
        if position is not None:
            sum_into(per_pos, position, sample)
    if per_pos and not any(v is None for v in per_pos.values()):
        fields["accepted_per_pos"] = tuple(per_pos[p] for p in sorted(per_pos, key=label_sort_key))
    decodes: dict[str, Any] = {}
    for sample in selected.get(DECODES, ()):
        sum_into(decodes, "steps", sample)
    per_decode = [gauge_value(s.value) for s in selected.get(BUSY_SLOTS_PER_DECODE, ())]
    steps, slots = decodes.get("steps"), (per_decode[-1] if per_decode else None)
    if steps is not None and slots is not None and slots >= 0:
        fields.update(decode_steps=steps, decode_step_requests=slots * steps)

    # The spec counters are written whether or not a draft model is loaded; they say speculation is
    # configured only once they have counted something (or the per-position vector, sized by n_max, exists).
    # They are counters all the same: an all-zero sample is a sample (a fresh server, or one that restarted),
    # and read as one, so that a drop to 0 reaches the reset-safe counters.
    enabled = bool(fields.get("drafts") or fields.get("draft_tokens") or per_pos)
    counting = any(selected.get(name) for name in SPEC_FAMILIES)
    k = len(fields.get("accepted_per_pos", ())) or None
    return EngineSample(
        ts=ts,
        engine_kind="llamacpp",
        acceptance_source="counter" if counting else "none",
        model_name="",  # not on /metrics: the source reads it from /props (MODEL_ENDPOINT)
        engine_version=version,
        speculation_enabled=enabled,
        num_speculative_tokens=k if enabled else None,
        engines=(EngineCounters(engine="0", **fields),),
    )
