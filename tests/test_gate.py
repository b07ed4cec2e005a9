"""`specwatch gate`'s verdict (probe/gate.py) and its CI outputs, on hand-built rounds; the real-engine runs are in
test_real_gate.py."""

from __future__ import annotations

import math
import random

import pytest

from specwatch.cli import build_parser
from specwatch.commands.gate import _config, _junit
from specwatch.config import ConfigError
from specwatch.probe.gate import (
    MIN_PAIRED_PROMPTS,
    MIN_SWEEP_REQUESTS,
    SpeedupPoint,
    combined_exit,
    judge,
    judge_against_ratio,
    judge_speedup,
    speedup_interval,
    t_quantile,
)
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


# ------------------------------------------------------------------ the fleet's traffic baseline as the reference
def test_against_a_traffic_baseline_a_clear_drop_fails_with_its_whole_interval_beyond_the_threshold():
    ratios = spread(32, 0.45, 8)
    verdict = judge_against_ratio(prompts(ratios), 0.75, 0.15)
    assert verdict.verdict == "fail" and verdict.exit_code == 1, verdict.reason
    assert verdict.drop_low is not None and verdict.drop_low >= 0.15
    assert "traffic baseline 0.750" in verdict.reason


def test_against_a_traffic_baseline_the_same_acceptance_is_never_a_pass():
    ratios = spread(32, 0.6, 9)
    pooled = judge(prompts(ratios), prompts(ratios), 0.15).candidate_ratio
    verdict = judge_against_ratio(prompts(ratios), pooled, 0.15)
    assert verdict.verdict == "inconclusive" and verdict.exit_code == 2
    assert verdict.drop == pytest.approx(0.0) and verdict.drop_high < 0.15
    assert "cannot pass" in verdict.reason and "gate record" in verdict.reason


def test_against_a_traffic_baseline_a_drop_whose_interval_reaches_below_the_threshold_is_inconclusive():
    # a drop estimated at the threshold, but ten uneven prompts: the per-prompt rule's point estimate is not enough
    rng = random.Random(10)
    ratios = [min(0.95, 0.5 * rng.uniform(0.4, 1.6)) for _ in range(10)]
    pooled = judge(prompts(ratios), prompts(ratios), 0.15).candidate_ratio
    verdict = judge_against_ratio(prompts(ratios), pooled / 0.82, 0.15)
    assert verdict.drop >= 0.15 and verdict.drop_low < 0.15
    assert verdict.verdict == "inconclusive", verdict.reason


def test_against_a_traffic_baseline_thin_evidence_is_inconclusive():
    ratios = spread(32, 0.4, 11)
    few = dict(list(prompts(ratios).items())[: MIN_PAIRED_PROMPTS - 1])
    assert "prompts read" in judge_against_ratio(few, 0.9, 0.15).reason
    short = {pid: Acceptance(4, a.accepted / a.drafted * 4, 2) for pid, a in prompts(ratios).items()}
    assert judge_against_ratio(short, 0.9, 0.15).verdict == "inconclusive"


# ------------------------------------------------------------------ the throughput verdict
def point(concurrency: int, speedup: float | None, half: float | None = 0.05) -> SpeedupPoint:
    if speedup is None or half is None:
        return SpeedupPoint(concurrency, speedup)
    return SpeedupPoint(concurrency, speedup, speedup * (1 - half), speedup * (1 + half))


def test_the_speedup_verdict_is_read_at_the_lowest_concurrency_and_needs_its_whole_interval():
    assert judge_speedup([point(8, 0.7), point(1, 1.6)]).verdict == "pass"  # slower at 8: the crossover
    assert judge_speedup([point(1, 0.9), point(8, 0.6)]).verdict == "fail"
    assert judge_speedup([point(1, 1.02), point(8, 0.8)]).verdict == "inconclusive"  # 0.97x to 1.07x
    assert judge_speedup([point(1, 1.3), point(8, 1.1)], min_speedup=1.5).verdict == "fail"
    wide = judge_speedup([point(1, 1.6, half=0.5), point(8, 1.1)])
    assert wide.verdict == "inconclusive" and "too wide" in wide.reason
    few = judge_speedup([point(1, 1.6, half=None), point(8, 1.1)])
    assert few.verdict == "inconclusive" and f"fewer than {MIN_SWEEP_REQUESTS} requests" in few.reason
    assert judge_speedup([point(1, None), point(8, 1.1)]).verdict == "inconclusive"
    stopped = judge_speedup([], failure="plain server refused")
    assert stopped.verdict == "inconclusive" and "plain server refused" in stopped.reason


def test_the_speedup_interval_comes_from_both_servers_requests():
    # plain 20 ms a token, spec 10 ms, each with a 10% spread over 8 requests: 2x, about +-11% at 95%
    low, high = speedup_interval(2.0, (0.020, 0.002, 8), (0.010, 0.001, 8))
    assert low < 2.0 < high and high / low == pytest.approx(math.exp(2 * 2.145 * math.sqrt(2 * 0.01 / 8)), rel=0.01)
    assert speedup_interval(2.0, (0.020, 0.002, MIN_SWEEP_REQUESTS - 1), (0.010, 0.001, 8)) is None
    steadier = speedup_interval(2.0, (0.020, 0.002, 32), (0.010, 0.001, 32))
    assert steadier[1] - steadier[0] < high - low


def test_a_throughput_fail_changes_the_exit_code_only_when_required():
    assert judge_speedup([point(1, 0.8), point(8, 0.6)]).exit_code == 0
    assert judge_speedup([point(1, 0.8), point(8, 0.6)], required=True).exit_code == 1
    assert judge_speedup([point(1, 1.0), point(8, 0.6)], required=True).exit_code == 2
    assert combined_exit(0, 1) == 1 and combined_exit(2, 1) == 1 and combined_exit(0, 2) == 2
    assert combined_exit(0, 0) == 0 and combined_exit(1, 0) == 1


@pytest.mark.parametrize("required, expected", [(True, (1, 0)), (False, (0, 1))])
def test_the_junit_report_carries_the_throughput_verdict(tmp_path, required, expected):
    junitparser = pytest.importorskip("junitparser")
    ratios = spread(12, 0.6, 12)
    verdict = judge(prompts(ratios), prompts(ratios), 0.15)
    rnd = Round(1, 0.0, 3.5, "ok", method="vllm_response", prompts=())
    speedup = judge_speedup([point(1, 0.85), point(8, 0.7)], required=required)
    path = tmp_path / "gate.xml"
    _junit(verdict, rnd, BaselineKey("m", "0.32.0", 3), speedup).write(path, encoding="utf-8", xml_declaration=True)
    suite = next(iter(junitparser.JUnitXml.fromfile(str(path))))
    case = next(case for case in suite if case.name == "low-batch speedup")
    assert (suite.failures, suite.skipped) == expected
    kind = junitparser.Failure if required else junitparser.Skipped
    assert isinstance(case.result[0], kind) and "0.85x at 1" in case.result[0].message


def test_a_plain_url_with_credentials_is_refused_without_echoing_them(capsys):
    from specwatch.cli import main as cli_main

    argv = ["gate", "--url", "http://127.0.0.1:9", "--engine", "vllm", "--reference", "r.json"]
    assert cli_main([*argv, "--plain", "http://ops:s3cret@plain:8000"]) == 2
    err = capsys.readouterr().err
    assert "credentials in the URL are refused" in err and "s3cret" not in err


@pytest.mark.parametrize(("extra", "concurrency"), [((), 1), (("--concurrency", "8"), 8)])
def test_the_gate_sends_concurrency_prompts_at_a_time_one_by_default(extra, concurrency):
    argv = ["gate", "--url", "http://staging:8000", "--engine", "vllm", *extra, "record", "--out", "ref.json"]
    probe = _config(build_parser("gate").parse_args(argv)).routes[0].probe
    assert probe is not None and probe.concurrency == concurrency


def test_a_gate_concurrency_out_of_range_is_refused_with_the_limit():
    argv = ["gate", "--url", "http://staging:8000", "--engine", "vllm", "--concurrency", "0"]
    with pytest.raises(ConfigError, match="concurrency"):
        _config(build_parser("gate").parse_args(argv))
