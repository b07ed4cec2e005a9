"""What the real engine servers (vllm_server, llamacpp_server) share: a process on a fixed loopback port, in its
own process group, that writes one log under its workdir and is ready when `/health` (or its `health_path`)
answers 200.

A subclass gives its argv, its environment, its log name, its error type and how it names itself in errors.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

# A server dies with the process that started it (PR_SET_PDEATHSIG), even when a killed test runner never
# reaches its cleanup and the server sits in its own session. The kernel sends the signal when the *thread*
# that forked the child exits, so every server is forked from one launcher thread that lives as long as the
# process (a server restarted from a short-lived thread would otherwise be killed with that thread).
_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
_launcher = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="server-launcher")

STOP_TIMEOUT_SECONDS = 30.0


def _die_with_parent() -> None:
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def launch(argv: list[str], **popen_kwargs: Any) -> subprocess.Popen:
    """Popen in a new session, SIGTERMed by the kernel when this process dies."""

    def popen() -> subprocess.Popen:
        return subprocess.Popen(argv, start_new_session=True, preexec_fn=_die_with_parent, **popen_kwargs)

    return _launcher.submit(popen).result()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


SpecT = TypeVar("SpecT")


class ServerProcess(Generic[SpecT]):
    """One engine server. Use as a context manager, or call start() and stop(); restart() swaps the spec."""

    error: ClassVar[type[RuntimeError]] = RuntimeError
    log_prefix: ClassVar[str] = "server"
    start_timeout: ClassVar[float] = 300.0
    poll_seconds: ClassVar[float] = 1.0
    health_path: ClassVar[str] = "/health"  # ready when a GET of it answers 200
    exited_note: ClassVar[str] = ""  # appended to "exited with CODE" when the server dies while starting
    # SIGKILL the group even when its leader exits within the grace (an engine's workers can outlive it).
    kill_group_after_grace: ClassVar[bool] = False

    def __init__(self, spec: SpecT, workdir: Path, port: int | None = None) -> None:
        self.spec = spec
        self.workdir = workdir
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def argv(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str] | None:
        """The server's environment (None: this process's); may prepare directories under the workdir."""
        return None

    def describe(self) -> str:
        """How errors name this server."""
        return f"server on port {self.port}"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.base_url}/metrics"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.log_prefix}-{self.port}.log"

    def __enter__(self) -> "ServerProcess[SpecT]":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float | None = None, wait: bool = True) -> None:
        """Launch the server and (unless `wait` is False: call wait_healthy() later) wait until it answers.
        Launching several before waiting lets their start-ups overlap."""
        if self.alive():
            raise self.error(f"server on port {self.port} is already running")
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = self.environment()
        argv = self.argv()
        with self.log_path.open("a") as log:
            log.write(f"\n==== start {self.starts + 1}: {' '.join(argv)}\n")
            log.flush()
            self.process = launch(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.workdir)
        self.starts += 1
        if wait:
            self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float | None = None) -> None:
        timeout = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise self.error(f"{self.describe()} exited with {code}{self.exited_note}\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.base_url}{self.health_path}", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(self.poll_seconds)
        self.stop()
        raise self.error(f"{self.describe()} not healthy after {timeout:.0f}s\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM the whole process group, SIGKILL it if it outlives the grace."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=STOP_TIMEOUT_SECONDS)
            if not self.kill_group_after_grace:
                return
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=STOP_TIMEOUT_SECONDS)

    def restart(self, spec: SpecT | None = None, timeout: float | None = None) -> None:
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
