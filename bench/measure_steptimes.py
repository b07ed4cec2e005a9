#!/usr/bin/env python3
"""Measure kernel-level decode step times of transformer shapes on one GPU (standalone; needs torch, numpy).

Writes one JSON per (shape, context) in the schema of specwatch/data/h200-crossover-llama3-8b.json:
`target["BxQ"]` (ms per forward, batch B, Q new tokens per sequence), `draft["B"]` (ms per draft step),
`gpm_plain["B"]`, `derived["gamma=G,alpha=A"]` (speedup, first_batch_below_1), plus `shape_config` and
`provenance`.

Method (as for the shipped Llama-3-8B table):
- Random bf16 weights, random bf16 KV cache of `context` tokens per sequence. Each layer gets its own weights
  and KV cache when they fit the memory budgets below; otherwise tensors are shared cyclically between layers,
  which only happens when one layer's tensor is far larger than the L2 cache (so it still streams from HBM).
- One forward = embedding gather, n_layers x (RMSNorm, QKV, RoPE, KV write, attention, O, RMSNorm, MLP or
  MoE), final norm, LM head over every new token.
- Attention is PyTorch SDPA: plain decode (q = 1) uses native GQA and no mask; the verify pass (q > 1) passes
  a bottom-right causal mask, which keeps it off the decode-optimised kernels (as in the 8B table). How that
  mask is built decides SDPA's kernel (see VARIANTS); --match-reference picks the variant closest to a
  reference table before measuring.
- MoE layers: a fixed uniform-random top-k routing per token (drawn before capture; a CUDA graph needs static
  shapes) dispatched through torch._grouped_mm, so only the experts that receive tokens stream weights.
- Draft: one dense decoder layer of the target's width (for MoE shapes the FFN width is top-k x expert FFN)
  plus a 32,000-token LM head, one token per sequence, over its own KV cache of the same context.
- Every forward is a captured CUDA graph; time = median of CUDA-event-timed replays.

Run with --dry-run on a CPU to check the code path with tiny shapes (times are meaningless there).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

BATCHES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
QUERY_LENGTHS = (1, 3, 5, 8)  # plain decode, then verify for gamma 2, 4, 7
GAMMAS = (2, 4, 7)
ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)
DRAFT_VOCAB = 32000

# Public model configs (config.json of each model on the Hugging Face hub).
SHAPES: dict[str, dict] = {
    "llama3-8b": dict(layers=32, d_model=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256),
    "llama2-7b": dict(layers=32, d_model=4096, heads=32, kv_heads=32, head_dim=128, ffn=11008, vocab=32000),
    "llama2-13b": dict(layers=40, d_model=5120, heads=40, kv_heads=40, head_dim=128, ffn=13824, vocab=32000),
    "qwen1.5-1.8b": dict(layers=24, d_model=2048, heads=16, kv_heads=16, head_dim=128, ffn=5504, vocab=151936),
    "qwen2.5-1.5b": dict(layers=28, d_model=1536, heads=12, kv_heads=2, head_dim=128, ffn=8960, vocab=151936),
    "llama3.2-1b": dict(layers=16, d_model=2048, heads=32, kv_heads=8, head_dim=64, ffn=8192, vocab=128256),
    "qwen2.5-14b": dict(layers=48, d_model=5120, heads=40, kv_heads=8, head_dim=128, ffn=13824, vocab=152064),
    "codellama-34b": dict(layers=48, d_model=8192, heads=64, kv_heads=8, head_dim=128, ffn=22016, vocab=32000),
    "qwen3-30b-a3b": dict(
        layers=48,
        d_model=2048,
        heads=32,
        kv_heads=4,
        head_dim=128,
        ffn=0,
        vocab=151936,
        experts=128,
        experts_per_token=8,
        expert_ffn=768,
    ),
    # OLMoE-1B-7B (allenai/OLMoE-1B-7B-0924): hidden_size 2048, intermediate_size 1024 (per expert), 16 layers,
    # 16 / 16 heads (MHA), num_experts 64, num_experts_per_tok 8, vocab_size 50304, no shared expert. Its QK norm
    # is left out, as Qwen3-30B-A3B's is (specwatch/data/README.md).
    "olmoe-1b-7b": dict(
        layers=16,
        d_model=2048,
        heads=16,
        kv_heads=16,
        head_dim=128,
        ffn=0,
        vocab=50304,
        experts=64,
        experts_per_token=8,
        expert_ffn=1024,
    ),
}
# How the verify pass's attention and RoPE are run (see --variant); plain decode is always native-GQA SDPA.
VARIANTS = {
    "gqa": dict(verify="gqa", mask="bool", rope=True),  # enable_gqa, mask as is (math kernel unless aligned)
    "gqa-aligned": dict(verify="aligned", mask="bool", rope=True),
    "gqa-aligned-float": dict(verify="aligned", mask="float", rope=True),
    "repeat-aligned": dict(verify="repeat", mask="bool", rope=True),  # KV repeated to all query heads
    "gqa-aligned-norope": dict(verify="aligned", mask="bool", rope=False),
    "gqa-norope": dict(verify="gqa", mask="bool", rope=False),
    # As serving engines on Hopper run verify: the GQA group's query heads x the q new tokens packed onto each KV
    # head, so the kernel reads the KV cache once per KV head (FlashInfer's head-group fusion, FlashAttention-3's
    # pack_gqa; docs/crossover.md). No mask: the causal order inside a block of q <= 8 new tokens changes which
    # scores are kept, not which KV bytes are read, and a mask would move SDPA off its flash kernel.
    "packed": dict(verify="packed", mask="none", rope=True),
}
VARIANT = dict(VARIANTS["gqa"])
TINY = dict(layers=2, d_model=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=512)
TINY_MOE = dict(TINY, ffn=0, experts=8, experts_per_token=2, expert_ffn=32)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def param_count(cfg: dict) -> dict[str, float]:
    """Parameters: total, and active per token (what one token's forward reads), LM head and embedding apart."""
    d, hd = cfg["d_model"], cfg["head_dim"]
    attn = d * (cfg["heads"] + 2 * cfg["kv_heads"]) * hd + cfg["heads"] * hd * d
    if cfg.get("experts"):
        expert = 3 * d * cfg["expert_ffn"]
        mlp_total = cfg["experts"] * expert + d * cfg["experts"]
        mlp_active = cfg["experts_per_token"] * expert + d * cfg["experts"]
    else:
        mlp_total = mlp_active = 3 * d * cfg["ffn"]
    layers = cfg["layers"]
    return {
        "total": layers * (attn + mlp_total) + 2 * cfg["vocab"] * d,
        "active_per_token": layers * (attn + mlp_active) + cfg["vocab"] * d,
        "lm_head": cfg["vocab"] * d,
    }


def randn(shape: tuple[int, ...], device: torch.device, std: float = 0.02) -> torch.Tensor:
    return torch.empty(shape, device=device, dtype=torch.bfloat16).normal_(0.0, std)


class Layers:
    """Weights of n decoder layers (shared cyclically if over budget) and their forward."""

    def __init__(self, cfg: dict, n_layers: int, device: torch.device, budget_bytes: float) -> None:
        d, hd = cfg["d_model"], cfg["head_dim"]
        self.cfg, self.device = cfg, device
        self.n_layers = n_layers
        self.qkv_out = (cfg["heads"] + 2 * cfg["kv_heads"]) * hd
        self.moe = bool(cfg.get("experts"))
        per_layer = (d * self.qkv_out + cfg["heads"] * hd * d) * 2
        if self.moe:
            per_layer += (cfg["experts"] * 3 * d * cfg["expert_ffn"] + d * cfg["experts"]) * 2
        else:
            per_layer += 3 * d * cfg["ffn"] * 2
        self.distinct = max(1, min(n_layers, int(budget_bytes // per_layer)))
        self.weights = [self._layer_weights() for _ in range(self.distinct)]
        self.moe_impl = "grouped_mm" if self.moe else None

    def _layer_weights(self) -> dict[str, torch.Tensor]:
        cfg, dev = self.cfg, self.device
        d, hd = cfg["d_model"], cfg["head_dim"]
        w = {
            "norm1": torch.ones(d, device=dev, dtype=torch.bfloat16),
            "norm2": torch.ones(d, device=dev, dtype=torch.bfloat16),
            "qkv": randn((self.qkv_out, d), dev),
            "o": randn((d, cfg["heads"] * hd), dev),
        }
        if self.moe:
            e, f = cfg["experts"], cfg["expert_ffn"]
            w["router"] = randn((e, d), dev)
            w["gate_up"] = randn((e, d, 2 * f), dev)  # grouped_mm: (tokens, d) @ (e, d, 2f)
            w["down"] = randn((e, f, d), dev)
        else:
            w["gate_up"] = randn((2 * cfg["ffn"], d), dev)
            w["down"] = randn((d, cfg["ffn"]), dev)
        return w

    def layer(self, i: int) -> dict[str, torch.Tensor]:
        return self.weights[i % self.distinct]


class Routing:
    """A fixed top-k routing for M tokens: token order sorted by expert, group offsets, gate weights."""

    def __init__(self, m_tokens: int, cfg: dict, device: torch.device, generator: torch.Generator) -> None:
        e, k = cfg["experts"], cfg["experts_per_token"]
        choice = torch.rand((m_tokens, e), generator=generator).argsort(dim=1)[:, :k]  # k distinct experts
        flat = choice.reshape(-1)
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=e)
        self.token_index = (order // k).to(device)
        self.offsets = counts.cumsum(0).to(torch.int32).to(device)
        self.counts = counts.tolist()
        self.gate = torch.full((m_tokens * k, 1), 1.0 / k, device=device, dtype=torch.bfloat16)
        self.experts_touched = int((counts > 0).sum())


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def moe_mlp(h: torch.Tensor, w: dict, routing: Routing, impl: str) -> torch.Tensor:
    """Top-k MoE over flattened tokens h (M, d)."""
    F.linear(h, w["router"])  # router GEMM cost; the routing itself is fixed (see Routing)
    xs = h.index_select(0, routing.token_index)
    if impl == "grouped_mm":
        gu = torch._grouped_mm(xs, w["gate_up"], offs=routing.offsets)
        g, u = gu.chunk(2, dim=-1)
        y = torch._grouped_mm((F.silu(g) * u).contiguous(), w["down"], offs=routing.offsets)
    else:  # per-expert loop, used only if grouped_mm is unavailable
        parts, start = [], 0
        for expert, count in enumerate(routing.counts):
            if count:
                gu = xs[start : start + count] @ w["gate_up"][expert]
                g, u = gu.chunk(2, dim=-1)
                parts.append((F.silu(g) * u) @ w["down"][expert])
            start += count
        y = torch.cat(parts)
    out = torch.zeros_like(h)
    return out.index_add_(0, routing.token_index, y * routing.gate)


def packed_attention(qh: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention of qh (B, H, q, d) against k, v (B, H_kv, L, d) with each KV head's G = H / H_kv query heads
    and q tokens as G x q rows of one head: one (sequence, KV head) work item reads its slice of the cache once.
    Query head h uses KV head h // G, as SDPA's enable_gqa and the engines group them."""
    b, h_q, q, hd = qh.shape
    h_kv = k.shape[1]
    rows = qh.reshape(b, h_kv, (h_q // h_kv) * q, hd)
    return F.scaled_dot_product_attention(rows, k, v).reshape(b, h_q, q, hd)


def decoder_forward(
    x: torch.Tensor,
    layers: Layers,
    kv: list[tuple[torch.Tensor, torch.Tensor]],
    context: int,
    mask: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    routing: Routing | None,
) -> torch.Tensor:
    """x: (B, q, d). kv[i]: (B, kv_heads, context + q, head_dim) key and value caches."""
    cfg = layers.cfg
    b, q, d = x.shape
    h_q, h_kv, hd = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    for i in range(layers.n_layers):
        w = layers.layer(i)
        k_cache, v_cache = kv[i % len(kv)]
        h = F.rms_norm(x, (d,), w["norm1"])
        qkv = F.linear(h, w["qkv"])
        qh, kh, vh = qkv.split((h_q * hd, h_kv * hd, h_kv * hd), dim=-1)
        qh = qh.view(b, q, h_q, hd).transpose(1, 2)
        kh = kh.view(b, q, h_kv, hd).transpose(1, 2)
        if VARIANT["rope"]:
            qh, kh = rope(qh, cos, sin), rope(kh, cos, sin)
        k_cache[:, :, context : context + q].copy_(kh)
        v_cache[:, :, context : context + q].copy_(vh.view(b, q, h_kv, hd).transpose(1, 2))
        if q > 1 and VARIANT["verify"] == "packed":
            attn = packed_attention(qh, k_cache, v_cache)
        elif q > 1 and VARIANT["verify"] == "repeat" and h_q != h_kv:
            k_all = k_cache.repeat_interleave(h_q // h_kv, dim=1)
            v_all = v_cache.repeat_interleave(h_q // h_kv, dim=1)
            attn = F.scaled_dot_product_attention(qh, k_all, v_all, attn_mask=mask)
        else:
            attn = F.scaled_dot_product_attention(qh, k_cache, v_cache, attn_mask=mask, enable_gqa=(h_q != h_kv))
        x = x + F.linear(attn.transpose(1, 2).reshape(b, q, h_q * hd), w["o"])
        h = F.rms_norm(x, (d,), w["norm2"])
        if layers.moe:
            x = x + moe_mlp(h.view(b * q, d), w, routing, layers.moe_impl).view(b, q, d)
        else:
            g, u = F.linear(h, w["gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(g) * u, w["down"])
    return x


class Model:
    """Embedding, decoder layers and LM head of one shape (or of its draft)."""

    def __init__(
        self,
        cfg: dict,
        device: torch.device,
        weight_budget: float,
        vocab: int | None = None,
        n_layers: int | None = None,
    ) -> None:
        self.cfg = cfg
        self.vocab = vocab or cfg["vocab"]
        self.layers = Layers(cfg, n_layers or cfg["layers"], device, weight_budget)
        self.embedding = randn((self.vocab, cfg["d_model"]), device)
        self.lm_head = randn((self.vocab, cfg["d_model"]), device)
        self.final_norm = torch.ones(cfg["d_model"], device=device, dtype=torch.bfloat16)
        self.device = device

    def kv_caches(self, batch: int, context: int, q: int, budget: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
        cfg = self.cfg
        shape = (batch, cfg["kv_heads"], context + q, cfg["head_dim"])
        per_layer = 2 * math.prod(shape) * 2
        distinct = max(1, min(self.layers.n_layers, int(budget // per_layer)))
        return [(randn(shape, self.device, 1.0), randn(shape, self.device, 1.0)) for _ in range(distinct)]

    def step_fn(self, batch: int, q: int, context: int, kv_budget: float, generator: torch.Generator):
        """A closure running one forward on static buffers (for CUDA-graph capture), plus the KV-layer count."""
        cfg, dev = self.cfg, self.device
        ids = torch.randint(0, self.vocab, (batch, q), device=dev)
        kv = self.kv_caches(batch, context, q, kv_budget)
        mask = None
        if q > 1 and VARIANT["mask"] != "none":  # bottom-right causal: new token i sees the cache and new tokens 0..i
            # Padding the mask's row to a multiple of 8 keeps its stride 16-byte aligned, which SDPA's
            # memory-efficient kernel needs; unaligned masks fall back to the math kernel.
            width = context + q
            if VARIANT["verify"] in ("aligned", "repeat"):
                width = -(-width // 8) * 8
            full = torch.ones(q, width, dtype=torch.bool, device=dev).tril(diagonal=context)
            if VARIANT["mask"] == "float":
                full = torch.zeros(q, width, dtype=torch.bfloat16, device=dev).masked_fill(~full, float("-inf"))
            mask = full[:, : context + q]
        pos = torch.arange(context, context + q, device=dev, dtype=torch.float32)
        inv_freq = 1.0 / (500000.0 ** (torch.arange(0, cfg["head_dim"], 2, device=dev).float() / cfg["head_dim"]))
        angles = torch.outer(pos, inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
        routing = Routing(batch * q, cfg, dev, generator) if self.layers.moe else None

        def forward() -> torch.Tensor:
            x = F.embedding(ids, self.embedding)
            x = decoder_forward(x, self.layers, kv, context, mask, cos, sin, routing)
            x = F.rms_norm(x, (cfg["d_model"],), self.final_norm)
            return F.linear(x, self.lm_head)

        return forward, {"kv_buffers": len(kv), "experts_touched": routing.experts_touched if routing else None}


def driver_version() -> str | None:
    """The NVIDIA driver's version (NVML), or None where NVML is absent."""
    try:
        import pynvml as nvml

        nvml.nvmlInit()
        version = nvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        return None


def verify_kernel(variant: dict) -> str:
    """How the verify pass reads the KV cache under `variant`: once per KV head or once per query head."""
    return "packed" if variant["verify"] == "packed" else "unpacked"


def cuda_provenance(device: torch.device, script: str) -> dict:
    """What every GPU file of these scripts records about the run: GPU, driver, torch, CUDA, SMs, date, command."""
    return {
        "gpu": torch.cuda.get_device_name(device),
        "driver": driver_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "sm_count": torch.cuda.get_device_properties(device).multi_processor_count,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "script": script,
        "command": " ".join(sys.argv),
    }


def time_graph(fn, device: torch.device, target_s: float, max_reps: int) -> float:
    """Median ms of CUDA-event-timed replays of fn captured as a CUDA graph (eager wall time on CPU)."""
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    first = start.elapsed_time(end)
    reps = int(min(max_reps, max(5, target_s * 1e3 / max(first, 1e-3))))
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del graph
    return statistics.median(times)


class GpmReader:
    """NVML GPM over a window of graph replays (Hopper and later); None where unavailable."""

    METRICS = ("SM_UTIL", "ANY_TENSOR_UTIL", "DRAM_BW_UTIL", "SM_OCCUPANCY")

    def __init__(self) -> None:
        self.nvml = None
        try:
            import pynvml as nvml

            nvml.nvmlInit()
            self.handle = nvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            if not nvml.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice:
                return
            self.samples = (nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc())
            self.nvml = nvml
        except Exception as exc:  # no NVML or no GPM: the tables are still useful without it
            log(f"GPM unavailable: {exc!r}")

    def read(self, fn, device: torch.device, seconds: float = 0.6) -> dict | None:
        if self.nvml is None:
            return None
        nvml = self.nvml
        graph = torch.cuda.CUDAGraph()
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        torch.cuda.synchronize()
        nvml.nvmlGpmSampleGet(self.handle, self.samples[0])
        stop = time.perf_counter() + seconds
        while time.perf_counter() < stop:
            graph.replay()
            torch.cuda.synchronize()
        nvml.nvmlGpmSampleGet(self.handle, self.samples[1])
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self.METRICS)
        request.sample1, request.sample2 = self.samples
        for i, name in enumerate(self.METRICS):
            request.metrics[i].metricId = getattr(nvml, f"NVML_GPM_METRIC_{name}")
        nvml.nvmlGpmMetricsGet(request)
        out = {name: round(request.metrics[i].value, 2) for i, name in enumerate(self.METRICS)}
        out["nvml_gpu_util"] = nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu
        del graph
        return out


def expected_tokens(alpha: float, gamma: int) -> float:
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def derive(target: dict[str, float], draft: dict[str, float], batches: list[int]) -> dict:
    """Speedups exactly as the shipped 8B table defines them (see specwatch/data/README.md)."""
    out = {}
    for gamma in GAMMAS:
        for alpha in ALPHAS:
            speedup = {}
            for b in batches:
                key = f"{b}x{gamma + 1}"
                if key in target and f"{b}x1" in target and str(b) in draft:
                    e = expected_tokens(alpha, gamma)
                    speedup[str(b)] = round(e * target[f"{b}x1"] / (target[key] + gamma * draft[str(b)]), 3)
            below = [int(b) for b, s in speedup.items() if s < 1]
            out[f"gamma={gamma},alpha={alpha}"] = {
                "speedup": speedup,
                "first_batch_below_1": min(below) if below else None,
            }
    return out


def measure(
    name: str,
    cfg: dict,
    context: int,
    batches: list[int],
    qs: list[int],
    device: torch.device,
    args: argparse.Namespace,
    gpm: GpmReader | None,
) -> dict:
    generator = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    model = Model(cfg, device, args.weight_budget_gb * 1e9)
    if model.layers.moe:
        model.layers.moe_impl = args.moe_impl
    draft_cfg = dict(cfg)
    if cfg.get("experts"):
        draft_cfg = {k: v for k, v in cfg.items() if k not in ("experts", "experts_per_token", "expert_ffn")}
        draft_cfg["ffn"] = cfg["experts_per_token"] * cfg["expert_ffn"]
    draft = Model(draft_cfg, device, 1e12, vocab=DRAFT_VOCAB, n_layers=1)
    log(
        f"{name}: weights ready ({model.layers.distinct}/{cfg['layers']} distinct layers) "
        f"in {time.perf_counter() - t0:.1f}s"
    )
    target_ms: dict[str, float] = {}
    draft_ms: dict[str, float] = {}
    gpm_plain: dict[str, dict] = {}
    notes: dict[str, dict] = {}
    kv_budget = args.kv_budget_gb * 1e9
    for b in batches:
        for q in qs:
            fn, info = model.step_fn(b, q, context, kv_budget, generator)
            try:
                target_ms[f"{b}x{q}"] = time_graph(fn, device, args.seconds_per_point, args.max_reps)
            except RuntimeError as exc:
                if model.layers.moe and model.layers.moe_impl == "grouped_mm":
                    log(f"{name}: torch._grouped_mm failed ({exc}); using a per-expert loop")
                    model.layers.moe_impl = "per_expert_loop"
                    target_ms[f"{b}x{q}"] = time_graph(fn, device, args.seconds_per_point, args.max_reps)
                else:
                    raise
            notes[f"{b}x{q}"] = info
            if q == 1 and gpm is not None:
                try:
                    reading = gpm.read(fn, device)
                except Exception as exc:  # a GPM hiccup must not cost the step times
                    log(f"GPM read failed at B={b}: {exc!r}")
                    reading = None
                if reading is not None:
                    gpm_plain[str(b)] = reading
            del fn
        dfn, _ = draft.step_fn(b, 1, context, kv_budget, generator)
        draft_ms[str(b)] = time_graph(dfn, device, args.seconds_per_point, args.max_reps)
        del dfn
        if device.type == "cuda":
            torch.cuda.empty_cache()
        log(
            f"{name} ctx {context} B={b}: "
            + " ".join(f"q{q}={target_ms[f'{b}x{q}']:.2f}" for q in qs)
            + f" draft={draft_ms[str(b)]:.3f} ms"
        )
    params = param_count(cfg)
    run = {
        "shape": name,
        "context": context,
        "shape_config": dict(
            cfg,
            params_total=params["total"],
            params_active_per_token=params["active_per_token"],
            draft_ffn=draft_cfg["ffn"],
            draft_vocab=DRAFT_VOCAB,
        ),
        "target": target_ms,
        "draft": draft_ms,
        "gpm_plain": gpm_plain,
        "derived": derive(target_ms, draft_ms, batches),
        "measurement": {
            "distinct_weight_layers": model.layers.distinct,
            "moe_impl": model.layers.moe_impl,
            "kv_buffers_and_experts_touched": notes,
            "seconds": round(time.perf_counter() - t0, 1),
        },
    }
    del model, draft
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return run


PROBE_POINTS = [(1, 1), (1, 5), (16, 5), (64, 1), (64, 3), (64, 5), (64, 8), (256, 1), (256, 3), (256, 5), (256, 8)]


def probe_variants(
    reference_path: str,
    device: torch.device,
    args: argparse.Namespace,
    shape: dict = SHAPES["llama3-8b"],
    context: int = 1024,
) -> tuple[str, dict]:
    """Time the Llama-3-8B shape under each variant at PROBE_POINTS and pick the one closest (RMS log error)
    to the shipped reference table at context 1024."""
    with open(reference_path) as fh:
        ref = next(r for r in json.load(fh)["runs"] if r["context"] == context)["target"]
    generator = torch.Generator().manual_seed(0)
    model = Model(shape, device, args.weight_budget_gb * 1e9)
    points = [(b, q) for b, q in PROBE_POINTS if f"{b}x{q}" in ref]
    scores: dict[str, dict] = {}
    for name, variant in VARIANTS.items():
        VARIANT.clear()
        VARIANT.update(variant)
        times = {}
        for b, q in points:
            fn, _ = model.step_fn(b, q, context, args.kv_budget_gb * 1e9, generator)
            times[f"{b}x{q}"] = round(time_graph(fn, device, 0.1, 10), 3)
            del fn
        errors = [math.log(times[k] / ref[k]) for k in times]
        rms = math.sqrt(sum(e * e for e in errors) / len(errors))
        scores[name] = {"rms_log_error": round(rms, 4), "ms": times, "reference_ms": {k: ref[k] for k in times}}
        log(
            f"variant {name}: RMS log error {rms:.3f}  "
            + " ".join(f"{k}={v:.2f}/{ref[k]:.2f}" for k, v in times.items())
        )
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    best = min(scores, key=lambda n: scores[n]["rms_log_error"])
    return best, scores


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="llama3-8b,qwen2.5-1.5b,llama2-7b,qwen2.5-14b,qwen3-30b-a3b,codellama-34b")
    parser.add_argument("--contexts", default="1024")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument(
        "--query-lengths",
        default=",".join(map(str, QUERY_LENGTHS)),
        help="q per sequence to time (1 = plain decode; gamma + 1 = its verify pass); derived skips a missing gamma",
    )
    parser.add_argument("--out", required=True, help="output folder: one <gpu>-<shape>-ctx<C>.json per run")
    parser.add_argument("--seconds-per-point", type=float, default=0.25, help="timed replay time per point")
    parser.add_argument("--max-reps", type=int, default=30)
    parser.add_argument("--weight-budget-gb", type=float, default=80.0)
    parser.add_argument("--kv-budget-gb", type=float, default=24.0)
    parser.add_argument("--deadline-s", type=float, default=480.0, help="start no new run after this long")
    parser.add_argument("--no-gpm", action="store_true")
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="gqa", help="verify attention / RoPE variant")
    parser.add_argument(
        "--match-reference",
        metavar="JSON",
        help="probe every variant on llama3-8b against this reference table, then use the closest",
    )
    parser.add_argument("--moe-impl", choices=("grouped_mm", "per_expert_loop"), default="grouped_mm")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU (fp32 SDPA), to test the code")
    args = parser.parse_args()

    started = time.perf_counter()
    batches = [int(b) for b in args.batches.split(",")]
    query_lengths = [int(q) for q in args.query_lengths.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    shapes = args.shapes.split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shapes {unknown}; known: {sorted(SHAPES)}")
    if args.dry_run:
        device = torch.device("cpu")
        gpu_name = "cpu (dry run)"
        shapes_cfg = {"tiny": TINY, "tiny-moe": TINY_MOE}
        batches, contexts = [1, 2], [16]
    else:
        if not torch.cuda.is_available():
            print("no CUDA device; use --dry-run to test on CPU", file=sys.stderr)
            return 2
        device = torch.device("cuda")
        gpu_name = torch.cuda.get_device_name(device)
        shapes_cfg = {s: SHAPES[s] for s in shapes}
    gpm = None if (args.no_gpm or device.type != "cuda") else GpmReader()
    os.makedirs(args.out, exist_ok=True)
    provenance = {
        "gpu": gpu_name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "script": "bench/measure_steptimes.py",
        "command": " ".join(sys.argv),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        provenance["sm_count"] = props.multi_processor_count
        provenance["driver"] = driver_version()
    log(f"device {gpu_name}, torch {torch.__version__}")
    VARIANT.update(VARIANTS[args.variant])
    provenance["variant"] = args.variant
    if args.match_reference:
        if args.dry_run:
            best, scores = probe_variants(args.match_reference, device, args, TINY, 16)
        else:
            best, scores = probe_variants(args.match_reference, device, args)
        VARIANT.clear()
        VARIANT.update(VARIANTS[best])
        provenance["variant"] = best
        provenance["variant_probe"] = scores
        log(f"closest to the reference: {best}")
    provenance["variant_settings"] = dict(VARIANT)
    provenance["verify_kernel"] = verify_kernel(VARIANT)
    failures = 0
    for name, cfg in shapes_cfg.items():
        for context in contexts:
            if time.perf_counter() - started > args.deadline_s:
                log(f"deadline reached: skipping {name} ctx {context}")
                failures += 1
                continue
            try:
                run = measure(name, cfg, context, batches, query_lengths, device, args, gpm)
            except Exception:
                failures += 1
                log(f"{name} ctx {context} FAILED:\n{traceback.format_exc()}")
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            doc = {"gpu": gpu_name, "torch": torch.__version__, "provenance": provenance, "runs": [run]}
            slug = re.sub(r"[^a-z0-9.]+", "-", gpu_name.lower().replace("nvidia ", "")).strip("-")
            suffix = "-packed" if provenance["verify_kernel"] == "packed" else ""
            path = os.path.join(args.out, f"{slug}-{name}-ctx{context}{suffix}.json")
            with open(path, "w") as fh:
                json.dump(doc, fh, indent=1)
            log(f"wrote {path} ({run['measurement']['seconds']} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
