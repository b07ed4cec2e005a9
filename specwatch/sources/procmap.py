"""Which processes serve a TCP port, from /proc alone (Linux): the route -> GPU auto-mapping's half on our side.

An engine's HTTP server is rarely the process that uses the GPU: vLLM's API server forks EngineCore and its
workers, SGLang's server forks schedulers. So a GPU compute process "serves" a port when it, or one of its
ancestors, holds a listening socket on that port. Only the few processes NVML reports (and their ancestors)
are inspected, never all of /proc.

Limits (documented for operators): specwatch must share the engine's PID and network namespaces and may need
the engine's user (or CAP_SYS_PTRACE) to read its /proc/<pid>/fd; otherwise set `gpus:` on the route.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from typing import Iterable

_TCP_LISTEN = "0A"


def _parse_address(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """/proc/net/tcp{,6} print addresses as 32-bit words in host byte order."""
    raw = bytes.fromhex(hex_addr)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(raw)


def parse_listening(text: str, port: int) -> dict[int, ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Socket inode -> local address of each LISTEN socket on `port` in one /proc/net/tcp{,6} table."""
    found = {}
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 10 or cols[3] != _TCP_LISTEN:
            continue
        addr, _, port_hex = cols[1].partition(":")
        try:
            if int(port_hex, 16) != port:
                continue
            inode = int(cols[9])
            found[inode] = _parse_address(addr)
        except ValueError:
            continue  # a malformed line is skipped, not fatal
    return found


def is_local_host(host: str) -> bool:
    """Whether a route URL's host names this machine (only then can its port be matched to local processes)."""
    host = host.strip("[]")
    if host == "localhost" or host == socket.gethostname():
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # another DNS name: resolving it here could block the loop
    if ip.is_loopback or ip.is_unspecified:
        return True
    # Binding succeeds only to an address this host owns; no packet is sent.
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((str(ip), 0))
        return True
    except OSError:
        return False


def listening_inodes(port: int, host: str, proc_root: str = "/proc") -> set[int]:
    """Inodes of LISTEN sockets on `port` that accept connections addressed to `host`."""
    wanted: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    if host == "localhost":
        wanted = ipaddress.IPv4Address("127.0.0.1")  # any loopback address matches below
    else:
        try:
            wanted = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            wanted = None  # this host's name: any local address serves it
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc_root, "net", table), encoding="ascii", errors="replace") as f:
                sockets = parse_listening(f.read(), port)
        except OSError:
            continue  # no IPv6, or /proc/net hidden
        for inode, addr in sockets.items():
            if wanted is None or addr.is_unspecified or addr == wanted or (wanted.is_loopback and addr.is_loopback):
                inodes.add(inode)
    return inodes


def parent_pid(pid: int, proc_root: str = "/proc") -> int | None:
    try:
        with open(os.path.join(proc_root, str(pid), "stat"), encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses; fields after the last ')' are fixed.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


def socket_inodes(pid: int, proc_root: str = "/proc") -> set[int]:
    """Inodes of the sockets a process holds open (empty when its fd table is unreadable)."""
    fd_dir = os.path.join(proc_root, str(pid), "fd")
    inodes: set[int] = set()
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(os.path.join(fd_dir, name))
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            try:
                inodes.add(int(target[8:-1]))
            except ValueError:
                continue
    return inodes


def pids_serving(inodes: set[int], candidates: Iterable[int], proc_root: str = "/proc") -> set[int]:
    """The candidates that hold one of `inodes`, or descend from a process that does.

    PID 1 is never an owner: with systemd socket activation it holds the listening socket and is everyone's
    ancestor.
    """
    if not inodes:
        return set()
    owns: dict[int, bool] = {}

    def holds(pid: int) -> bool:
        if pid not in owns:
            owns[pid] = bool(socket_inodes(pid, proc_root) & inodes)
        return owns[pid]

    serving = set()
    for pid in candidates:
        current: int | None = pid
        seen = set()
        while current is not None and current > 1 and current not in seen:
            seen.add(current)
            if holds(current):
                serving.add(pid)
                break
            current = parent_pid(current, proc_root)
    return serving
