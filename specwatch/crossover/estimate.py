"""Build a StepModel from what a user knows: a GPU name, a size or a shape, a dtype and a draft method.

Shared by `specwatch crossover estimate` and the daemon's `crossover: {estimate: {...}}` source, so both
answer the same question the same way.
"""

from __future__ import annotations

from specwatch.config import CrossoverEstimateConfig
from specwatch.crossover import gpus
from specwatch.crossover.hfconfig import load_hf_config
from specwatch.crossover.model import BYTES_PER_WEIGHT, Draft, ModelShape, StepModel

DEFAULT_VOCAB = 128_256


# What the estimator needs is exactly a route's `crossover.estimate` config section (the CLI builds one from its
# flags), so there is one type for both; `context` is read by the live flag, not here.
EstimateInputs = CrossoverEstimateConfig


def resolve_shape(inp: EstimateInputs, default: ModelShape | None = None) -> ModelShape:
    """hf_config, else an explicit shape (with --params to size the MLP), else a Llama-like shape of --params,
    else `default`."""
    if inp.hf_config:
        return load_hf_config(inp.hf_config)
    explicit = (inp.layers, inp.hidden_size, inp.kv_heads, inp.head_dim)
    if any(v is not None for v in explicit):
        layers, hidden, kv_heads, head_dim = explicit
        if layers is None or hidden is None or kv_heads is None or head_dim is None:
            raise ValueError("give all of --layers, --hidden-size, --kv-heads, --head-dim (or --hf-config)")
        heads = max(1, hidden // head_dim)
        attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
        if inp.params:  # size the MLP so the total matches --params
            per_layer = (inp.params * 1e9 - 2 * DEFAULT_VOCAB * hidden) / layers
            intermediate = max(hidden, int((per_layer - attention) / (3 * hidden)))
        else:
            intermediate = int(hidden * 3.5)
        return ModelShape(layers=layers, hidden_size=hidden, kv_heads=kv_heads, head_dim=head_dim,
                          intermediate_size=intermediate, vocab_size=DEFAULT_VOCAB, attention_heads=heads)
    if inp.params:
        return ModelShape.from_params(inp.params)
    if default is not None:
        return default
    raise ValueError("say what the target is: --params, the shape (--layers ...) or --hf-config")


def build_step_model(inp: EstimateInputs, default_shape: ModelShape | None = None) -> StepModel:
    """Raises ValueError with a message fit for the user on any unusable input."""
    if inp.dtype not in BYTES_PER_WEIGHT:
        raise ValueError(f"unknown dtype {inp.dtype!r}; use one of {', '.join(BYTES_PER_WEIGHT)}")
    gpu_name = inp.gpu or gpus.detect_gpu_name()
    if not gpu_name:
        raise ValueError("no GPU found through NVML; name one with --gpu (e.g. H200)")
    hardware, efficiency = gpus.lookup(gpu_name)
    shape = resolve_shape(inp, default_shape)
    return StepModel(shape=shape, hardware=hardware, efficiency=efficiency, dtype=inp.dtype,
                     draft=Draft.parse(inp.draft, shape))
