"""Build a StepModel from what a user knows: a GPU name, a size or a shape, a dtype and a draft method.

Shared by `specwatch crossover estimate` and the daemon's `crossover: {estimate: {...}}` source, so both
answer the same question the same way.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from specwatch.config import CrossoverEstimateConfig
from specwatch.crossover import gpus
from specwatch.crossover.band import PACKED_VALIDATION_FILE, Band, error_band, load_validation, validation_gpu
from specwatch.crossover.hfconfig import load_hf_config
from specwatch.crossover.inputs import ModelShape
from specwatch.crossover.kernel import PACKED, UNPACKED
from specwatch.crossover.speedup import BYTES_PER_WEIGHT, Draft, StepModel

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
        return ModelShape(
            layers=layers,
            hidden_size=hidden,
            kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=intermediate,
            vocab_size=DEFAULT_VOCAB,
            attention_heads=heads,
        )
    if inp.params:
        return ModelShape.from_params(inp.params)
    if default is not None:
        return default
    raise ValueError("say what the target is: --params, the shape (--layers ...) or --hf-config")


def with_kernel(model: StepModel, kernel: str) -> StepModel:
    """`model` with its verify attention priced for `kernel` (`kernel.py`): packed reads the KV cache once per
    KV head, as decode does; unpacked once per query head. Every other efficiency stays the GPU's."""
    if kernel not in (PACKED, UNPACKED):
        raise ValueError(f"no step model for attention kernel {kernel!r}")
    return model.with_efficiency(replace(model.efficiency, verify_reads_per_query_head=kernel == UNPACKED))


def build_step_model(inp: EstimateInputs, default_shape: ModelShape | None = None) -> StepModel:
    """Raises ValueError with a message fit for the user on any unusable input."""
    if inp.dtype not in BYTES_PER_WEIGHT:
        raise ValueError(f"unknown dtype {inp.dtype!r}; use one of {', '.join(BYTES_PER_WEIGHT)}")
    gpu_name = inp.gpu or gpus.detect_gpu_name()
    if not gpu_name:
        raise ValueError("no GPU found through NVML; name one with --gpu (e.g. H200)")
    hardware, efficiency = gpus.lookup(gpu_name)
    shape = resolve_shape(inp, default_shape)
    return StepModel(
        shape=shape, hardware=hardware, efficiency=efficiency, dtype=inp.dtype, draft=Draft.parse(inp.draft, shape)
    )


# --params is in billions. Nothing served has more than a few thousand billion parameters, and a raw count
# is at least millions: values in between are neither, and are refused.
MAX_BILLIONS = 5000.0
MIN_RAW_COUNT = 1e6


def params_in_billions(value: float) -> tuple[float, str | None]:
    """--params as billions, and a note when a raw count was converted. Raises ValueError when ambiguous."""
    if not value > 0:
        raise ValueError(f"--params must be positive, got {value:g}")
    if value <= MAX_BILLIONS:
        return value, None
    if value >= MIN_RAW_COUNT:
        billions = value / 1e9
        return billions, (
            f"--params {value:g} read as a raw parameter count: {billions:g} billion "
            f"(the flag takes billions: --params {billions:g})"
        )
    raise ValueError(
        f"--params {value:g} is neither billions (at most {MAX_BILLIONS:g}) nor a raw parameter count "
        f"(at least {MIN_RAW_COUNT:g}); for a 70B model say --params 70 or --params 70e9"
    )


def assumptions(model: StepModel, inp: EstimateInputs, positions: tuple[float, ...], context: float) -> list[str]:
    """What an estimate rests on, one line each, for printing with it."""
    hw, eff, shape = model.hardware, model.efficiency, model.shape
    if inp.hf_config:
        origin = f"from {inp.hf_config}"
    elif inp.layers is not None:
        origin = "from --layers/--hidden-size/--kv-heads/--head-dim"
    elif inp.params:
        origin = f"a Llama-like shape scaled to {inp.params:g}B (pass --hf-config for the real one)"
    else:
        origin = "default"
    moe = f", MoE {shape.experts} experts top-{shape.experts_per_token}" if shape.experts else ""
    lines = [
        f"GPU {hw.name}: {hw.bandwidth / 1e12:g} TB/s, {hw.flops(model.dtype) / 1e12:g} dense TFLOP/s "
        f"({model.dtype}), {hw.sms} SMs",
        f"efficiency: memory {eff.memory:.3f}, compute {eff.compute:.3f}, decode attention "
        f"{eff.decode_attention:.3f}, verify attention {eff.verify_attention:.3f}"
        f"{' (per query head)' if eff.verify_reads_per_query_head else ''} + {eff.verify_key_s * 1e12:.0f} ps/key, "
        f"decode scores {eff.decode_attention_flop_s * 1e15:.1f} fs/FLOP, attention slice "
        f"{eff.attention_slice_key_s * 1e9:.1f} ns/key, MoE {eff.expert_group_s * 1e6:.2f} us/expert, overhead "
        f"{eff.layer_overhead_s * 1e6:.0f} us/layer + {eff.step_overhead_s * 1e6:.0f} us/step ({eff.source})",
        f"target {shape.params / 1e9:.2f}B params, {origin}: {shape.layers} layers, hidden {shape.hidden_size}, "
        f"{shape.attention_heads} heads / {shape.kv_heads} KV heads (GQA {shape.gqa_ratio:g}), head dim "
        f"{shape.head_dim}, FFN {shape.intermediate_size}{moe}, vocab {shape.vocab_size}",
        f"draft {model.draft.kind if model.draft else 'none'}"
        + (f": {model.draft.params / 1e9:.2f}B params" if model.draft and model.draft.params else ""),
        f"gamma {len(positions)}, acceptance p_j {', '.join(f'{p:.2f}' for p in positions)}, tau "
        f"{1 + sum(positions):.2f}; context {context:g} tokens per sequence",
        "kernel-level step times: no scheduler, sampler or rejection cost (real engines cross earlier)",
    ]
    return lines


def validation_warnings(model: StepModel, inp: EstimateInputs, context: float) -> list[str]:
    """Where this estimate leaves what the estimator was validated on (`docs/benchmarks.md`)."""
    from specwatch.crossover import gpus, shapes

    warnings = []
    rng = shapes.validated_range()
    if model.hardware.name not in gpus.CALIBRATED:
        warnings.append(f"{model.hardware.name} has no measured efficiencies: default derating, B* likely optimistic")
    billions = model.shape.params / 1e9
    lo, hi = rng["params_billions"]
    if not lo * 0.9 <= billions <= hi * 1.1:
        warnings.append(f"{billions:.1f}B parameters is outside the validated {lo:.1f}-{hi:.1f}B")
    lo, hi = rng["gqa_ratio"]
    if not lo <= model.shape.gqa_ratio <= hi:
        warnings.append(f"GQA ratio {model.shape.gqa_ratio:g} is outside the validated {lo:g}-{hi:g}")
    lo, hi = rng["context"]
    if not lo <= context <= hi:
        warnings.append(f"context {context:g} is outside the validated {lo:g}-{hi:g} tokens")
    if model.dtype != "bf16":
        warnings.append(f"{model.dtype} weights: only bf16 was measured")
    if model.shape.experts:
        warnings.append(
            "MoE: validated on two shapes (Qwen3-30B-A3B, OLMoE-1B-7B) at context 1024-2048, uniform routing only"
        )
    if inp.params and not inp.hf_config and inp.layers is None:
        warnings.append("shape guessed from the parameter count: GQA, width and depth are Llama-like guesses")
    return warnings


def estimate_band(
    model: StepModel, inp: EstimateInputs, bstar: float | None, context: float, positions: Sequence[float]
) -> Band:
    """B*'s error band from the held-out validation of the model's verify kernel (`band.py`): validated where no
    warning applies (and, packed, on the GPU the packed tables were measured on)."""
    validated = not validation_warnings(model, inp, context)
    cells = None
    if not model.efficiency.verify_reads_per_query_head:
        cells = load_validation(PACKED_VALIDATION_FILE)
        validated = validated and model.hardware.name == validation_gpu(PACKED_VALIDATION_FILE)
    return error_band(
        bstar,
        model.shape,
        context,
        validated=validated,
        cells=cells,
        speedup_at_one=model.speedup(1.0, positions, context),
    )


def describe_band(bstar: float | None, band: Band) -> str:
    """One line: the band and what it rests on."""
    if bstar is None:
        return f"no crossover predicted ({band.basis})"
    upper = "no upper bound" if band.upper is None else f"{band.upper:.0f}"
    return f"band {band.lower:.0f}-{upper}: {band.basis}"
