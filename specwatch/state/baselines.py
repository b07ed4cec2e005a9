"""Acceptance baselines: the `baselines` table, its values, and the learner that produces them.

One baseline per (route, model_name, engine_version, k, drafter): what the route's acceptance should be, learned once
(or configured, accepted by an operator, adopted after a model change). `BaselineLearner` holds the running sums
of one key's traffic; its JSON is part of the detector state the store keeps per route.
"""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, cast

from specwatch.stats.daily import DailyFit, DailyProfile
from specwatch.stats.overdispersion import BLOCK_SECONDS, ClosedBlock, DispersionEstimator, DispersionModel

SOURCES = ("learned", "config", "accepted", "adopted")
# A learner's sums past 2^53, the largest count a float holds exactly, cannot come from traffic (at a million
# tokens per second that is 285 years); tracking rejects counter samples past the same bound.
MAX_LEARNED_COUNT = 2.0**53

_TABLE = """
CREATE TABLE IF NOT EXISTS {name} (
    route TEXT NOT NULL, model_name TEXT NOT NULL, engine_version TEXT NOT NULL, k INTEGER NOT NULL,
    acceptance_ratio REAL NOT NULL, position_acceptance TEXT NOT NULL, mean_acceptance_length REAL,
    overdispersion REAL NOT NULL, drafted_tokens REAL NOT NULL, source TEXT NOT NULL, pinned INTEGER NOT NULL,
    created REAL NOT NULL, updated REAL NOT NULL, dispersion_intercept REAL, dispersion_slope REAL NOT NULL DEFAULT 0,
    dispersion_block_seconds REAL, daily_profile TEXT, drafter TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (route, model_name, engine_version, k, drafter));
"""
SCHEMA = _TABLE.format(name="baselines")
# Columns added after schema version 1 shipped; a version-1 file gets them on open (ALTER TABLE ... ADD COLUMN).
_ADDED_COLUMNS = (
    ("dispersion_intercept", "REAL"),
    ("dispersion_slope", "REAL NOT NULL DEFAULT 0"),
    ("dispersion_block_seconds", "REAL"),
    ("daily_profile", "TEXT"),
)
_COLUMNS = (
    "route, model_name, engine_version, k, acceptance_ratio, position_acceptance, "
    "mean_acceptance_length, overdispersion, drafted_tokens, source, pinned, created, updated, "
    "dispersion_intercept, dispersion_slope, dispersion_block_seconds, daily_profile, drafter"
)
# The key column added after the others: a file without it has its table rebuilt (`migrate`), its rows keyed
# with drafter "" (not told), which is what a route whose engine and config name no drafter runs.
KEY_COLUMN = "drafter"


@dataclass(frozen=True, order=True)
class BaselineKey:
    model_name: str
    engine_version: str
    k: int  # draft length; 0 when unknown
    drafter: str = ""  # the speculative method and drafter, "method:drafter" (EngineSample.drafter); "" unknown

    def label(self) -> str:
        text = f"{self.model_name or '-'} {self.engine_version or '-'} k={self.k or '?'}"
        return f"{text} drafter={self.drafter}" if self.drafter else text

    def to_json(self) -> list[Any]:
        """[model, version, k, drafter]; [model, version, k] while drafter is "", as files before it held."""
        head: list[Any] = [self.model_name, self.engine_version, self.k]
        return [*head, self.drafter] if self.drafter else head

    @classmethod
    def from_json(cls, raw: Any) -> "BaselineKey":
        """The key `to_json` wrote (three items: drafter ""). Raises ValueError, TypeError or IndexError."""
        if not isinstance(raw, (list, tuple)) or len(raw) not in (3, 4):
            raise ValueError(f"not a baseline key: {raw!r}")
        return cls(str(raw[0]), str(raw[1]), int(raw[2]), str(raw[3]) if len(raw) == 4 else "")


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
        learner._check()
        # state saved before the block length was recorded was learned on BLOCK_SECONDS blocks
        if float(raw.get("block_seconds", BLOCK_SECONDS)) != block_seconds:
            learner.dispersion = DispersionEstimator(block_seconds=block_seconds)
            learner.daily = DailyFit()  # its sums are of those blocks too
        return learner

    def _check(self) -> None:
        """Raise ValueError for sums no traffic can produce (saved before counter samples were checked, or
        edited): the learner then starts afresh instead of never learning a baseline."""
        d = self.dispersion
        counts = (self.drafts, self.drafted, self.accepted, *self.per_pos, d.sum_drafted, d.sum_accepted)
        if not all(math.isfinite(x) and 0.0 <= x <= MAX_LEARNED_COUNT for x in counts):
            raise ValueError(f"learner sums out of range: {counts}")
        if self.accepted > self.drafted or d.sum_accepted > d.sum_drafted:
            raise ValueError("learner holds more accepted tokens than drafted")
        second = (d.sum_sq_over_drafted, d.sum_drafted_sq, d.sum_accepted_sq, d.sum_cross)
        if d.blocks < 0 or not all(math.isfinite(x) for x in second):
            raise ValueError("learner dispersion sums out of range")
        if self.start is not None and not math.isfinite(self.start):
            raise ValueError("learner start is not finite")


# --------------------------------------------------------------------------- the table
def migrate(conn: sqlite3.Connection) -> None:
    """Add the columns a file written by an older release lacks; key its rows by drafter ("")."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(baselines)")}
    for name, decl in _ADDED_COLUMNS:
        if name not in have:
            conn.execute(f"ALTER TABLE baselines ADD COLUMN {name} {decl}")
    if KEY_COLUMN not in have:
        columns = _COLUMNS.removesuffix(f", {KEY_COLUMN}")
        rekey(conn, "baselines", _TABLE, f"{columns}, {KEY_COLUMN}", f"{columns}, ''")


def rekey(conn: sqlite3.Connection, table: str, create: str, into: str, select: str) -> None:
    """Rebuild `table` under `create` (a template with `{name}`, the new primary key) with its rows, as one
    transaction: a process killed half way leaves the old table as it was, and the next open does it again.
    The connection is in autocommit mode (store.py), so the transaction is explicit."""
    new = f"{table}_rekeyed"
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(f"DROP TABLE IF EXISTS {new}")
        conn.execute(create.format(name=new))
        conn.execute(f"INSERT INTO {new} ({into}) SELECT {select} FROM {table}")
        conn.execute(f"DROP TABLE {table}")
        conn.execute(f"ALTER TABLE {new} RENAME TO {table}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def select(conn: sqlite3.Connection, route: str | None = None, key: BaselineKey | None = None) -> list[Baseline]:
    """The route's baselines (all routes' when None), or the one of `key`, oldest update first."""
    # a file of an older release opened read-only has not gained the added columns: they read as NULL
    have = {row[1] for row in conn.execute("PRAGMA table_info(baselines)")}
    columns = ", ".join(c if c in have else "NULL" for c in _COLUMNS.split(", "))
    sql, args = f"SELECT {columns} FROM baselines", cast(tuple[Any, ...], ())
    if key is not None:
        sql += " WHERE route=? AND model_name=? AND engine_version=? AND k=?"
        args = (route, key.model_name, key.engine_version, key.k)
        if KEY_COLUMN in have:
            sql, args = sql + f" AND {KEY_COLUMN}=?", (*args, key.drafter)
        elif key.drafter:
            return []  # an older file read-only: its rows are all of drafter ""
    elif route is not None:
        sql, args = sql + " WHERE route=?", (route,)
    return [_row_to_baseline(r) for r in conn.execute(sql + " ORDER BY route, updated", args).fetchall()]


def insert(conn: sqlite3.Connection, b: Baseline) -> None:
    conn.execute(
        f"INSERT OR REPLACE INTO baselines ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
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
            b.key.drafter,
        ),
    )


def delete(conn: sqlite3.Connection, route: str, key: BaselineKey | None = None) -> None:
    """Delete the key's baseline, or all of the route's when `key` is None."""
    if key is None:
        conn.execute("DELETE FROM baselines WHERE route=?", (route,))
    else:
        conn.execute(
            "DELETE FROM baselines WHERE route=? AND model_name=? AND engine_version=? AND k=? AND drafter=?",
            (route, key.model_name, key.engine_version, key.k, key.drafter),
        )


def routes(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT DISTINCT route FROM baselines").fetchall()}


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
        drafter,
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
        key=BaselineKey(model, version, int(k), drafter or ""),
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
