"""Fixtures shared across test modules: the real vLLM engine of testbed, and the simulated engine canary probes
run against.

The engine venv is built on first use (a few minutes, once per checkout) and its tests carry the
`real_engine` marker. Where the processor cannot run vLLM's CPU build, they skip and say why; where it can,
a failure to install or start the engine is an error, never a skip.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

import real_vllm_servers
from testbed.engine_env import cpu_support, ensure_engine_env
from testbed.models import TinyModels, build_tiny_models

# Hypothesis: the same examples on every machine and every run (CI, a fresh clone), from a fixed seed and no
# example database, so a red run is never luck. `HYPOTHESIS_PROFILE=explore` (CONTRIBUTING.md) draws new random
# examples on each run, for a local hunt; a failure found there becomes an @example.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# tiers: the --fast option and the unit tier's guard; pytester: tests/test_tiers.py runs pytest on made-up tests
pytest_plugins = ("tiers", "pytester")


# Modules whose engine scripts/test.sh may still be building in the background when pytest starts: they run last.
RUN_LAST = ("test_real_llamacpp.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name in RUN_LAST)  # stable: the order within each part is kept
    real_vllm_servers.order_block(items)  # one start per spec of the shared successor server


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """The shared successor server stops after the last test of its block, not at the session's end."""
    if real_vllm_servers.uses_shared(item) and not real_vllm_servers.uses_shared(nextitem):
        shared = item.funcargs.get(real_vllm_servers.FIXTURE) if hasattr(item, "funcargs") else None
        if shared is not None:
            shared.stop()


@pytest.fixture(scope="session")
def engine_env():
    supported, reason = cpu_support()
    if not supported:
        pytest.skip(f"the real vLLM engine cannot run on this machine: {reason}")
    return ensure_engine_env()


@pytest.fixture(scope="session")
def tiny_models(engine_env) -> TinyModels:
    return build_tiny_models(engine_env)


@pytest.fixture
def simulator():
    """Starts simulated engines the canary probe can run rounds against (greedy answers repeat, so rounds compare
    prompt by prompt): `simulator(kind="vllm", per_request="summary", **spec)`; each is stopped at the end."""
    from specwatch.simulator.server import RunningSimulator
    from specwatch.simulator.simulation import Simulation, SimulationSpec

    started = []

    def start(kind="vllm", per_request="summary", **kw):
        spec = SimulationSpec(
            engine_kind=kind,
            k=3,
            acceptance=0.7,
            time_scale=50,
            seed=3,
            per_request_spec_decode_metrics=per_request,
            repeatable_greedy=True,
            **kw,
        )
        sim = RunningSimulator(Simulation(spec)).start()
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.stop()


@pytest.fixture(scope="session")
def successor_vllm(engine_env, tmp_path_factory):
    """The successor models' vLLM server, shared across modules (tests/real_vllm_servers.py)."""
    shared = real_vllm_servers.SharedVllm(engine_env, tmp_path_factory.mktemp("successor-vllm"))
    try:
        yield shared
    finally:
        shared.stop()
