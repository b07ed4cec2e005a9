"""Files the config names for the HTTP client (a password, a bearer token, TLS keys and certificates): read with
a size cap, re-read only when they change, refused unless they are regular files.

1. `problem(path, cap)`: what is wrong with the file as it is now ("" for nothing), from its metadata alone, so a
   FIFO (which would block the opener until a writer comes) or a device (`/dev/zero` never ends) is refused
   without being opened.
2. `read_secret(path)`: the file's text, stripped, from a cache keyed by (device, inode, size, mtime): one
   `stat` per use, a read only after the file changed (a rotated token is picked up at the next scrape). The
   read itself opens without blocking and checks the opened file again, so a file swapped for a FIFO between
   the two cannot hang it. Raises `SecretFileError`, whose message names the file.
3. `exposure(path, own_gid)`: a warning for a secret file that others can read: world-readable, or
   group-readable by a group other than the daemon's own (the shipped layout gives keys to group `specwatch`,
   mode 0640: that is not a warning).
"""

from __future__ import annotations

import os
import stat
import threading

MAX_SECRET_BYTES = 64 << 10  # a password or token; far above any real one
MAX_TLS_FILE_BYTES = 4 << 20  # a CA bundle (the system's is ~200 KB), a certificate chain, a key

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


class SecretFileError(OSError):
    """A secret file that cannot be used; the message says which and why."""


def _kind_problem(path: str, st: os.stat_result, cap: int) -> str:
    for test, kind in _KINDS:
        if test(st.st_mode):
            return f"{path} is {kind}, not a regular file: refused"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file: refused"
    if st.st_size > cap:
        return f"{path} is {st.st_size} bytes, over the {cap}-byte cap for this file: refused"
    return ""


def problem(path: str, cap: int = MAX_SECRET_BYTES) -> str:
    """What makes `path` unusable now ("" for nothing), without opening anything that could block."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror}"
    found = _kind_problem(path, st, cap)
    if found:
        return found
    if not os.access(path, os.R_OK):
        return f"cannot read {path}: Permission denied"
    return ""


def _stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def checked_stamp(path: str, cap: int) -> tuple[int, int, int, int]:
    """(device, inode, size, mtime) of `path`, for a reader that loads it itself (TLS files, through `ssl`), so it
    rebuilds only when the file changed; raises `SecretFileError` where `problem` finds one in its metadata."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise SecretFileError(f"cannot read {path}: {exc.strerror}") from None
    found = _kind_problem(path, st, cap)
    if found:
        raise SecretFileError(found)
    return _stamp(st)


_cache: dict[str, tuple[tuple[int, int, int, int], str]] = {}
_lock = threading.Lock()


def read_secret(path: str, cap: int = MAX_SECRET_BYTES) -> str:
    """The text of `path` without its surrounding whitespace (a trailing newline is not part of a token, as
    Prometheus reads it), re-read only when the file changed."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise SecretFileError(f"cannot read {path}: {exc.strerror}") from None
    key = _stamp(st)
    cached = _cache.get(path)
    if cached is not None and cached[0] == key:
        return cached[1]
    found = _kind_problem(path, st, cap)
    if found:
        raise SecretFileError(found)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise SecretFileError(f"cannot read {path}: {exc.strerror}") from None
    try:
        opened = os.fstat(fd)
        found = _kind_problem(path, opened, cap)
        if found:
            raise SecretFileError(found)
        data = os.read(fd, cap + 1)
    except SecretFileError:
        raise
    except OSError as exc:
        raise SecretFileError(f"cannot read {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > cap:
        raise SecretFileError(f"{path} is over the {cap}-byte cap for this file: refused")
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise SecretFileError(f"{path} is not UTF-8 text: {exc.reason}") from None
    with _lock:
        _cache[path] = (_stamp(opened), text)
    return text


def exposure(path: str, own_gid: int) -> str:
    """A warning when others can read the secret file `path` ("" when not, or when it is no regular file)."""
    try:
        st = os.stat(path)
    except OSError:
        return ""
    if not stat.S_ISREG(st.st_mode):
        return ""  # refused anyway, by `problem` and `read_secret`
    mode = stat.S_IMODE(st.st_mode)
    if mode & stat.S_IROTH:
        return f"{path} is world-readable (mode {mode:04o}): chmod o-r it"
    if mode & stat.S_IRGRP and st.st_gid != own_gid:
        return (
            f"{path} is readable by group {st.st_gid}, not the daemon's own ({own_gid}) (mode {mode:04o}): "
            "chmod g-r it, or give it to the daemon's group"
        )
    return ""


_warned: set[str] = set()


def exposure_once(path: str) -> str:
    """`exposure(path, this process's group)` the first time it is asked about `path`, "" afterwards."""
    with _lock:
        if path in _warned:
            return ""
        _warned.add(path)
    return exposure(path, os.getegid())
