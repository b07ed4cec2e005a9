"""Build the testbed's tiny models: a seeded random Llama target, a tokenizer trained here, and drafters
(and the successor target and drafters of successor.py, whose acceptance is known exactly).

No model hub is reachable, so every model is made locally and reproducibly (same seed, same bytes):
- the **tokenizer** is a byte-level BPE trained on the text in `CORPUS` below;
- the **target** is a random `LlamaForCausalLM` (2 layers, hidden 256) with that tokenizer's vocabulary;
- a **drafter** is the target with seeded Gaussian noise added to every weight, `noise` times that weight
  tensor's own standard deviation. Noise 0 is an exact copy (every draft token accepted under greedy
  decoding); more noise accepts less; a differently seeded random model accepts almost nothing.

This module runs with the *engine* venv's Python (it needs torch, transformers and tokenizers, which the
daemon's venv does not have): `python -m testbed.make_models DEST --drafter-noise 0.05 ...`.
It imports nothing else from specwatch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

SEED = 20261202
VOCAB_SIZE = 1024
# Enough text for a byte-level BPE to learn common English and code fragments. Written for this file.
CORPUS = """
A route is one engine endpoint, or a label set on one. Speculative decoding drafts a few tokens cheaply and
lets the target model verify them in one pass; accepted tokens are free, rejected ones cost compute.
At low batch the decode step waits on memory bandwidth and speculation wins. As the batch grows the GPU becomes
compute-bound, verification displaces real work, and past the crossover batch size speculation is slower.
def fibonacci(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a
class Counter:
    def __init__(self) -> None:
        self.value = 0
    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        self.value += amount
for (int i = 0; i < n; i++) { total += values[i]; }
func handler(w http.ResponseWriter, r *http.Request) { json.NewEncoder(w).Encode(status) }
Question: a train travels 180 km in 2.5 hours. What is its average speed? Answer: 72 km per hour.
Solve for x: 3x + 7 = 2x - 5, so x = -12. The sum of the first ten odd numbers is one hundred.
Summarise the incident: acceptance fell from 0.71 to 0.55 after the drafter was replaced; latency rose by a
third; the on-call engineer rolled back the drafter and acceptance recovered within five minutes.
Dear team, the production freeze starts on Friday. Please merge only fixes that have a reviewed rollback plan.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How vexingly quick daft
zebras jump. Sphinx of black quartz, judge my vow. 0 1 2 3 4 5 6 7 8 9 10 100 1000 0.5 0.85 1.0
"""


def build_tokenizer(dest: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines() * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(dest)
    return tok.get_vocab_size()


def llama_config(vocab: int, *, hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int) -> Any:
    """A float32 Llama config with the tiny tokenizer's special tokens and untied embeddings."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )


def build_target(dest: Path, vocab_size: int, seed: int = SEED) -> None:
    import torch
    from transformers import LlamaForCausalLM

    config = llama_config(vocab_size, hidden=256, intermediate=512, layers=2, heads=4, kv_heads=2)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    # The default init (std 0.02) gives near-flat logits, so greedy outputs collapse onto a few tokens.
    # A wider init makes outputs vary with the prompt, as a trained model's do.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.25 if "embed" in name or "lm_head" in name else 0.08)
    model.save_pretrained(dest, safe_serialization=True)


def build_drafter(target: Path, dest: Path, noise: float, seed: int) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(target, torch_dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if noise > 0 and param.dim() > 1:
                param.add_(torch.randn(param.shape, generator=generator) * param.std() * noise)
    model.save_pretrained(dest, safe_serialization=True)
    AutoTokenizer.from_pretrained(target).save_pretrained(dest)


def build_successor(target: Path, dest: Path, wrong_fraction: float) -> None:
    """A model that maps token t to t + 1 whatever came before, or t + 2 on the tokens of
    `successor.wrong_tokens(vocab, wrong_fraction)` (a drafter): see testbed/successor.py.

    Attention and MLP outputs are zeroed (o_proj, down_proj), so the final hidden state is the normalised
    embedding of the current token; the LM head row of each proposed successor is that embedding, so its logit
    stands about 4 standard deviations above every other token's (random 256-d embeddings are near orthogonal)."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from testbed.successor import wrong_tokens

    model = LlamaForCausalLM.from_pretrained(target, torch_dtype=torch.float32)
    vocab = model.config.vocab_size
    wrong = wrong_tokens(vocab, wrong_fraction)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed = model.model.embed_tokens.weight
        unit = embed / embed.norm(dim=1, keepdim=True)
        head = torch.zeros_like(model.lm_head.weight)
        for token in range(vocab):
            head[(token + (2 if token in wrong else 1)) % vocab] += unit[token]
        model.lm_head.weight.copy_(head)
    model.save_pretrained(dest, safe_serialization=True)
    AutoTokenizer.from_pretrained(target).save_pretrained(dest)


# A successor target whose forward is compute-heavy for a CPU: its zeroed o_proj/down_proj still run their
# GEMMs, so a step costs what a dense model of this width costs while the mapping stays exact. Its drafter is
# the same width with one layer. Sixteen layers make the target's forward cost about ten of the drafter's (a
# speedup near 2 at batch 1); on two cores the verify pass of about ten sequences is compute-bound.
HEAVY_HIDDEN = 1024
HEAVY_INTERMEDIATE = 2816
HEAVY_LAYERS = 16


def build_heavy_successor(target: Path, dest: Path, wrong_fraction: float, layers: int) -> None:
    """A successor model (see `build_successor`) of width HEAVY_HIDDEN and `layers` layers, seeded, with the
    tokenizer of the tiny target."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    vocab = len(json.loads((target / "tokenizer.json").read_text())["model"]["vocab"])
    config = llama_config(
        vocab, hidden=HEAVY_HIDDEN, intermediate=HEAVY_INTERMEDIATE, layers=layers, heads=8, kv_heads=2
    )
    torch.manual_seed(SEED + 11)  # the same embedding for the target and every drafter
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.25 if "embed" in name or "lm_head" in name else 0.08)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest, safe_serialization=True)
    AutoTokenizer.from_pretrained(target).save_pretrained(dest)
    build_successor(dest, dest, wrong_fraction)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="build the testbed's tiny target and drafters")
    parser.add_argument("dest", type=Path)
    parser.add_argument(
        "--drafter-noise",
        type=float,
        action="append",
        default=[],
        help="add a drafter with this relative weight noise (repeatable)",
    )
    parser.add_argument("--unrelated", action="store_true", help="also build an unrelated random drafter")
    parser.add_argument(
        "--successor-drafter",
        type=float,
        action="append",
        default=[],
        help="also build the successor target and a successor drafter with this wrong fraction",
    )
    parser.add_argument(
        "--heavy-target-layers",
        type=int,
        default=HEAVY_LAYERS,
        help=f"layers of the heavy successor target (default {HEAVY_LAYERS})",
    )
    parser.add_argument(
        "--heavy-successor-drafter",
        type=float,
        action="append",
        default=[],
        help="also build the heavy successor target and a one-layer heavy drafter with this wrong fraction",
    )
    args = parser.parse_args(argv)

    target = args.dest / "target"
    if not (target / "model.safetensors").exists():
        target.mkdir(parents=True, exist_ok=True)
        vocab = build_tokenizer(target)
        build_target(target, vocab)
    built: dict[str, Any] = {"target": str(target), "drafters": {}}
    for noise in args.drafter_noise:
        dest = args.dest / f"drafter-noise-{noise:g}"
        if not (dest / "model.safetensors").exists():
            build_drafter(target, dest, noise, seed=SEED + 1)
        built["drafters"][f"{noise:g}"] = str(dest)
    if args.unrelated:
        dest = args.dest / "drafter-unrelated"
        if not (dest / "model.safetensors").exists():
            dest.mkdir(parents=True, exist_ok=True)
            vocab = json.loads((target / "tokenizer.json").read_text())["model"]["vocab"]
            build_target(dest, len(vocab), seed=SEED + 7)
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(target).save_pretrained(dest)
        built["unrelated"] = str(dest)
    if args.successor_drafter:
        successor = args.dest / "successor-target"
        if not (successor / "model.safetensors").exists():
            build_successor(target, successor, 0.0)
        built["successor"] = {"target": str(successor), "drafters": {}}
        for fraction in args.successor_drafter:
            dest = args.dest / f"successor-wrong-{fraction:g}"
            if not (dest / "model.safetensors").exists():
                build_successor(target, dest, fraction)
            built["successor"]["drafters"][f"{fraction:g}"] = str(dest)
    if args.heavy_successor_drafter:
        layers = args.heavy_target_layers
        heavy = args.dest / f"heavy-successor-target-{layers}-layers"
        if not (heavy / "model.safetensors").exists():
            build_heavy_successor(target, heavy, 0.0, layers)
        built["heavy_successor"] = {"target": str(heavy), "drafters": {}}
        for fraction in args.heavy_successor_drafter:
            dest = args.dest / f"heavy-successor-wrong-{fraction:g}"
            if not (dest / "model.safetensors").exists():
                build_heavy_successor(target, dest, fraction, 1)
            built["heavy_successor"]["drafters"][f"{fraction:g}"] = str(dest)
    json.dump(built, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
