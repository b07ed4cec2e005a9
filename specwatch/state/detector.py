"""Detector state: the `route_state` table, one JSON document per route (the acceptance-drop evaluator's CUSUM,
SPRT, learner sums and verdicts), written every persist period so that a restart carries on."""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Mapping

SCHEMA = """
CREATE TABLE IF NOT EXISTS route_state (route TEXT PRIMARY KEY, state TEXT NOT NULL, updated REAL NOT NULL);
"""


def get(conn: sqlite3.Connection, route: str) -> str | None:
    rows = conn.execute("SELECT state FROM route_state WHERE route=?", (route,)).fetchall()
    return str(rows[0][0]) if rows else None


def put(conn: sqlite3.Connection, states: Mapping[str, Mapping[str, Any]], now: float) -> None:
    conn.executemany(
        "INSERT OR REPLACE INTO route_state VALUES (?,?,?)",
        [(route, json.dumps(state, separators=(",", ":")), now) for route, state in states.items()],
    )


def routes(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT route FROM route_state").fetchall()}


def delete_route(conn: sqlite3.Connection, route: str) -> None:
    conn.execute("DELETE FROM route_state WHERE route=?", (route,))
