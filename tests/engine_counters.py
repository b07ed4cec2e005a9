"""vLLM's spec-decode counters and queue gauges, read from its exposition with prometheus_client's parser: the
tests' own reading, independent of specwatch's parser, that specwatch's figures and the successor design are
held to. Every series of a name is summed (vLLM labels them per engine and model)."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from testbed import successor

SUMMED = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
)
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def engine_values(body: str) -> dict[str, Any]:
    """drafts, draft_tokens, accepted, per_pos (accepted per draft position), running, waiting."""
    sums: dict[str, float] = {}
    positions: dict[int, float] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == PER_POSITION:
                position = int(sample.labels["position"])
                positions[position] = positions.get(position, 0.0) + sample.value
            elif sample.name in SUMMED:
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return {
        "drafts": sums["vllm:spec_decode_num_drafts_total"],
        "draft_tokens": sums["vllm:spec_decode_num_draft_tokens_total"],
        "accepted": sums["vllm:spec_decode_num_accepted_tokens_total"],
        "per_pos": tuple(positions[p] for p in sorted(positions)),
        "running": sums["vllm:num_requests_running"],
        "waiting": sums["vllm:num_requests_waiting"],
    }


def spec_counts(body: str) -> successor.Counts:
    """The spec-decode counters as the successor design predicts them (drafts, draft tokens, accepted)."""
    values = engine_values(body)
    return successor.Counts(int(values["drafts"]), int(values["draft_tokens"]), int(values["accepted"]))
