"""One probe request's own acceptance, read from the engine's response. The engines' contracts as data.

vLLM 0.32+ (`vllm serve --per-request-spec-decode-metrics summary`; vllm/config/observability.py
`per_request_spec_decode_metrics`, "none" by default): completions carry `metrics.speculative_decoding`
(vllm/entrypoints/generate/base/protocol.py `SpeculativeDecodingMetrics`, filled from
vllm/v1/metrics/stats.py `RequestSpecDecodeMetrics.to_dict`): `num_draft_tokens`,
`num_accepted_draft_tokens` (bonus token excluded), `num_spec_steps` (verify steps) and
`acceptance_histogram` (index j: verify steps that accepted exactly j drafts). Only for n == 1; on streaming
only in the final usage chunk (vllm/entrypoints/openai/completion/serving.py).

SGLang 0.5.23: native `/generate` puts `spec_verify_ct`, `spec_num_correct_drafts` (bonus excluded),
`spec_num_proposed_drafts` (= verify_ct x (speculative_num_draft_tokens - 1)), `spec_accept_rate`,
`spec_accept_length` and `spec_correct_drafts_histogram` in `meta_info`, only when the request verified at least
once (sglang/srt/managers/tokenizer_manager.py `_calculate_spec_decoding_metrics`). OpenAI endpoints return
the same numbers under `sglext.spec_tokens_details` when the request sets `return_spec_tokens_details: true`
(sglang/srt/entrypoints/openai/protocol.py `SpecTokensDetails`, `SglExt`; a list when n > 1).

llama.cpp (llama-server b11434): every completion answer, OpenAI-compatible or native, carries `timings`
(tools/server/server-task.cpp, `to_json_oaicompat` and `to_json_non_oaicompat`), which holds `draft_n` and
`draft_n_accepted` (bonus excluded) only when the request drafted at least one token (tools/server/
server-common.cpp, `result_timings::to_json`). The verify steps are counted (`n_draft_verif_steps`) but not
written there, so a probe read this way has no mean acceptance length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

# vLLM: response path and field names (0.32.0).
VLLM_METRICS_FIELD = "metrics"
VLLM_SPEC_FIELD = "speculative_decoding"
VLLM_FIELDS = {
    "drafted": "num_draft_tokens",
    "accepted": "num_accepted_draft_tokens",
    "steps": "num_spec_steps",
    "histogram": "acceptance_histogram",
}
VLLM_SERVER_FLAG = "--per-request-spec-decode-metrics summary"
# SGLang: meta_info / SpecTokensDetails field names (0.5.23).
SGLANG_FIELDS = {
    "drafted": "spec_num_proposed_drafts",
    "accepted": "spec_num_correct_drafts",
    "steps": "spec_verify_ct",
    "histogram": "spec_correct_drafts_histogram",
}
SGLANG_EXT_FIELD = "sglext"
SGLANG_SPEC_DETAILS = "spec_tokens_details"
SGLANG_REQUEST_FLAG = "return_spec_tokens_details"
# llama.cpp: `timings` field names (b11434).
LLAMACPP_TIMINGS_FIELD = "timings"
LLAMACPP_FIELDS = {"drafted": "draft_n", "accepted": "draft_n_accepted"}


class ResponseError(ValueError):
    """An engine answer that is not what its contract says (the message names the field)."""


@dataclass(frozen=True)
class Acceptance:
    """One request's speculative decoding: draft tokens verified, accepted (bonus excluded), verify steps."""

    drafted: float
    accepted: float
    steps: float
    histogram: tuple[int, ...] = ()

    @property
    def ratio(self) -> float | None:
        return self.accepted / self.drafted if self.drafted > 0 else None

    def per_position(self) -> tuple[float, ...]:
        """Steps whose draft token at position j was accepted, from the histogram (accepted j+1 or more)."""
        h = self.histogram
        return tuple(float(sum(h[j + 1 :])) for j in range(len(h) - 1))

    @property
    def mean_length(self) -> float | None:
        """Tokens per verify step including the bonus token."""
        return 1.0 + self.accepted / self.steps if self.steps > 0 else None


def _read(fields: Mapping[str, Any], names: Mapping[str, str], where: str) -> Acceptance:
    values = {}
    for key in ("drafted", "accepted", "steps"):
        raw = fields.get(names[key])
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw) or raw < 0:
            raise ResponseError(f"{where}.{names[key]}: not a count: {raw!r}")
        values[key] = float(raw)
    if values["accepted"] > values["drafted"]:
        raise ResponseError(
            f"{where}: {names['accepted']} {values['accepted']:g} > {names['drafted']} {values['drafted']:g}"
        )
    hist = fields.get(names["histogram"]) or []
    histogram = (
        tuple(int(x) for x in hist if isinstance(x, (int, float)) and not isinstance(x, bool))
        if isinstance(hist, list)
        else ()
    )
    return Acceptance(
        drafted=values["drafted"], accepted=values["accepted"], steps=values["steps"], histogram=histogram
    )


def vllm_completion(body: Mapping[str, Any]) -> Acceptance | None:
    """From a vLLM completion (or the final usage chunk of a stream); None when the server does not report it."""
    metrics = body.get(VLLM_METRICS_FIELD)
    spec = metrics.get(VLLM_SPEC_FIELD) if isinstance(metrics, dict) else None
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ResponseError(f"{VLLM_METRICS_FIELD}.{VLLM_SPEC_FIELD}: not an object")
    return _read(spec, VLLM_FIELDS, f"{VLLM_METRICS_FIELD}.{VLLM_SPEC_FIELD}")


def sglang_generate(body: Mapping[str, Any]) -> Acceptance | None:
    """From a native SGLang /generate answer; zero drafts when it finished without a verify step (the fields
    are left out then); None when `meta_info` carries no spec fields at all (speculation off)."""
    meta = body.get("meta_info")
    if not isinstance(meta, dict):
        raise ResponseError("meta_info: missing from the /generate answer")
    if SGLANG_FIELDS["steps"] not in meta:
        return None
    return _read(meta, SGLANG_FIELDS, "meta_info")


def sglang_openai(body: Mapping[str, Any]) -> Acceptance | None:
    """From an SGLang OpenAI completion sent with `return_spec_tokens_details: true` (n == 1)."""
    ext = body.get(SGLANG_EXT_FIELD)
    details = ext.get(SGLANG_SPEC_DETAILS) if isinstance(ext, dict) else None
    if isinstance(details, list):
        if len(details) != 1:
            raise ResponseError(f"{SGLANG_EXT_FIELD}.{SGLANG_SPEC_DETAILS}: {len(details)} entries, probes send n=1")
        details = details[0]
    if details is None:
        return None
    if not isinstance(details, dict):
        raise ResponseError(f"{SGLANG_EXT_FIELD}.{SGLANG_SPEC_DETAILS}: not an object")
    return _read(details, SGLANG_FIELDS, f"{SGLANG_EXT_FIELD}.{SGLANG_SPEC_DETAILS}")


def llamacpp_completion(body: Mapping[str, Any]) -> Acceptance | None:
    """From a llama-server completion's `timings`; None when it holds no draft counts (nothing drafted, or
    speculation off: the answer does not tell which). The verify steps are not reported: `steps` is 0."""
    timings = body.get(LLAMACPP_TIMINGS_FIELD)
    if not isinstance(timings, dict) or LLAMACPP_FIELDS["drafted"] not in timings:
        return None
    return _read({**timings, "steps": 0}, {**LLAMACPP_FIELDS, "steps": "steps", "histogram": ""}, "timings")


def completion_tokens(body: Mapping[str, Any]) -> int | None:
    """Generated tokens of an OpenAI answer (`usage`) or a /generate answer (`meta_info`)."""
    usage = body.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        return usage["completion_tokens"]
    meta = body.get("meta_info")
    if isinstance(meta, dict) and isinstance(meta.get("completion_tokens"), int):
        return meta["completion_tokens"]
    return None
