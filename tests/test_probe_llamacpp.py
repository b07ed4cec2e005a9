"""A canary probe reads one llama-server answer's own acceptance from its `timings` (b11434's field names)."""

from __future__ import annotations

import pytest

from specwatch.probe.responses import ResponseError, llamacpp_completion

# The shape of a b11434 /v1/completions answer (tools/server/server-task.cpp to_json_oaicompat, timings from
# tools/server/server-common.cpp result_timings::to_json), trimmed.
ANSWER = {
    "choices": [{"text": "x", "index": 0, "finish_reason": "length"}],
    "usage": {"completion_tokens": 16, "prompt_tokens": 4, "total_tokens": 20},
    "timings": {"prompt_n": 4, "predicted_n": 16, "draft_n": 20, "draft_n_accepted": 11},
}


def test_the_draft_counts_of_timings_are_the_requests_acceptance():
    acceptance = llamacpp_completion(ANSWER)
    assert acceptance is not None
    assert (acceptance.drafted, acceptance.accepted, acceptance.ratio) == (20, 11, 0.55)
    assert acceptance.mean_length is None, "llama-server does not report verify steps per request"


def test_an_answer_without_draft_counts_has_no_acceptance():
    assert llamacpp_completion({"timings": {"prompt_n": 4, "predicted_n": 16}}) is None
    assert llamacpp_completion({"choices": []}) is None


def test_more_accepted_than_drafted_is_refused():
    with pytest.raises(ResponseError):
        llamacpp_completion({"timings": {"draft_n": 3, "draft_n_accepted": 4}})
