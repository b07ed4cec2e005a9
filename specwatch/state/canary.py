"""Canary probe state: the `probe_fingerprints` and `probe_state` tables.

A fingerprint is one key's per-prompt readings (drafted, accepted, verify steps) on a prompt set; the probe state
is the canary evaluator's own JSON (schedule, verdict), one row per route.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Mapping

from specwatch.state.baselines import KEY_COLUMN, BaselineKey, rekey

_FINGERPRINTS = """
CREATE TABLE IF NOT EXISTS {name} (
    route TEXT NOT NULL, model_name TEXT NOT NULL, engine_version TEXT NOT NULL, k INTEGER NOT NULL,
    prompt_set TEXT NOT NULL, prompt_id TEXT NOT NULL, drafted REAL NOT NULL, accepted REAL NOT NULL,
    steps REAL NOT NULL, updated REAL NOT NULL, drafter TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (route, model_name, engine_version, k, drafter, prompt_set, prompt_id));
"""
_COLUMNS = "route, model_name, engine_version, k, prompt_set, prompt_id, drafted, accepted, steps, updated"
SCHEMA = (
    _FINGERPRINTS.format(name="probe_fingerprints")
    + "CREATE TABLE IF NOT EXISTS probe_state (route TEXT PRIMARY KEY, state TEXT NOT NULL, updated REAL NOT NULL);"
)
_KEY = "route=? AND model_name=? AND engine_version=? AND k=? AND drafter=?"


Reading = tuple[float, float, float]  # drafted, accepted, verify steps


def _keyed(conn: sqlite3.Connection) -> bool:
    """Whether the table has the drafter column (a file of an older release opened read-only has not)."""
    return KEY_COLUMN in {row[1] for row in conn.execute("PRAGMA table_info(probe_fingerprints)")}


def migrate(conn: sqlite3.Connection) -> None:
    """Key the fingerprints of a file written before the drafter was part of the key by drafter ""."""
    if not _keyed(conn):
        rekey(conn, "probe_fingerprints", _FINGERPRINTS, f"{_COLUMNS}, {KEY_COLUMN}", f"{_COLUMNS}, ''")


def fingerprint(conn: sqlite3.Connection, route: str, key: BaselineKey, prompt_set: str) -> dict[str, Reading]:
    args: tuple[object, ...] = (route, key.model_name, key.engine_version, key.k)
    if _keyed(conn):
        where, args = _KEY, (*args, key.drafter)
    elif key.drafter:
        return {}  # an older file read-only: its fingerprints are all of drafter ""
    else:
        where = _KEY.removesuffix(" AND drafter=?")
    rows = conn.execute(
        f"SELECT prompt_id, drafted, accepted, steps FROM probe_fingerprints WHERE {where} AND prompt_set=?",
        (*args, prompt_set),
    ).fetchall()
    return {pid: (float(d), float(a), float(s)) for pid, d, a, s in rows}


def put_fingerprint(
    conn: sqlite3.Connection,
    route: str,
    key: BaselineKey,
    prompt_set: str,
    prompts: Mapping[str, Reading],
    now: float,
) -> None:
    conn.execute(
        f"DELETE FROM probe_fingerprints WHERE {_KEY} AND prompt_set=?",
        (route, key.model_name, key.engine_version, key.k, key.drafter, prompt_set),
    )
    conn.executemany(
        f"INSERT INTO probe_fingerprints ({_COLUMNS}, {KEY_COLUMN}) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        [
            (route, key.model_name, key.engine_version, key.k, prompt_set, pid, d, a, s, now, key.drafter)
            for pid, (d, a, s) in sorted(prompts.items())
        ],
    )


def fingerprint_keys(conn: sqlite3.Connection, route: str, prompt_set: str) -> list[BaselineKey]:
    drafter = KEY_COLUMN if _keyed(conn) else "''"
    rows = conn.execute(
        f"SELECT model_name, engine_version, k, {drafter} FROM probe_fingerprints WHERE route=? AND prompt_set=? "
        f"GROUP BY model_name, engine_version, k, {drafter} ORDER BY max(updated) DESC",
        (route, prompt_set),
    ).fetchall()
    return [BaselineKey(m, v, int(k), d) for m, v, k, d in rows]


def probe_state(conn: sqlite3.Connection, route: str) -> str | None:
    rows = conn.execute("SELECT state FROM probe_state WHERE route=?", (route,)).fetchall()
    return str(rows[0][0]) if rows else None


def put_probe_state(conn: sqlite3.Connection, route: str, state: Mapping[str, Any], now: float) -> None:
    conn.execute(
        "INSERT OR REPLACE INTO probe_state VALUES (?,?,?)", (route, json.dumps(state, separators=(",", ":")), now)
    )


def delete_route(conn: sqlite3.Connection, route: str) -> None:
    conn.execute("DELETE FROM probe_fingerprints WHERE route=?", (route,))
    conn.execute("DELETE FROM probe_state WHERE route=?", (route,))
