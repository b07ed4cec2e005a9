"""Canary probe prompt sets: the built-in one shipped in `specwatch/data/probe_prompts.json`, or a file.

A prompt set is a JSON document `{"prompts": [{"id": ..., "kind": ..., "prompt": ...}, ...]}` (a YAML file
of the same shape works too). A `prompt` is a text or a list of token ids, sent as they are (vLLM's completions
API takes either; SGLang's `/generate` gets ids as `input_ids`): ids pin exactly what the target sees, whatever
the tokenizer or chat template. Its hash covers the ids and prompts, so a fingerprint learned on one set is never
compared with rounds of another.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

BUILTIN = "builtin"
MAX_PROMPTS = 256


class PromptSetError(ValueError):
    """A prompt file that cannot be used; the message says which entry and why."""


@dataclass(frozen=True)
class Prompt:
    id: str
    kind: str
    text: str = ""  # "" when the prompt is given as token ids
    token_ids: tuple[int, ...] = ()

    @property
    def payload(self) -> str | list[int]:
        """The prompt as the completions API takes it: a string or a list of token ids."""
        return list(self.token_ids) if self.token_ids else self.text


@dataclass(frozen=True)
class PromptSet:
    name: str
    prompts: tuple[Prompt, ...]

    @property
    def hash(self) -> str:
        """First 12 hex digits of sha256 over the ids and prompts, in order (token ids behind a \\x01 marker,
        which no text prompt starts with, so text prompts hash as they always have)."""
        digest = hashlib.sha256()
        for p in self.prompts:
            body = b"\x01" + ",".join(map(str, p.token_ids)).encode() if p.token_ids else p.text.encode()
            digest.update(p.id.encode() + b"\0" + body + b"\0")
        return digest.hexdigest()[:12]


def load_prompt_set(source: str) -> PromptSet:
    """`builtin` or a path to a JSON/YAML prompt file. Raises PromptSetError listing every problem."""
    if source == BUILTIN:
        text = resources.files("specwatch").joinpath("data/probe_prompts.json").read_text(encoding="utf-8")
        return parse_prompt_set(json.loads(text), BUILTIN)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptSetError(f"{source}: cannot read prompt file: {exc}") from exc
    try:
        raw = yaml.safe_load(text)  # YAML is a superset of JSON
    except yaml.YAMLError as exc:
        raise PromptSetError(f"{source}: not valid JSON or YAML: {exc}") from exc
    return parse_prompt_set(raw, source)


def parse_prompt_set(raw: Any, name: str) -> PromptSet:
    problems: list[str] = []
    entries = raw.get("prompts") if isinstance(raw, dict) else None
    if not isinstance(entries, list) or not entries:
        raise PromptSetError(f"{name}: needs a non-empty `prompts` list")
    if len(entries) > MAX_PROMPTS:
        problems.append(f"{len(entries)} prompts; at most {MAX_PROMPTS} (each costs a request per round)")
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            problems.append(f"prompts[{i}]: must be a mapping with id and prompt")
            continue
        pid, text, kind = entry.get("id"), entry.get("prompt"), entry.get("kind", "")
        if not isinstance(pid, str) or not pid:
            problems.append(f"prompts[{i}].id: must be a non-empty string")
            continue
        if pid in seen:
            problems.append(f"prompts[{i}].id: duplicate id {pid!r}")
        seen.add(pid)
        if not isinstance(kind, str):
            problems.append(f"prompts[{i}].kind: must be a string")
            continue
        if isinstance(text, list):
            if not text or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in text):
                problems.append(f"prompts[{i}].prompt: a token-id prompt must be a non-empty list of integers >= 0")
                continue
            prompts.append(Prompt(pid, kind, token_ids=tuple(text)))
        elif isinstance(text, str) and text.strip():
            prompts.append(Prompt(pid, kind, text))
        else:
            problems.append(f"prompts[{i}].prompt: must be a non-empty string or a list of token ids")
    if problems:
        raise PromptSetError(f"{name}: " + "; ".join(problems))
    return PromptSet(name, tuple(prompts))
