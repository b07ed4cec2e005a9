"""Drive vLLM's own PrometheusStatLogger with synthetic traffic and render its /metrics exposition.

Imported only inside the capture venv (it needs vllm + CPU torch). Names, types, labels, HELP text,
ordering and `_created` all come from vLLM; only the traffic is ours.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import prometheus_client

from capture.traffic import Truth, draft_accepted


def _duck_config(model_name: str, k: int | None) -> SimpleNamespace:
    """The few attributes PrometheusStatLogger reads; anything optional is None (feature off)."""
    cache_info = {
        "block_size": "16",
        "cache_dtype": "auto",
        "enable_prefix_caching": "True",
        "gpu_memory_utilization": "0.9",
        "num_gpu_blocks": "27000",
        "num_cpu_blocks": "None",
    }
    return SimpleNamespace(
        model_config=SimpleNamespace(served_model_name=model_name, max_model_len=8192, is_diffusion=False),
        observability_config=SimpleNamespace(
            show_hidden_metrics=False,
            kv_cache_metrics=False,
            custom_histogram_buckets=None,
            cudagraph_metrics=False,
            enable_mfu_metrics=False,
        ),
        speculative_config=None if k is None else SimpleNamespace(num_speculative_tokens=k),
        cache_config=SimpleNamespace(num_gpu_blocks=27000, metrics_info=lambda: dict(cache_info)),
        kv_transfer_config=None,
        ec_transfer_config=None,
        lora_config=None,
        watermark_config=None,
        device_config=SimpleNamespace(device_type="cuda"),
        parallel_config=SimpleNamespace(data_parallel_size=1),
    )


class VllmCapture:
    """One logger for `engines` DP engines; `step()` feeds one scheduler step per engine."""

    def __init__(self, model_name: str, engines: int, k: int | None, seed: int, accept_p: float) -> None:
        from vllm.v1.metrics.loggers import PrometheusStatLogger

        self.k = k
        self.accept_p = accept_p
        self.rng = random.Random(seed)
        self.engines = list(range(engines))
        self.logger = PrometheusStatLogger(_duck_config(model_name, k), engine_indexes=self.engines)
        self.logger.log_engine_initialized()
        self.truth = {str(e): Truth(k=k or 0) for e in self.engines}

    def step(self, engine: int, running: int, waiting: int, finished: int) -> None:
        from vllm.v1.engine import FinishReason
        from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, PrefixCacheStats, SchedulerStats
        from vllm.v1.spec_decode.metrics import SpecDecodingStats

        rng, truth = self.rng, self.truth[str(engine)]
        spec = SpecDecodingStats.new(self.k) if self.k else None
        generated = 0
        for _ in range(running):
            if spec is not None:
                accepted = draft_accepted(rng, self.k, self.accept_p)
                spec.observe_draft(num_draft_tokens=self.k, num_accepted_tokens=accepted)
                truth.observe(self.k, accepted)
                generated += accepted + 1  # accepted drafts + the bonus token
            else:
                generated += 1
        truth.generation_tokens += generated

        prefix = PrefixCacheStats(requests=finished, queries=512 * finished, hits=128 * finished)
        sched = SchedulerStats(
            num_running_reqs=running,
            num_waiting_reqs=waiting,
            kv_cache_usage=round(min(0.95, 0.02 * running + 0.05), 4),
            prefix_cache_stats=prefix,
            spec_decoding_stats=spec,
        )
        it = IterationStats()
        it.num_generation_tokens = generated
        it.prompt_token_stats.computed = it.prompt_token_stats.total = 384 * finished
        it.prompt_token_stats.local_cache_hit = it.prompt_token_stats.cached_tokens = 128 * finished
        it.prompt_token_stats.total += 128 * finished
        it.inter_token_latencies_iter = [rng.uniform(0.012, 0.03) for _ in range(running)]
        it.time_to_first_tokens_iter = [rng.uniform(0.05, 0.4) for _ in range(finished)]
        it.max_num_generation_tokens_iter = [256] * finished
        it.n_params_iter = [1] * finished
        for _ in range(finished):
            out_tokens = rng.randint(64, 512)
            it.finished_requests.append(
                FinishedRequestStats(
                    finish_reason=FinishReason.STOP if rng.random() < 0.9 else FinishReason.LENGTH,
                    e2e_latency=rng.uniform(1.0, 8.0),
                    num_prompt_tokens=512,
                    num_generation_tokens=out_tokens,
                    max_tokens_param=512,
                    queued_time=rng.uniform(0.0, 0.2),
                    prefill_time=rng.uniform(0.03, 0.3),
                    inference_time=rng.uniform(1.0, 7.0),
                    decode_time=rng.uniform(0.9, 6.5),
                    mean_time_per_output_token=rng.uniform(0.006, 0.02),
                    num_cached_tokens=128,
                )
            )
        self.logger.record(scheduler_stats=sched, iteration_stats=it, engine_idx=engine)

    def render(self) -> str:
        return prometheus_client.generate_latest(prometheus_client.REGISTRY).decode("utf-8")


def capture(args: Any) -> list[tuple[str, str, dict]]:
    """Returns [(suffix, exposition, truth)] for each scrape taken (one or two)."""
    cap = VllmCapture(args.model, args.engines, args.k, args.seed, args.accept_p)
    scrapes = []
    for scrape_index in range(args.scrapes):
        for _ in range(args.steps):
            for e in cap.engines:
                running = cap.rng.randint(args.running // 2, args.running) if args.running else 0
                cap.step(e, running=running, waiting=cap.rng.randint(0, 3), finished=cap.rng.randint(0, 2))
        truth = {e: t.as_dict() for e, t in cap.truth.items()}
        scrapes.append(("" if scrape_index == 0 else f"_scrape{scrape_index + 1}", cap.render(), truth))
    return scrapes
