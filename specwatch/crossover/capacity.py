"""How many sequences of a given context fit in an engine's KV cache: the largest batch it can run.

A crossover B* above that batch cannot be reached on the route's GPUs: speculation pays at every batch the
engine can schedule. 14B at 8k context on an 80 GB GPU holds about 27 sequences of 1.6 GB of KV each.
"""

from __future__ import annotations

import math

from specwatch.crossover.inputs import Hardware, ModelShape

# vLLM's default `gpu_memory_utilization`: the share of each GPU's memory the engine claims for weights, KV cache
# and activations (vllm/config/cache.py, vLLM 0.32.0: `gpu_memory_utilization: float = Field(default=0.92, ...)`).
GPU_MEMORY_UTILIZATION = 0.92


def kv_capacity_tokens(
    shape: ModelShape,
    hardware: Hardware,
    weight_bytes: float,
    gpus: int = 1,
    utilization: float = GPU_MEMORY_UTILIZATION,
) -> float:
    """KV-cache tokens the engine's GPUs hold once the weights are loaded (0 when the weights alone do not fit).
    `weight_bytes` per parameter. Activations and CUDA graphs are not subtracted: an upper bound by a few GB."""
    free = max(1, gpus) * utilization * hardware.memory_bytes - shape.params * weight_bytes
    return max(0.0, free / shape.kv_bytes_per_token)


def kv_capacity_batch(
    shape: ModelShape,
    hardware: Hardware,
    weight_bytes: float,
    context: float,
    gpus: int = 1,
    utilization: float = GPU_MEMORY_UTILIZATION,
) -> int:
    """The largest number of sequences of `context` tokens whose KV cache fits (0: not even one)."""
    tokens = kv_capacity_tokens(shape, hardware, weight_bytes, gpus, utilization)
    return int(math.floor(tokens / max(1.0, context)))
