"""Where the testbed keeps what it builds once per machine: `${XDG_CACHE_HOME:-~/.cache}/specwatch/`.

Every clone on the machine (and every CI run that shares the cache) reuses the engines built there, each in a
folder whose name carries a hash of what it was built from, so a changed pin builds afresh beside the old one.
`exclusive()` serialises builders across processes: a second clone waits for the first's build, then reuses it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path


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
