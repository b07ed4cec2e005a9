"""Start and stop real vLLM OpenAI servers (the CPU build) on loopback, each in its own process group.

A server keeps its port across restarts, so a specwatch route pointed at it sees what a real node sees when
an engine is redeployed: the same URL, counters starting again from zero, maybe a new drafter or model name.
Everything the engine writes (its log, ZMQ sockets, caches, temp files) goes under the server's own workdir.

Settings that make vLLM fit a 2-core test machine:
- `VLLM_CPU_KVCACHE_SPACE` (GiB): without it the CPU worker asks for most of RAM and may refuse to start;
- `OMP_NUM_THREADS=2`, threads not pinned to cores (`VLLM_CPU_OMP_THREADS_BIND=nobind`), and
  `--enforce-eager` (no torch.compile: start-up in about a minute instead of many);
- float32 weights: the tiny models are float32, and bf16 matmuls need AVX-512 BF16 to be fast;
- the model runner inside the engine-core process (`--distributed-executor-backend uni` with
  `VLLM_ENABLE_V1_MULTIPROCESSING=0`): one Python process fewer to start and import vLLM into, which takes
  30-40 s off each start on 2 cores (39-53 s against 78-83 s at load 4-6). The CPU platform replaces `uni` with
  `mp` unless that variable is 0 (vLLM 0.32.0 `vllm/platforms/cpu.py` l.333-341); the API server still runs the
  engine core in a process of its own (`vllm/v1/engine/async_llm.py` l.184 `make_async_mp_client`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from testbed.engine_env import EngineEnv
from testbed.server_process import ServerProcess, free_port, launch

__all__ = ["VllmServer", "VllmServerError", "VllmServerSpec", "free_port", "launch"]

START_TIMEOUT_SECONDS = 900.0  # a loaded 2-core machine has been seen to take several minutes


class VllmServerError(RuntimeError):
    """A server failed to start or died; the message ends with the tail of its log."""


@dataclass(frozen=True)
class VllmServerSpec:
    """What to serve. `speculative` is vLLM's `--speculative-config` (None: no speculation)."""

    model: Path
    served_model_name: str = "tiny"
    speculative: dict[str, Any] | None = None
    max_num_seqs: int = 16
    max_model_len: int = 1024
    kv_cache_gib: int = 1
    per_request_spec_metrics: str = ""  # "" | "summary" | "detailed" (vLLM >= 0.32)
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def with_speculative(self, **changes: Any) -> "VllmServerSpec":
        return replace(self, speculative={**(self.speculative or {}), **changes})

    def argv(self, python: Path, port: int) -> list[str]:
        args = [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            "--served-model-name",
            self.served_model_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            "float32",
            "--enforce-eager",
            "--distributed-executor-backend",
            "uni",
            "--max-model-len",
            str(self.max_model_len),
            "--max-num-seqs",
            str(self.max_num_seqs),
        ]
        if self.speculative is not None:
            args += ["--speculative-config", json.dumps(self.speculative)]
        if self.per_request_spec_metrics:
            args += ["--per-request-spec-decode-metrics", self.per_request_spec_metrics]
        return args + list(self.extra_args)


class VllmServer(ServerProcess[VllmServerSpec]):
    """One real vLLM server. Use as a context manager, or call start() and stop(); restart() swaps the spec."""

    error = VllmServerError
    log_prefix = "vllm"
    start_timeout = START_TIMEOUT_SECONDS
    poll_seconds = 1.0
    exited_note = " while starting"
    kill_group_after_grace = True  # the engine core can outlive the API server

    def __init__(self, env: EngineEnv, spec: VllmServerSpec, workdir: Path, port: int | None = None) -> None:
        super().__init__(spec, workdir, port)
        self.env = env

    def argv(self) -> list[str]:
        return self.spec.argv(self.env.python, self.port)

    def describe(self) -> str:
        return f"vLLM on port {self.port}"

    def environment(self) -> dict[str, str]:
        tmp = self.workdir / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        return {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": str(self.spec.kv_cache_gib),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
            # "auto" pins every server's OpenMP threads to core 0 (reserving the rest), so two servers on a
            # 2-core machine would share one core; let the OS place them instead.
            "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # keeps `uni` (see the module's docstring)
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CACHE_ROOT": str(self.workdir / "vllm-cache"),
            "HF_HOME": str(self.workdir / "hf-home"),
            "TMPDIR": str(tmp),
            "VLLM_RPC_BASE_PATH": str(tmp),
            "PYTHONUNBUFFERED": "1",
            **self.spec.env,
        }

    def __enter__(self) -> "VllmServer":
        self.start()
        return self
