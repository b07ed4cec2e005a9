"""The operator command queue (state/commands.py) stays bounded under a flood of commands, and the daemon still
takes every command that changes something."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from specwatch.state.commands import KEEP_ROWS
from specwatch.state.store import COMMAND_POLL_SECONDS, StateStore


def _rows(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT count(*) FROM commands").fetchone()[0])
    finally:
        conn.close()


def _size(path: Path) -> int:
    return sum(os.path.getsize(p) for p in (str(path), f"{path}-wal") if os.path.exists(p))


def test_a_flood_of_commands_keeps_the_table_and_the_file_bounded(tmp_path: Path) -> None:
    path = tmp_path / "baselines.db"
    daemon = StateStore(str(path), clock=lambda: 0.0)
    cli = StateStore(str(path), repair=False)
    daemon.tick(0.0)
    sizes = []
    for i in range(12_000):
        # every kind of flood: one action repeated, actions alternating, many routes
        assert cli.append_command(f"r{i % 7}", ("reset", "accept", "adopt")[i % 3] if i % 2 else "adopt")
        if i % 2000 == 1999:
            daemon.tick(COMMAND_POLL_SECONDS * (i + 1))  # the daemon takes what is queued now and then
            cli._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            sizes.append(_size(path))
    assert _rows(path) <= KEEP_ROWS
    assert cli.errors == [] and daemon.errors == []
    # the file stops growing once the table holds its KEEP_ROWS rows: freed pages are reused
    assert sizes[-1] <= sizes[1] * 1.2, sizes
    assert sizes[-1] < 512 * 1024, sizes
    cli.close()
    daemon.close()


def test_a_command_already_waiting_is_not_queued_again_but_one_taken_is(tmp_path: Path) -> None:
    path = tmp_path / "baselines.db"
    daemon = StateStore(str(path), clock=lambda: 0.0)
    daemon.tick(0.0)
    cli = StateStore(str(path), repair=False)
    for _ in range(500):
        assert cli.append_command("chat", "adopt")
    assert _rows(path) == 1  # the daemon applies a waiting adopt once, however often it was asked for
    daemon.tick(COMMAND_POLL_SECONDS)
    assert daemon.take_commands("chat", ("adopt",)) == ["adopt"]
    assert cli.append_command("chat", "adopt")  # taken: the next one is a new command
    assert cli.append_command("chat", "reset")
    assert cli.append_command("chat", "adopt")  # not the newest waiting one: its order matters
    daemon.tick(2 * COMMAND_POLL_SECONDS)
    assert daemon.take_commands("chat", ("adopt", "reset")) == ["adopt", "reset", "adopt"]
    cli.close()
    daemon.close()
