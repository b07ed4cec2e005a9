"""Baseline store: round trips, kill -9 durability, corrupt and unwritable state, operator commands."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specwatch.stats.overdispersion import DispersionEstimator
from specwatch.state.baselines import Baseline, BaselineKey, BaselineLearner
from specwatch.state.store import DB_NAME, StateStore

KEY = BaselineKey("llama", "0.11.0", 4)


def _baseline(ratio: float = 0.5, tokens: float = 50_000.0, route: str = "chat") -> Baseline:
    return Baseline(
        route=route,
        key=KEY,
        acceptance_ratio=ratio,
        position_acceptance=(0.7, 0.5, 0.4, 0.3),
        mean_acceptance_length=2.9,
        overdispersion=30.0,
        drafted_tokens=tokens,
        source="learned",
        pinned=True,
        created=100.0,
        updated=200.0,
    )


def test_round_trip_survives_reopen(tmp_path: Path) -> None:
    store = StateStore.in_state_dir(str(tmp_path))
    assert store.put(_baseline())
    store.close()
    again = StateStore.in_state_dir(str(tmp_path))
    assert again.get("chat", KEY) == _baseline()
    assert again.get("chat", BaselineKey("llama", "0.11.0", 5)) is None
    assert [b.route for b in again.baselines()] == ["chat"]
    again.close()


def test_relative_stderr_follows_n_eff() -> None:
    b = _baseline(ratio=0.5, tokens=30_000.0)  # φ 30 -> n_eff 1000 -> se 0.0158 -> relative 0.0316
    assert b.relative_stderr() == pytest.approx(0.0316, rel=0.01)
    assert Baseline(route="r", key=KEY, acceptance_ratio=0.5).relative_stderr() == 0.0  # configured: exact


def test_learner_json_round_trip() -> None:
    learner = BaselineLearner()
    for i in range(400):
        learner.add(i * 15.0, 40.0 + (i % 7), 100.0, 25.0, [20.0, 12.0, 8.0, 5.0])
    again = BaselineLearner.from_json(learner.to_json())
    b1 = learner.baseline("chat", KEY, 9999.0, "learned", pinned=False)
    b2 = again.baseline("chat", KEY, 9999.0, "learned", pinned=False)
    assert b1.acceptance_ratio == b2.acceptance_ratio
    assert b1.position_acceptance == pytest.approx((0.8, 0.48, 0.32, 0.2))
    assert b1.mean_acceptance_length == pytest.approx(1 + learner.accepted / learner.drafts)


_WRITER = textwrap.dedent("""
    import sys
    from specwatch.state.baselines import Baseline, BaselineKey
    from specwatch.state.store import StateStore
    store = StateStore.in_state_dir(sys.argv[1])
    key = BaselineKey("llama", "0.11.0", 4)
    i = 0
    while True:
        i += 1
        b = Baseline(route="chat", key=key, acceptance_ratio=0.5, drafted_tokens=float(i), updated=float(i),
                     position_acceptance=tuple(float(i % 10) / 10 for _ in range(64)))
        assert store.put(b)
        store.flush()
        print(i, flush=True)
""")


@pytest.mark.slow
def test_kill_minus_nine_mid_write_keeps_last_committed(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        committed = 0
        for line in proc.stdout:  # let it commit a good number of transactions, then kill it mid-loop
            committed = int(line)
            if committed >= 300:
                break
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    errors: list[str] = []
    store = StateStore.in_state_dir(str(tmp_path), errors)
    b = store.get("chat", KEY)
    assert errors == []
    assert b is not None and b.drafted_tokens >= committed  # every printed (committed) write is there
    assert b.acceptance_ratio == 0.5
    store.close()


def test_corrupt_file_is_moved_aside_and_counted(tmp_path: Path) -> None:
    db = tmp_path / DB_NAME
    db.write_bytes(b"this is not sqlite at all \x00\x01\x02" * 200)
    errors: list[str] = []
    store = StateStore.in_state_dir(str(tmp_path), errors, clock=lambda: 1234.0)
    assert len(errors) == 1 and "corrupt" in errors[0] and "moved aside" in errors[0]
    assert (tmp_path / f"{DB_NAME}.corrupt-1234").exists()
    assert store.put(_baseline()) and store.get("chat", KEY) is not None  # the fresh store works
    store.close()
    assert StateStore.in_state_dir(str(tmp_path)).get("chat", KEY) is not None


def test_truncated_database_is_recovered(tmp_path: Path) -> None:
    store = StateStore.in_state_dir(str(tmp_path))
    for i in range(50):
        store.put(_baseline(route=f"r{i}"))
    store.close()
    db = tmp_path / DB_NAME
    data = db.read_bytes()
    db.write_bytes(data[:100] + b"\xff" * 3000 + data[3100:])  # clobber the header's tail and first pages
    for suffix in ("-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    errors: list[str] = []
    fresh = StateStore.in_state_dir(str(tmp_path), errors)
    assert errors and fresh.put(_baseline()) and fresh.get("chat", KEY) is not None
    fresh.close()


def test_unwritable_state_dir_keeps_working_in_memory(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the state directory should be")
    errors: list[str] = []
    store = StateStore.in_state_dir(str(blocker / "state"), errors)
    assert len(errors) == 1 and "in memory" in errors[0]
    assert store.put(_baseline()) and store.get("chat", KEY) is not None


def test_commands_reach_a_running_store(tmp_path: Path) -> None:
    daemon = StateStore.in_state_dir(str(tmp_path))
    daemon.tick(0.0)
    cli = StateStore.in_state_dir(str(tmp_path))
    cli.append_command("chat", "accept")
    cli.append_command("other", "reset")
    cli.close()
    daemon.tick(5.0)  # before the poll period: not seen yet
    assert daemon.take_commands("chat") == []
    daemon.tick(11.0)
    assert daemon.take_commands("chat") == ["accept"]
    assert daemon.take_commands("chat") == []
    assert daemon.take_commands("other") == ["reset"]
    daemon.close()


def test_route_state_is_flushed_periodically_and_on_unregister(tmp_path: Path) -> None:
    store = StateStore.in_state_dir(str(tmp_path), persist_seconds=60.0)
    state = {"n": 0}
    store.register("chat", lambda: dict(state))
    store.tick(0.0)
    state["n"] = 1
    store.tick(30.0)
    reader = StateStore.in_state_dir(str(tmp_path))
    assert reader.route_state("chat") is None
    store.tick(61.0)
    assert reader.route_state("chat") == {"n": 1}
    state["n"] = 2
    store.unregister("chat")  # last user: flushes and closes
    assert reader.route_state("chat") == {"n": 2}
    reader.close()


# --------------------------------------------------------------------------- the operator CLI
def _daemon_after_a_model_change(tmp_path: Path):
    from specwatch.config import Config, DetectionConfig, RouteConfig
    from specwatch.evaluators.acceptance_drop import build_evaluator
    from specwatch.evaluators.base import EvaluatorContext
    from specwatch.offline.replay import ObservationBuilder
    from specwatch.offline.tracegen import ModelChange, TraceSpec, generate

    detection = DetectionConfig(warmup_drafted_tokens=20_000, warmup_seconds=1800.0)
    ctx = EvaluatorContext(config=Config(state_dir=str(tmp_path), detection=detection), clock=lambda: 0.0)
    ev = build_evaluator(ctx, RouteConfig(name="chat", url="http://127.0.0.1:1/metrics", detection=detection))
    spec = TraceSpec(
        rate=1.0,
        duration=2.75 * 3600.0,
        seed=3,  # ends before adopt_after (1 h)
        changes=(ModelChange(at=2 * 3600.0, model_name="m2"),),
    )
    builder = ObservationBuilder("chat")
    for sample in generate(spec):
        ev.evaluate(builder.observe(sample), ())
    ev.store.flush()
    return ev, spec.start + spec.duration


def test_cli_list_show_accept_on_a_running_daemon(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specwatch.cli import main as cli_main
    from specwatch.snapshot import RouteObservation

    ev, end = _daemon_after_a_model_change(tmp_path)
    assert ev.reference.key.model_name == "model-a"  # the old baseline is still the reference
    assert cli_main(["baseline", "--state-dir", str(tmp_path), "list"]) == 0
    out = capsys.readouterr().out
    assert "ROUTE" in out and "chat" in out and "model-a" in out
    assert cli_main(["baseline", "--state-dir", str(tmp_path), "show", "chat"]) == 0
    out = capsys.readouterr().out
    assert "current model:     m2" in out and "SPRT" in out and "p1=" in out
    assert cli_main(["baseline", "--state-dir", str(tmp_path), "accept", "chat"]) == 0
    assert "accepted" in capsys.readouterr().out
    ev.evaluate(RouteObservation(route="chat", ts=end + 15, up=True, model_name="m2", k=4), ())
    assert ev.reference is not None and ev.reference.key.model_name == "m2" and ev.reference.source == "accepted"
    assert ev.fields()["degraded"] is False
    ev.close()


def test_cli_reset_on_a_stopped_daemon(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specwatch.cli import main as cli_main

    ev, _ = _daemon_after_a_model_change(tmp_path)
    ev.close()
    assert cli_main(["baseline", "--state-dir", str(tmp_path), "reset", "chat"]) == 0
    assert "relearns" in capsys.readouterr().out
    store = StateStore.in_state_dir(str(tmp_path))
    assert store.baselines("chat") == [] and store.route_state("chat") is None
    store.close()
    assert cli_main(["baseline", "--state-dir", str(tmp_path), "show", "chat"]) == 1
    assert cli_main(["baseline", "--state-dir", str(tmp_path / "nowhere"), "list"]) == 1


def test_learner_state_keeps_its_dispersion_only_for_the_same_block_length() -> None:
    learner = BaselineLearner(dispersion=DispersionEstimator(block_seconds=15.0))
    for i in range(1, 401):
        learner.add(i * 15.0, 40.0 + (i % 7), 100.0, 25.0, [20.0, 12.0, 8.0, 5.0], start=(i - 1) * 15.0)
    assert learner.dispersion.blocks == 400  # every 15 s interval is a whole block
    same = BaselineLearner.from_json(learner.to_json(), block_seconds=15.0)
    assert same.dispersion == learner.dispersion
    other = BaselineLearner.from_json(learner.to_json(), block_seconds=60.0)
    assert other.dispersion.blocks == 0 and other.dispersion.block_seconds == 60.0  # φ is re-learned on 60 s blocks
    assert other.drafted == learner.drafted  # the token counts do not depend on the blocks
    legacy = learner.to_json()
    del legacy["block_seconds"]  # saved before it was recorded: learned on 60 s blocks
    assert BaselineLearner.from_json(legacy, block_seconds=60.0).dispersion.blocks == 400
