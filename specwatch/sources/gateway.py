"""Gateway expositions: one /metrics that re-exports several workers' series, each with a label naming its worker.

SGLang's model gateway (SMG) serves `GET /engine_metrics`: it fetches every registered worker's `/metrics`,
replaces `:` by `_` in the whole text, adds the label `worker_addr` (the worker's URL) to every family and merges
the families by name (`aggregate_metrics`, model_gateway/src/core/metrics_aggregator.rs at lightseekorg/smg
24634ae98431, the same code as sgl-model-gateway/src/core/metrics_aggregator.rs at sgl-project/sglang
30d1e5aeee6b; the label is set where `get_engine_metrics` builds each worker's `MetricPack`,
`labels: vec![("worker_addr", resp.url)]`, in core/worker_manager.rs at lightseekorg/smg 059da7af9f94). Each
worker keeps its own engine labels (vLLM `engine`, SGLang `dp_rank`), which repeat from worker to worker: without
the worker label, one worker's gauges would stand for all of them.

So the engine modules key each engine by (worker, engine label): every worker's engines are engines of their own,
their counters summed over engines as any engine's are, their gauges (the batch) kept per worker. A route that
names a worker in `match` (`worker_addr: http://...`) reads that worker alone. A gateway that names its workers
by another label is read with the route's `worker_label`.
"""

from __future__ import annotations

from typing import Mapping

WORKER_LABEL = "worker_addr"


def engine_id(labels: Mapping[str, str], engine: str, worker_label: str = WORKER_LABEL) -> str:
    """The engine's id: its own engine label, prefixed by its worker where a gateway names one."""
    worker = labels.get(worker_label)
    return engine if worker is None else f"{worker}|{engine}"


def worker_of(labels: Mapping[str, str], worker_label: str = WORKER_LABEL) -> str:
    """The worker a series comes from ("" for an engine's own /metrics)."""
    return labels.get(worker_label, "")
