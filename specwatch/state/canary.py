"""Canary probe state: the `probe_fingerprints` and `probe_state` tables.

A fingerprint is one key's per-prompt readings (drafted, accepted, verify steps) on a prompt set; the probe state
is the canary evaluator's own JSON (schedule, verdict), one row per route.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Mapping

from specwatch.state.baselines import BaselineKey

SCHEMA = """
CREATE TABLE IF NOT EXISTS probe_fingerprints (
    route TEXT NOT NULL, model_name TEXT NOT NULL, engine_version TEXT NOT NULL, k INTEGER NOT NULL,
    prompt_set TEXT NOT NULL, prompt_id TEXT NOT NULL, drafted REAL NOT NULL, accepted REAL NOT NULL,
    steps REAL NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY (route, model_name, engine_version, k, prompt_set, prompt_id));
CREATE TABLE IF NOT EXISTS probe_state (route TEXT PRIMARY KEY, state TEXT NOT NULL, updated REAL NOT NULL);
"""

Reading = tuple[float, float, float]  # drafted, accepted, verify steps


def fingerprint(conn: sqlite3.Connection, route: str, key: BaselineKey, prompt_set: str) -> dict[str, Reading]:
    rows = conn.execute(
        "SELECT prompt_id, drafted, accepted, steps FROM probe_fingerprints WHERE route=? AND model_name=? "
        "AND engine_version=? AND k=? AND prompt_set=?",
        (route, key.model_name, key.engine_version, key.k, prompt_set),
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
        "DELETE FROM probe_fingerprints WHERE route=? AND model_name=? AND engine_version=? AND k=? AND prompt_set=?",
        (route, key.model_name, key.engine_version, key.k, prompt_set),
    )
    conn.executemany(
        "INSERT INTO probe_fingerprints VALUES (?,?,?,?,?,?,?,?,?,?)",
        [
            (route, key.model_name, key.engine_version, key.k, prompt_set, pid, d, a, s, now)
            for pid, (d, a, s) in sorted(prompts.items())
        ],
    )


def fingerprint_keys(conn: sqlite3.Connection, route: str, prompt_set: str) -> list[BaselineKey]:
    rows = conn.execute(
        "SELECT model_name, engine_version, k FROM probe_fingerprints WHERE route=? AND prompt_set=? "
        "GROUP BY model_name, engine_version, k ORDER BY max(updated) DESC",
        (route, prompt_set),
    ).fetchall()
    return [BaselineKey(m, v, int(k)) for m, v, k in rows]


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
