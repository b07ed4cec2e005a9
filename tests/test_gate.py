"""`specwatch gate`'s verdict (probe/gate.py) and its CI outputs, on hand-built rounds; the real-engine runs are in
test_real_gate.py."""

from __future__ import annotations

import random

import pytest

from specwatch.cli import build_parser
from specwatch.commands.gate import _config, _junit
from specwatch.config import ConfigError
from specwatch.probe.gate import MIN_PAIRED_PROMPTS, judge, t_quantile
from specwatch.probe.responses import Acceptance
from specwatch.probe.runner import PromptResult, Round
from specwatch.state.baselines import BaselineKey


def prompts(ratios: list[float], drafted: float = 120.0) -> dict[str, Acceptance]:
    return {f"p{i}": Acceptance(drafted, round(r * drafted), drafted / 3) for i, r in enumerate(ratios)}


def spread(n: int, mean: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [min(0.95, max(0.05, rng.gauss(mean, 0.12))) for _ in range(n)]


def test_the_same_drafter_passes_with_a_tight_interval():
    reference = prompts(spread(32, 0.6, 1))
    verdict = judge(reference, reference, 0.15)
    assert verdict.verdict == "pass" and verdict.exit_code == 0
    assert verdict.drop == pytest.approx(0.0) and verdict.drop_high is not None and verdict.drop_high < 0.15


def test_a_drafter_accepted_20_percent_less_fails_though_its_prompts_each_fall_differently():
    ratios = spread(32, 0.6, 2)
    rng = random.Random(3)
    candidate = prompts([r * rng.uniform(0.7, 0.9) for r in ratios])
    verdict = judge(candidate, prompts(ratios), 0.15)
    assert verdict.verdict == "fail" and verdict.exit_code == 1, verdict.reason
    assert 0.15 <= verdict.drop < 0.25 and verdict.drop_low > 0


def test_a_small_drop_passes_only_when_the_interval_is_below_the_threshold():
    ratios = spread(32, 0.6, 4)
    assert judge(prompts([r * 0.97 for r in ratios]), prompts(ratios), 0.15).verdict == "pass"
    rng = random.Random(6)  # a drop under the threshold, but ten prompts that move every which way: no pass
    noisy = prompts([min(0.95, r * rng.uniform(0.3, 1.5)) for r in ratios[:10]])
    verdict = judge(noisy, prompts(ratios[:10]), 0.15)
    assert verdict.verdict == "inconclusive" and "too wide" in verdict.reason


def test_too_few_prompts_or_tokens_is_inconclusive_never_a_pass():
    reference = prompts(spread(32, 0.6, 6))
    few = dict(list(reference.items())[: MIN_PAIRED_PROMPTS - 1])
    assert judge(few, reference, 0.15).verdict == "inconclusive"
    short = {pid: Acceptance(4, a.accepted / a.drafted * 4, 2) for pid, a in reference.items()}
    verdict = judge(short, reference, 0.15)
    assert verdict.verdict == "inconclusive" and "drafted 128 tokens" in verdict.reason
    assert judge({}, reference, 0.15).exit_code == 2


def test_students_t_matches_the_table():
    for dof, expected in ((5, 2.5706), (7, 2.3646), (31, 2.0395), (100, 1.9840)):
        assert t_quantile(0.975, dof) == pytest.approx(expected, abs=1e-3)


def test_the_junit_report_is_read_by_a_junit_consumer(tmp_path):
    junitparser = pytest.importorskip("junitparser")
    ratios = spread(12, 0.6, 7)
    candidate = prompts([r * 0.78 for r in ratios])
    verdict = judge(candidate, prompts(ratios), 0.15)
    results = tuple(PromptResult(pid, "chat", a) for pid, a in candidate.items()) + (
        PromptResult("broken", "chat", None, error="HTTP 500"),
    )
    rnd = Round(1, 0.0, 3.5, "ok", method="vllm_response", prompts=results)
    path = tmp_path / "gate.xml"
    _junit(verdict, rnd, BaselineKey("m", "0.32.0", 3)).write(path, encoding="utf-8", xml_declaration=True)
    xml = junitparser.JUnitXml.fromfile(str(path))
    suite = next(iter(xml))
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (14, 1, 1, 0)
    verdict_case = next(case for case in suite if case.name == "acceptance drop")
    assert isinstance(verdict_case.result[0], junitparser.Failure) and "threshold" in verdict_case.result[0].message


@pytest.mark.parametrize(("extra", "concurrency"), [((), 1), (("--concurrency", "8"), 8)])
def test_the_gate_sends_concurrency_prompts_at_a_time_one_by_default(extra, concurrency):
    argv = ["gate", "--url", "http://staging:8000", "--engine", "vllm", *extra, "record", "--out", "ref.json"]
    probe = _config(build_parser("gate").parse_args(argv)).routes[0].probe
    assert probe is not None and probe.concurrency == concurrency


def test_a_gate_concurrency_out_of_range_is_refused_with_the_limit():
    argv = ["gate", "--url", "http://staging:8000", "--engine", "vllm", "--concurrency", "0"]
    with pytest.raises(ConfigError, match="concurrency"):
        _config(build_parser("gate").parse_args(argv))
