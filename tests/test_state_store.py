"""The state store: files written by the current release load, and faults of the file never lose state."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from specwatch.cli import main as cli_main
from specwatch.config import Config, RouteConfig
from specwatch.evaluators.acceptance_drop import build_evaluator
from specwatch.evaluators.base import EvaluatorContext
from specwatch.snapshot import RouteObservation
from specwatch.state.baselines import Baseline, BaselineKey
from specwatch.state.store import DB_NAME, OPEN_RETRY_SECONDS, StateStore

KEY = BaselineKey("llama", "0.11.0", 4)

# The schema and rows as the release before the `state` package wrote them, kept verbatim so that the new code is
# held to reading them.
RELEASE_FILE = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE baselines (
    route TEXT NOT NULL, model_name TEXT NOT NULL, engine_version TEXT NOT NULL, k INTEGER NOT NULL,
    acceptance_ratio REAL NOT NULL, position_acceptance TEXT NOT NULL, mean_acceptance_length REAL,
    overdispersion REAL NOT NULL, drafted_tokens REAL NOT NULL, source TEXT NOT NULL, pinned INTEGER NOT NULL,
    created REAL NOT NULL, updated REAL NOT NULL, dispersion_intercept REAL, dispersion_slope REAL NOT NULL DEFAULT 0,
    dispersion_block_seconds REAL, daily_profile TEXT, PRIMARY KEY (route, model_name, engine_version, k));
CREATE TABLE route_state (route TEXT PRIMARY KEY, state TEXT NOT NULL, updated REAL NOT NULL);
CREATE TABLE probe_fingerprints (
    route TEXT NOT NULL, model_name TEXT NOT NULL, engine_version TEXT NOT NULL, k INTEGER NOT NULL,
    prompt_set TEXT NOT NULL, prompt_id TEXT NOT NULL, drafted REAL NOT NULL, accepted REAL NOT NULL,
    steps REAL NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY (route, model_name, engine_version, k, prompt_set, prompt_id));
CREATE TABLE probe_state (route TEXT PRIMARY KEY, state TEXT NOT NULL, updated REAL NOT NULL);
CREATE TABLE commands (
    id INTEGER PRIMARY KEY AUTOINCREMENT, route TEXT NOT NULL, action TEXT NOT NULL, created REAL NOT NULL);
INSERT INTO meta VALUES ('schema_version', '1');
INSERT INTO baselines VALUES ('chat', 'llama', '0.11.0', 4, 0.62, '[0.8,0.6]', 2.5, 12.0, 2e6, 'learned', 1,
    100.0, 200.0, 9.0, 0.01, 60.0, NULL);
INSERT INTO route_state VALUES ('chat', '{"version":1,"key":["llama","0.11.0",4]}', 300.0);
INSERT INTO probe_fingerprints VALUES ('chat', 'llama', '0.11.0', 4, 'default', 'p1', 100.0, 60.0, 40.0, 5.0);
INSERT INTO probe_state VALUES ('chat', '{"rounds":3}', 6.0);
INSERT INTO commands (route, action, created) VALUES ('chat', 'reset', 7.0);
"""


def _release_file(state_dir: Path) -> Path:
    path = state_dir / DB_NAME
    conn = sqlite3.connect(path)
    conn.executescript(RELEASE_FILE)
    conn.close()
    return path


def test_a_file_of_the_current_release_loads_in_full(tmp_path: Path) -> None:
    path = _release_file(tmp_path)
    store = StateStore(str(path))
    (b,) = store.baselines()
    assert (b.route, b.key, b.acceptance_ratio, b.position_acceptance) == ("chat", KEY, 0.62, (0.8, 0.6))
    assert b.dispersion_intercept == 9.0 and b.pinned and b.daily is None
    assert store.get("chat", KEY) == b
    assert store.route_state("chat") == {"version": 1, "key": ["llama", "0.11.0", 4]}
    assert store.fingerprint("chat", KEY, "default") == {"p1": (100.0, 60.0, 40.0)}
    assert store.fingerprint_keys("chat", "default") == [KEY]
    assert store.probe_state("chat") == {"rounds": 3}
    assert store.routes() == ["chat"]
    assert store.append_command("chat", "accept")  # continues the release's queue
    assert store.errors == []
    store.close()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT id, action FROM commands ORDER BY id").fetchall() == [(1, "reset"), (2, "accept")]
    assert json.loads(conn.execute("SELECT state FROM probe_state").fetchone()[0]) == {"rounds": 3}
    conn.close()


# --------------------------------------------------------------------------- faults of the file
def _baseline(ratio: float = 0.6, updated: float = 200.0, route: str = "chat") -> Baseline:
    return Baseline(
        route=route, key=KEY, acceptance_ratio=ratio, overdispersion=5.0, drafted_tokens=1e6, updated=updated
    )


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A state directory an unprivileged user can reach (pytest's tmp_path of root is not)."""
    d = Path(tempfile.mkdtemp(prefix="specwatch-state-"))
    d.chmod(0o755)
    yield d
    d.chmod(0o755)
    shutil.rmtree(d)


@contextlib.contextmanager
def _unprivileged() -> Iterator[None]:
    """File permissions bind root only once it gives them up: run the block as nobody (effective ids)."""
    if os.geteuid() != 0:
        yield
        return
    os.setegid(65534)
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


def _make_read_only(state_dir: Path) -> None:
    (state_dir / DB_NAME).chmod(0o444)
    state_dir.chmod(0o555)


def test_a_read_only_state_dir_is_still_read_and_writes_are_counted(
    shared_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = StateStore.in_state_dir(str(shared_dir))
    assert store.put(_baseline(0.6))
    store.close()
    _make_read_only(shared_dir)
    with _unprivileged():
        errors: list[str] = []
        store = StateStore.in_state_dir(str(shared_dir), errors)
        assert store.get("chat", KEY) == _baseline(0.6)  # the stored baseline holds
        assert store.mode == "read_only" and len(errors) == 1
        assert not store.put(_baseline(0.5, updated=300.0)) and len(errors) == 2  # the write failed, counted
        assert store.get("chat", KEY) == _baseline(0.5, updated=300.0)  # what this process learned still holds
        store.close()
        ctx = EvaluatorContext(config=Config(state_dir=str(shared_dir)), clock=lambda: 0.0)
        ev = build_evaluator(ctx, RouteConfig(name="chat", url="http://127.0.0.1:8000/metrics"))
        ev.evaluate(
            RouteObservation(route="chat", ts=1000.0, up=True, model_name="llama", engine_version="0.11.0", k=4)
        )
        assert ev.reference == _baseline(0.6)  # the detector tests against it, instead of relearning
        ev.close()
        assert cli_main(["baseline", "--state-dir", str(shared_dir), "list"]) == 0
    out = capsys.readouterr().out
    assert "llama" in out and "0.6000" in out and "no baselines yet" not in out


def _corrupt(path: Path) -> None:
    with open(path, "r+b") as f:
        f.write(b"this is not a database" * 200)


def test_commands_leave_a_corrupt_file_to_the_daemon(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / DB_NAME
    daemon = StateStore(str(path), clock=lambda: 1000.0)
    assert daemon.put(_baseline(0.6))
    daemon.register("chat", lambda: {"version": 1, "key": ["llama", "0.11.0", 4]})
    daemon.close()
    _corrupt(path)
    for action in (["list"], ["show", "chat"], ["reset", "chat"]):
        assert cli_main(["baseline", "--state-dir", str(tmp_path), *action]) == 1
        assert "corrupt" in capsys.readouterr().err
        assert sorted(p.name for p in tmp_path.iterdir() if "corrupt" in p.name) == []  # not moved
    errors: list[str] = []
    daemon = StateStore(str(path), errors, clock=lambda: 1000.0)  # only the daemon moves it aside
    assert any("moved aside" in e for e in errors) and (tmp_path / f"{DB_NAME}.corrupt-1000").exists()
    daemon.close()


def test_the_daemon_writes_a_new_file_when_its_file_is_moved_and_sees_later_commands(tmp_path: Path) -> None:
    path = tmp_path / DB_NAME
    errors: list[str] = []
    daemon = StateStore(str(path), errors, persist_seconds=60.0)
    daemon.register("chat", lambda: {"version": 1, "key": ["llama", "0.11.0", 4]})
    assert daemon.put(_baseline(0.6))
    daemon.tick(0.0)
    os.replace(path, tmp_path / "elsewhere.db")  # what a command that repaired the file used to do
    daemon.tick(60.0)
    assert any("moved or replaced" in e for e in errors)
    reader = StateStore(str(path), readonly=True)
    assert reader.get("chat", KEY) == _baseline(0.6) and reader.route_state("chat") is not None
    reader.close()
    assert cli_main(["baseline", "--state-dir", str(tmp_path), "reset", "chat"]) == 0
    daemon.tick(70.0)
    assert daemon.take_commands("chat") == ["reset"]  # the reset reached the daemon's file
    daemon.close()


def _full(store: StateStore) -> None:
    """No room for one more page: every write that needs one fails with SQLITE_FULL."""
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count={pages}")


def test_a_full_disk_logs_recovery_only_after_a_write_succeeds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    errors: list[str] = []
    store = StateStore(str(tmp_path / DB_NAME), errors)
    _full(store)
    big = dataclasses.replace(_baseline(), position_acceptance=tuple(0.5 for _ in range(4000)))
    with caplog.at_level(logging.INFO, logger="specwatch.state.store"):
        for _ in range(3):
            assert not store.put(big)
            assert store.get("chat", KEY) == big  # reads work on a full disk, and serve what was not written
        assert len(errors) == 3
        assert "again" not in caplog.text
        store._conn.execute("PRAGMA max_page_count=1000000")
        assert store.put(big)
        assert "written again" in caplog.text
    store.close()


def test_a_state_dir_unusable_at_start_is_retried_and_gets_what_was_learned(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state directory should be")  # as a full disk, it fails every open
    errors: list[str] = []
    store = StateStore.in_state_dir(str(blocker), errors)
    assert store.mode == "memory" and len(errors) == 1
    store.register("chat", lambda: {"version": 1, "key": ["llama", "0.11.0", 4]})
    assert store.put(_baseline(0.6))
    store.tick(0.0)
    store.tick(OPEN_RETRY_SECONDS)  # still unusable
    assert store.mode == "memory"
    blocker.unlink()
    store.tick(2 * OPEN_RETRY_SECONDS)
    assert store.mode == "file"
    reader = StateStore.in_state_dir(str(blocker), readonly=True)
    assert reader.get("chat", KEY) == _baseline(0.6) and reader.route_state("chat") is not None
    reader.close()
    store.close()


def test_corruption_while_running_is_noticed_and_nothing_is_lost(tmp_path: Path) -> None:
    path = tmp_path / DB_NAME
    errors: list[str] = []
    store = StateStore(str(path), errors, clock=lambda: 2000.0, persist_seconds=60.0)
    store.register("chat", lambda: {"version": 1, "key": ["llama", "0.11.0", 4]})
    assert store.put(_baseline(0.6))
    store.tick(0.0)
    store._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every page in the file, as after any checkpoint
    _corrupt(path)
    store.tick(60.0)
    assert any("corrupt" in e for e in errors) and (tmp_path / f"{DB_NAME}.corrupt-2000").exists()
    reader = StateStore(str(path), readonly=True)
    assert reader.get("chat", KEY) == _baseline(0.6) and reader.route_state("chat") is not None
    reader.close()
    assert store.put(_baseline(0.55, updated=300.0))  # and it keeps writing the new file
    store.close()


def test_a_version_one_file_reads_read_only_without_its_later_columns(tmp_path: Path) -> None:
    path = tmp_path / DB_NAME
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE baselines (
            route TEXT NOT NULL, model_name TEXT NOT NULL, engine_version TEXT NOT NULL, k INTEGER NOT NULL,
            acceptance_ratio REAL NOT NULL, position_acceptance TEXT NOT NULL, mean_acceptance_length REAL,
            overdispersion REAL NOT NULL, drafted_tokens REAL NOT NULL, source TEXT NOT NULL, pinned INTEGER NOT NULL,
            created REAL NOT NULL, updated REAL NOT NULL, PRIMARY KEY (route, model_name, engine_version, k));
        INSERT INTO baselines VALUES ('chat', 'llama', '0.11.0', 4, 0.5, '[]', 3.0, 30.0, 1e6, 'learned', 1, 1.0, 2.0);
    """)
    conn.close()
    before = path.read_bytes()
    errors: list[str] = []
    store = StateStore(str(path), errors, readonly=True)
    b = store.get("chat", KEY)
    assert b is not None and b.acceptance_ratio == 0.5 and b.dispersion_intercept is None and errors == []
    store.close()
    assert path.read_bytes() == before  # not migrated: a command that reads never writes
