"""One daemon per state directory.

Two `specwatch run` on one state directory would each learn and flush their own baselines over the other's. The
daemon holds an exclusive `flock` on the directory itself while it runs, so a second one refuses to start and
says why. The kernel drops the lock when the holder exits or dies, so a crash never leaves it stale, and the
directory needs no file of ours (a read-only state directory still locks). Commands (`specwatch baseline`)
never take it: they work beside a running daemon.
"""

from __future__ import annotations

import fcntl
import os


class StateDirBusy(Exception):
    """Another daemon holds the state directory."""


class StateDirLock:
    """Held from `acquire()` until `release()` or the process ends."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self._fd: int | None = None

    def acquire(self) -> None:
        """Raises StateDirBusy when another daemon holds it; a directory that cannot be opened is left to the
        state store to report (it says what is wrong with it, and keeps the daemon running from memory)."""
        try:
            os.makedirs(self.state_dir, exist_ok=True)
            fd = os.open(self.state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateDirBusy(
                f"another `specwatch run` is using state_dir {self.state_dir}: two daemons on one state "
                "directory overwrite each other's baselines; stop it, or give this one its own state_dir"
            ) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd = None
