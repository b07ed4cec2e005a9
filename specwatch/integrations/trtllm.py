"""TensorRT-LLM speculative-config snippets from specwatch's recommendation and a route's pinned baseline.

Keys come from `DecodingBaseConfig` in NVIDIA/TensorRT-LLM `tensorrt_llm/llmapi/llm_args.py` (the
`speculative_config` of the LLM API and of `trtllm-serve --extra_llm_api_options`). `draft_len_schedule`
changed meaning with TensorRT-LLM PR #10860 ("Dynamic draft length on spec decode one-model path", merged
2026-03-13), so a schedule is written in both meanings, each tagged with the source it matches:

- `upper` (PR #10860 on): keys are inclusive upper batch bounds, batches past the last key draft 0, the
  smallest key must map to `max_draft_len`; `{4: 4, 8: 2, 32: 1}` drafts 4 up to batch 4, 2 up to 8, 1 up
  to 32, none beyond.
- `lower` (before it): keys are lower batch bounds, `{1: max_draft_len}` is required and 0 disables;
  `{1: 4, 4: 2, 8: 0}` drafts 4 from batch 1, 2 from 4, none from 8.

`acceptance_window` / `acceptance_length_threshold` (PyTorch backend, both meanings): speculation is turned
off for good once the mean acceptance length over the last N completed requests falls below the threshold.
The suggestion puts the threshold at the acceptance length of specwatch's own page threshold, baseline x
(1 - drop), so the engine gives up no earlier than specwatch would page.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

PR_10860 = "NVIDIA/TensorRT-LLM PR #10860 (merged 2026-03-13)"
LLM_ARGS = "tensorrt_llm/llmapi/llm_args.py, DecodingBaseConfig"
SOURCES = {
    "upper": f"{LLM_ARGS}: TensorRT-LLM main from {PR_10860}",
    "lower": f"{LLM_ARGS}: TensorRT-LLM before {PR_10860}",
}
MIN_WINDOW, MAX_WINDOW = 16, 1000
WINDOW_Z = 3.0  # standard errors between the baseline and the threshold before the window trusts its mean


def draft_len_schedules(ranges: Sequence[tuple[int, int, int]]) -> dict[str, dict[str, Any]]:
    """`[(start_batch, end_batch, k), ...]` (k non-increasing, as `crossover.recommend` gives) -> a
    `speculative_config` fragment per key meaning, or {} when drafting never pays (k = 0 from batch 1).
    In the `upper` meaning batches past the schedule's last batch draft 0, so a schedule that drafts up to
    `--max-batch` stops drafting beyond it."""
    if not ranges or ranges[0][2] == 0:
        return {}
    k_max = ranges[0][2]
    upper = {end: k for _, end, k in ranges if k > 0}
    lower = {start: k for start, _, k in ranges}
    return {
        "upper": {
            "source": SOURCES["upper"],
            "speculative_config": {"max_draft_len": k_max, "draft_len_schedule": upper},
        },
        "lower": {
            "source": SOURCES["lower"],
            "speculative_config": {"max_draft_len": k_max, "draft_len_schedule": lower},
        },
    }


def acceptance_gate(baseline_ratio: float, threshold_ratio: float, k: int) -> dict[str, Any]:
    """`acceptance_length_threshold` and `acceptance_window` from a pinned baseline (accepted / draft tokens)
    and the page threshold (baseline x (1 - drop)) at draft length k.

    Acceptance length = 1 + k x ratio (the bonus token plus the accepted drafts). The window is the number of
    requests whose mean separates the baseline from the threshold by WINDOW_Z standard errors, taking one
    verify step's spread, sqrt(k r (1 - r)), as a request's (an upper bound: a request averages many steps)."""
    if k < 1 or not 0 < threshold_ratio < baseline_ratio <= 1:
        raise ValueError("need 0 < threshold < baseline <= 1 and k >= 1")
    threshold_length = 1.0 + k * threshold_ratio
    gap = k * (baseline_ratio - threshold_ratio)
    spread = math.sqrt(k * baseline_ratio * (1.0 - baseline_ratio))
    window = math.ceil((WINDOW_Z * spread / gap) ** 2) if spread > 0 else MIN_WINDOW
    return {
        "source": f"{LLM_ARGS}: acceptance_window, acceptance_length_threshold (PyTorch backend)",
        "speculative_config": {
            "acceptance_window": min(MAX_WINDOW, max(MIN_WINDOW, window)),
            "acceptance_length_threshold": round(threshold_length, 3),
        },
        "baseline_acceptance_length": round(1.0 + k * baseline_ratio, 3),
    }
