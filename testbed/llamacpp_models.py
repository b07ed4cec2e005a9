"""Tiny GGUF models for llama-server: a seeded random Llama target and drafters at known acceptance.

Written with llama.cpp's own GGUF writer (`gguf-py` in the pinned tree that testbed/llamacpp_build.py unpacks),
with numpy's seeded generator, so the same seed gives the same bytes on every build:
- the **vocabulary** is GPT-2 style byte-level BPE: the 256 byte symbols, a few merges and `<s>`/`</s>`;
  target and drafters share it (llama-server refuses a drafter whose vocabulary differs);
- the **target** is a random Llama (2 layers, width 64): a few hundred kB, fast on 2 cores;
- a **drafter** is the target with seeded Gaussian noise added to every weight, `noise` times that tensor's
  own standard deviation: noise 0 is an exact copy (every draft accepted under greedy decoding), more noise
  accepts less, and an independently seeded random model accepts almost nothing.

    python -m testbed.llamacpp_models DEST       # writes DEST/target.gguf and DEST/drafter-*.gguf
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

SEED = 20261203
N_EMBD = 64
N_LAYER = 2
N_HEAD = 4
N_FF = 192
N_CTX = 1024
# Drafters written by `write_all`: name -> noise (None: an independent random model, seeded differently).
DRAFTERS: dict[str, float | None] = {"copy": 0.0, "small": 0.02, "large": 0.05, "random": None}
MERGES = ("Ġ t", "t h", "Ġt h", "e r", "i n", "Ġ a", "o n", "r e", "Ġ s", "e n", "a t", "o r", "Ġ c", "e s")


def _gguf() -> Any:
    """llama.cpp's gguf package, from the pinned tree (built or not, the source is unpacked first)."""
    from testbed import llamacpp_build

    path = str(llamacpp_build.gguf_py_dir())
    if not llamacpp_build.gguf_py_dir().is_dir():
        llamacpp_build.unpack(llamacpp_build.fetch_sdist())
    if path not in sys.path:
        sys.path.insert(0, path)
    import gguf  # type: ignore[import-not-found]  # gguf-py of the unpacked tree, put on sys.path above

    logging.getLogger("gguf").setLevel(logging.WARNING)  # it logs every file it writes at info
    return gguf


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-in for each byte (its `bytes_to_unicode`), in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    table: dict[int, str] = {}
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): byte symbols, merged pairs, then the two control tokens."""
    tokens = _byte_symbols() + [m.replace(" ", "") for m in MERGES] + ["<s>", "</s>"]
    types = [1] * (len(tokens) - 2) + [3, 3]  # 1 normal, 3 control
    return tokens, types, list(MERGES)


def _weights(seed: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    n_vocab = len(vocabulary()[0])

    def mat(rows: int, cols: int) -> Any:
        # GGUF shapes are (cols, rows) in numpy order: llama.cpp's ne0 is the input width.
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    w: dict[str, Any] = {"token_embd.weight": mat(n_vocab, N_EMBD)}
    for i in range(N_LAYER):
        w[f"blk.{i}.attn_norm.weight"] = np.ones(N_EMBD, dtype=np.float32)
        w[f"blk.{i}.attn_q.weight"] = mat(N_EMBD, N_EMBD)
        w[f"blk.{i}.attn_k.weight"] = mat(N_EMBD, N_EMBD)
        w[f"blk.{i}.attn_v.weight"] = mat(N_EMBD, N_EMBD)
        w[f"blk.{i}.attn_output.weight"] = mat(N_EMBD, N_EMBD)
        w[f"blk.{i}.ffn_norm.weight"] = np.ones(N_EMBD, dtype=np.float32)
        w[f"blk.{i}.ffn_gate.weight"] = mat(N_FF, N_EMBD)
        w[f"blk.{i}.ffn_up.weight"] = mat(N_FF, N_EMBD)
        w[f"blk.{i}.ffn_down.weight"] = mat(N_EMBD, N_FF)
    w["output_norm.weight"] = np.ones(N_EMBD, dtype=np.float32)
    # A sharper output layer makes greedy choices robust to the float noise of batched verification.
    w["output.weight"] = mat(n_vocab, N_EMBD) * 4.0
    return w


def _noisy(weights: dict[str, Any], noise: float, seed: int) -> dict[str, Any]:
    import numpy as np

    if noise == 0:
        return dict(weights)
    rng = np.random.default_rng(seed)
    out = {}
    for name in sorted(weights):
        t = weights[name]
        scale = float(t.std()) or 1.0
        out[name] = (t + rng.standard_normal(t.shape) * noise * scale).astype(np.float32)
    return out


def write_model(path: Path, weights: dict[str, Any], name: str) -> Path:
    gguf = _gguf()
    tokens, types, merges = vocabulary()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name(name)
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(0)  # all float32
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(len(tokens) - 2)
    writer.add_eos_token_id(len(tokens) - 1)
    writer.add_add_bos_token(False)
    for tensor_name, tensor in weights.items():
        writer.add_tensor(tensor_name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return path


def write_all(dest: Path, seed: int = SEED) -> dict[str, Path]:
    """target.gguf and drafter-<name>.gguf for each of DRAFTERS; files already there are kept (same bytes)."""
    out = {"target": dest / "target.gguf"}
    out.update({name: dest / f"drafter-{name}.gguf" for name in DRAFTERS})
    if all(p.is_file() for p in out.values()):
        return out
    target = _weights(seed)
    write_model(out["target"], target, "specwatch-tiny-target")
    for j, (name, noise) in enumerate(DRAFTERS.items()):
        weights = _weights(seed + 1000) if noise is None else _noisy(target, noise, seed + 1 + j)
        write_model(out[name], weights, f"specwatch-tiny-drafter-{name}")
    return out


def write_drafter(path: Path, noise: float, seed: int = SEED) -> Path:
    """One more drafter of the same target at `noise` (bench/gate_power.py sweeps it); kept when already there."""
    if not path.is_file():
        write_model(path, _noisy(_weights(seed), noise, seed + 7919), f"specwatch-tiny-drafter-{noise:g}")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dest", type=Path)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    for name, path in write_all(args.dest, args.seed).items():
        print(f"{name}: {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
