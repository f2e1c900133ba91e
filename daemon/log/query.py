"""Reading the decision log: a checked read-only connection and filtered queries.

WAL lets readers work while the daemon writes, with read permission only; queries go
to the view `decisions` (or a version-1 file's one table).
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbudget.daemon.log.schema import INDEXED, JSON_FIELDS, RECENT, VIEW, DecisionLogError, check_meta
from kvbudget.daemon.core.records import DecisionKind


def open_read_only(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """A read-only connection to a decision log, checked to be one. Raises DecisionLogError."""
    path = Path(path)
    if not path.exists():
        raise DecisionLogError(f"no decision log at {path}")
    if path.is_dir():
        raise DecisionLogError(f"{path} is a directory, not a decision log")
    if not os.access(path, os.R_OK):
        raise DecisionLogError(f"cannot read {path}: permission denied")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        conn.execute("PRAGMA busy_timeout=5000")
        check_meta(conn, str(path))
    except sqlite3.DatabaseError as exc:
        raise DecisionLogError(f"{path} is not a readable SQLite database ({exc})") from None
    except DecisionLogError as exc:
        index = Path(f"{path}-shm")
        if index.exists() or os.access(path.parent, os.W_OK) or "no meta table" in str(exc):
            raise
        # SQLite reads a WAL-mode file only through its index, which it makes if missing:
        # not in a directory this user may not write to (a daemon that stopped cleanly
        # leaves its log out of WAL mode; one that crashed leaves the index there).
        raise DecisionLogError(
            f"{exc}: the file is in WAL mode and its index {index.name} is missing, which this user "
            f"cannot create in {path.parent}; read it as the daemon's user, or while the daemon runs"
        ) from None
    return conn


def query_decisions(
    path: str | os.PathLike[str],
    *,
    request_id: str | None = None,
    engine_id: str | None = None,
    tenant: str | None = None,
    kind: str | DecisionKind | None = None,
    since_s: float | None = None,
    until_s: float | None = None,
    limit: int | None = 100,
    newest_first: bool = True,
    after_id: int | None = None,
    before_seq: int | None = None,
) -> list[dict[str, Any]]:
    """Rows matching every given filter (time filters on `logged_at`, unix seconds, since
    inclusive, until exclusive; `after_id`: ids above it, what `--follow` has not shown
    yet; `before_seq`: seqs below it, the next page back from a page whose oldest seq it
    is), JSON columns decoded to lists. `limit=None` or 0: all."""
    if before_seq is not None and before_seq > _SQLITE_MAX_INT:
        before_seq = None  # every seq a log holds is below it (and it would not bind)
    where, params = _filters(after_id, request_id, engine_id, tenant, kind)
    window = _Window.of(since_s, until_s)
    order = " ORDER BY id " + ("DESC" if newest_first else "ASC")
    tail: list[Any] = []
    if limit:
        order += " LIMIT ?"
        tail.append(int(limit))
    conn = open_read_only(path)
    try:
        conn.row_factory = sqlite3.Row
        try:
            # One read transaction, so every statement below sees the same rows: the daemon
            # folds recent rows into the indexed table meanwhile, and a row moved between
            # the two tables' probes of the seq search was in neither (the page skipped it).
            conn.execute("BEGIN")
            if before_seq is not None:
                # The id bound is what makes it cheap (a range on the primary key, and on
                # every index). It assumes seqs rise with ids: in a log written before
                # restarts numbered on from the last seq (each run from 1 again), seqs
                # repeat and a page skips matches of a later run (the seq condition only
                # keeps rows at or above the bound out); no seq bound pages such a log.
                where += ["id < ?", "seq < ?"]
                params += [_first_id_at_or_after_seq(conn, before_seq), before_seq]
            rows = _select(conn, where, params, window, order, tail, by_time_allowed=request_id is None)
        except sqlite3.DatabaseError as exc:
            raise DecisionLogError(f"{path}: {exc}") from None
    finally:
        conn.close()
    return [_decoded(row) for row in rows]


def _filters(
    after_id: int | None, request_id: str | None, engine_id: str | None, tenant: str | None,
    kind: str | DecisionKind | None,
) -> tuple[list[str], list[Any]]:
    """The WHERE conditions (and their parameters) of the filters other than time."""
    where: list[str] = []
    params: list[Any] = []
    if after_id is not None:
        # (an index on engine, kind... is ordered by id within each value too: a range there)
        where.append("id > ?")
        params.append(after_id)
    for column, value in (("request_id", request_id), ("engine_id", engine_id), ("tenant", tenant)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    if kind is not None:
        where.append("kind = ?")
        params.append(kind.value if isinstance(kind, DecisionKind) else kind)
    return where, params


@dataclass(frozen=True)
class _Window:
    """The time filters on `logged_at`: conditions and their parameters."""

    conditions: list[str]
    params: list[Any]

    @classmethod
    def of(cls, since_s: float | None, until_s: float | None) -> _Window:
        conditions: list[str] = []
        params: list[Any] = []
        if since_s is not None:
            conditions.append("logged_at >= ?")
            params.append(since_s)
        if until_s is not None:
            conditions.append("logged_at < ?")
            params.append(until_s)
        return cls(conditions, params)


def _select(
    conn: sqlite3.Connection, where: list[str], params: list[Any], window: _Window, order: str,
    tail: list[Any], *, by_time_allowed: bool,
) -> list[sqlite3.Row]:
    """The rows, through the time index when the window is sparse (see SPARSE_WINDOW_ROWS)."""
    if window.conditions and by_time_allowed and _window_is_sparse(conn, window.conditions, window.params):
        return _query_by_time(conn, where + window.conditions, params + window.params, order, tail)
    sql = f"SELECT * FROM {VIEW}"
    if where or window.conditions:
        sql += " WHERE " + " AND ".join(where + window.conditions)
    return conn.execute(sql + order, params + window.params + tail).fetchall()


def _decoded(row: sqlite3.Row) -> dict[str, Any]:
    record = dict(row)
    for name in JSON_FIELDS:
        record[name] = json.loads(record[name])
    return record


# A time window with few rows in it. The view's plan for a window reads newest first by id
# and filters on the way (that finds a dense window's newest rows at once), so for a window
# with fewer rows than the limit it reads on through every row outside it: `--since 10m`
# on a quiet daemon took 20 s on a log of 3.7 million rows. Below this many rows, the
# window is read through the logged_at index instead and sorted by id (exact either way:
# the same rows, whatever the wall clock did between them).
SPARSE_WINDOW_ROWS = 10_000
_TIME_INDEX = f"idx_{VIEW}_logged_at"  # (both schema versions name it so)


_SQLITE_MAX_INT = 2**63 - 1


def _first_id_at_or_after_seq(conn: sqlite3.Connection, seq: int) -> int:
    """The lowest id whose row's seq is `seq` or more (past the newest id when none is).

    A log the daemon has not opened since seq got its index has none, and `seq < ?`
    alone makes a page far back read every newer row first. But seq rises with id (the
    daemon numbers decisions in the order it commits them, and a restart numbers on from
    the log's last), so a binary search over the primary key finds where seqs reach `seq`
    in about 30 lookups. Each looks up the first row at or after an id, not that id:
    retention leaves no row below the oldest. (Each table is asked on its own: through
    the view, SQLite sorts every row past the id.)"""
    tables = _tables(conn)
    low, high = 0, _newest_id(conn) + 1
    while low < high:
        middle = (low + high) // 2
        found = [conn.execute(f"SELECT id, seq FROM {table} WHERE id >= ? ORDER BY id LIMIT 1", (middle,)).fetchone()
                 for table in tables]
        rows = [(row[0], row[1]) for row in found if row is not None]
        if not rows or min(rows)[1] >= seq:
            high = middle
        else:
            low = middle + 1
    return low


def _tables(conn: sqlite3.Connection) -> tuple[str, ...]:
    """The tables holding the rows: version 2's two, or version 1's one."""
    names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    return (INDEXED, RECENT) if INDEXED in names else (VIEW,)


def _window_is_sparse(conn: sqlite3.Connection, window: list[str], params: list[Any]) -> bool:
    """Whether the indexed rows in the window number under SPARSE_WINDOW_ROWS (counted on
    the logged_at index, stopping there)."""
    table = _tables(conn)[0]
    (count,) = conn.execute(
        f"SELECT count(*) FROM (SELECT 1 FROM {table} INDEXED BY {_TIME_INDEX} "
        f"WHERE {' AND '.join(window)} LIMIT {SPARSE_WINDOW_ROWS})",
        params,
    ).fetchone()
    return bool(count < SPARSE_WINDOW_ROWS)


def _query_by_time(
    conn: sqlite3.Connection, where: list[str], params: list[Any], order: str, tail: list[Any]
) -> list[sqlite3.Row]:
    """The query, each table read through its time index (the recent table has none: it is
    small, rows are indexed a fraction of a second after their commit)."""
    condition = " AND ".join(where)
    indexed, *recent = _tables(conn)
    parts = [f"SELECT * FROM {indexed} INDEXED BY {_TIME_INDEX} WHERE {condition}"]
    parts += [f"SELECT * FROM {table} WHERE {condition}" for table in recent]
    sql = f"SELECT * FROM ({' UNION ALL '.join(parts)})" + order
    return conn.execute(sql, params * len(parts) + tail).fetchall()


def log_identity(path: str | os.PathLike[str]) -> str:
    """What tells this log file from another later made at the same path (a log removed
    and started over by a restarted daemon): its `meta.created_at` ("" when it has none).
    `kvbudget log -f` checks it, where ids alone would wait for the new log to pass the
    old one's newest id, and show nothing meanwhile."""
    conn = open_read_only(path)
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'created_at'").fetchone()
    except sqlite3.DatabaseError as exc:
        raise DecisionLogError(f"{path}: {exc}") from None
    finally:
        conn.close()
    return str(row[0]) if row else ""


def newest_id(path: str | os.PathLike[str]) -> int:
    """The newest row's id (0: none), from the ends of the primary keys: instant."""
    conn = open_read_only(path)
    try:
        return _newest_id(conn)
    except sqlite3.DatabaseError as exc:
        raise DecisionLogError(f"{path}: {exc}") from None
    finally:
        conn.close()


def _newest_id(conn: sqlite3.Connection) -> int:
    ids = [conn.execute(f"SELECT max(id) FROM {table}").fetchone()[0] for table in _tables(conn)]
    return max((i for i in ids if i is not None), default=0)


def newest_seq(path: str | os.PathLike[str]) -> int:
    """The newest row's seq (0: none): where a restarted daemon numbers on from, so that a
    decision's seq stays unique in the log across restarts (an engine, a dashboard or a
    script keyed on it met the same seq twice)."""
    conn = open_read_only(path)
    try:
        newest = [conn.execute(f"SELECT id, seq FROM {table} ORDER BY id DESC LIMIT 1").fetchone()
                  for table in _tables(conn)]
    except sqlite3.DatabaseError as exc:
        raise DecisionLogError(f"{path}: {exc}") from None
    finally:
        conn.close()
    rows = [row for row in newest if row is not None]
    return max(rows)[1] if rows else 0


@dataclass(frozen=True)
class LogUsage:
    """How big a decision log is and how far back it reaches (`kvbudget log --disk-usage`)."""

    file_bytes: int  # the database file
    used_bytes: int  # its pages in use; the rest are free pages SQLite reuses (files never shrink)
    wal_bytes: int  # the -wal file beside it (0 once the last connection closed)
    num_decisions: int
    oldest_unix_s: float | None  # logged_at of the oldest and newest rows (None: empty)
    newest_unix_s: float | None


def log_usage(path: str | os.PathLike[str]) -> LogUsage:
    """Sizes from the file system and SQLite's header, the decisions and their time span
    from the two ends of each table's primary key: instant on a log of any size (a count(*)
    reads a whole index). The count is the id span: the daemon numbers rows one by one and
    retention deletes only the oldest, so ids have no gaps."""
    path = Path(path)
    conn = open_read_only(path)
    try:
        page_size, page_count, free_pages = (
            conn.execute(f"PRAGMA {name}").fetchone()[0] for name in ("page_size", "page_count", "freelist_count")
        )
        ends: list[tuple[int, float]] = []
        for table in _tables(conn):
            for direction in ("ASC", "DESC"):
                row = conn.execute(f"SELECT id, logged_at FROM {table} ORDER BY id {direction} LIMIT 1").fetchone()
                if row is not None:
                    ends.append((int(row[0]), float(row[1])))
    except sqlite3.DatabaseError as exc:
        raise DecisionLogError(f"{path}: {exc}") from None
    finally:
        conn.close()
    wal = Path(f"{path}-wal")
    oldest, newest = (min(ends), max(ends)) if ends else (None, None)
    return LogUsage(
        file_bytes=path.stat().st_size,
        used_bytes=(page_count - free_pages) * page_size,
        wal_bytes=wal.stat().st_size if wal.exists() else 0,
        num_decisions=newest[0] - oldest[0] + 1 if oldest and newest else 0,
        oldest_unix_s=oldest[1] if oldest else None,
        newest_unix_s=newest[1] if newest else None,
    )
