"""The run order of the tests on the shared successor vLLM server (tests/real_vllm_servers.py): one block, in
phase order, where the first of them was collected; no server is started here."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from real_vllm_servers import FIXTURE, MARKER, order_block


@dataclass
class Item:
    """What order_block reads of a pytest item."""

    nodeid: str
    phase: str | None = None
    fixturenames: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.phase is not None:
            self.fixturenames = ("tmp_path", FIXTURE)

    def get_closest_marker(self, name: str) -> SimpleNamespace | None:
        if name != MARKER or self.phase is None or self.phase == "unmarked":
            return None
        return SimpleNamespace(args=(self.phase,))


def test_the_shared_server_tests_run_as_one_block_in_phase_order():
    items = [
        Item("a"),
        Item("gate_worse", "worse"),
        Item("gate_base", "base"),
        Item("b"),
        Item("probe_base", "base"),
        Item("probe_swap", "swap"),
        Item("auth", "api_key"),
        Item("c"),
    ]
    order_block(items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == ["a", "auth", "gate_base", "probe_base", "probe_swap", "gate_worse", "b", "c"]


def test_a_test_on_the_shared_server_without_a_phase_is_a_usage_error():
    with pytest.raises(pytest.UsageError, match="unmarked"):
        order_block([Item("unmarked", "unmarked")])  # type: ignore[list-item]
