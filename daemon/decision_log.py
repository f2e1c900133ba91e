"""The decision log: every Decision as one SQLite row, written by one thread with group commit.

Schema. One table `decisions` with one column per `records.Decision` field (tuples as JSON
text, enums as their string values) plus `id` (rowid, insertion order) and `logged_at`
(wall-clock unix seconds when the row was queued; time filters use it because the core's
`time_s` may have any origin). Indexes on logged_at, request_id, kind, engine_id and tenant.
A `meta` table carries `app = kvbudget` and `schema_version`; opening a file with another
version is refused rather than silently mixed.

Writing. `append()` queues rows and returns a future. One writer thread takes everything
queued (up to `max_batch` rows), writes it in ONE transaction with a raw `executemany`, then
resolves the futures of that batch. So a caller that waits on the future before replying to
an engine knows the decision is committed, and concurrent callers share one commit
(group commit): the cost of a commit is paid per batch, not per decision.
`append_inline()` is the daemon's path: when nothing is queued ahead and the writer is
idle, it commits in the caller's thread (one transaction) and returns a resolved future,
which halves a small step's commit latency (no hand-off to the writer and no wake-up
back); otherwise it queues like `append`. One lock serialises users of the connection,
and rows stay in append order either way.

The indexes on engine_id and tenant serve `kvbudget log --engine/--tenant`. Measured on
the 2-core machine, dropping them changed the daemon's round trip by about 2% and its
batched throughput by less than run-to-run noise, so they stay.

Durability contract. The file is in WAL mode with `synchronous=NORMAL`:
  * a resolved future means the transaction is committed to the WAL file: it survives the
    daemon crashing or being SIGKILLed (the OS has the data; the next open replays the WAL);
  * it does NOT survive a power loss or kernel crash that strikes before the next WAL
    checkpoint syncs the file: NORMAL skips the fsync on every commit (FULL would do it and
    costs ~10x in commit rate). The database stays consistent, but the last committed
    transactions may be gone. Hosts that must keep every decision across power loss should
    put the file on storage with power-loss protection.
  * a write that fails (disk full, file locked past busy_timeout) fails the futures of its
    batch with DecisionLogError; rows still queued when the process dies had unresolved
    futures, so no engine was told about them.

Reading. WAL lets `sqlite3`, `sqlite-utils` and Datasette read the file while the daemon
writes it; `query_decisions` opens it read-only (`mode=ro`) and works with or without the
daemon running. A reader needs read permission only, not write access to the `-shm` file
(SQLite >= 3.22 maps the WAL index read-only), so an operator in the daemon's group can
read a file the daemon owns.

Checkpoints. SQLite's automatic checkpoint runs inside a commit every 1000 WAL pages and
fsyncs the database file, which shows up as a latency spike for whichever engine step
triggered it. The log turns it off and runs PASSIVE checkpoints every
`checkpoint_interval_s` on a connection of its own (`checkpoint_interval_s=None` restores
SQLite's default); `journal_size_limit` lets the WAL shrink back after a burst.

Retention by age (`retention_s`) and/or size (`max_rows`) is applied by the writer thread
itself, every `retention_interval_s`, in bounded chunks so a large purge never holds up
commits for long.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlite_utils

from kvbudget.daemon.records import Decision, DecisionKind, Reason

SCHEMA_VERSION = 1
APP_NAME = "kvbudget"
TABLE = "decisions"

# Column type of each Decision field, from its annotation (the module uses postponed
# annotations, so these are strings). A new field with another type fails at import,
# which is the moment to bump SCHEMA_VERSION.
_SQL_TYPE_OF_ANNOTATION: dict[str, type] = {
    "int": int,
    "float": float,
    "str": str,
    "DecisionKind": str,
    "Reason": str,
    "tuple[int, ...]": str,  # JSON text
    "tuple[tuple[int, ...], ...]": str,  # JSON text
}
DECISION_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Decision))
JSON_FIELDS: frozenset[str] = frozenset(
    f.name for f in dataclasses.fields(Decision) if str(f.type).startswith("tuple")
)
COLUMNS: tuple[str, ...] = ("logged_at", *DECISION_FIELDS)
INDEXED_COLUMNS: tuple[str, ...] = ("logged_at", "request_id", "kind", "engine_id", "tenant")
_INSERT_SQL = f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"


def _column_types() -> dict[str, type]:
    types: dict[str, type] = {"id": int, "logged_at": float}
    for f in dataclasses.fields(Decision):
        try:
            types[f.name] = _SQL_TYPE_OF_ANNOTATION[str(f.type)]
        except KeyError:
            raise TypeError(f"Decision.{f.name}: no column type for {f.type!r}") from None
    return types


_COLUMN_TYPES = _column_types()


class DecisionLogError(Exception):
    """The file is missing, unreadable, not SQLite, or not a KVBudget decision log."""


# ----------------------------------------------------------------------- encoding
def _int_list(values: tuple[int, ...]) -> str:
    # str(list) is valid JSON for ints ("[1, 2]") and runs in C: ~5x faster than json.dumps.
    return str(list(values)) if values else "[]"


def _nested_int_list(values: tuple[tuple[int, ...], ...]) -> str:
    return str([list(ids) for ids in values]) if values else "[]"


def decision_row(decision: Decision, logged_at: float) -> tuple[Any, ...]:
    """One Decision as a row in `COLUMNS` order.

    `kind` and `reason` are str enums: sqlite3 binds a str subclass as its text, which is
    the enum's value, so they go in as they are (no per-row `.value` lookups).
    """
    d = decision
    return (
        logged_at,
        d.seq,
        d.time_s,
        d.kind,
        d.reason,
        d.request_id,
        d.engine_id,
        d.tenant,
        d.policy,
        d.prompt_tokens,
        d.max_new_tokens,
        d.num_tokens,
        d.num_computed,
        _int_list(d.blocks_reserved),
        _int_list(d.blocks_held),
        _nested_int_list(d.new_block_ids),
        d.freed_blocks,
        d.cached_hit_blocks,
        d.num_free_blocks,
        d.num_waiting,
        d.num_running,
        d.detail,
    )


# decision_row spells the fields out for speed; make sure it follows the dataclass.
assert DECISION_FIELDS == (
    "seq", "time_s", "kind", "reason", "request_id", "engine_id", "tenant", "policy",
    "prompt_tokens", "max_new_tokens", "num_tokens", "num_computed", "blocks_reserved",
    "blocks_held", "new_block_ids", "freed_blocks", "cached_hit_blocks", "num_free_blocks",
    "num_waiting", "num_running", "detail",
), "records.Decision changed: update decision_row and bump SCHEMA_VERSION"


def decision_from_row(row: dict[str, Any]) -> Decision:
    """Back from a `query_decisions` row (JSON columns already decoded) to a Decision."""
    values: dict[str, Any] = {name: row[name] for name in DECISION_FIELDS}
    values["kind"] = DecisionKind(values["kind"])
    values["reason"] = Reason(values["reason"])
    values["blocks_reserved"] = tuple(values["blocks_reserved"])
    values["blocks_held"] = tuple(values["blocks_held"])
    values["new_block_ids"] = tuple(tuple(ids) for ids in values["new_block_ids"])
    return Decision(**values)


# ----------------------------------------------------------------------- schema
def _create_schema(db: sqlite_utils.Database, where: str) -> None:
    """Create tables and indexes in an empty file, or check an existing file is ours and current."""
    if not db.table_names():
        with db.atomic():
            db["meta"].create({"key": str, "value": str}, pk="key")
            db["meta"].insert_all(
                [
                    {"key": "app", "value": APP_NAME},
                    {"key": "schema_version", "value": str(SCHEMA_VERSION)},
                    {"key": "created_at", "value": repr(time.time())},
                ]
            )
            db[TABLE].create(_COLUMN_TYPES, pk="id", column_order=["id", *COLUMNS])
            for column in INDEXED_COLUMNS:
                db[TABLE].create_index([column], index_name=f"idx_{TABLE}_{column}")
    _check_meta(db.conn, where)


def _check_meta(conn: sqlite3.Connection, where: str) -> None:
    try:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.OperationalError:
        raise DecisionLogError(f"{where} is not a KVBudget decision log (no meta table)") from None
    if meta.get("app") != APP_NAME:
        raise DecisionLogError(f"{where} is not a KVBudget decision log (meta.app={meta.get('app')!r})")
    if meta.get("schema_version") != str(SCHEMA_VERSION):
        raise DecisionLogError(
            f"{where} has schema version {meta.get('schema_version')}, "
            f"this kvbudget reads version {SCHEMA_VERSION}"
        )


# ----------------------------------------------------------------------- writer
_STOP = object()


@dataclasses.dataclass
class _Pending:
    decisions: Sequence[Decision]
    logged_at: float
    future: concurrent.futures.Future[None]


class DecisionLog:
    """See the module docstring. Thread-safe `append`; one writer thread owns the connection."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        retention_s: float | None = None,
        max_rows: int | None = None,
        max_batch: int = 2000,
        retention_interval_s: float = 60.0,
        retention_chunk_rows: int = 50_000,
        checkpoint_interval_s: float | None = 1.0,
    ) -> None:
        if retention_s is not None and retention_s <= 0:
            raise ValueError(f"retention_s must be positive or None, got {retention_s}")
        if max_rows is not None and max_rows <= 0:
            raise ValueError(f"max_rows must be positive or None, got {max_rows}")
        if max_batch <= 0:
            raise ValueError(f"max_batch must be positive, got {max_batch}")
        self.path = Path(path)
        self.retention_s = retention_s
        self.max_rows = max_rows
        self.max_batch = max_batch
        self.retention_interval_s = retention_interval_s
        self.retention_chunk_rows = retention_chunk_rows
        self.checkpoint_interval_s = checkpoint_interval_s
        self.rows_written = 0
        self.rows_deleted = 0
        self.batches_committed = 0
        self._queue: queue.SimpleQueue[_Pending | object] = queue.SimpleQueue()
        self._db: sqlite_utils.Database | None = None
        self._thread: threading.Thread | None = None
        self._checkpointer: threading.Thread | None = None
        self._stop_checkpoints = threading.Event()
        self._closed = False
        self._lock = threading.Lock()  # orders append() against close()
        self._carry: _Pending | None = None  # taken from the queue but over max_batch
        # The connection has one user at a time: the writer thread, or a caller of
        # append_inline when nothing is queued ahead of it (see there).
        self._conn_lock = threading.Lock()
        self._queued = 0  # appended, not yet committed (or failed); guarded by _lock

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Open (WAL, synchronous=NORMAL), create or check the schema, start the writer."""
        if self._thread is not None:
            raise RuntimeError("DecisionLog.start() called twice")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: transactions are explicit (BEGIN/COMMIT) and nothing else.
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db = sqlite_utils.Database(conn)
            if db.table_names():
                # Refuse someone else's file before changing anything in it (even its journal mode).
                _check_meta(conn, str(self.path))
            db.enable_wal()
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=5000")  # a reader's checkpoint may hold the lock briefly
            conn.execute(f"PRAGMA journal_size_limit={64 * 2**20}")  # WAL shrinks back after a burst
            if self.checkpoint_interval_s is not None:
                # Checkpoints (copying the WAL into the file, with an fsync) move off the
                # commit path onto their own thread; see _checkpoint_loop.
                conn.execute("PRAGMA wal_autocheckpoint=0")
            _create_schema(db, str(self.path))
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise DecisionLogError(f"{self.path}: {exc}") from exc
        except DecisionLogError:
            conn.close()
            raise
        self._db = db
        self._thread = threading.Thread(target=self._run, name="kvbudget-decision-log", daemon=True)
        self._thread.start()
        if self.checkpoint_interval_s is not None:
            self._checkpointer = threading.Thread(
                target=self._checkpoint_loop, name="kvbudget-decision-log-checkpoint", daemon=True
            )
            self._checkpointer.start()

    def append(self, decisions: Sequence[Decision]) -> concurrent.futures.Future[None]:
        """Queue rows; the future resolves once they are committed (or fails with the error)."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            if self._closed or self._thread is None:
                raise RuntimeError("decision log is not running (start() not called, or closed)")
            self._queue.put(_Pending(decisions, time.time(), future))
            self._queued += 1
        return future

    def append_inline(self, decisions: Sequence[Decision], max_rows: int = 1024) -> concurrent.futures.Future[None]:
        """Like `append`, but commits in the caller's thread when it can keep the order.

        When nothing is queued ahead and the writer is idle, the rows are written here, in
        one transaction, and the returned future is already resolved (or failed): a small
        batch then costs one commit and no thread hand-off and wake-up (about half the
        latency of the writer round trip). Otherwise (a backlog, the writer or
        retention busy, more than `max_rows` rows) the rows are queued as by `append`, so
        rows stay in the order they were appended. The durability contract is the same.
        """
        if len(decisions) > max_rows:
            return self.append(decisions)
        with self._lock:
            if self._closed or self._thread is None:
                raise RuntimeError("decision log is not running (start() not called, or closed)")
            if self._queued == 0 and self._conn_lock.acquire(blocking=False):
                try:
                    future: concurrent.futures.Future[None] = concurrent.futures.Future()
                    assert self._db is not None
                    self._commit(self._db.conn, [_Pending(decisions, time.time(), future)])
                    return future
                finally:
                    self._conn_lock.release()
        return self.append(decisions)

    def flush(self) -> None:
        """Block until everything appended so far is committed."""
        # FIFO queue + one writer: once this empty batch is done, all before it are too.
        self.append(()).result()

    def close(self) -> None:
        """Flush, stop the writer, close the file. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._queue.put(_STOP)
        if thread is not None:
            thread.join()
        self._stop_checkpoints.set()
        if self._checkpointer is not None:
            self._checkpointer.join()
        if self._db is not None:
            self._db.conn.close()
            self._db = None

    def __enter__(self) -> DecisionLog:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ writer thread
    def _run(self) -> None:
        assert self._db is not None
        conn = self._db.conn
        next_retention = time.monotonic()
        retention_behind = False
        stopping = False
        while not stopping:
            timeout = 0.0 if retention_behind else max(0.0, next_retention - time.monotonic())
            batch, stopping = self._take_batch(timeout if self._has_retention else None)
            if batch:
                self._commit_queued(conn, batch)
            if self._has_retention and (retention_behind or time.monotonic() >= next_retention):
                with self._conn_lock:
                    retention_behind = self._apply_retention_safely(conn)
                next_retention = time.monotonic() + self.retention_interval_s
        # Anything appended races with close() only before _closed was set; drain it.
        leftover, _ = self._take_batch(0.0)
        while leftover:
            self._commit_queued(conn, leftover)
            leftover, _ = self._take_batch(0.0)

    def _checkpoint_loop(self) -> None:
        """Copy the WAL into the database file every checkpoint_interval_s, on its own
        connection. PASSIVE never blocks the writer (or readers), so a commit never pays
        for a checkpoint's fsync; sqlite3 releases the GIL meanwhile, so on a second core
        it costs the daemon nothing. The last connection to close checkpoints the rest."""
        assert self.checkpoint_interval_s is not None
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            while not self._stop_checkpoints.wait(self.checkpoint_interval_s):
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error:
                    pass  # busy or I/O trouble: the next round tries again
        finally:
            conn.close()

    @property
    def _has_retention(self) -> bool:
        return self.retention_s is not None or self.max_rows is not None

    def _take_batch(self, timeout: float | None) -> tuple[list[_Pending], bool]:
        """Everything queued now (at least one item unless timed out), up to max_batch rows."""
        batch: list[_Pending] = []
        rows = 0
        if self._carry is not None:
            batch.append(self._carry)
            rows = len(self._carry.decisions)
            self._carry = None
        else:
            try:
                item = self._queue.get(timeout=timeout) if timeout != 0.0 else self._queue.get_nowait()
            except queue.Empty:
                return batch, False
            if item is _STOP:
                return batch, True
            assert isinstance(item, _Pending)
            batch.append(item)
            rows = len(item.decisions)
        while rows < self.max_batch:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                return batch, True
            assert isinstance(item, _Pending)
            if rows + len(item.decisions) > self.max_batch:
                self._carry = item  # next transaction starts with it: order is kept
                break
            batch.append(item)
            rows += len(item.decisions)
        return batch, False

    def _commit_queued(self, conn: sqlite3.Connection, batch: list[_Pending]) -> None:
        with self._conn_lock:
            self._commit(conn, batch)
        with self._lock:
            self._queued -= len(batch)

    def _commit(self, conn: sqlite3.Connection, batch: list[_Pending]) -> None:
        # A future cancelled by its caller still gets its rows written: the decisions
        # happened. set_running_or_notify_cancel makes the rest uncancellable from here.
        live = [p.future for p in batch if p.future.set_running_or_notify_cancel()]
        rows = [decision_row(d, p.logged_at) for p in batch for d in p.decisions]
        try:
            if rows:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    conn.executemany(_INSERT_SQL, rows)
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
        except Exception as exc:  # disk full, I/O error: every caller of this batch hears it
            for future in live:
                future.set_exception(DecisionLogError(f"{self.path}: write failed: {exc}"))
            return
        if rows:
            self.rows_written += len(rows)
            self.batches_committed += 1
        for future in live:
            future.set_result(None)

    def _apply_retention_safely(self, conn: sqlite3.Connection) -> bool:
        try:
            return self.apply_retention(conn)
        except sqlite3.Error:
            return False  # a failed purge is retried at the next interval; writes go on

    def apply_retention(self, conn: sqlite3.Connection, now: float | None = None) -> bool:
        """Delete the oldest rows beyond the age / size limits, one bounded chunk.

        Returns True when more rows are due (the writer runs it again right after the next
        batch). Only the writer thread calls this (tests call it on a stopped log's file).
        """
        now = time.time() if now is None else now
        first_id, last_id = conn.execute(f"SELECT min(id), max(id) FROM {TABLE}").fetchone()
        if first_id is None:
            return False
        keep_from = first_id  # rows with id >= keep_from survive
        if self.max_rows is not None:
            keep_from = max(keep_from, last_id - self.max_rows + 1)
        if self.retention_s is not None:
            (first_recent,) = conn.execute(
                f"SELECT min(id) FROM {TABLE} WHERE logged_at >= ?", (now - self.retention_s,)
            ).fetchone()
            keep_from = max(keep_from, last_id + 1 if first_recent is None else first_recent)
        if keep_from <= first_id:
            return False
        delete_below = min(keep_from, first_id + self.retention_chunk_rows)
        conn.execute("BEGIN IMMEDIATE")
        try:
            deleted = conn.execute(f"DELETE FROM {TABLE} WHERE id < ?", (delete_below,)).rowcount
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self.rows_deleted += deleted
        return delete_below < keep_from


# ----------------------------------------------------------------------- reading
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
        _check_meta(conn, str(path))
    except sqlite3.DatabaseError as exc:
        raise DecisionLogError(f"{path} is not a readable SQLite database ({exc})") from None
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
) -> list[dict[str, Any]]:
    """Rows matching every given filter (time filters on `logged_at`, unix seconds, since
    inclusive, until exclusive), JSON columns decoded to lists. `limit=None` or 0: all."""
    where: list[str] = []
    params: list[Any] = []
    for column, value in (("request_id", request_id), ("engine_id", engine_id), ("tenant", tenant)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    if kind is not None:
        where.append("kind = ?")
        params.append(kind.value if isinstance(kind, DecisionKind) else kind)
    if since_s is not None:
        where.append("logged_at >= ?")
        params.append(since_s)
    if until_s is not None:
        where.append("logged_at < ?")
        params.append(until_s)
    sql = f"SELECT * FROM {TABLE}"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY id " + ("DESC" if newest_first else "ASC")
    if limit:
        sql += " LIMIT ?"
        params.append(int(limit))
    conn = open_read_only(path)
    try:
        conn.row_factory = sqlite3.Row
        try:
            rows = conn.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as exc:
            raise DecisionLogError(f"{path}: {exc}") from None
    finally:
        conn.close()
    result = []
    for row in rows:
        record = dict(row)
        for name in JSON_FIELDS:
            record[name] = json.loads(record[name])
        result.append(record)
    return result
