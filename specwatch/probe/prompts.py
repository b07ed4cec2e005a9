"""Canary probe prompt sets: the built-in one shipped in `specwatch/data/probe_prompts.json`, or a file.

A prompt set is a JSON document `{"prompts": [{"id": ..., "kind": ..., "prompt": ...}, ...]}` (a YAML file
of the same shape works too). Its hash covers the ids and texts, so a fingerprint learned on one set is never
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
    text: str


@dataclass(frozen=True)
class PromptSet:
    name: str
    prompts: tuple[Prompt, ...]

    @property
    def hash(self) -> str:
        """First 12 hex digits of sha256 over the ids and texts, in order."""
        digest = hashlib.sha256()
        for p in self.prompts:
            digest.update(p.id.encode() + b"\0" + p.text.encode() + b"\0")
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
        if not isinstance(text, str) or not text.strip():
            problems.append(f"prompts[{i}].prompt: must be a non-empty string")
            continue
        if not isinstance(kind, str):
            problems.append(f"prompts[{i}].kind: must be a string")
            continue
        prompts.append(Prompt(pid, kind, text))
    if problems:
        raise PromptSetError(f"{name}: " + "; ".join(problems))
    return PromptSet(name, tuple(prompts))
