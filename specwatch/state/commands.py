"""The operator command queue: the `commands` table.

`specwatch baseline reset/accept` (and the daemon's `POST /api/v1/baselines/...`, which runs the same functions)
writes the baselines directly and appends one row here; the running daemon polls for rows past the last id it
saw and reloads that route.
"""

from __future__ import annotations

import sqlite3

# The actions: "reset" and "accept" for the acceptance baselines (`specwatch baseline`), "adopt" for the canary
# fingerprint (the next probe round becomes the current key's fingerprint).
BASELINE_ACTIONS = ("reset", "accept")
CANARY_ACTIONS = ("adopt",)
ACTIONS = BASELINE_ACTIONS + CANARY_ACTIONS

SCHEMA = """
CREATE TABLE IF NOT EXISTS commands (
    id INTEGER PRIMARY KEY AUTOINCREMENT, route TEXT NOT NULL, action TEXT NOT NULL, created REAL NOT NULL);
"""


def append(conn: sqlite3.Connection, route: str, action: str, now: float) -> None:
    conn.execute("INSERT INTO commands (route, action, created) VALUES (?,?,?)", (route, action, now))


def last_id(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT max(id) FROM commands").fetchone()
    return int(row[0] or 0) if row else 0


def since(conn: sqlite3.Connection, last: int) -> list[tuple[int, str, str]]:
    """(id, route, action) of the commands after id `last`, in order."""
    rows = conn.execute("SELECT id, route, action FROM commands WHERE id > ? ORDER BY id", (last,)).fetchall()
    return [(int(i), str(r), str(a)) for i, r, a in rows]
