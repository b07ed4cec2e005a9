"""Start simulated engines from other code: tests, the sweep command, end-to-end alert tests.

`spawn()` runs `specwatch simulate` as a child process (its own GIL, like a real engine); `start_inprocess()`
runs one on background threads of this process, cheaper when only a few requests flow.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from specwatch.simulator.server import RunningSimulator
from specwatch.simulator.simulation import Simulation, SimulationSpec


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def spawn(port: int, *args: str) -> subprocess.Popen:
    """`specwatch simulate --port PORT ARGS...` as a child process; call `wait_ready()` before using it."""
    cmd = [sys.executable, "-m", "specwatch", "--log.level", "warn", "simulate", "--port", str(port), *args]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_ready(url: str, timeout: float = 20.0, process: subprocess.Popen | None = None) -> None:
    """Poll `url` until it answers 200; raise with the child's stderr if it died first."""
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            err = process.stderr.read().decode(errors="replace") if process.stderr else ""
            raise RuntimeError(f"simulator exited with {process.returncode} before {url} answered: {err}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"simulator at {url} did not answer within {timeout:g}s")
        time.sleep(0.1)


def start_inprocess(spec: SimulationSpec, host: str = "127.0.0.1", port: int = 0) -> RunningSimulator:
    return RunningSimulator(Simulation(spec), host=host, port=port).start()
