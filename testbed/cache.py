"""Where the testbed keeps what it builds once per machine: `${XDG_CACHE_HOME:-~/.cache}/specwatch/`.

Every clone on the machine (and every CI run that shares the cache) reuses the engines built there, each in a
folder whose name carries a hash of what it was built from, so a changed pin builds afresh beside the old one.
`exclusive()` serialises builders across processes: a second clone waits for the first's build, then reuses it.
`ensure_pinned_venv()` is that for a venv installed from one pinned requirements file (the vLLM engine's, the
LiteLLM proxy's): keyed by the file, stamped with its sha256 once the install finished.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

STAMP_NAME = ".specwatch-requirements-sha256"  # in a pinned venv, written last: the list it was installed from


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specwatch"


def digest(parts: Iterable[bytes], length: int = 16) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:length]


@contextlib.contextmanager
def exclusive(name: str) -> Iterator[None]:
    """Hold `<cache>/<name>.lock` (an flock, released by the kernel if the holder dies)."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / f"{name}.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def pinned_venv_dir(prefix: str, requirements: Path) -> Path:
    """`<cache>/<prefix>-<hash of the requirements file>`: a changed list gets a folder of its own."""
    return cache_root() / f"{prefix}-{digest([requirements.read_bytes()])}"


def requirements_digest(requirements: Path) -> str:
    return hashlib.sha256(requirements.read_bytes()).hexdigest()


def venv_is_current(venv: Path, requirements: Path, executable: str = "python") -> bool:
    """The venv's `bin/<executable>` is there and its stamp names this requirements file's content."""
    stamp = venv / STAMP_NAME
    return (
        (venv / "bin" / executable).exists()
        and stamp.is_file()
        and stamp.read_text().strip() == requirements_digest(requirements)
    )


def ensure_pinned_venv(
    venv: Path, requirements: Path, install: Callable[[Path], None], executable: str = "python"
) -> None:
    """Install the venv unless it is current: under the lock, from an empty folder, by `install(venv)` (which
    raises on failure), then the stamp. Another process installing it meanwhile is waited for, then reused."""
    if venv_is_current(venv, requirements, executable):
        return
    with exclusive(venv.name):
        if venv_is_current(venv, requirements, executable):
            return
        if venv.exists():
            shutil.rmtree(venv)
        venv.parent.mkdir(parents=True, exist_ok=True)
        install(venv)
        (venv / STAMP_NAME).write_text(requirements_digest(requirements) + "\n")
