"""Start and stop real llama.cpp `llama-server` processes on loopback (the build of testbed/llamacpp_build.py).

A server keeps its port across restarts, so a specwatch route pointed at it sees what a real node sees when
llama-server is redeployed: the same URL, counters starting again from zero, maybe another drafter.

Flags of the pinned build (b11434) that matter, with where they are defined in the tree:
- `--spec-draft-model`/`-md` loads a drafter, but llama-server drafts with it only when `--spec-type
  draft-simple` is given too (common/arg.cpp, `--spec-type`; common/speculative.cpp, "draft-simple");
- the draft length is `--spec-draft-n-max`: `--draft-max` is removed and errors (common/arg.cpp, "removed params");
- `--metrics` enables `/metrics`; `/props` is always readable.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from testbed.server_process import ServerProcess

START_TIMEOUT_SECONDS = 300.0


class LlamaServerError(RuntimeError):
    """A server failed to start or died; the message ends with the tail of its log."""


@dataclass(frozen=True)
class LlamaServerSpec:
    """What to serve: a target, optionally a drafter drafting up to `draft_max` tokens a step."""

    model: Path
    drafter: Path | None = None
    draft_max: int = 4
    alias: str = "tiny"
    ctx: int = 1024
    parallel: int = 2
    threads: int = 1
    extra_args: tuple[str, ...] = ()

    def with_drafter(self, drafter: Path | None) -> "LlamaServerSpec":
        return replace(self, drafter=drafter)

    def argv(self, binary: Path, port: int) -> list[str]:
        args = [
            str(binary),
            "--model",
            str(self.model),
            "--alias",
            self.alias,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--metrics",
            "--ctx-size",
            str(self.ctx),
            "--parallel",
            str(self.parallel),
            "--threads",
            str(self.threads),
            "--threads-batch",
            str(self.threads),
            "--no-warmup",
        ]
        if self.drafter is not None:
            args += [
                "--spec-draft-model",
                str(self.drafter),
                "--spec-type",
                "draft-simple",
                "--spec-draft-n-max",
                str(self.draft_max),
                "--spec-draft-n-min",
                "0",
                "--spec-draft-p-min",
                "0",
                "--spec-draft-threads",
                str(self.threads),
            ]
        return args + list(self.extra_args)


class LlamaServer(ServerProcess[LlamaServerSpec]):
    """One real llama-server. Use as a context manager, or start() and stop(); restart() swaps the spec."""

    error = LlamaServerError
    log_prefix = "llama-server"
    start_timeout = START_TIMEOUT_SECONDS
    poll_seconds = 0.5

    def __init__(self, binary: Path, spec: LlamaServerSpec, workdir: Path, port: int | None = None) -> None:
        super().__init__(spec, workdir, port)
        self.binary = binary

    def argv(self) -> list[str]:
        return self.spec.argv(self.binary, self.port)

    def describe(self) -> str:
        return f"llama-server on {self.port}"

    def __enter__(self) -> "LlamaServer":
        self.start()
        return self

    def complete(self, prompt: str, n_predict: int = 32, timeout: float = 120.0) -> dict[str, Any]:
        """One greedy completion; the answer carries `timings` (with `draft_n`/`draft_n_accepted` when drafted)."""
        body = json.dumps(
            {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1, "cache_prompt": False}
        ).encode()
        req = urllib.request.Request(
            f"{self.base_url}/completion", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return json.loads(response.read())


PROMPTS = (
    "The quick brown fox",
    "def fibonacci(n):",
    "Speculative decoding drafts",
    "Dear team, the freeze",
    "0 1 2 3 4 5",
    "Summarise the incident:",
)


def drive(server: LlamaServer, requests: int, n_predict: int = 32) -> list[dict[str, Any]]:
    """`requests` greedy completions one after another, cycling through PROMPTS; their answers."""
    return [server.complete(PROMPTS[j % len(PROMPTS)], n_predict) for j in range(requests)]


def measure_baseline(server: LlamaServer, requests: int = 12, n_predict: int = 32) -> tuple[float, float]:
    """(acceptance, design effect) of greedy requests, from each answer's own `timings` (draft_n,
    draft_n_accepted): the pooled rate and the Pearson dispersion of each request's accepted count around it."""
    pairs = []
    for answer in drive(server, requests, n_predict):
        timings = answer.get("timings", {})
        if timings.get("draft_n", 0) > 0:
            pairs.append((timings["draft_n"], timings["draft_n_accepted"]))
    if len(pairs) < 2:
        raise RuntimeError("fewer than two requests drafted: is the server started with a drafter?")
    drafted = sum(d for d, _ in pairs)
    rate = sum(a for _, a in pairs) / drafted
    if not 0.0 < rate < 1.0:
        return rate, 1.0
    chi2 = sum((a - d * rate) ** 2 / (d * rate * (1.0 - rate)) for d, a in pairs)
    return rate, max(1.0, chi2 / (len(pairs) - 1))


class Load:
    """Greedy requests one after another on a thread, riding out the engine's restarts; `ok` counts answers."""

    def __init__(self, server: LlamaServer, n_predict: int = 32) -> None:
        self.server = server
        self.n_predict = n_predict
        self.ok = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="llamacpp-load")

    def _run(self) -> None:
        j = 0
        while not self._stop.is_set():
            try:
                self.server.complete(PROMPTS[j % len(PROMPTS)], self.n_predict, timeout=30)
                self.ok += 1
            except (OSError, ValueError):  # restarting, or a cut answer: try again shortly
                self._stop.wait(0.2)
            j += 1

    def start(self) -> "Load":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def __enter__(self) -> "Load":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
