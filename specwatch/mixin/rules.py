"""Fleet recording rules: one series per route across every node that serves it.

specwatch judges each node alone; these rules let Prometheus (or a federated / long-term store above it) judge a
route served by many hosts as one. Names follow `level:metric:operations`. Ratios are ratios of summed rates,
never averages of per-node ratios, so a busy node weighs as much as its traffic.
"""

from __future__ import annotations

from typing import Any

from specwatch.mixin.settings import Settings

# Recorded series, by role; dashboards and tests refer to these instead of spelling names twice.
DRAFT_TOKENS_RATE = "route:specwatch_route_draft_tokens:rate{w}"
ACCEPTED_TOKENS_RATE = "route:specwatch_route_accepted_tokens:rate{w}"
DRAFTS_RATE = "route:specwatch_route_drafts:rate{w}"
ACCEPTANCE = "route:specwatch_route_accepted_tokens_per_draft_tokens:ratio_rate{w}"
MEAN_ACCEPTANCE_LENGTH = "route:specwatch_route_mean_acceptance_length:ratio_rate{w}"
ACCEPTANCE_DROP = "route:specwatch_route_acceptance_drop:ratio_rate{w}"
BASELINE = "route:specwatch_route_acceptance_baseline_ratio:avg"
BATCH_AVG = "route:specwatch_route_batch_size:avg"
BATCH_MAX = "route:specwatch_route_batch_size:max"
CROSSOVER_MIN = "route:specwatch_route_crossover_batch_size:min"
NODES_UP = "route:specwatch_route_up:sum"
NODES_DEGRADED = "route:specwatch_route_acceptance_degraded:sum"
NODES_ABOVE_CROSSOVER = "route:specwatch_route_above_crossover:sum"


def _rule(record: str, expr: str) -> dict[str, Any]:
    return {"record": record, "expr": expr}


def fleet_group(s: Settings) -> dict[str, Any]:
    sel = s.sel()
    # Rules of a group run in order: the baseline comes before the drop that divides by it.
    rules: list[dict[str, Any]] = [
        # Nodes of one route share model, engine version and k, so their pinned baselines agree; avg is exact.
        _rule(BASELINE, f"avg by (route) (specwatch_route_acceptance_baseline_ratio{sel})"),
    ]
    for w in s.fleet_windows:
        rules += [
            _rule(
                DRAFT_TOKENS_RATE.format(w=w), f"sum by (route) (rate(specwatch_route_draft_tokens_total{sel}[{w}]))"
            ),
            _rule(
                ACCEPTED_TOKENS_RATE.format(w=w),
                f"sum by (route) (rate(specwatch_route_accepted_tokens_total{sel}[{w}]))",
            ),
            _rule(DRAFTS_RATE.format(w=w), f"sum by (route) (rate(specwatch_route_drafts_total{sel}[{w}]))"),
            # Division by a zero rate gives NaN (no drafts); drop it so graphs and alerts see "no data".
            _rule(
                ACCEPTANCE.format(w=w), f"{ACCEPTED_TOKENS_RATE.format(w=w)} / ({DRAFT_TOKENS_RATE.format(w=w)} > 0)"
            ),
            _rule(
                MEAN_ACCEPTANCE_LENGTH.format(w=w),
                f"1 + {ACCEPTED_TOKENS_RATE.format(w=w)} / ({DRAFTS_RATE.format(w=w)} > 0)",
            ),
            _rule(ACCEPTANCE_DROP.format(w=w), f"1 - {ACCEPTANCE.format(w=w)} / {BASELINE}"),
        ]
    rules += [
        _rule(BATCH_AVG, f"avg by (route) (specwatch_route_batch_size{sel})"),
        _rule(BATCH_MAX, f"max by (route) (specwatch_route_batch_size{sel})"),
        _rule(CROSSOVER_MIN, f"min by (route) (specwatch_route_crossover_batch_size{sel})"),
        _rule(NODES_UP, f"sum by (route) (specwatch_route_up{sel})"),
        _rule(NODES_DEGRADED, f"sum by (route) (specwatch_route_acceptance_degraded{sel})"),
        _rule(NODES_ABOVE_CROSSOVER, f"sum by (route) (specwatch_route_above_crossover{sel})"),
    ]
    return {"name": "specwatch-fleet.rules", "rules": rules}


def recording_groups(s: Settings) -> list[dict[str, Any]]:
    return [fleet_group(s)]
