"""The real vLLM server of the successor models (testbed/successor.py), shared by the gate and probe tests.

A vLLM start costs one to several minutes of CPU on the 2-core box, and tests/test_real_gate.py,
tests/test_real_probe.py and tests/test_real_probe_auth.py all serve the successor target with per-request
spec-decode metrics, differing only in the drafter and the API key. They share one server process (the session
fixture `successor_vllm`, tests/conftest.py): each test asks for the spec it needs with `serve()`, which restarts
the server on its port only when the spec differs from what it runs. Each such test names its phase with
`@pytest.mark.successor_vllm(PHASE)`; conftest runs them as one block in PHASES order, so each spec starts once
(3 starts instead of 5), and stops the server after the block. Order only saves starts: any test run alone, or
in any order, gets the spec it asks for.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.engine_env import EngineEnv
from testbed.models import SUCCESSOR_BASE, TinyModels
from testbed.vllm_server import VllmServer, VllmServerSpec

FIXTURE = "successor_vllm"
MARKER = "successor_vllm"
# "api_key": the base drafter behind vLLM's --api-key; "base": the base drafter; "swap": starts on the base
# drafter and swaps to the worse one mid-test; "worse": on the worse drafter from the start.
PHASES = ("api_key", "base", "swap", "worse")
K = 3


def successor_spec(models: TinyModels, wrong_fraction: float = SUCCESSOR_BASE, api_key: str = "") -> VllmServerSpec:
    """The successor target with the drafter of this wrong fraction, k=K, vLLM's per-request summary metrics."""
    return VllmServerSpec(
        model=models.successor_target,
        per_request_spec_metrics="summary",
        speculative={
            "method": "draft_model",
            "num_speculative_tokens": K,
            "model": str(models.successor_drafter(wrong_fraction)),
        },
        extra_args=("--api-key", api_key) if api_key else (),
    )


class SharedVllm:
    """One vLLM server whose spec follows what the current test asks for, on one port throughout."""

    def __init__(self, env: EngineEnv, workdir: Path) -> None:
        self.env, self.workdir = env, workdir
        self.server: VllmServer | None = None

    def serve(self, spec: VllmServerSpec) -> VllmServer:
        """The server running `spec`: started, restarted on its port with it, or left as it is."""
        if self.server is None:
            self.server = VllmServer(self.env, spec, self.workdir)
            self.server.start()
        elif not self.server.alive():
            self.server.spec = spec
            self.server.start()
        elif self.server.spec != spec:
            self.server.restart(spec)
        return self.server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


def phase(item: pytest.Item) -> int:
    marker = item.get_closest_marker(MARKER)
    if marker is None or not marker.args or marker.args[0] not in PHASES:
        raise pytest.UsageError(f"{item.nodeid} uses {FIXTURE}: mark it @pytest.mark.{MARKER}(one of {PHASES})")
    return PHASES.index(marker.args[0])


def order_block(items: list[pytest.Item]) -> None:
    """Moves the tests on the shared server, in PHASES order (stable), to where the first of them was."""
    block = [item for item in items if FIXTURE in getattr(item, "fixturenames", ())]
    if not block:
        return
    at = items.index(block[0])
    rest = [item for item in items if FIXTURE not in getattr(item, "fixturenames", ())]
    items[:] = rest[:at] + sorted(block, key=phase) + rest[at:]


def uses_shared(item: pytest.Item | None) -> bool:
    return item is not None and FIXTURE in getattr(item, "fixturenames", ())
