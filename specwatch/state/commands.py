"""The operator command queue: the `commands` table.

`specwatch baseline reset/accept` and the canary's adopt (`POST /api/v1/baselines/{route}/adopt`) write the
state directly and append one row here; the running daemon polls for rows past the last id it saw, reloads
that route, and records that id (`mark_seen`).

The table is bounded, so that a flood of commands cannot grow the file: a command equal to the route's newest
one not yet seen is not queued again (applying it twice is applying it once), and only the newest KEEP_ROWS
rows are kept.
"""

from __future__ import annotations

import sqlite3

# The actions: "reset" and "accept" for the acceptance baselines (`specwatch baseline`), "adopt" for the canary
# fingerprint (the next probe round becomes the current key's fingerprint).
BASELINE_ACTIONS = ("reset", "accept")
CANARY_ACTIONS = ("adopt",)
ACTIONS = BASELINE_ACTIONS + CANARY_ACTIONS
# Rows kept. The daemon reads its rows within COMMAND_POLL_SECONDS (10 s) of their writing; the rest is history.
KEEP_ROWS = 1000
_SEEN_KEY = "commands_seen"  # in the store's `meta` table: the last id the daemon took

SCHEMA = """
CREATE TABLE IF NOT EXISTS commands (
    id INTEGER PRIMARY KEY AUTOINCREMENT, route TEXT NOT NULL, action TEXT NOT NULL, created REAL NOT NULL);
"""


def append(conn: sqlite3.Connection, route: str, action: str, now: float) -> bool:
    """Queue `action` on `route` (False: the same action is already waiting for the daemon) and drop the rows
    older than the newest KEEP_ROWS."""
    waiting = conn.execute(
        "SELECT action FROM commands WHERE route=? AND id > ? ORDER BY id DESC LIMIT 1", (route, seen(conn))
    ).fetchone()
    if waiting is not None and waiting[0] == action:
        return False
    conn.execute("INSERT INTO commands (route, action, created) VALUES (?,?,?)", (route, action, now))
    conn.execute("DELETE FROM commands WHERE id <= (SELECT max(id) FROM commands) - ?", (KEEP_ROWS,))
    return True


def last_id(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT max(id) FROM commands").fetchone()
    return int(row[0] or 0) if row else 0


def since(conn: sqlite3.Connection, last: int) -> list[tuple[int, str, str]]:
    """(id, route, action) of the commands after id `last`, in order."""
    rows = conn.execute("SELECT id, route, action FROM commands WHERE id > ? ORDER BY id", (last,)).fetchall()
    return [(int(i), str(r), str(a)) for i, r, a in rows]


def seen(conn: sqlite3.Connection) -> int:
    """The last command id the daemon took (0: none recorded)."""
    row = conn.execute("SELECT value FROM meta WHERE key=?", (_SEEN_KEY,)).fetchone()
    try:
        return int(row[0]) if row else 0
    except ValueError:
        return 0


def mark_seen(conn: sqlite3.Connection, command_id: int) -> None:
    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (_SEEN_KEY, str(command_id)))
