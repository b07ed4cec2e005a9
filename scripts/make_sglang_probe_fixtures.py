#!/usr/bin/env python3
"""Write tests/fixtures/sglang/responses/probe_*.json: SGLang 0.5.23 per-request spec answers, built with SGLang's code.

Run with SGLang's unpacked wheel and pydantic, openai and msgspec installed (not specwatch's dependencies,
so not in its venv):

    pip download --no-deps sglang==0.5.23 -d /tmp/w && unzip -q /tmp/w/sglang-0.5.23-*.whl -d /tmp/sgl
    python -m venv /tmp/v && /tmp/v/bin/pip install pydantic openai msgspec
    /tmp/v/bin/python scripts/make_sglang_probe_fixtures.py /tmp/sgl

sglang/srt/entrypoints/openai/protocol.py is loaded on its own (its one sglang import, the
`convert_json_schema_to_str` helper, which these classes never call, is stood in for), so the OpenAI answer
is serialised by SGLang's own `CompletionResponse`/`SglExt`/`SpecTokensDetails` models. `meta_info`'s spec
fields follow sglang/srt/managers/tokenizer_manager.py `_calculate_spec_decoding_metrics` line by line
(it needs a running scheduler), from one request's scheduler counters given below.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "sglang" / "responses"

# One request's scheduler-side counters (batch_result_processor.py): 50 verify steps with 3 drafts each
# (speculative_num_draft_tokens 4), correct drafts per step as a histogram over 0..3.
NUM_DRAFT_TOKENS = 4
HISTOGRAM = [9, 12, 14, 15]
VERIFY_CT = sum(HISTOGRAM)
CORRECT = sum(j * n for j, n in enumerate(HISTOGRAM))
COMPLETION_TOKENS = CORRECT + VERIFY_CT  # every verify step emits its correct drafts plus the bonus token


def meta_info() -> dict:
    """tokenizer_manager.py 0.5.23: the base meta_info of a finished request and `_calculate_spec_decoding_metrics`."""
    meta = {
        "id": "2f0c5d7e0d8b4a3c9b1e6f4a5d3c2b1a",
        "finish_reason": {"type": "length", "length": COMPLETION_TOKENS},
        "prompt_tokens": 41,
        "weight_version": "default",
        "num_retractions": 0,
        "completion_tokens": COMPLETION_TOKENS,
        "cached_tokens": 0,
    }
    num_proposed_drafts = VERIFY_CT * (NUM_DRAFT_TOKENS - 1)
    meta["spec_accept_rate"] = CORRECT / num_proposed_drafts
    meta["spec_accept_length"] = COMPLETION_TOKENS / VERIFY_CT
    meta["spec_num_correct_drafts"] = CORRECT
    meta["spec_num_proposed_drafts"] = num_proposed_drafts
    meta["spec_verify_ct"] = VERIFY_CT
    meta["spec_correct_drafts_histogram"] = HISTOGRAM
    return meta


def load_protocol(wheel_dir: Path) -> types.ModuleType:
    """protocol.py alone: importing the sglang package would pull in torch and the rest of the runtime."""
    utils = types.ModuleType("sglang.utils")
    utils.convert_json_schema_to_str = lambda schema: json.dumps(schema)  # not called by the classes used
    sys.modules["sglang"] = types.ModuleType("sglang")
    sys.modules["sglang.utils"] = utils
    path = wheel_dir / "sglang" / "srt" / "entrypoints" / "openai" / "protocol.py"
    spec = importlib.util.spec_from_file_location("sglang_openai_protocol", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = load_protocol(Path(sys.argv[1]))
    meta = meta_info()
    generate = {
        "text": " Here is the function you asked for.",
        "output_ids": list(range(COMPLETION_TOKENS)),
        "meta_info": meta,
    }
    # serving_completions.py 0.5.23: spec_tokens_details_from_meta_info (entrypoints/openai/utils.py) copies
    # these keys from meta_info into SpecTokensDetails; the response-level sglext carries it for n == 1.
    keys = (
        "spec_accept_rate",
        "spec_accept_length",
        "spec_num_correct_drafts",
        "spec_num_proposed_drafts",
        "spec_verify_ct",
        "spec_correct_drafts_histogram",
    )
    details = p.SpecTokensDetails(**{k: meta[k] for k in keys})
    response = p.CompletionResponse(
        id="cmpl-3c1f",
        created=1764640000,
        model="meta-llama/Llama-3.1-8B-Instruct",
        choices=[p.CompletionResponseChoice(index=0, text=generate["text"], finish_reason="length")],
        usage=p.UsageInfo(prompt_tokens=41, completion_tokens=COMPLETION_TOKENS, total_tokens=41 + COMPLETION_TOKENS),
        sglext=p.SglExt(spec_tokens_details=details),
    )
    header = {
        "_provenance": "SGLang 0.5.23 (pip wheel sglang-0.5.23-cp311); made by "
        "scripts/make_sglang_probe_fixtures.py; see its docstring"
    }
    (OUT / "probe_generate_0.5.23.json").write_text(json.dumps({**header, **generate}, indent=1) + "\n")
    (OUT / "probe_openai_sglext_0.5.23.json").write_text(
        json.dumps({**header, **response.model_dump()}, indent=1) + "\n"
    )
    print(f"wrote {OUT}/probe_generate_0.5.23.json and probe_openai_sglext_0.5.23.json")


if __name__ == "__main__":
    main()
