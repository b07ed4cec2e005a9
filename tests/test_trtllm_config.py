"""TensorRT-LLM speculative_config snippets: the draft-length schedule in each key meaning, the acceptance gate."""

from __future__ import annotations

import pytest

from specwatch.integrations.trtllm import acceptance_gate, draft_len_schedules

RANGES = ((1, 4, 4), (5, 8, 2), (9, 32, 1), (33, 256, 0))


def test_the_upper_bound_meaning_lists_each_ranges_last_batch_and_leaves_zero_implicit():
    upper = draft_len_schedules(RANGES)["upper"]
    assert upper["speculative_config"] == {"max_draft_len": 4, "draft_len_schedule": {4: 4, 8: 2, 32: 1}}
    assert "PR #10860" in upper["source"] and "llm_args.py" in upper["source"]


def test_the_lower_bound_meaning_lists_each_ranges_first_batch_with_an_explicit_zero():
    lower = draft_len_schedules(RANGES)["lower"]
    assert lower["speculative_config"] == {"max_draft_len": 4, "draft_len_schedule": {1: 4, 5: 2, 9: 1, 33: 0}}
    assert "before" in lower["source"]


def test_the_smallest_key_maps_to_max_draft_len_as_both_meanings_require():
    for snippet in draft_len_schedules(((1, 10, 2), (11, 64, 1))).values():
        config = snippet["speculative_config"]
        schedule = config["draft_len_schedule"]
        assert schedule[min(schedule)] == config["max_draft_len"] == 2


def test_no_schedule_when_drafting_never_pays():
    assert draft_len_schedules(((1, 256, 0),)) == {}


def test_the_gate_sits_at_the_acceptance_length_of_specwatchs_page_threshold():
    gate = acceptance_gate(baseline_ratio=0.7, threshold_ratio=0.595, k=3)
    config = gate["speculative_config"]
    assert config["acceptance_length_threshold"] == pytest.approx(1 + 3 * 0.595)
    assert gate["baseline_acceptance_length"] == pytest.approx(3.1)
    # sqrt(3 x 0.7 x 0.3) = 0.794 over a gap of 0.315: (3 x 2.52)^2 = 57.2 -> 58 requests
    assert config["acceptance_window"] == 58


def test_a_narrow_gap_needs_a_longer_window_capped_at_its_maximum():
    assert acceptance_gate(0.7, 0.69, 3)["speculative_config"]["acceptance_window"] == 1000


def test_the_gate_refuses_a_threshold_at_or_above_the_baseline():
    with pytest.raises(ValueError):
        acceptance_gate(0.6, 0.6, 3)
