"""The daemon's state store: one SQLite file (`<state_dir>/baselines.db`), one table per concern.

| table | module | holds |
|---|---|---|
| `baselines` | state/baselines.py | acceptance baselines per (route, model, engine version, k, drafter) |
| `route_state` | state/detector.py | each route's detector state (JSON), saved every persist period |
| `probe_fingerprints`, `probe_state` | state/canary.py | canary fingerprints per key, the canary's own state |
| `commands` | state/commands.py | operator commands for the running daemon |

The daemon, `specwatch baseline ...`, `specwatch probe` and replay all use `StateStore`, so the file format lives in
this package only. `StateStore` owns the connection and the error policy; the table modules own their SQL.

Durability: WAL journal, `synchronous=NORMAL` (a committed transaction survives kill -9 of the process), one
transaction per write. No store error ever propagates to the daemon; each is reported through the caller's
`errors` list (specwatch_state_errors_total) and a log line per failing spell. Only the daemon repairs:

- a file that is not a readable SQLite database, at start or found by the check every persist period (a fresh
  connection's quick_check, and an error of any read or write), is moved aside as `<name>.corrupt-<unix ts>`
  and a fresh one gets everything this process holds (the baselines it read or wrote, every route's state);
- a file moved or replaced under it is noticed by the same check and written anew the same way;
- a file that cannot be written (read-only, full disk, missing directory) is read if it can be, so stored
  baselines still hold, writes fail and are counted, and opening it for writing is retried every
  `OPEN_RETRY_SECONDS`; "written again" is logged only after a write succeeded.

Commands (`specwatch baseline`, `specwatch probe`) never move or repair the file; `list` and `show` open it
read-only.

Operators talk to a running daemon through the `commands` table: the CLI writes baselines directly and
appends a command row; the daemon polls `max(id)` every `COMMAND_POLL_SECONDS` and reloads that route.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Container, Mapping, cast

from specwatch.state import baselines, canary, commands, detector
from specwatch.state.baselines import Baseline, BaselineKey
from specwatch.state.commands import BASELINE_ACTIONS

log = logging.getLogger(__name__)

DB_NAME = "baselines.db"
SCHEMA_VERSION = 1
COMMAND_POLL_SECONDS = 10.0
# A state file the daemon could not open for writing (a full disk, a read-only mount, a missing directory) is
# retried this often: an operator may fix it while the daemon runs, and nothing learned meanwhile is lost.
OPEN_RETRY_SECONDS = 60.0
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
    """SQLite-backed baselines, per-route detector state and operator commands. Never raises sqlite3 errors.

    Modes: "file" (read-write on `path`), "read_only" (the file could be read but not written: stored
    baselines are honoured, every write fails and is counted, the daemon retries writing), "memory" (no
    usable file; the daemon retries opening it).
    """

    def __init__(
        self,
        path: str | None,
        errors: list[str] | None = None,
        clock: Callable[[], float] = time.time,
        persist_seconds: float = 60.0,
        readonly: bool = False,
        repair: bool = True,
    ) -> None:
        """`path` None: in memory (replay, tests). `errors` receives one line per state error.

        `readonly`: open for reading only (`baseline list/show`): the file is never created, written or moved.
        `repair`: move a corrupt file aside and start a fresh one, check the file every persist period and
        retry a failed open; only the daemon does this, so commands pass False and leave a bad file to it.
        """
        self.path = path
        self.errors = errors if errors is not None else []
        self.clock = clock
        self.persist_seconds = persist_seconds
        self.readonly = readonly
        self.repair = repair and not readonly
        self.mode = "memory"
        self._identity: tuple[int, int] | None = None  # (device, inode) of the file opened read-write
        self._providers: dict[str, StateProvider] = {}
        self._users = 0
        self._last_flush: float | None = None
        self._last_poll: float | None = None
        self._last_retry: float | None = None
        self._last_command_id = 0
        self._marked_command_id: int | None = None  # the last id recorded as taken (commands.mark_seen)
        self._pending: dict[str, list[str]] = {}
        # Every baseline this process read or wrote, so that a file moved aside or replaced is written again
        # with them, and the ones whose write failed (served from here, since the file lacks them).
        self._baselines: dict[tuple[str, BaselineKey], Baseline] = {}
        self._unsaved: set[tuple[str, BaselineKey]] = set()
        self._failing = False  # log a write failure once per state change, count every one
        self._rewriting = False
        self.closed = False
        self._conn = self._open()
        if not readonly:  # a reader never takes commands
            self._last_command_id = self._max_command_id()

    @classmethod
    def in_state_dir(cls, state_dir: str, errors: list[str] | None = None, **kwargs: Any) -> "StateStore":
        return cls(str(Path(state_dir) / DB_NAME), errors, **kwargs)

    # ------------------------------------------------------------------ opening and recovery
    def _open(self) -> sqlite3.Connection:
        if self.path is None:
            return self._memory()
        if self.readonly:
            try:
                conn = _connect_read_only(self.path)
            except sqlite3.Error as exc:
                what = (
                    "is corrupt; left as it is (the daemon moves it aside)" if _is_corruption(exc) else "cannot be read"
                )
                self._error(f"state file {self.path} {what}: {exc}")
                return self._memory()
            self.mode = "read_only"
            return conn
        try:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            return self._open_file()
        except sqlite3.DatabaseError as exc:
            if _is_corruption(exc):
                if self.repair:
                    return self._recover(exc)
                self._error(f"state file {self.path} is corrupt ({exc}); left as it is (the daemon moves it aside)")
                return self._memory()
            return self._fallback(exc)
        except OSError as exc:
            return self._fallback(exc)

    def _open_file(self) -> sqlite3.Connection:
        assert self.path is not None
        conn = _connect(self.path)
        try:
            st = os.stat(self.path)
        except OSError:
            conn.close()
            raise
        self.mode, self._identity = "file", (st.st_dev, st.st_ino)
        return conn

    def _memory(self) -> sqlite3.Connection:
        self.mode, self._identity = "memory", None
        return _connect(":memory:")

    def _fallback(self, exc: Exception) -> sqlite3.Connection:
        """The file cannot be opened for writing: read it if possible, so that stored (pinned) baselines hold."""
        assert self.path is not None
        retry = f"; retried every {OPEN_RETRY_SECONDS:.0f} s" if self.repair else ""
        try:
            conn = _connect_read_only(self.path)
        except sqlite3.Error:
            self._error(f"cannot open {self.path}: {exc}; keeping state in memory only{retry}")
            return self._memory()
        self._error(f"cannot write {self.path} ({exc}); reading it, keeping changes in memory{retry}")
        self.mode, self._identity = "read_only", None
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
                f"state file {self.path} is corrupt ({exc}); moved aside to {aside}, "
                "a fresh one holds what this process knows"
            )
            return self._open_file()
        except (OSError, sqlite3.Error) as again:
            self._error(
                f"state file {self.path} is corrupt ({exc}) and cannot be replaced ({again}); "
                f"keeping state in memory only"
            )
            return self._memory()

    def _reopen(self, conn: sqlite3.Connection) -> None:
        """Swap in a new connection and write into it what this process holds."""
        old, self._conn = self._conn, conn
        if old is not conn:
            try:
                old.close()
            except sqlite3.Error:
                pass
        self._rewrite()

    def _rewrite(self) -> None:
        """After a recovery or reopen: every baseline this process knows (where the file has no newer one)
        and every route's detector state go into the file, and commands are read from its current end."""
        if self._rewriting:
            return
        self._rewriting = True
        try:
            known = list(self._baselines.values())

            def statements(c: sqlite3.Connection) -> None:
                for b in known:
                    stored = baselines.select(c, b.route, b.key)
                    if not stored or stored[0].updated < b.updated:
                        baselines.insert(c, b)

            if self._transaction("writing the baselines held in memory", statements):
                self._unsaved.clear()
            self.flush()
            self._last_command_id = self._max_command_id()
        finally:
            self._rewriting = False

    def _retry_open(self) -> None:
        """The daemon's retry of a file it could not write: a full disk or a read-only mount may be fixed."""
        assert self.path is not None
        try:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = self._open_file()
        except sqlite3.DatabaseError as exc:
            if _is_corruption(exc):
                self._reopen(self._recover(exc))
            else:
                log.debug("state store: %s still cannot be opened for writing: %s", self.path, exc)
            return
        except OSError as exc:
            log.debug("state store: %s still cannot be opened for writing: %s", self.path, exc)
            return
        log.info("state store: %s opened for writing", self.path)
        self._reopen(conn)

    def _check_file(self) -> None:
        """The daemon's periodic check that the file at `path` is still the one it writes, and still sound (a
        fresh read-only connection's quick_check: this connection's page cache would hide a damaged file)."""
        assert self.path is not None
        try:
            st = os.stat(self.path)
            same = (st.st_dev, st.st_ino) == self._identity
        except OSError:
            same = False
        if not same:
            self._error(f"state file {self.path} was moved or replaced while open; writing a new one")
            try:
                conn = self._open_file()
            except sqlite3.DatabaseError as exc:
                conn = self._recover(exc) if _is_corruption(exc) else self._fallback(exc)
            except OSError as exc:
                conn = self._fallback(exc)
            self._reopen(conn)
            return
        # pages still in the WAL shadow the file's: copy them back first, so that the check reads the file
        self._run("checkpointing the state file", lambda c: c.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall())
        try:
            _connect_read_only(self.path).close()
        except sqlite3.DatabaseError as exc:
            if _is_corruption(exc):
                self._conn.close()
                self._reopen(self._recover(exc))

    def _error(self, message: str) -> None:
        self.errors.append(message)
        log.error("state store: %s", message)

    def _run(self, what: str, fn: Callable[[sqlite3.Connection], Any], default: Any = None, write: bool = False) -> Any:
        """Run one statement or transaction; turn any SQLite error into a counted state error. Only a write
        that succeeds ends a failing spell (a read can succeed on a full disk)."""
        try:
            result = fn(self._conn)
        except sqlite3.Error as exc:
            if self._conn.in_transaction:
                try:
                    self._conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            if _is_corruption(exc) and self.repair and self.mode == "file" and not self._rewriting:
                self._conn.close()
                self._reopen(self._recover(exc))
            elif not self._failing:
                self._error(f"{what} failed on {self.path or 'memory'}: {exc}")
            else:
                self.errors.append(f"{what} failed: {exc}")
            self._failing = True
            return default
        if write and self._failing:
            log.info("state store: %s written again", self.path)
            self._failing = False
        return result

    def _transaction(self, what: str, statements: Callable[[sqlite3.Connection], object]) -> bool:
        def tx(conn: sqlite3.Connection) -> bool:
            conn.execute("BEGIN IMMEDIATE")
            statements(conn)
            conn.execute("COMMIT")
            return True

        return bool(self._run(what, tx, False, write=True))

    # ------------------------------------------------------------------ baselines
    def get(self, route: str, key: BaselineKey) -> Baseline | None:
        k = (route, key)
        if k in self._unsaved:  # its write failed: the file has an older one or none
            return self._baselines[k]
        rows = self._run("reading a baseline", lambda c: baselines.select(c, route, key))
        if rows is None:  # the file cannot be read: what this process knows
            return self._baselines.get(k)
        if rows:
            self._baselines[k] = rows[0]
            return rows[0]
        self._baselines.pop(k, None)
        return None

    def baselines(self, route: str | None = None) -> list[Baseline]:
        return list(self._run("listing baselines", lambda c: baselines.select(c, route), []))

    def put(self, baseline: Baseline) -> bool:
        k = (baseline.route, baseline.key)
        self._baselines[k] = baseline
        ok = self._transaction("writing a baseline", lambda c: baselines.insert(c, baseline))
        if ok:
            self._unsaved.discard(k)
        else:
            self._unsaved.add(k)
        return ok

    def delete(self, route: str, key: BaselineKey) -> bool:
        self._baselines.pop((route, key), None)
        self._unsaved.discard((route, key))
        return self._transaction("deleting a baseline", lambda c: baselines.delete(c, route, key))

    def _forget_route(self, route: str) -> None:
        for k in [k for k in self._baselines if k[0] == route]:
            del self._baselines[k]
            self._unsaved.discard(k)

    def delete_route(self, route: str) -> bool:
        self._forget_route(route)

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
        """Called by every evaluator every cycle; does real work only every persist/poll/retry period."""
        if self.repair and self.path is not None and self.mode != "file":
            if self._last_retry is None:
                self._last_retry = now
            elif now - self._last_retry >= OPEN_RETRY_SECONDS or now < self._last_retry:
                self._last_retry = now
                self._retry_open()
        if self._last_flush is None:
            self._last_flush = now
        elif now - self._last_flush >= self.persist_seconds or now < self._last_flush:
            if self.repair and self.path is not None and self.mode == "file":
                self._check_file()
            self.flush()
            self._last_flush = now
        if self._last_poll is None or now - self._last_poll >= COMMAND_POLL_SECONDS or now < self._last_poll:
            self._last_poll = now
            self._poll_commands()

    def save(self, route: str) -> bool:
        """Write `route`'s detector state now (an operator's decision must survive a kill before the next flush)."""
        provider = self._providers.get(route)
        return True if provider is None else self._save_states({route: provider()})

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
        """Queue a command for the daemon (or find the same one already waiting); False when the write failed."""
        now = self.clock()
        return self._transaction("queueing an operator command", lambda c: commands.append(c, route, action, now))

    def take_commands(self, route: str, actions: Container[str] = BASELINE_ACTIONS) -> list[str]:
        """Operator actions among `actions` for `route` seen since the last call, in order; each part of the
        daemon takes its own ("reset" and "accept" the acceptance detector, "adopt" the canary)."""
        pending = self._pending.get(route, [])
        taken = [a for a in pending if a in actions]
        if taken:
            left = [a for a in pending if a not in actions]
            if left:
                self._pending[route] = left
            else:
                del self._pending[route]
        return taken

    def _max_command_id(self) -> int:
        return int(self._run("reading commands", commands.last_id, 0))

    def _poll_commands(self) -> None:
        last = self._last_command_id
        for command_id, route, action in self._run("reading commands", lambda c: commands.since(c, last), []):
            self._last_command_id = max(self._last_command_id, command_id)
            self._pending.setdefault(route, []).append(action)
            if action in BASELINE_ACTIONS:
                self._forget_route(route)  # the command changed the route's baselines in the file
        taken = self._last_command_id
        if (
            taken != self._marked_command_id
            and self.mode != "read_only"
            and self._transaction("recording the commands taken", lambda c: commands.mark_seen(c, taken))
        ):
            self._marked_command_id = taken  # a command equal to one taken is queued again (commands.append)

    def close(self) -> None:
        self.closed = True
        try:
            self._conn.close()
        except sqlite3.Error:
            pass


def _connect(target: str) -> sqlite3.Connection:
    """A read-write connection with the schema in place (created or migrated)."""
    conn = sqlite3.connect(target, timeout=2.0, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        if target != ":memory:":
            _quick_check(conn)
        conn.executescript(_SCHEMA)
        baselines.migrate(conn)
        canary.migrate(conn)
        conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
    except sqlite3.Error:
        conn.close()
        raise
    return conn


def _connect_read_only(path: str) -> sqlite3.Connection:
    """A connection that cannot write. A WAL file in a directory that cannot be written is read as immutable
    when plain read-only fails (SQLite needs to create the -shm file otherwise)."""
    uri = "file:" + urllib.parse.quote(os.path.abspath(path))
    failure: sqlite3.Error | None = None
    for query in ("?mode=ro", "?mode=ro&immutable=1"):
        try:
            conn = sqlite3.connect(uri + query, uri=True, timeout=2.0, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            failure = exc
            continue
        try:
            _quick_check(conn)
            return conn
        except sqlite3.Error as exc:
            conn.close()
            if isinstance(exc, sqlite3.DatabaseError) and _is_corruption(exc):
                raise
            failure = exc
    assert failure is not None
    raise failure


def _quick_check(conn: sqlite3.Connection) -> None:
    row = conn.execute("PRAGMA quick_check").fetchone()
    if row is None or row[0] != "ok":
        raise sqlite3.DatabaseError(f"database disk image is malformed (quick_check: {row})")


# SQLite's primary result codes for a damaged file: SQLITE_CORRUPT (11) and SQLITE_NOTADB (26).
_CORRUPTION_CODES = (11, 26)


def _is_corruption(exc: BaseException) -> bool:
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in _CORRUPTION_CODES:
        return True
    text = str(exc).lower()
    return any(s in text for s in ("not a database", "malformed", "file is encrypted", "corrupt"))
