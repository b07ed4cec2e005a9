"""The state store: files written by the current release load, and faults of the file never lose state."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from specwatch.state.baselines import BaselineKey
from specwatch.state.store import DB_NAME, StateStore

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
