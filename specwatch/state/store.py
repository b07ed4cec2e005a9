"""The daemon's state store: one SQLite file (`<state_dir>/baselines.db`), one table per concern.

| table | module | holds |
|---|---|---|
| `baselines` | state/baselines.py | acceptance baselines per (route, model, engine version, k) |
| `route_state` | state/detector.py | each route's detector state (JSON), saved every persist period |
| `probe_fingerprints`, `probe_state` | state/canary.py | canary fingerprints per key, the canary's own state |
| `commands` | state/commands.py | operator commands for the running daemon |

The daemon, `specwatch baseline ...`, `specwatch probe` and replay all use `StateStore`, so the file format lives in
this package only. `StateStore` owns the connection and the error policy; the table modules own their SQL.

Durability: WAL journal, `synchronous=NORMAL` (a committed transaction survives kill -9 of the process), one
transaction per write. A file that is not a readable SQLite database is moved aside as
`<name>.corrupt-<unix ts>`, reported through the caller's `errors` list and one log line, and a fresh store
is created; if the state directory cannot be written at all the store keeps working in memory. No store
error ever propagates to the daemon.

Operators talk to a running daemon through the `commands` table: the CLI writes baselines directly and
appends a command row; the daemon polls `max(id)` every `COMMAND_POLL_SECONDS` and reloads that route.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable, Mapping, cast

from specwatch.state import baselines, canary, commands, detector
from specwatch.state.baselines import Baseline, BaselineKey

log = logging.getLogger(__name__)

DB_NAME = "baselines.db"
SCHEMA_VERSION = 1
COMMAND_POLL_SECONDS = 10.0
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    + baselines.SCHEMA
    + detector.SCHEMA
    + canary.SCHEMA
    + commands.SCHEMA
)


# --------------------------------------------------------------------------- the store
StateProvider = Callable[[], "dict[str, Any] | None"]


class StateStore:
    """SQLite-backed baselines, per-route detector state and operator commands. Never raises sqlite3 errors."""

    def __init__(
        self,
        path: str | None,
        errors: list[str] | None = None,
        clock: Callable[[], float] = time.time,
        persist_seconds: float = 60.0,
    ) -> None:
        """`path` None: in memory (replay, tests). `errors` receives one line per state error."""
        self.path = path
        self.errors = errors if errors is not None else []
        self.clock = clock
        self.persist_seconds = persist_seconds
        self._providers: dict[str, StateProvider] = {}
        self._users = 0
        self._last_flush: float | None = None
        self._last_poll: float | None = None
        self._last_command_id = 0
        self._pending: dict[str, list[str]] = {}
        self._failing = False  # log a write failure once per state change, count every one
        self.closed = False
        self._conn = self._open()
        self._last_command_id = self._max_command_id()

    @classmethod
    def in_state_dir(cls, state_dir: str, errors: list[str] | None = None, **kwargs: Any) -> "StateStore":
        return cls(str(Path(state_dir) / DB_NAME), errors, **kwargs)

    # ------------------------------------------------------------------ opening and recovery
    def _open(self) -> sqlite3.Connection:
        if self.path is None:
            return self._connect(":memory:")
        try:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._error(f"cannot create state directory for {self.path}: {exc}; keeping baselines in memory only")
            return self._connect(":memory:")
        try:
            return self._connect(self.path)
        except sqlite3.DatabaseError as exc:
            if _is_corruption(exc):
                return self._recover(exc)
            self._error(f"cannot open {self.path}: {exc}; keeping baselines in memory only")
            return self._connect(":memory:")

    def _connect(self, target: str) -> sqlite3.Connection:
        conn = sqlite3.connect(target, timeout=2.0, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            if target != ":memory:":
                row = conn.execute("PRAGMA quick_check").fetchone()
                if row is None or row[0] != "ok":
                    raise sqlite3.DatabaseError(f"database disk image is malformed (quick_check: {row})")
            conn.executescript(_SCHEMA)
            baselines.migrate(conn)
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        except sqlite3.Error:
            conn.close()
            raise
        return conn

    def _recover(self, exc: Exception) -> sqlite3.Connection:
        """Move a corrupt database (and its WAL/SHM) aside and start an empty one."""
        assert self.path is not None
        aside = f"{self.path}.corrupt-{int(self.clock())}"
        try:
            os.replace(self.path, aside)
            for suffix in ("-wal", "-shm"):
                if os.path.exists(self.path + suffix):
                    os.replace(self.path + suffix, aside + suffix)
            self._error(
                f"state file {self.path} is corrupt ({exc}); moved aside to {aside}, baselines will be relearned"
            )
            return self._connect(self.path)
        except (OSError, sqlite3.Error) as again:
            self._error(
                f"state file {self.path} is corrupt ({exc}) and cannot be replaced ({again}); "
                f"keeping baselines in memory only"
            )
            return self._connect(":memory:")

    def _error(self, message: str) -> None:
        self.errors.append(message)
        log.error("baseline store: %s", message)

    def _run(self, what: str, fn: Callable[[sqlite3.Connection], Any], default: Any = None) -> Any:
        """Run one statement or transaction; turn any SQLite error into a counted state error."""
        try:
            result = fn(self._conn)
        except sqlite3.Error as exc:
            if self._conn.in_transaction:
                try:
                    self._conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            if isinstance(exc, sqlite3.DatabaseError) and _is_corruption(exc) and self.path is not None:
                self._conn.close()
                self._conn = self._recover(exc)
            elif not self._failing:
                self._error(f"{what} failed on {self.path or 'memory'}: {exc}")
            else:
                self.errors.append(f"{what} failed: {exc}")
            self._failing = True
            return default
        if self._failing:
            log.info("baseline store: %s works again", self.path)
            self._failing = False
        return result

    def _transaction(self, what: str, statements: Callable[[sqlite3.Connection], object]) -> bool:
        def tx(conn: sqlite3.Connection) -> bool:
            conn.execute("BEGIN IMMEDIATE")
            statements(conn)
            conn.execute("COMMIT")
            return True

        return bool(self._run(what, tx, False))

    # ------------------------------------------------------------------ baselines
    def get(self, route: str, key: BaselineKey) -> Baseline | None:
        rows = self._run("reading a baseline", lambda c: baselines.select(c, route, key), [])
        return rows[0] if rows else None

    def baselines(self, route: str | None = None) -> list[Baseline]:
        return list(self._run("listing baselines", lambda c: baselines.select(c, route), []))

    def put(self, baseline: Baseline) -> bool:
        return self._transaction("writing a baseline", lambda c: baselines.insert(c, baseline))

    def delete(self, route: str, key: BaselineKey) -> bool:
        return self._transaction("deleting a baseline", lambda c: baselines.delete(c, route, key))

    def delete_route(self, route: str) -> bool:
        def statements(c: sqlite3.Connection) -> None:
            baselines.delete(c, route)
            detector.delete_route(c, route)
            canary.delete_route(c, route)

        return self._transaction("deleting a route's baselines", statements)

    def routes(self) -> list[str]:
        """Routes with a baseline or detector state."""
        return sorted(
            self._run("listing routes", lambda c: baselines.routes(c) | detector.routes(c), cast(set[str], set()))
        )

    # ------------------------------------------------------------------ canary probe fingerprints
    def fingerprint(self, route: str, key: BaselineKey, prompt_set: str) -> dict[str, canary.Reading]:
        """prompt id -> (drafted, accepted, verify steps) of the key's fingerprint; empty when there is none."""
        return dict(
            self._run("reading a probe fingerprint", lambda c: canary.fingerprint(c, route, key, prompt_set), {})
        )

    def put_fingerprint(
        self, route: str, key: BaselineKey, prompt_set: str, prompts: Mapping[str, canary.Reading]
    ) -> bool:
        """Replace the key's fingerprint with these per-prompt readings."""
        now = self.clock()
        return self._transaction(
            "writing a probe fingerprint", lambda c: canary.put_fingerprint(c, route, key, prompt_set, prompts, now)
        )

    def fingerprint_keys(self, route: str, prompt_set: str) -> list[BaselineKey]:
        """Keys with a fingerprint for this route and prompt set, most recently written first."""
        return list(
            self._run("listing probe fingerprints", lambda c: canary.fingerprint_keys(c, route, prompt_set), [])
        )

    def probe_state(self, route: str) -> dict[str, Any] | None:
        raw = self._run("reading probe state", lambda c: canary.probe_state(c, route))
        try:
            state = json.loads(raw) if raw is not None else None
        except ValueError:
            return None
        return state if isinstance(state, dict) else None

    def put_probe_state(self, route: str, state: Mapping[str, Any]) -> bool:
        now = self.clock()
        return self._transaction("saving probe state", lambda c: canary.put_probe_state(c, route, state, now))

    # ------------------------------------------------------------------ detector state
    def route_state(self, route: str) -> dict[str, Any] | None:
        raw = self._run("reading route state", lambda c: detector.get(c, route))
        if raw is None:
            return None
        try:
            state = json.loads(raw)
        except ValueError as exc:
            self._error(f"unreadable state of route {route!r} ({exc}); starting it afresh")
            return None
        return state if isinstance(state, dict) else None

    def register(self, route: str, provider: StateProvider) -> None:
        """`provider()` returns the route's detector state to persist (JSON-able) at every flush."""
        self._providers[route] = provider
        self._users += 1

    def acquire(self) -> None:
        """One more user with no state to flush (the canary evaluator); `release()` when done."""
        self._users += 1

    def release(self) -> None:
        self._users -= 1
        if self._users <= 0:
            self.close()

    def unregister(self, route: str) -> None:
        """Flush this route's state; close the store when its last user leaves."""
        provider = self._providers.get(route)
        if provider is not None:
            self._save_states({route: provider()})
            del self._providers[route]
        self._users -= 1
        if self._users <= 0:
            self.close()

    def tick(self, now: float) -> None:
        """Called by every evaluator every cycle; does real work only every persist/poll period."""
        if self._last_flush is None:
            self._last_flush = now
        elif now - self._last_flush >= self.persist_seconds or now < self._last_flush:
            self.flush()
            self._last_flush = now
        if self._last_poll is None or now - self._last_poll >= COMMAND_POLL_SECONDS or now < self._last_poll:
            self._last_poll = now
            self._poll_commands()

    def flush(self) -> bool:
        return self._save_states({route: provider() for route, provider in self._providers.items()})

    def _save_states(self, states: Mapping[str, dict[str, Any] | None]) -> bool:
        now = self.clock()
        present = {route: state for route, state in states.items() if state is not None}
        if not present:
            return True
        return self._transaction("saving detector state", lambda c: detector.put(c, present, now))

    # ------------------------------------------------------------------ operator commands
    def append_command(self, route: str, action: str) -> bool:
        now = self.clock()
        return self._transaction("queueing an operator command", lambda c: commands.append(c, route, action, now))

    def take_commands(self, route: str) -> list[str]:
        """Operator actions ("reset", "accept") for `route` seen since the last call."""
        return self._pending.pop(route, [])

    def _max_command_id(self) -> int:
        return int(self._run("reading commands", commands.last_id, 0))

    def _poll_commands(self) -> None:
        last = self._last_command_id
        for command_id, route, action in self._run("reading commands", lambda c: commands.since(c, last), []):
            self._last_command_id = max(self._last_command_id, command_id)
            self._pending.setdefault(route, []).append(action)

    def close(self) -> None:
        self.closed = True
        try:
            self._conn.close()
        except sqlite3.Error:
            pass


def _is_corruption(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return any(s in text for s in ("not a database", "malformed", "file is encrypted", "corrupt"))
