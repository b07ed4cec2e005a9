"""The baselines API's accept and reset, decided on the daemon's live state (commands/_admin.py over a real
Daemon with a fake source and a fake clock): a node still on the old model refuses and keeps its baseline,
an upgraded node adopts from what its loop knows now (not from state flushed a minute ago), idempotently;
a dry run changes nothing; nothing deletes a baseline unless the request names the route."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specwatch.commands._admin import BaselineAdmin
from specwatch.commands.baseline import accept_route
from specwatch.config import parse_config
from specwatch.daemon import Daemon
from specwatch.export.admin_api import Caller
from specwatch.snapshot import EngineSample
from specwatch.state.baselines import BaselineKey
from specwatch.state.store import StateStore

from fakes import NEW, OLD, VERSION, FakeClock, SwitchableEngine

CALLER = Caller("ops", "127.0.0.1:50000")
INTERVAL = 5.0
# A 10 s block, so that the evidence for a new model (3 closed blocks and the warm-up's tokens) comes in well
# under the 60 s between two flushes of the state file: the window in which a decision on the file goes wrong.
DETECTION = {"warmup_drafted_tokens": 20_000, "warmup_duration": "60s", "block": "10s"}


class Node:
    """One specwatch daemon (ticked by the test) and its baselines API."""

    def __init__(self, state_dir: Path, engine: SwitchableEngine | None = None) -> None:
        self.clock = FakeClock()
        self.engine = engine or SwitchableEngine()
        config = parse_config(
            {
                "interval": f"{INTERVAL:g}s",
                "state_dir": str(state_dir),
                "gpu": {"enabled": "false"},
                "detection": DETECTION,
                "routes": [{"name": "chat", "url": "http://127.0.0.1:9/metrics"}],
            }
        )
        self.daemon = Daemon(config, source_factory=lambda r, c: self.engine, clock=self.clock)
        self.admin = BaselineAdmin(lambda: self.daemon.config, self.daemon, enabled_without_auth=True)
        self.state_dir = state_dir

    def run(self, seconds: float) -> None:
        for _ in range(int(seconds / INTERVAL)):
            self.daemon.tick(self.clock.advance(INTERVAL))

    def accept(self, **body: Any):
        return self.admin.act("chat", "accept", CALLER, body)

    def stored(self) -> dict[str, float]:
        """model -> stored acceptance ratio, read from the state file as another process would."""
        store = StateStore(str(self.state_dir / "baselines.db"), readonly=True, repair=False)
        try:
            return {b.key.model_name: b.acceptance_ratio for b in store.baselines("chat")}
        finally:
            store.close()

    def route(self):
        return self.daemon.snapshot.routes[0]

    def close(self) -> None:
        self.daemon.close()


@pytest.fixture
def node(tmp_path: Path):
    n = Node(tmp_path)
    n.run(120.0)  # the warm-up: a baseline for the old model, flushed to the file
    assert n.stored() == {OLD: pytest.approx(0.6)}
    yield n
    n.close()


def test_a_node_still_on_the_old_model_refuses_and_keeps_its_baseline(node: Node) -> None:
    answer = node.accept(model=NEW)
    assert answer.status == 409, answer.document
    doc = answer.document
    assert doc["outcome"] == "refused" and f"model {OLD!r}, not {NEW!r}" in doc["reason"]
    assert doc["before"]["model"] == OLD and doc["after"] == doc["before"]
    assert node.stored() == {OLD: pytest.approx(0.6)}  # the file still holds it
    node.run(30.0)
    assert node.route().baseline_ratio == pytest.approx(0.6)  # and the loop still judges against it


def test_an_upgraded_node_adopts_from_live_state_within_the_first_flush_period(node: Node) -> None:
    """The bump lands just after a flush: the state file says the old model for the next 60 s, while the loop
    already has the evidence for the new one. Deciding on the file would delete the old baseline."""
    node.run(60.0)  # a flush has just written the old model's state
    node.engine.bump(NEW, 0.48)  # 20% fewer drafts accepted
    node.run(45.0)  # 3 closed 10 s blocks and 36k drafted tokens of the new model, no flush since the bump
    answer = node.accept(model=NEW, engine_version=VERSION, draft_length=4)
    assert answer.status == 200, answer.document
    doc = answer.document
    assert doc["outcome"] == "adopted"
    assert doc["before"]["model"] == OLD and doc["before"]["acceptance_ratio"] == pytest.approx(0.6)
    assert doc["after"]["model"] == NEW and doc["after"]["acceptance_ratio"] == pytest.approx(0.48)
    # the old model's baseline stays (a rollback uses it at once); the new one is in the file
    assert node.stored() == {OLD: pytest.approx(0.6), NEW: pytest.approx(0.48)}
    node.run(INTERVAL)
    assert node.route().baseline_ratio == pytest.approx(0.48) and not node.route().degraded
    again = node.accept(model=NEW)
    assert again.status == 200 and again.document["outcome"] == "already"
    assert again.document["before"] == again.document["after"]
    assert node.stored() == {OLD: pytest.approx(0.6), NEW: pytest.approx(0.48)}


def test_a_bumped_node_without_evidence_yet_refuses_and_changes_nothing(node: Node) -> None:
    node.engine.bump(NEW, 0.48)
    node.run(10.0)  # one block: no dispersion estimate yet
    answer = node.accept(model=NEW)
    assert answer.status == 409 and "no evidence" in answer.document["reason"]
    assert node.stored() == {OLD: pytest.approx(0.6)}
    node.run(10.0)
    assert node.route().baseline_ratio == pytest.approx(0.6)  # the old baseline is still the reference


def test_dry_run_says_what_it_would_adopt_and_changes_nothing(node: Node) -> None:
    node.engine.bump(NEW, 0.48)
    node.run(45.0)
    answer = node.accept(model=NEW, dry_run=True)
    assert answer.status == 200 and answer.document["outcome"] == "would_adopt"
    assert answer.document["after"]["acceptance_ratio"] == pytest.approx(0.48)
    node.run(INTERVAL)
    assert node.stored() == {OLD: pytest.approx(0.6)}
    assert node.route().baseline_ratio == pytest.approx(0.6)
    assert node.accept(model=NEW).document["outcome"] == "adopted"


def test_wrong_engine_version_or_draft_length_is_refused(node: Node) -> None:
    node.engine.bump(NEW, 0.48)
    node.run(45.0)
    wrong_version = node.accept(model=NEW, engine_version="0.34.0")
    assert wrong_version.status == 409 and "engine version '0.33.0', not '0.34.0'" in wrong_version.document["reason"]
    wrong_k = node.accept(model=NEW, draft_length=5)
    assert wrong_k.status == 409 and "k=4, not 5" in wrong_k.document["reason"]
    assert node.stored() == {OLD: pytest.approx(0.6)}


@pytest.mark.parametrize(
    "body, problem",
    [
        ({}, '"model" is required'),
        ({"model": ""}, '"model" is required'),
        ({"model": 3}, "model must be a JSON string"),
        ({"model": NEW, "draft_length": True}, "draft_length must be a JSON int"),
        ({"model": NEW, "draft_length": 0}, "at least 1"),
        ({"model": NEW, "dry_run": "yes"}, "dry_run must be a JSON bool"),
        ({"model": NEW, "draft_len": 4}, "unknown field 'draft_len'"),
    ],
)
def test_a_malformed_accept_body_is_a_400_naming_the_problem(node: Node, body: dict, problem: str) -> None:
    answer = node.admin.act("chat", "accept", CALLER, body)
    assert answer.status == 400 and problem in answer.document["error"]


def test_accept_before_the_engine_answered_since_start_is_refused_not_guessed(tmp_path: Path) -> None:
    first = Node(tmp_path)
    first.run(120.0)
    first.close()  # flushes the old model's state
    restarted = Node(tmp_path, SwitchableEngine(NEW, 0.48))  # the daemon restarts with the engine upgraded
    try:
        answer = restarted.accept(model=OLD)  # the saved state says OLD: it must not be taken for the live one
        assert answer.status == 409 and "has not answered since the daemon started" in answer.document["reason"]
        restarted.run(INTERVAL)
        assert "it runs model" in restarted.accept(model=OLD).document["reason"]
    finally:
        restarted.close()


def test_accept_when_the_engine_is_down_is_refused(node: Node) -> None:
    def down(now: float) -> EngineSample:
        from specwatch.sources.base import SourceError

        raise SourceError("connection", "connection refused")

    node.engine.sample = down  # type: ignore[method-assign]
    node.run(INTERVAL)
    answer = node.accept(model=OLD)
    assert answer.status == 409 and "last scrape failed (connection)" in answer.document["reason"]


def test_reset_deletes_only_when_the_body_names_the_route(node: Node) -> None:
    for body in ({}, {"confirm": "other"}, {"confirm": "chat", "also": 1}):
        answer = node.admin.act("chat", "reset", CALLER, body)
        assert answer.status == 400 and '{"confirm": "chat"}' in answer.document["error"]
    assert node.stored() == {OLD: pytest.approx(0.6)}
    answer = node.admin.act("chat", "reset", CALLER, {"confirm": "chat"})
    assert answer.status == 200 and answer.document["outcome"] == "reset"
    assert [b["model"] for b in answer.document["before"]] == [OLD]
    assert node.stored() == {}
    node.run(INTERVAL)
    assert node.route().baseline_ratio is None  # learning again


def test_unknown_route_and_action_are_404(node: Node) -> None:
    assert node.admin.act("nope", "accept", CALLER, {"model": NEW}).status == 404
    assert node.admin.act("chat", "forget", CALLER, {}).status == 404


def test_the_state_file_accept_refuses_rather_than_deletes(tmp_path: Path) -> None:
    """`specwatch baseline accept` on the file (a stopped daemon): the model has not changed and the saved
    learner has no evidence of anything new, so it refuses; the baseline stays."""
    n = Node(tmp_path)
    n.run(120.0)
    n.close()
    store = StateStore(str(tmp_path / "baselines.db"), repair=False)
    try:
        state = store.route_state("chat")
        assert state is not None
        key = BaselineKey(*state["key"])
        state["learner"]["drafted"] = 0.0  # as right after an operator's accept: nothing learned since
        state["learner"]["accepted"] = 0.0
        state["reference_key"] = None
        from specwatch.state import detector

        store._transaction("test", lambda c: detector.put(c, {"chat": state}, 0.0))
        ok, message = accept_route(store, "chat", n.daemon.config.routes[0].detection)
        assert not ok and "no evidence" in message and "specwatch baseline reset chat" in message
        assert store.get("chat", key) is not None
    finally:
        store.close()
