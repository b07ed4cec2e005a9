"""sd_notify(3) over $NOTIFY_SOCKET, with no dependency: READY=1, WATCHDOG=1, STOPPING=1, RELOADING=1.

Every call is a no-op returning False when not started by systemd (no NOTIFY_SOCKET), so callers need no
guards.
"""

from __future__ import annotations

import os
import socket
import time


def notify(state: str) -> bool:
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    if path.startswith("@"):  # abstract namespace socket
        path = "\0" + path[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(path)
            sock.sendall(state.encode())
        return True
    except OSError:
        return False


def ready() -> bool:
    return notify("READY=1")


def watchdog() -> bool:
    return notify("WATCHDOG=1")


def stopping() -> bool:
    return notify("STOPPING=1")


def reloading() -> bool:
    # systemd >= 253 wants MONOTONIC_USEC with RELOADING=1; older versions ignore the extra field.
    return notify(f"RELOADING=1\nMONOTONIC_USEC={int(time.monotonic() * 1_000_000)}")


def watchdog_interval_seconds() -> float | None:
    """The interval at which to pet the watchdog (half of WatchdogSec), or None when no watchdog is set."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2_000_000
    except ValueError:
        return None
