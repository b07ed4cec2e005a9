"""Which attention kernel an engine's verify pass runs: packed (the KV cache read once per KV head) or unpacked
(once per query head).

A verify pass scores q = k + 1 new tokens per sequence. An engine whose kernel packs each KV head's GQA group of
query heads with those q tokens into the rows of one tile reads the cache once, as plain decoding does; a
kernel that runs one work item per *query* head reads it GQA-ratio times. At long context that factor decides
whether speculation still pays (docs/crossover.md, "The verify kernel").

Engine facts (file and version):
- vLLM 0.32.0, `vllm/platforms/cuda.py` `_get_backend_priorities`: for a non-MLA model on compute capability 9
  (Hopper) FLASH_ATTN is tried first, then FLASHINFER. `vllm/v1/attention/backends/fa_utils.py`
  `get_flash_attn_version`: FA3 on Hopper. `vllm/vllm_flash_attn/flash_attn_interface.py` calls FA3 with
  `cu_seqlens_q` (variable-length queries) and `pack_gqa=None`, leaving it to FA3's heuristic.
- FlashAttention-3, Dao-AILab/flash-attention `hopper/heuristics.h` (commit 13d0fd9c) `should_pack_gqa`:
  `if (varlen_q) return true;`, so every vLLM and SGLang call packs the group.
- SGLang 0.5.23, `sglang/srt/arg_groups/model_override_base.py` `get_default_attn_backend`: on Hopper (CUDA >= 12.3)
  an MHA-architecture model (Llama, Qwen: GQA included) gets `fa3` unless EAGLE runs with topk > 1 or page
  size > 1, else `flashinfer`; `sglang/srt/layers/attention/flashattention_backend.py` runs target verify
  through FA3 with `cu_seqlens_q`.
- FlashInfer, `include/flashinfer/attention/prefill.cuh` (commit 00b57feb) `BatchPrefillWithPagedKVCacheDevice`:
  one thread block per (request, query tile, KV head), its query rows `qo_len x group_size` of that KV head
  (`packed_qo_len`), so FlashInfer packs too.
Elsewhere (another GPU generation, another engine, an engine not yet detected) the kernel is not known here.
"""

from __future__ import annotations

from dataclasses import dataclass

from specwatch.config_schema import ATTENTION_KERNELS as SETTINGS  # auto, packed, unpacked

PACKED = "packed"
UNPACKED = "unpacked"
UNKNOWN = "unknown"
AUTO = "auto"

# Engines whose Hopper default backends pack GQA (module docstring).
PACKING_ENGINES = ("vllm", "sglang")
HOPPER = ("H100-SXM", "H100-PCIE", "H200")


@dataclass(frozen=True)
class KernelAssumption:
    kernel: str  # PACKED, UNPACKED or UNKNOWN (the estimate's band then covers both)
    basis: str  # why, one line


def resolve(setting: str, engine_kind: str, gpu: str) -> KernelAssumption:
    """The verify kernel a route's estimate assumes: the route's setting when not `auto`, else the engine's
    Hopper default (packed for vLLM and SGLang), else unknown."""
    if setting not in SETTINGS:
        raise ValueError(f"attention_kernel {setting!r}: use one of {', '.join(SETTINGS)}")
    if setting != AUTO:
        return KernelAssumption(setting, "set by the route's crossover.attention_kernel")
    engine = engine_kind.lower()
    if engine in PACKING_ENGINES and gpu in HOPPER:
        return KernelAssumption(PACKED, f"{engine} on {gpu}: FlashAttention-3 / FlashInfer pack GQA by default")
    if not engine or engine == "auto":
        return KernelAssumption(UNKNOWN, "engine not detected yet: the band covers packed and unpacked")
    if engine in PACKING_ENGINES:
        return KernelAssumption(UNKNOWN, f"{engine} on {gpu}: backend not known here, the band covers both")
    return KernelAssumption(UNKNOWN, f"{engine}: verify kernel not known here, the band covers both")
