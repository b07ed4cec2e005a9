"""sd_notify over a real AF_UNIX datagram socket standing in for systemd's $NOTIFY_SOCKET.

Module level: each message's wire format, abstract sockets, the no-systemd no-op, WATCHDOG_USEC/PID.
Daemon level (a real `specwatch run`): READY=1 only once the first cycle is published, WATCHDOG=1 only while
cycles really complete (a tick hung on purpose silences it, and it resumes after), STOPPING=1 on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import pytest
import requests

from specwatch import systemd_notify
from test_service_e2e import Daemon, write_config


class NotifySocket:
    """A bound datagram socket collecting (monotonic time, message) pairs, as systemd would receive them."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._closed:
            try:
                data = self.sock.recv(4096)
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            self.messages.append((time.monotonic(), data.decode()))

    def states(self, since: float = 0.0) -> list[str]:
        return [m for t, m in list(self.messages) if t >= since]

    def wait_for(self, state: str, timeout: float = 60.0) -> float:  # ends at the event; generous for loaded boxes
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, m in list(self.messages):
                if state in m.split("\n"):
                    return t
            time.sleep(0.02)
        raise AssertionError(f"{state} never arrived; got {self.messages}")

    def close(self) -> None:
        self._closed = True
        self._thread.join(timeout=2)
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path, monkeypatch):
    path = str(tmp_path / "notify.sock")
    receiver = NotifySocket(path)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    yield receiver
    receiver.close()


# --------------------------------------------------------------------------- the module
@pytest.mark.slow
def test_messages_reach_the_socket(notify_socket):
    assert systemd_notify.ready() and systemd_notify.watchdog() and systemd_notify.stopping()
    assert systemd_notify.reloading()
    notify_socket.wait_for("RELOADING=1")
    states = notify_socket.states()
    assert states[:3] == ["READY=1", "WATCHDOG=1", "STOPPING=1"]
    reloading, monotonic = states[3].split("\n")
    assert reloading == "RELOADING=1" and monotonic.startswith("MONOTONIC_USEC=")
    assert abs(int(monotonic.split("=")[1]) - time.monotonic() * 1e6) < 5e6  # CLOCK_MONOTONIC, in µs


@pytest.mark.slow
def test_abstract_namespace_socket(monkeypatch):
    name = f"specwatch-test-{os.getpid()}-{time.monotonic_ns()}"
    receiver = NotifySocket("\0" + name)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert systemd_notify.ready()
        receiver.wait_for("READY=1")
    finally:
        receiver.close()


def test_without_systemd_every_call_is_a_quiet_no_op(monkeypatch, tmp_path):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert systemd_notify.ready() is False
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens.sock"))
    assert systemd_notify.watchdog() is False  # a vanished socket is not an error worth raising


def test_watchdog_interval(monkeypatch):
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert systemd_notify.watchdog_interval_seconds() is None
    monkeypatch.setenv("WATCHDOG_USEC", "120000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert systemd_notify.watchdog_interval_seconds() == 60.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert systemd_notify.watchdog_interval_seconds() == 60.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))  # meant for another process (e.g. our parent)
    assert systemd_notify.watchdog_interval_seconds() is None
    monkeypatch.setenv("WATCHDOG_USEC", "soon")
    monkeypatch.delenv("WATCHDOG_PID")
    assert systemd_notify.watchdog_interval_seconds() is None


# --------------------------------------------------------------------------- the daemon
# Installed in the daemon process before the CLI runs: while the file exists, every tick hangs before it
# starts, exactly like a wedged evaluation.
BLOCK_PRELUDE = """
import os, time
import specwatch.daemon as _daemon
_tick = _daemon.Daemon.tick
def _hanging_tick(self, *args, **kwargs):
    while os.path.exists({block!r}):
        time.sleep(0.02)
    return _tick(self, *args, **kwargs)
_daemon.Daemon.tick = _hanging_tick
"""


@pytest.mark.e2e
def test_ready_watchdog_only_while_evaluating_and_stopping(tmp_path, notify_socket):
    block = tmp_path / "hang"
    env = dict(os.environ, WATCHDOG_USEC="20000000")  # 20s: pets at cycle pace, far below it
    d = Daemon(
        write_config(tmp_path / "specwatch.yml", ["chat"]),
        env=env,
        python_prelude=BLOCK_PRELUDE.format(block=str(block)),
    )
    try:
        notify_socket.wait_for("READY=1")
        # READY=1 follows the first published cycle, so readiness is already true when systemd hears it
        assert requests.get(d.url + "/-/ready", timeout=5).status_code == 200

        time.sleep(1.5)
        assert notify_socket.states().count("WATCHDOG=1") >= 3  # 300ms interval: several cycles, several pets

        block.touch()
        time.sleep(0.7)  # let a cycle already past the hang point finish and pet one last time
        hung_since = time.monotonic()
        time.sleep(1.5)
        assert "WATCHDOG=1" not in notify_socket.states(since=hung_since), "petted while no cycle completed"
        assert d.proc.poll() is None and requests.get(d.url + "/-/healthy", timeout=5).ok

        block.unlink()
        resumed = time.monotonic()
        time.sleep(1.2)
        assert notify_socket.states(since=resumed).count("WATCHDOG=1") >= 1

        d.signal(signal.SIGTERM)
        notify_socket.wait_for("STOPPING=1")
        assert d.stop() == 0
    finally:
        if block.exists():
            block.unlink()
        d.stop()
