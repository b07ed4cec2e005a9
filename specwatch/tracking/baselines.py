"""Acceptance baselines: what a route's acceptance should be, learned once and kept in SQLite.

One baseline per (route, model_name, engine_version, k). The daemon, `specwatch baseline ...` and replay all
use `BaselineStore`, so the file format lives in this module only.

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
import math
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, cast

from specwatch.stats.daily import DailyFit, DailyProfile
from specwatch.stats.overdispersion import BLOCK_SECONDS, ClosedBlock, DispersionEstimator, DispersionModel

log = logging.getLogger(__name__)

DB_NAME = "baselines.db"
SCHEMA_VERSION = 1
COMMAND_POLL_SECONDS = 10.0
SOURCES = ("learned", "config", "accepted", "adopted")

# Columns added after schema version 1 shipped; a version-1 file gets them on open (ALTER TABLE ... ADD COLUMN).
_ADDED_COLUMNS = (
    ("dispersion_intercept", "REAL"),
    ("dispersion_slope", "REAL NOT NULL DEFAULT 0"),
    ("dispersion_block_seconds", "REAL"),
    ("daily_profile", "TEXT"),
)
_BASELINE_COLUMNS = (
    "route, model_name, engine_version, k, acceptance_ratio, position_acceptance, "
    "mean_acceptance_length, overdispersion, drafted_tokens, source, pinned, created, updated, "
    "dispersion_intercept, dispersion_slope, dispersion_block_seconds, daily_profile"
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS baselines (
    route TEXT NOT NULL, model_name TEXT NOT NULL, engine_version TEXT NOT NULL, k INTEGER NOT NULL,
    acceptance_ratio REAL NOT NULL, position_acceptance TEXT NOT NULL, mean_acceptance_length REAL,
    overdispersion REAL NOT NULL, drafted_tokens REAL NOT NULL, source TEXT NOT NULL, pinned INTEGER NOT NULL,
    created REAL NOT NULL, updated REAL NOT NULL, dispersion_intercept REAL, dispersion_slope REAL NOT NULL DEFAULT 0,
    dispersion_block_seconds REAL, daily_profile TEXT, PRIMARY KEY (route, model_name, engine_version, k));
CREATE TABLE IF NOT EXISTS route_state (route TEXT PRIMARY KEY, state TEXT NOT NULL, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS probe_fingerprints (
    route TEXT NOT NULL, model_name TEXT NOT NULL, engine_version TEXT NOT NULL, k INTEGER NOT NULL,
    prompt_set TEXT NOT NULL, prompt_id TEXT NOT NULL, drafted REAL NOT NULL, accepted REAL NOT NULL,
    steps REAL NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY (route, model_name, engine_version, k, prompt_set, prompt_id));
CREATE TABLE IF NOT EXISTS probe_state (route TEXT PRIMARY KEY, state TEXT NOT NULL, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS commands (
    id INTEGER PRIMARY KEY AUTOINCREMENT, route TEXT NOT NULL, action TEXT NOT NULL, created REAL NOT NULL);
"""


# --------------------------------------------------------------------------- values
@dataclass(frozen=True, order=True)
class BaselineKey:
    model_name: str
    engine_version: str
    k: int  # draft length; 0 when unknown

    def label(self) -> str:
        return f"{self.model_name or '-'} {self.engine_version or '-'} k={self.k or '?'}"


@dataclass(frozen=True)
class Baseline:
    route: str
    key: BaselineKey
    acceptance_ratio: float
    position_acceptance: tuple[float, ...] = ()
    mean_acceptance_length: float | None = None
    overdispersion: float = 1.0  # mean design effect φ̄ (stderr of r0, window sizes, display)
    # the design effect as a line in an interval's drafted tokens (stats/overdispersion.py); None: φ̄
    dispersion_intercept: float | None = None
    dispersion_slope: float = 0.0
    # the block length φ was learned on (`detection.block`); rows stored before it was recorded used BLOCK_SECONDS
    dispersion_block_seconds: float = BLOCK_SECONDS
    # r0 by time of day (stats/daily.py), learned over the first day; None: not (yet) learned, or stored before it
    daily: DailyProfile | None = None
    drafted_tokens: float = 0.0  # sample size behind the estimate; 0 for a configured baseline (exact)
    source: str = "learned"
    pinned: bool = True  # False while a learned baseline is still being refined
    created: float = 0.0
    updated: float = 0.0

    def dispersion_model(self) -> DispersionModel:
        intercept = self.overdispersion if self.dispersion_intercept is None else self.dispersion_intercept
        return DispersionModel(max(1.0, intercept), max(0.0, self.dispersion_slope))

    def relative_stderr(self) -> float:
        """Standard error of acceptance_ratio relative to it, with n_eff = drafted / φ; 0 when exact."""
        r, n = self.acceptance_ratio, self.drafted_tokens
        if n <= 0 or not 0.0 < r < 1.0:
            return 0.0
        return math.sqrt(self.overdispersion * (1.0 - r) / (r * n))


@dataclass
class BaselineLearner:
    """Running sums of one key's traffic, turned into a Baseline once there is enough of it."""

    start: float | None = None
    drafts: float = 0.0
    drafted: float = 0.0
    accepted: float = 0.0
    per_pos: list[float] = field(default_factory=list)
    dispersion: DispersionEstimator = field(default_factory=DispersionEstimator)
    daily: DailyFit = field(default_factory=DailyFit)

    def add(
        self,
        now: float,
        accepted: float,
        drafted: float,
        drafts: float,
        per_pos: Iterable[float],
        idle: bool = False,
        start: float | None = None,
    ) -> None:
        """One interval (start, now], `start` being the previous scrape (None: not known)."""
        if drafted <= 0:
            if idle:  # closes the block of the requests just finished
                self._add_block(self.dispersion.add(now, 0.0, 0.0, idle=True, start=start))
            return
        if self.start is None:
            self.start = now
        self.drafts += drafts
        self.drafted += drafted
        self.accepted += accepted
        for j, value in enumerate(per_pos):
            if j < len(self.per_pos):
                self.per_pos[j] += value
            else:
                self.per_pos.append(value)
        self._add_block(self.dispersion.add(now, accepted, drafted, idle, start))

    def _add_block(self, block: ClosedBlock | None) -> None:
        if block is not None:  # the daily profile is fitted on the blocks φ is (and the CUSUM weighs)
            self.daily.add(block)

    def seconds(self, now: float) -> float:
        return 0.0 if self.start is None else now - self.start

    def has(self, now: float, drafted_tokens: float, seconds: float) -> bool:
        """Enough traffic for a baseline: both thresholds met, a usable ratio and a φ estimate."""
        return (
            self.drafted >= max(1.0, drafted_tokens)
            and self.seconds(now) >= seconds
            and 0.0 < self.accepted < self.drafted
            and self.dispersion.estimate() is not None
        )

    def baseline(
        self, route: str, key: BaselineKey, now: float, source: str, pinned: bool, created: float | None = None
    ) -> Baseline:
        model = self.dispersion.model()
        return Baseline(
            route=route,
            key=key,
            acceptance_ratio=self.accepted / self.drafted,
            position_acceptance=tuple(p / self.drafts for p in self.per_pos) if self.drafts > 0 else (),
            mean_acceptance_length=1.0 + self.accepted / self.drafts if self.drafts > 0 else None,
            overdispersion=self.dispersion.conservative_estimate() or 1.0,
            dispersion_intercept=model.intercept if model is not None else None,
            dispersion_slope=model.slope if model is not None else 0.0,
            dispersion_block_seconds=self.dispersion.block_seconds,
            drafted_tokens=self.drafted,
            source=source,
            pinned=pinned,
            created=now if created is None else created,
            updated=now,
        )

    def daily_profile(self, final: bool = False) -> DailyProfile | None:
        """r0 by time of day from this traffic, with the design effect of its blocks about it."""
        return self.daily.fit(final)

    def to_json(self) -> dict[str, Any]:
        d = self.dispersion
        return {
            "start": self.start,
            "drafts": self.drafts,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "per_pos": self.per_pos,
            "dispersion": [
                d.blocks,
                d.sum_drafted,
                d.sum_accepted,
                d.sum_sq_over_drafted,
                d.sum_drafted_sq,
                d.sum_accepted_sq,
                d.sum_cross,
            ],
            "block_seconds": d.block_seconds,
            "daily": self.daily.to_json(),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], block_seconds: float = BLOCK_SECONDS) -> "BaselineLearner":
        """`block_seconds`: the route's block length now; dispersion sums saved on other blocks start afresh."""
        # state saved before the dispersion model has 4 sums: the model then falls back to a plain φ̂
        blocks, sum_d, sum_a, sum_sq, *line = raw["dispersion"]
        sum_dd, sum_aa, sum_ad = (float(x) for x in line) if len(line) == 3 else (0.0, 0.0, 0.0)
        learner = cls(
            start=raw["start"],
            drafts=float(raw["drafts"]),
            drafted=float(raw["drafted"]),
            accepted=float(raw["accepted"]),
            per_pos=[float(x) for x in raw["per_pos"]],
            dispersion=DispersionEstimator(
                blocks=int(blocks),
                sum_drafted=float(sum_d),
                sum_accepted=float(sum_a),
                sum_sq_over_drafted=float(sum_sq),
                sum_drafted_sq=sum_dd,
                sum_accepted_sq=sum_aa,
                sum_cross=sum_ad,
                block_seconds=block_seconds,
            ),
            daily=DailyFit.from_json(raw.get("daily")),
        )
        # state saved before the block length was recorded was learned on BLOCK_SECONDS blocks
        if float(raw.get("block_seconds", BLOCK_SECONDS)) != block_seconds:
            learner.dispersion = DispersionEstimator(block_seconds=block_seconds)
            learner.daily = DailyFit()  # its sums are of those blocks too
        return learner


# --------------------------------------------------------------------------- the store
StateProvider = Callable[[], "dict[str, Any] | None"]


class BaselineStore:
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
    def in_state_dir(cls, state_dir: str, errors: list[str] | None = None, **kwargs: Any) -> "BaselineStore":
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
            have = {row[1] for row in conn.execute("PRAGMA table_info(baselines)")}
            for name, decl in _ADDED_COLUMNS:
                if name not in have:
                    conn.execute(f"ALTER TABLE baselines ADD COLUMN {name} {decl}")
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
        rows = self._run(
            "reading a baseline",
            lambda c: c.execute(
                f"SELECT {_BASELINE_COLUMNS} FROM baselines"
                " WHERE route=? AND model_name=? AND engine_version=? AND k=?",
                (route, key.model_name, key.engine_version, key.k),
            ).fetchall(),
            [],
        )
        return _row_to_baseline(rows[0]) if rows else None

    def baselines(self, route: str | None = None) -> list[Baseline]:
        sql, args = f"SELECT {_BASELINE_COLUMNS} FROM baselines", cast(tuple[str, ...], ())
        if route is not None:
            sql, args = sql + " WHERE route=?", (route,)
        rows = self._run(
            "listing baselines", lambda c: c.execute(sql + " ORDER BY route, updated", args).fetchall(), []
        )
        return [_row_to_baseline(r) for r in rows]

    def put(self, baseline: Baseline) -> bool:
        b = baseline
        return self._transaction(
            "writing a baseline",
            lambda c: c.execute(
                f"INSERT OR REPLACE INTO baselines ({_BASELINE_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    b.route,
                    b.key.model_name,
                    b.key.engine_version,
                    b.key.k,
                    b.acceptance_ratio,
                    json.dumps(list(b.position_acceptance)),
                    b.mean_acceptance_length,
                    b.overdispersion,
                    b.drafted_tokens,
                    b.source,
                    int(b.pinned),
                    b.created,
                    b.updated,
                    b.dispersion_intercept,
                    b.dispersion_slope,
                    b.dispersion_block_seconds,
                    None if b.daily is None else json.dumps(b.daily.to_json()),
                ),
            ),
        )

    def delete(self, route: str, key: BaselineKey) -> bool:
        return self._transaction(
            "deleting a baseline",
            lambda c: c.execute(
                "DELETE FROM baselines WHERE route=? AND model_name=? AND engine_version=? AND k=?",
                (route, key.model_name, key.engine_version, key.k),
            ),
        )

    def delete_route(self, route: str) -> bool:
        def statements(c: sqlite3.Connection) -> None:
            c.execute("DELETE FROM baselines WHERE route=?", (route,))
            c.execute("DELETE FROM route_state WHERE route=?", (route,))
            c.execute("DELETE FROM probe_fingerprints WHERE route=?", (route,))
            c.execute("DELETE FROM probe_state WHERE route=?", (route,))

        return self._transaction("deleting a route's baselines", statements)

    # ------------------------------------------------------------------ canary probe fingerprints
    def fingerprint(self, route: str, key: BaselineKey, prompt_set: str) -> dict[str, tuple[float, float, float]]:
        """prompt id -> (drafted, accepted, verify steps) of the key's fingerprint; empty when there is none."""
        rows = self._run(
            "reading a probe fingerprint",
            lambda c: c.execute(
                "SELECT prompt_id, drafted, accepted, steps FROM probe_fingerprints WHERE route=? AND model_name=? "
                "AND engine_version=? AND k=? AND prompt_set=?",
                (route, key.model_name, key.engine_version, key.k, prompt_set),
            ).fetchall(),
            [],
        )
        return {pid: (float(d), float(a), float(s)) for pid, d, a, s in rows}

    def put_fingerprint(
        self, route: str, key: BaselineKey, prompt_set: str, prompts: Mapping[str, tuple[float, float, float]]
    ) -> bool:
        """Replace the key's fingerprint with these per-prompt readings."""
        now = self.clock()

        def statements(c: sqlite3.Connection) -> None:
            c.execute(
                "DELETE FROM probe_fingerprints WHERE route=? AND model_name=? AND engine_version=? AND k=? "
                "AND prompt_set=?",
                (route, key.model_name, key.engine_version, key.k, prompt_set),
            )
            c.executemany(
                "INSERT INTO probe_fingerprints VALUES (?,?,?,?,?,?,?,?,?,?)",
                [
                    (route, key.model_name, key.engine_version, key.k, prompt_set, pid, d, a, s, now)
                    for pid, (d, a, s) in sorted(prompts.items())
                ],
            )

        return self._transaction("writing a probe fingerprint", statements)

    def fingerprint_keys(self, route: str, prompt_set: str) -> list[BaselineKey]:
        """Keys with a fingerprint for this route and prompt set, most recently written first."""
        rows = self._run(
            "listing probe fingerprints",
            lambda c: c.execute(
                "SELECT model_name, engine_version, k FROM probe_fingerprints WHERE route=? AND prompt_set=? "
                "GROUP BY model_name, engine_version, k ORDER BY max(updated) DESC",
                (route, prompt_set),
            ).fetchall(),
            [],
        )
        return [BaselineKey(m, v, int(k)) for m, v, k in rows]

    def probe_state(self, route: str) -> dict[str, Any] | None:
        rows = self._run(
            "reading probe state",
            lambda c: c.execute("SELECT state FROM probe_state WHERE route=?", (route,)).fetchall(),
            [],
        )
        try:
            state = json.loads(rows[0][0]) if rows else None
        except ValueError:
            return None
        return state if isinstance(state, dict) else None

    def put_probe_state(self, route: str, state: Mapping[str, Any]) -> bool:
        return self._transaction(
            "saving probe state",
            lambda c: c.execute(
                "INSERT OR REPLACE INTO probe_state VALUES (?,?,?)",
                (route, json.dumps(state, separators=(",", ":")), self.clock()),
            ),
        )

    # ------------------------------------------------------------------ detector state
    def route_state(self, route: str) -> dict[str, Any] | None:
        rows = self._run(
            "reading route state",
            lambda c: c.execute("SELECT state FROM route_state WHERE route=?", (route,)).fetchall(),
            [],
        )
        if not rows:
            return None
        try:
            state = json.loads(rows[0][0])
        except ValueError as exc:
            self._error(f"unreadable state of route {route!r} ({exc}); starting it afresh")
            return None
        return state if isinstance(state, dict) else None

    def routes(self) -> list[str]:
        rows = self._run(
            "listing routes",
            lambda c: c.execute(
                "SELECT route FROM baselines UNION SELECT route FROM route_state ORDER BY 1"
            ).fetchall(),
            [],
        )
        return [r[0] for r in rows]

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
        rows = [
            (route, json.dumps(state, separators=(",", ":")), now)
            for route, state in states.items()
            if state is not None
        ]
        if not rows:
            return True
        return self._transaction(
            "saving detector state", lambda c: c.executemany("INSERT OR REPLACE INTO route_state VALUES (?,?,?)", rows)
        )

    # ------------------------------------------------------------------ operator commands
    def append_command(self, route: str, action: str) -> bool:
        return self._transaction(
            "queueing an operator command",
            lambda c: c.execute(
                "INSERT INTO commands (route, action, created) VALUES (?,?,?)", (route, action, self.clock())
            ),
        )

    def take_commands(self, route: str) -> list[str]:
        """Operator actions ("reset", "accept") for `route` seen since the last call."""
        return self._pending.pop(route, [])

    def _max_command_id(self) -> int:
        rows = self._run("reading commands", lambda c: c.execute("SELECT max(id) FROM commands").fetchall(), [])
        return int(rows[0][0] or 0) if rows else 0

    def _poll_commands(self) -> None:
        rows = self._run(
            "reading commands",
            lambda c: c.execute(
                "SELECT id, route, action FROM commands WHERE id > ? ORDER BY id", (self._last_command_id,)
            ).fetchall(),
            [],
        )
        for command_id, route, action in rows:
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


def _row_to_baseline(row: tuple) -> Baseline:
    (
        route,
        model,
        version,
        k,
        ratio,
        positions,
        length,
        phi,
        drafted,
        source,
        pinned,
        created,
        updated,
        intercept,
        slope,
        block,
        daily,
    ) = row
    try:
        pos = tuple(float(x) for x in json.loads(positions))
    except (ValueError, TypeError):
        pos = ()
    try:
        profile = None if daily is None else DailyProfile.from_json(json.loads(daily))
    except (ValueError, TypeError, KeyError):
        profile = None  # an unreadable profile is learned again; r0 itself stays
    return Baseline(
        route=route,
        key=BaselineKey(model, version, int(k)),
        acceptance_ratio=float(ratio),
        position_acceptance=pos,
        mean_acceptance_length=length,
        overdispersion=float(phi),
        dispersion_intercept=None if intercept is None else float(intercept),
        dispersion_slope=float(slope or 0.0),
        dispersion_block_seconds=BLOCK_SECONDS if block is None else float(block),
        daily=profile,
        drafted_tokens=float(drafted),
        source=source,
        pinned=bool(pinned),
        created=float(created),
        updated=float(updated),
    )
