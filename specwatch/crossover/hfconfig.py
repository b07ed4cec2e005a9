"""Read a model shape from a Hugging Face `config.json` (Llama, Qwen, Mistral and similar dense decoders)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from specwatch.crossover.inputs import ModelShape


def shape_from_hf_config(raw: Mapping[str, Any]) -> ModelShape:
    """Raises ValueError naming the missing key. Multimodal configs are read from their `text_config`."""
    cfg = raw.get("text_config", raw) if isinstance(raw.get("text_config"), dict) else raw

    def need(*keys: str) -> int:
        for key in keys:
            value = cfg.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        raise ValueError(f"config.json has no positive integer {' / '.join(keys)}")

    hidden = need("hidden_size", "n_embd", "d_model")
    heads = need("num_attention_heads", "n_head")
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    return ModelShape(
        layers=need("num_hidden_layers", "n_layer"),
        hidden_size=hidden,
        kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        intermediate_size=need("intermediate_size", "ffn_dim", "n_inner"),
        vocab_size=need("vocab_size"),
        attention_heads=heads,
    )


def load_hf_config(path: str | Path) -> ModelShape:
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read a Hugging Face config: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object")
    try:
        return shape_from_hf_config(raw)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc
