"""The test tiers: the unit tier is every test without one of TIER_MARKERS; `--fast` selects it.

It must pass in under a minute on two cores, so a test that starts a process or a server, or takes more than
about a second, carries one of the markers. An unmarked test that starts a process or binds a socket fails
with a message naming it: the guard below is installed while such a test sets up and runs.
"""

from __future__ import annotations

import multiprocessing.util
import os
import socket
import subprocess
import sys
from collections.abc import Generator
from typing import NoReturn

import pytest

TIER_MARKERS = ("slow", "e2e", "real_engine", "gpu")
UNIT_TIER = " and ".join(f"not {name}" for name in TIER_MARKERS)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true", help=f'run the unit tier only, as -m "{UNIT_TIER}"')


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("fast"):
        given = config.option.markexpr
        config.option.markexpr = f"({given}) and ({UNIT_TIER})" if given else UNIT_TIER


class _UnitGuard:
    """While an unmarked test sets up or runs, starting a process or binding a socket fails it.

    The failure is `pytest.fail` (a BaseException, so an `except Exception` in the code under test cannot
    swallow it) and is also recorded, so the test fails even where the call ran on another thread.
    """

    def __init__(self, item: pytest.Item) -> None:
        self.item = item
        self.violations: list[str] = []
        self.saved: list[tuple[object, str, object]] = []  # (owner, name, its own attribute or _INHERITED)

    def _refuse(self, what: str) -> NoReturn:
        message = (
            f"{self.item.nodeid} {what} but carries none of the markers {', '.join(TIER_MARKERS)}: "
            "mark it @pytest.mark.slow (e2e where it starts real Prometheus, Alertmanager or daemons) "
            "so that the unit tier stays under a minute"
        )
        self.violations.append(message)
        pytest.fail(message)

    def _patch(self, owner: object, name: str, what: str) -> None:
        if not hasattr(owner, name):  # os.forkpty and the like are missing on some platforms
            return
        self.saved.append((owner, name, vars(owner).get(name, _INHERITED)))
        current = getattr(owner, name)

        def refuse(*args: object, **kwargs: object) -> object:
            if _importing():
                return current(*args, **kwargs)
            self._refuse(what)

        setattr(owner, name, refuse)

    def __enter__(self) -> _UnitGuard:
        self._patch(subprocess.Popen, "_execute_child", "started a process")
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
            self._patch(os, name, f"started a process (os.{name})")
        self._patch(multiprocessing.util, "spawnv_passfds", "started a process (multiprocessing)")
        self._patch(socket.socket, "bind", "bound a socket")
        self._patch(socket.socket, "listen", "listened on a socket")
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self.saved):
            if original is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


_INHERITED = object()


def _importing() -> bool:
    """Whether a module is being imported: some probe the host once at import (urllib3 binds a socket to learn
    whether IPv6 works), which would otherwise fail whichever test happens to import them first."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def _guarded(item: pytest.Item) -> Generator[None, object, object]:
    if any(item.get_closest_marker(name) for name in TIER_MARKERS):
        return (yield)
    with _UnitGuard(item) as guard:
        result = yield
    if guard.violations:
        pytest.fail(guard.violations[0])
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item))
