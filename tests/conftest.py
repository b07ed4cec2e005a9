"""Fixtures shared across test modules: the real vLLM engine of testbed.

The engine venv is built on first use (a few minutes, once per checkout) and its tests carry the
`real_engine` marker. Where the processor cannot run vLLM's CPU build, they skip and say why; where it can,
a failure to install or start the engine is an error, never a skip.
"""

from __future__ import annotations

import pytest

from testbed.engine_env import cpu_support, ensure_engine_env
from testbed.models import TinyModels, build_tiny_models

# tiers: the --fast option and the unit tier's guard; pytester: tests/test_tiers.py runs pytest on made-up tests
pytest_plugins = ("tiers", "pytester")


# Modules whose engine scripts/test.sh may still be building in the background when pytest starts: they run last.
RUN_LAST = ("test_real_llamacpp.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name in RUN_LAST)  # stable: the order within each part is kept


@pytest.fixture(scope="session")
def engine_env():
    supported, reason = cpu_support()
    if not supported:
        pytest.skip(f"the real vLLM engine cannot run on this machine: {reason}")
    return ensure_engine_env()


@pytest.fixture(scope="session")
def tiny_models(engine_env) -> TinyModels:
    return build_tiny_models(engine_env)
