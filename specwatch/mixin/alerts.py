"""Alerting rules: what pages, what opens a ticket, and what tells you specwatch itself is blind.

Each alert belongs to a class (drop, model_change, canary, crossover, source, self, gpu, watch) whose severity
is a setting: `critical`
pages, `warning` opens a ticket. Every class is `warning` by default: an acceptance drop costs throughput, it
is not an outage, and a site that wants it to page says so (`specwatch generate --severity.drop=critical`).
Each alert has a static `summary`, a templated `description`, a `runbook_url` pointing at its own anchor in
docs/runbook.md and, where a Grafana address is set, a `dashboard_url` to its dashboard with the alert's node
and route selected, all added by one transform (`_with_links`) so no alert can lack them. A site's own labels
(`Settings.alert_labels`: team, env) are on every alert.
"""

from __future__ import annotations

from typing import Any

from specwatch.mixin.settings import Settings, prom_duration

# Alertmanager example: `critical` goes to the page receiver, anything else to the ticket receiver.
PAGE = "critical"
TICKET = "warning"


def _lookup(s: Settings, query: str, render: str, fallback: str) -> str:
    """A description fragment that runs `query` at notification time for the alert's own node and route.

    `query` holds `SEL` where the matchers of the alert's node and route go; `render` is the template pipeline
    applied to the first result (e.g. `value | humanizePercentage`); `fallback` is shown when nothing matches.
    """
    labels = (*s.node_labels, "route")
    matchers = ",".join(f"{label}=%q" for label in labels)
    go_string = query.replace('"', '\\"').replace("SEL", matchers)
    args = " ".join(f"$labels.{label}" for label in labels)
    return (
        f'{{{{ with printf "{go_string}" {args} | query }}}}'
        f"{{{{ . | first | {render} }}}}{{{{ else }}}}{fallback}{{{{ end }}}}"
    )


# The class of every alert, whose setting (`Settings.severity_<class>`) gives its severity.
CLASS_OF: dict[str, str] = {
    "SpecwatchAcceptanceDegraded": "drop",
    "SpecwatchAcceptanceDegradedAfterModelChange": "model_change",
    "SpecwatchCanaryAcceptanceDropped": "canary",
    "SpecwatchRouteAboveCrossover": "crossover",
    "SpecwatchSpeculationInactive": "crossover",
    "SpecwatchSourceDown": "source",
    "SpecwatchTargetDown": "self",
    "SpecwatchStale": "self",
    "SpecwatchStateStoreErrors": "self",
    "SpecwatchInternalErrors": "self",
    "SpecwatchConfigReloadFailed": "self",
    "SpecwatchGpuLost": "gpu",
    "SpecwatchGpuThrottling": "gpu",
    "SpecwatchRouteUnderWatched": "watch",
}


# Alerts a failed scrape of specwatch leaves as they are: TargetDown reads `up`, which every scrape writes, and
# the error alerts read `increase()` over a window, which skips the stale markers. Every other alert reads
# specwatch's gauges, which one failed scrape marks stale, so they get `keep_firing_for:`.
SURVIVES_A_FAILED_SCRAPE = frozenset({"SpecwatchTargetDown", "SpecwatchStateStoreErrors", "SpecwatchInternalErrors"})


def _alert(s: Settings, name: str, expr: str, for_: str, summary: str, description: str) -> dict[str, Any]:
    keep = {"keep_firing_for": s.keep_firing_for} if s.keeps_firing and name not in SURVIVES_A_FAILED_SCRAPE else {}
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        **keep,
        "labels": {"severity": s.severity(CLASS_OF[name]), **dict(s.alert_labels)},
        "annotations": {"summary": summary, "description": description},
    }


def runbook_anchor(alert_name: str) -> str:
    """The GitHub-style anchor of the runbook heading `## <AlertName>`."""
    return alert_name.lower()


# The dashboard a self alert links to (a slug of mixin/dashboards/); route alerts link to the route dashboard.
def _self_dashboard(alert_name: str) -> str:
    return "gpus" if alert_name.startswith("SpecwatchGpu") else "fleet"


def dashboard_link(s: Settings, slug: str, with_route: bool) -> str:
    """Grafana's URL of dashboard `slug` with the alert's job, instance (and route) selected."""
    labels = ["job", "instance", *(["route"] if with_route else [])]
    query = "&".join(f"var-{label}={{{{ $labels.{label} | urlquery }}}}" for label in labels)
    return f"{s.dashboard_url.rstrip('/')}/d/{s.dashboard_uid_prefix}-{slug}?{query}"


def _with_links(s: Settings, alert: dict[str, Any], slug: str, with_route: bool) -> dict[str, Any]:
    annotations = {**alert["annotations"], "runbook_url": f"{s.runbook_url}#{runbook_anchor(alert['alert'])}"}
    if s.dashboard_url:
        annotations["dashboard_url"] = dashboard_link(s, slug, with_route)
    return {**alert, "annotations": annotations}


def route_alerts(s: Settings) -> list[dict[str, Any]]:
    """Alerts about one route on one node; Alertmanager inhibits these while specwatch on that node is blind."""
    sel = s.sel()
    recent_change = (
        f"(time() - specwatch_route_last_model_change_timestamp_seconds{sel} < {s.model_change_window_seconds:g})"
    )
    change_window = prom_duration(s.model_change_window_seconds)
    drop = _lookup(s, "specwatch_route_acceptance_drop_ratio{SEL}", "value | humanizePercentage", "an unknown share")
    baseline = _lookup(s, "specwatch_route_acceptance_baseline_ratio{SEL}", 'value | printf "%.2f"', "unknown")
    current = _lookup(s, 'specwatch_route_acceptance_ratio{window="5m",SEL}', 'value | printf "%.2f"', "unknown")
    return [
        _alert(
            s,
            "SpecwatchAcceptanceDegraded",
            f"specwatch_route_acceptance_degraded{sel} == 1\nunless on({s.on_route})\n  {recent_change}\n",
            s.acceptance_degraded_for,
            "Speculative-decoding draft acceptance dropped below the route's baseline.",
            f"Draft acceptance on route {{{{ $labels.route }}}} ({{{{ $labels.instance }}}}) is {drop} below its "
            f"pinned baseline (now {current} vs {baseline}) with no model change in the last {change_window}. "
            "Speculation buys less per step: throughput and latency are worse than planned.",
        ),
        _alert(
            s,
            "SpecwatchAcceptanceDegradedAfterModelChange",
            f"(\n  specwatch_route_acceptance_degraded{sel} == 1\n"
            f"  and on({s.on_route})\n  {recent_change}\n)\n"
            f"* on({s.on_route}) group_left(model_name, engine_version)\n  specwatch_route_info{sel}\n",
            s.acceptance_degraded_for,
            "Draft acceptance dropped after a model, engine or draft-length change.",
            "Route {{ $labels.route }} ({{ $labels.instance }}) now serves model {{ $labels.model_name }} on "
            "engine {{ $labels.engine_version }}, changed "
            + _lookup(
                s,
                "time() - specwatch_route_last_model_change_timestamp_seconds{SEL}",
                "value | humanizeDuration",
                "recently",
            )
            + f" ago, and its draft acceptance is {drop} below the previous baseline (now {current} vs "
            f"{baseline}). Roll back, or if the new acceptance is expected, accept it as the new baseline.",
        ),
        _alert(
            s,
            "SpecwatchCanaryAcceptanceDropped",
            f"(specwatch_route_probe_degraded{sel} == 1)\n"
            f"* on({s.on_route}) group_left(model_name, engine_version)\n  specwatch_route_info{sel}\n",
            s.canary_dropped_for,
            "Canary probes accept fewer draft tokens than the route's fingerprint.",
            "Two canary rounds in a row on route {{ $labels.route }} ({{ $labels.instance }}, model "
            "{{ $labels.model_name }}, engine {{ $labels.engine_version }}) accepted "
            + _lookup(s, "specwatch_route_probe_acceptance_ratio{SEL}", 'value | printf "%.2f"', "unknown")
            + " of their draft tokens against the fingerprint's "
            + _lookup(s, "specwatch_route_probe_baseline_ratio{SEL}", 'value | printf "%.2f"', "unknown")
            + ", prompt by prompt on the same greedy prompts: the drafter or the target changed behaviour, "
            "whatever the route's traffic. Roll back, or if the change is intended, `specwatch probe "
            "{{ $labels.route }} --adopt`.",
        ),
        _alert(
            s,
            "SpecwatchRouteAboveCrossover",
            f"specwatch_route_above_crossover{sel} == 1",
            s.above_crossover_for,
            "The route's batch runs above its speculative-decoding crossover.",
            "Route {{ $labels.route }} ({{ $labels.instance }}) runs at batch "
            + _lookup(s, "specwatch_route_batch_size{SEL}", 'value | printf "%.0f"', "unknown")
            + " per engine, above its crossover of "
            + _lookup(s, 'specwatch_route_crossover_batch_size{SEL,source!="live"}', 'value | printf "%.0f"', "unknown")
            + ": speculation now costs throughput (predicted spec/plain "
            + _lookup(s, "specwatch_route_predicted_speedup_ratio{SEL}", 'value | printf "%.2f"', "unknown")
            + "). Use a batch-size schedule that drafts less at high batch.",
        ),
        _alert(
            s,
            "SpecwatchSpeculationInactive",
            f"specwatch_route_speculation_active{sel} == 0",
            s.speculation_inactive_for,
            "A route generates tokens without speculative decoding although it is configured.",
            "Route {{ $labels.route }} ({{ $labels.instance }}) has generated tokens for "
            f"{s.speculation_inactive_for} without proposing a single draft token, while its engine has "
            "speculation configured: a batch-size schedule at K=0, adaptive speculation at step 0, or the "
            "engine's own acceptance gate switched the drafter off. Every request now pays full decode cost.",
        ),
        _alert(
            s,
            "SpecwatchRouteUnderWatched",
            # Over budget by traffic, no probe that pages within the budget, and speculation not known to be off.
            f'specwatch_route_detection_horizon_seconds{{path="traffic",{s.selector}}}\n'
            f"  > on({s.on_route}) specwatch_route_detection_horizon_budget_seconds{sel}\n"
            f"unless on({s.on_route}) (\n"
            f'  specwatch_route_detection_horizon_seconds{{path="probe",{s.selector}}}\n'
            f"    <= on({s.on_route}) specwatch_route_detection_horizon_budget_seconds{sel}\n"
            ")\n"
            f"unless on({s.on_route}) specwatch_route_speculation_active{sel} == 0\n",
            s.under_watched_for,
            "A 20% acceptance drop on this route would page later than its detection budget, and no probe covers it.",
            "At its traffic of the last hour, route {{ $labels.route }} ({{ $labels.instance }}) would take about "
            "{{ $value | humanizeDuration }} to page a 20% draft-acceptance drop, more than its budget of "
            + _lookup(s, "specwatch_route_detection_horizon_budget_seconds{SEL}", "value | humanizeDuration", "1h")
            + ", and it has no canary probe that pages sooner. Add `probe:` to the route (the runbook gives the "
            "config and its GPU cost), or accept the longer horizon with a larger detection.horizon_budget.",
        ),
        _alert(
            s,
            "SpecwatchSourceDown",
            f"specwatch_route_up{sel} == 0",
            s.source_down_for,
            "specwatch cannot scrape a route's engine endpoint.",
            "specwatch on {{ $labels.instance }} has failed to scrape route {{ $labels.route }} for "
            f"{s.source_down_for} (last error reason: "
            + _lookup(s, "topk(1, increase(specwatch_source_errors_total{SEL}[15m]))", 'label "reason"', "unknown")
            + "). Acceptance and crossover of this route are not being evaluated.",
        ),
    ]


def self_alerts(s: Settings) -> list[dict[str, Any]]:
    """Alerts about specwatch itself and the GPUs it reads; these inhibit route alerts of the same node."""
    sel = s.sel()
    stale_after = s.stale_intervals * s.evaluation_interval_seconds
    # PromQL has no bitwise AND: bit b of the mask is set when floor(mask / b) is odd.
    mask = f"specwatch_gpu_clock_throttle_reasons{sel}"
    throttle_bits = "\n  or ".join(f"floor({mask} / {bit}) % 2 == 1" for _, bit in s.gpu_throttle_bits)
    throttle_names = ", ".join(f"{name} (0x{bit:x})" for name, bit in s.gpu_throttle_bits)
    return [
        _alert(
            s,
            "SpecwatchTargetDown",
            # Only targets that were specwatch: `up` of another exporter sharing the job has no build_info.
            f"up{sel} == 0\nand on({', '.join(s.node_labels)})\n"
            f"  max_over_time(specwatch_build_info{sel}[{s.target_down_lookback}])\n",
            s.target_down_for,
            "Prometheus cannot scrape specwatch.",
            "Prometheus has failed to scrape specwatch on {{ $labels.instance }} for "
            f"{s.target_down_for}: acceptance regressions on this node cannot page.",
        ),
        _alert(
            s,
            "SpecwatchStale",
            # Age of the last evaluation when Prometheus scraped it: independent of the scrape interval, and
            # true only while the process serves /metrics but its loop has stopped.
            f"timestamp(specwatch_last_evaluation_timestamp_seconds{sel})\n"
            f"  - specwatch_last_evaluation_timestamp_seconds{sel}\n> {stale_after:g}\n",
            s.stale_for,
            "specwatch serves metrics but has stopped evaluating.",
            "specwatch on {{ $labels.instance }} last completed an evaluation {{ $value | humanizeDuration }} "
            f"before its latest scrape (more than {s.stale_intervals} intervals of "
            f"{s.evaluation_interval_seconds:g}s): every value it exports is frozen.",
        ),
        _alert(
            s,
            "SpecwatchGpuLost",
            f"specwatch_gpu_up{sel} == 0",
            s.gpu_lost_for,
            "A GPU stopped answering NVML.",
            "GPU {{ $labels.gpu }} on {{ $labels.instance }} has not answered NVML for "
            f"{s.gpu_lost_for}; engines on it are likely dead or hung (check `dmesg` for Xid errors).",
        ),
        _alert(
            s,
            "SpecwatchGpuThrottling",
            f"{mask}\nand (\n  {throttle_bits}\n)\n",
            s.gpu_throttling_for,
            "A GPU is slowed down by heat or a hardware slowdown.",
            "GPU {{ $labels.gpu }} on {{ $labels.instance }} has been throttled for "
            f'{s.gpu_throttling_for} (clock event reasons mask {{{{ $value | printf "%.0f" }}}}; any of '
            f"{throttle_names}): step times, and with them the crossover, are off.",
        ),
        _alert(
            s,
            "SpecwatchStateStoreErrors",
            f"increase(specwatch_state_errors_total{sel}[{s.state_errors_window}]) > 0",
            s.state_errors_for,
            "specwatch's baseline store failed.",
            "specwatch on {{ $labels.instance }} failed to read or write its baseline state store in the last "
            f"{s.state_errors_window}: a corrupt store is moved aside and rebuilt, so learned baselines may be "
            "gone and routes back in warm-up.",
        ),
        _alert(
            s,
            "SpecwatchInternalErrors",
            "\nor ".join(
                f"sum by ({', '.join(s.node_labels)}) "
                f"(increase(specwatch_{name}_errors_total{sel}[{s.internal_errors_window}])) > 0"
                for name in ("evaluator", "render", "otlp_export")
            )
            + "\n",
            s.internal_errors_for,
            "specwatch keeps failing internally: an evaluator, a /metrics section or the OTLP export.",
            "specwatch on {{ $labels.instance }} has kept failing for "
            f"{s.internal_errors_for}: an evaluator, a /metrics section or the OTLP export failed "
            f'{{{{ $value | printf "%.0f" }}}} times in the last {s.internal_errors_window}, and what it '
            "produces is missing. specwatch_evaluator_errors_total, specwatch_render_errors_total and "
            "specwatch_otlp_export_errors_total say which part; the journal has the error.",
        ),
        _alert(
            s,
            "SpecwatchConfigReloadFailed",
            f"specwatch_config_last_reload_successful{sel} == 0",
            s.config_reload_failed_for,
            "specwatch rejected its new configuration.",
            "specwatch on {{ $labels.instance }} rejected its configuration on reload and keeps running the "
            "previous one; `specwatch check-config` lists every problem.",
        ),
    ]


def alert_groups(s: Settings) -> list[dict[str, Any]]:
    return [
        {"name": "specwatch-route.alerts", "rules": [_with_links(s, a, "route", True) for a in route_alerts(s)]},
        {
            "name": "specwatch-self.alerts",
            "rules": [_with_links(s, a, _self_dashboard(a["alert"]), False) for a in self_alerts(s)],
        },
    ]
