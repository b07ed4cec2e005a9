"""Start and stop real vLLM OpenAI servers (the CPU build) on loopback, each in its own process group.

A server keeps its port across restarts, so a specwatch route pointed at it sees what a real node sees when
an engine is redeployed: the same URL, counters starting again from zero, maybe a new drafter or model name.
Everything the engine writes (its log, ZMQ sockets, caches, temp files) goes under the server's own workdir.

Settings that make vLLM fit a 2-core test machine:
- `VLLM_CPU_KVCACHE_SPACE` (GiB): without it the CPU worker asks for most of RAM and may refuse to start;
- `OMP_NUM_THREADS=2`, threads not pinned to cores (`VLLM_CPU_OMP_THREADS_BIND=nobind`), and
  `--enforce-eager` (no torch.compile: start-up in about a minute instead of many);
- float32 weights: the tiny models are float32, and bf16 matmuls need AVX-512 BF16 to be fast.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from testbed.engine_env import EngineEnv

# A server dies with the process that started it (PR_SET_PDEATHSIG), even when a killed test runner never
# reaches its cleanup and the server sits in its own session. The kernel sends the signal when the *thread*
# that forked the child exits, so every server is forked from one launcher thread that lives as long as the
# process (a server restarted from a short-lived thread would otherwise be killed with that thread).
_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
_launcher = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-launcher")


def _die_with_parent() -> None:
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def launch(argv: list[str], **popen_kwargs: Any) -> subprocess.Popen:
    """Popen in a new session, SIGTERMed by the kernel when this process dies."""

    def popen() -> subprocess.Popen:
        return subprocess.Popen(argv, start_new_session=True, preexec_fn=_die_with_parent, **popen_kwargs)

    return _launcher.submit(popen).result()


START_TIMEOUT_SECONDS = 900.0  # a loaded 2-core machine has been seen to take several minutes
STOP_TIMEOUT_SECONDS = 30.0


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class VllmServer:
    """One real vLLM server. Use as a context manager, or call start() and stop(); restart() swaps the spec."""

    def __init__(self, env: EngineEnv, spec: VllmServerSpec, workdir: Path, port: int | None = None) -> None:
        self.env = env
        self.spec = spec
        self.workdir = workdir
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None
        self.starts = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.base_url}/metrics"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"vllm-{self.port}.log"

    def __enter__(self) -> "VllmServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = START_TIMEOUT_SECONDS, wait: bool = True) -> None:
        """Launch the server and (unless `wait` is False: call wait_healthy() later) wait until it answers.
        Launching several before waiting lets their start-ups overlap."""
        if self.process is not None and self.process.poll() is None:
            raise VllmServerError(f"server on port {self.port} is already running")
        tmp = self.workdir / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": str(self.spec.kv_cache_gib),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
            # "auto" pins every server's OpenMP threads to core 0 (reserving the rest), so two servers on a
            # 2-core machine would share one core; let the OS place them instead.
            "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CACHE_ROOT": str(self.workdir / "vllm-cache"),
            "HF_HOME": str(self.workdir / "hf-home"),
            "TMPDIR": str(tmp),
            "VLLM_RPC_BASE_PATH": str(tmp),
            "PYTHONUNBUFFERED": "1",
            **self.spec.env,
        }
        with self.log_path.open("a") as log:
            log.write(f"\n==== start {self.starts + 1}: {' '.join(self.spec.argv(self.env.python, self.port))}\n")
            log.flush()
            self.process = launch(
                self.spec.argv(self.env.python, self.port),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.workdir,
            )
        self.starts += 1
        if wait:
            self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float = START_TIMEOUT_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise VllmServerError(f"vLLM on port {self.port} exited with {code} while starting\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        self.stop()
        raise VllmServerError(f"vLLM on port {self.port} not healthy after {timeout:.0f}s\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM the whole process group (API server and engine core), SIGKILL what outlives the grace."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(process.pid, signal.SIGKILL)  # the engine core can outlive the API server
        except ProcessLookupError:
            pass
        process.wait(timeout=STOP_TIMEOUT_SECONDS)

    def restart(self, spec: VllmServerSpec | None = None, timeout: float = START_TIMEOUT_SECONDS) -> None:
        """Stop, optionally change what is served, start again on the same port."""
        self.stop()
        if spec is not None:
            self.spec = spec
        self.start(timeout)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def get(self, path: str, timeout: float = 10.0) -> str:
        with urllib.request.urlopen(f"{self.base_url}{path}", timeout=timeout) as response:
            return response.read().decode()
