"""Fixtures for engine versions we do not install: metric definitions transcribed, traffic synthetic.

- vLLM V0 (removed by v0.10.0): the spec-decode gauges and counters and the scheduler gauges as declared in
  V0's `vllm/engine/metrics.py` (label `model_name` only, `disable_created_metrics()`, so no `_created`).
- SGLang 0.4.3 / 0.5.4: names, types, label sets and HELP from `docs/reference/sglang-metrics-inventory.tsv`
  (HELP is the text of the newest version holding each name) and the label table of docs/engines.md §2.2.
  Rendered in multiprocess mode, like the server.
"""

from __future__ import annotations

import os
import random
from typing import Any

import prometheus_client

from capture.traffic import Truth, draft_accepted

# (name, type, HELP) as in V0 vllm/engine/metrics.py; the typo "Speulative" is V0's own.
_V0_METRICS = (
    ("vllm:num_requests_running", "gauge", "Number of requests currently running on GPU."),
    ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
    ("vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage. 1 means 100 percent usage."),
    ("vllm:generation_tokens", "counter", "Number of generation tokens processed."),
    ("vllm:spec_decode_draft_acceptance_rate", "gauge", "Speulative token acceptance rate."),
    ("vllm:spec_decode_efficiency", "gauge", "Speculative decoding system efficiency."),
    ("vllm:spec_decode_num_accepted_tokens", "counter", "Number of accepted tokens."),
    ("vllm:spec_decode_num_draft_tokens", "counter", "Number of draft tokens."),
    ("vllm:spec_decode_num_emitted_tokens", "counter", "Number of emitted tokens."),
)


def capture_vllm_v0(args: Any) -> list[tuple[str, str, dict]]:
    prometheus_client.disable_created_metrics()
    registry = prometheus_client.CollectorRegistry()
    metrics = {}
    for name, kind, doc in _V0_METRICS:
        cls = prometheus_client.Gauge if kind == "gauge" else prometheus_client.Counter
        metrics[name] = cls(name=name, documentation=doc, labelnames=["model_name"], registry=registry)
    rng = random.Random(args.seed)
    truth = Truth(k=args.k)
    emitted = 0
    for _ in range(args.steps * args.running):
        accepted = draft_accepted(rng, args.k, args.accept_p)
        truth.observe(args.k, accepted)
        emitted += accepted + 1
    truth.generation_tokens = emitted
    labels = {"model_name": args.model}
    metrics["vllm:num_requests_running"].labels(**labels).set(args.running)
    metrics["vllm:num_requests_waiting"].labels(**labels).set(1)
    metrics["vllm:gpu_cache_usage_perc"].labels(**labels).set(0.31)
    metrics["vllm:generation_tokens"].labels(**labels).inc(emitted)
    rate = truth.accepted_tokens / truth.draft_tokens
    metrics["vllm:spec_decode_draft_acceptance_rate"].labels(**labels).set(rate)
    # V0 efficiency: emitted / max emittable, i.e. (accepted + bonus) / (drafts x (k + 1)).
    metrics["vllm:spec_decode_efficiency"].labels(**labels).set(emitted / (truth.drafts * (args.k + 1)))
    # V0's counters were incremented by cumulative totals every ~5 s (sum of sums); reproduce that bug so
    # the fixture shows why they must never be read: three log ticks of the running totals.
    for tick in (1, 2, 3):
        metrics["vllm:spec_decode_num_accepted_tokens"].labels(**labels).inc(truth.accepted_tokens * tick // 3)
        metrics["vllm:spec_decode_num_draft_tokens"].labels(**labels).inc(truth.draft_tokens * tick // 3)
        metrics["vllm:spec_decode_num_emitted_tokens"].labels(**labels).inc(emitted * tick // 3)
    text = prometheus_client.generate_latest(registry).decode("utf-8")
    return [("", text, {"lifetime_acceptance_rate": rate, "0": truth.as_dict()})]


def _inventory(path: str) -> dict[str, tuple[str, str, str]]:
    """name -> (type, multiprocess_mode, HELP) from the SGLang inventory TSV."""
    rows = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            cols = line.rstrip("\n").split("\t")
            rows[cols[0]] = (cols[1], cols[3], cols[6])
    return rows


def capture_sglang_legacy(args: Any) -> list[tuple[str, str, dict]]:
    from prometheus_client import multiprocess

    inventory = _inventory(args.inventory)
    version = args.version
    # docs/engines.md §2.2: 0.4.3 has model_name only; 0.4.10-0.5.6 add tp/pp/dp ranks and engine_type.
    sched_labels = {"model_name": args.model}
    if version != "0.4.3":
        sched_labels.update(engine_type="unified", tp_rank="0", pp_rank="0", dp_rank="0")
    tok_labels = {"model_name": args.model}
    gauges = [
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:gen_throughput",
        "sglang:cache_hit_rate",
        "sglang:spec_accept_length",
    ]
    if version >= "0.5.4":
        gauges.append("sglang:spec_accept_rate")
    rng = random.Random(args.seed)
    steps, draft_tokens = args.k, args.k + 1
    accepted = [draft_accepted(rng, steps, args.accept_p) for _ in range(args.running * 40)]
    length = 1 + sum(accepted) / len(accepted)
    # Before 0.5.13 spec_accept_rate included the bonus token: (accepted + bonus) / (forward_ct x draft_tokens).
    rate = (sum(accepted) + len(accepted)) / (len(accepted) * draft_tokens)
    values = {
        "sglang:num_running_reqs": args.running,
        "sglang:num_queue_reqs": 1,
        "sglang:token_usage": 0.42,
        "sglang:gen_throughput": 1234.5,
        "sglang:cache_hit_rate": 0.37,
        "sglang:spec_accept_length": length,
        "sglang:spec_accept_rate": rate,
    }
    for name in gauges:
        kind, mode, doc = inventory[name]
        assert kind == "Gauge", name
        g = prometheus_client.Gauge(
            name, doc, labelnames=list(sched_labels), multiprocess_mode=mode if mode != "None" else "all"
        )
        g.labels(**sched_labels).set(values[name])
    generated = sum(a + 1 for a in accepted)
    kind, _, doc = inventory["sglang:generation_tokens_total"]
    prometheus_client.Counter("sglang:generation_tokens_total", doc, labelnames=list(tok_labels)).labels(
        **tok_labels
    ).inc(generated)
    registry = prometheus_client.CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=os.environ["PROMETHEUS_MULTIPROC_DIR"])
    text = prometheus_client.generate_latest(registry).decode("utf-8")
    return [
        (
            "",
            text,
            {
                "spec_accept_length": length,
                "spec_accept_rate": rate,
                "num_running_reqs": args.running,
                "generation_tokens": generated,
                "spec_num_steps": steps,
            },
        )
    ]
