"""The series budget: what one fully configured route costs every fleet on /metrics (docs/metrics-budget.md).

A route with every feature on (counters, per-position acceptance, a baseline with its detector, a crossover
source with live calibration, canary probes, two GPUs) is built with every RouteState field set, its reason
counters holding every key the daemon starts them with, and rendered through the real collector.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from specwatch import catalog
from specwatch.evaluators.canary import ROUND_RESULTS
from specwatch.evaluators.fleet_seed import SEED_ERROR_REASONS
from specwatch.evaluators.registry import EVALUATOR_FACTORIES
from specwatch.export.prometheus import render_text
from specwatch.snapshot import WINDOWS, RouteState, Snapshot
from specwatch.sources.base import ERROR_REASONS
from specwatch.tracking.counters import REJECT_REASONS

BUDGET = 60  # per-route series of a fully configured route in steady state
K = 5  # draft length: one per-position series each
BUDGET_DOC = Path(__file__).parent.parent / "docs" / "metrics-budget.md"
# RouteState fields a healthy, fully configured route leaves at their default, and why.
LEFT_AT_DEFAULT = {
    "error_reason": "set only while the route is down",
    "error_message": "set only while the route is down",
    "draft_length_basis": "set only for engines that count no draft tokens (SGLang); a vLLM route counts them",
}


def evaluator_names() -> list[str]:
    names = [f.__module__.rsplit(".", 1)[-1] for f in EVALUATOR_FACTORIES]
    return names


def fully_configured(name: str = "chat") -> RouteState:
    return RouteState(
        name=name,
        up=True,
        engine_kind="vllm",
        model_name="meta-llama/Llama-3.1-8B-Instruct",
        engine_version="0.33.0",
        drafter="eagle3:yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        acceptance_source="counter",
        drafts_total=1e5,
        draft_tokens_total=5e5,
        accepted_tokens_total=3e5,
        # The daemon starts these with every key at 0 (daemon.py, tracking/routes.py, evaluators/canary.py).
        rejected_samples_total=dict.fromkeys(REJECT_REASONS, 0.0),
        acceptance_ratio=dict.fromkeys(WINDOWS, 0.6),
        mean_acceptance_length=dict.fromkeys(WINDOWS, 4.0),
        position_acceptance_ratio=tuple(0.9 - 0.1 * i for i in range(K)),
        position_acceptance_comparable=True,
        draft_length=float(K),
        speculation_active=True,
        running_requests=24.0,
        waiting_requests=1.0,
        kv_usage_ratio=0.4,
        scrape_duration_seconds=0.01,
        engines=2,
        last_scrape_timestamp=1.7e9,
        errors_total=dict.fromkeys(ERROR_REASONS, 0.0),
        evaluator_errors_total=dict.fromkeys(evaluator_names(), 0.0),
        gpus=(0, 1),
        baseline_ratio=0.65,
        baseline_model="meta-llama/Llama-3.1-8B-Instruct",
        baseline_engine_version="0.33.0",
        baseline_draft_length=K,
        baseline_drafter="eagle3:yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        baseline_source="learned",
        baseline_overdispersion=20.0,
        acceptance_threshold_ratio=0.55,
        drop_ratio=0.07,
        degraded=False,
        cusum_statistic=1.0,
        traffic_horizon_seconds=600.0,
        probe_horizon_seconds=1800.0,
        horizon_budget_seconds=3600.0,
        model_changes_total=1.0,
        last_model_change_timestamp=1.6e9,
        crossover_batch_size=32.0,
        crossover_source="estimate",
        crossover_lower=28.0,
        crossover_upper=36.0,
        batch_size=12.0,
        above_crossover=False,
        predicted_speedup_ratio=1.4,
        compute_bound=False,
        speculation_gpu_seconds_lost_total=10.0,
        speculation_gpu_seconds_saved_total=900.0,
        live_crossover_batch_size=30.0,
        live_crossover_lower=27.0,
        live_crossover_upper=33.0,
        live_crossover_bins=6,
        live_crossover_attention_kernel="packed",
        crossover_flag_source="live",
        crossover_attention_kernel="packed",
        crossover_kv_capacity_batch=240.0,
        crossover_beyond_capacity=False,
        crossover_flag_batch_size=30.0,
        live_crossover_settled=True,
        probe_acceptance_ratio=0.6,
        probe_baseline_ratio=0.62,
        probe_degraded=False,
        probe_success=True,
        probe_duration_seconds=8.0,
        probe_rounds_total={**dict.fromkeys(ROUND_RESULTS, 0.0), "ok": 12.0},
        seed_errors_total=dict.fromkeys(SEED_ERROR_REASONS, 0.0),
        probe_method="vllm_response",
    )


def route_series(route: RouteState) -> list[str]:
    """Every sample of /metrics that carries the route's label, as `name{labels}`."""
    text = render_text(Snapshot(timestamp=1.7e9, routes=(route,), nvml_up=True)).decode()
    return [
        f"{s.name}{sorted(s.labels.items())}"
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("route") == route.name
    ]


def test_the_fully_configured_route_sets_every_field():
    route = fully_configured()
    for field in dataclasses.fields(RouteState):
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        if field.name not in LEFT_AT_DEFAULT:
            assert getattr(route, field.name) != default, f"{field.name} is left at its default: set it"


def test_a_fully_configured_route_stays_within_the_series_budget():
    series = route_series(fully_configured())
    assert len(series) <= BUDGET, f"{len(series)} series per route, budget {BUDGET}:\n" + "\n".join(series)


def test_every_per_route_metric_is_in_the_budget_table():
    """docs/metrics-budget.md names each per-route metric with what reads it; a new one must be justified there."""
    documented = set(re.findall(r"^\| `(specwatch_\w+)", BUDGET_DOC.read_text(), re.M))
    per_route = {m.name for m in catalog.METRICS if "route" in m.labels}
    assert per_route - documented == set(), "add these to docs/metrics-budget.md"
    assert documented - per_route == set(), "docs/metrics-budget.md lists metrics no longer exported per route"
