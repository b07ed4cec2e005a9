"""Drive SGLang 0.5.23's own metric collectors in multiprocess mode, as a real server does.

One forked child per scheduler (dp_rank x tp_rank) and one for the tokenizer manager each build their
collector and write prometheus_client's mmap files; the parent renders them with `MultiProcessCollector`,
which is exactly what the server's /metrics handler does (no `_created`, `pid` on gauges without a
multiprocess mode). Imported only inside the capture venv, after PROMETHEUS_MULTIPROC_DIR is set.
"""

from __future__ import annotations

import os
import random
from types import SimpleNamespace
from typing import Any

from capture.stubs import install_torchvision_placeholder
from capture.traffic import draft_accepted


def _publish_runtime_context(mc: Any, served_model_name: str, custom_labels: tuple[str, ...]) -> None:
    """The collectors read settings through runtime_context accessors, which need a running server."""
    schedule = SimpleNamespace(
        prefill_delayer_max_delay_passes=30,
        prefill_delayer_forward_passes_buckets=None,
        prefill_delayer_wait_seconds_buckets=None,
        enable_priority_scheduling=True,
    )
    observability = SimpleNamespace(
        enable_metrics=True,
        enable_metrics_for_all_schedulers=True,
        kv_events_config=None,
        extra_metric_labels=None,
        stat_loggers=None,
        tokenizer_metrics_allowed_custom_labels=list(custom_labels),
        prompt_tokens_buckets=None,
        generation_tokens_buckets=None,
    )
    mc.get_schedule = lambda: schedule
    mc.get_observability = lambda: observability
    mc.get_serving = lambda: SimpleNamespace(served_model_name=served_model_name, enable_streaming_session=False)
    mc.get_disagg = lambda: SimpleNamespace(enable_pd_role_switch=False, disaggregation_mode="null")
    mc.exports_expert_balancedness_to_prometheus = lambda: False


def _run_in_child(fn) -> None:
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            fn()
        except BaseException:  # noqa: BLE001 - report and fail the child, never return into the parent's loop
            import traceback

            traceback.print_exc()
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError("capture child failed (see traceback above)")


def capture(args: Any) -> list[tuple[str, str, dict]]:
    install_torchvision_placeholder()
    import prometheus_client
    from prometheus_client import multiprocess
    from sglang.srt.observability import metrics_collector as mc

    _publish_runtime_context(mc, args.model, ("route",))
    server_args = None  # SchedulerMetricsCollector accepts it but never reads it (0.5.23)
    rng = random.Random(args.seed)
    steps, draft_tokens = args.k, args.k + 1  # EAGLE topk=1: num_draft_tokens = steps + 1
    truth: dict[str, Any] = {
        "spec_num_steps": steps,
        "spec_num_draft_tokens": draft_tokens,
        "schedulers": {},
        "tokenizer": {},
    }
    token_counters = {route: {"spec_verify_calls": 0, "generation_tokens": 0} for route in args.routes}

    def scheduler_tick(dp_rank: int, tp_rank: int, running: int, accepted: list[int]) -> None:
        labels = {
            "model_name": args.model,
            "engine_type": "unified",
            "tp_rank": tp_rank,
            "pp_rank": 0,
            "moe_ep_rank": 0,
            "priority": "",
        }
        if args.engines > 1:  # the scheduler gets a dp_rank only when --dp-size > 1
            labels["dp_rank"] = dp_rank
        collector = mc.SchedulerMetricsCollector(labels=labels, server_args=server_args)
        stats = mc.SchedulerStats()
        stats.num_running_reqs = mc.QueueCount(total=running, by_priority={0: running - running // 4, 1: running // 4})
        stats.num_queue_reqs = mc.QueueCount(total=2, by_priority={0: 2})
        stats.gen_throughput = 950.0 + 20 * running
        stats.token_usage = stats.full_token_usage = round(0.03 * running, 4)
        stats.num_used_tokens = stats.kv_used_tokens = 1200 * running
        # The 0.5.13+ definitions: length includes the bonus token; rate excludes it.
        stats.spec_accept_length = 1 + sum(accepted) / len(accepted)
        stats.spec_accept_rate = sum(accepted) / (len(accepted) * (draft_tokens - 1))
        stats.spec_num_steps, stats.spec_num_draft_tokens = steps, draft_tokens
        collector.log_stats(stats)

    def tokenizer_requests(requests: list[tuple[str, int, int, bool]]) -> None:
        base = {"model_name": args.model, "engine_type": "unified", "priority": "", "route": ""}
        collector = mc.TokenizerMetricsCollector(server_args=None, labels=base)
        for route, generated, verify_ct, streaming in requests:
            labels = {**base, "route": route}
            collector.observe_one_finished_request(
                labels,
                prompt_tokens=512,
                generation_tokens=generated,
                cached_tokens=128,
                e2e_latency=3.2,
                has_grammar=False,
                spec_verify_ct=verify_ct,
                is_streaming=streaming,
                time_per_output_token=0.011,
            )

    scrapes = []
    multiproc_dir = os.environ["PROMETHEUS_MULTIPROC_DIR"]
    for scrape_index in range(args.scrapes):
        for dp_rank in range(args.engines):
            running = rng.randint(max(1, args.running // 2), max(1, args.running))
            accepted = [draft_accepted(rng, steps, args.accept_p) for _ in range(running * 40)]
            truth["schedulers"][str(dp_rank)] = {
                "num_running_reqs": running,
                "spec_accept_length": 1 + sum(accepted) / len(accepted),
                "spec_accept_rate": sum(accepted) / (len(accepted) * (draft_tokens - 1)),
            }
            for tp_rank in range(args.tp):  # --enable-metrics-for-all-schedulers: tp ranks duplicate rank 0
                _run_in_child(lambda: scheduler_tick(dp_rank, tp_rank, running, accepted))
        requests = []
        for _ in range(args.steps):
            route = rng.choice(args.routes)
            verify_ct = rng.randint(20, 120)
            generated = 1 + sum(draft_accepted(rng, steps, args.accept_p) + 1 for _ in range(verify_ct))
            requests.append((route, generated, verify_ct, rng.random() < 0.5))
            token_counters[route]["spec_verify_calls"] += verify_ct
            token_counters[route]["generation_tokens"] += generated
        _run_in_child(lambda: tokenizer_requests(requests))
        truth["tokenizer"] = {route: dict(c) for route, c in token_counters.items()}
        registry = prometheus_client.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=multiproc_dir)
        text = prometheus_client.generate_latest(registry).decode("utf-8")
        scrapes.append(("" if scrape_index == 0 else f"_scrape{scrape_index + 1}", text, json_copy(truth)))
    return scrapes


def json_copy(value: Any) -> Any:
    import json

    return json.loads(json.dumps(value))
