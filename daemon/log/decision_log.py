"""The decision log's writer: every Decision as one SQLite row, committed before the reply.

The file format (tables, row encoding, versions) is in `decision_schema`; reading is in
`decision_query`. This module is the one writer; its thread's loop is `decision_writer`.

Writing. `append()` queues rows and returns a future. One writer thread takes everything
queued (up to `max_batch` rows), writes it in ONE transaction, then resolves the futures
of that batch. So a caller that waits on the future before replying to an engine knows the
decision is committed, and concurrent callers share one commit (group commit): the cost
of a commit is paid per batch, not per decision.
`commit_inline()` is the daemon's path: when nothing is queued ahead and the writer is
idle, it commits in the caller's thread (one transaction) and says so, which halves a
small step's commit latency (no hand-off to the writer, no wake-up back, no Future);
otherwise the caller queues with `append`. One lock serialises users of the connection,
and rows get their ids, and stay, in append order either way.

Two tables, one view. Commits go into `decisions_recent`, which has no index, so a commit
writes one or two pages instead of one per index: measured on the 2-core machine, an
engine step's inline commit went from ~80 us to ~30 us. The writer thread then "folds"
them into `decisions_indexed` `fold_interval_s` after the first unfolded commit, or at
once past `fold_rows`; and on start (after a crash) and close. Readers query the view
`decisions` and see every committed row at once, folded or not; each fold moves rows in
one transaction, so a reader never sees a row twice or not at all.

Durability contract. The file is in WAL mode with `synchronous=NORMAL`:
  * a resolved future means the transaction is committed to the WAL file: it survives the
    daemon crashing or being SIGKILLed (the OS has the data; the next open replays the WAL
    and folds what was not folded);
  * it does NOT survive a power loss or kernel crash that strikes before the next WAL
    checkpoint syncs the file: NORMAL skips the fsync on every commit (FULL would do it and
    costs ~10x in commit rate). The database stays consistent, but the last committed
    transactions may be gone. Hosts that must keep every decision across power loss should
    put the file on storage with power-loss protection.
  * a write that fails (disk full, file locked past busy_timeout) fails the futures of its
    batch with DecisionLogError (an `UnwrittenError`), so no engine is told of them; rows
    still queued when the process dies had unresolved futures, so no engine was told
    about them either.
  * the decisions of a failed write are not dropped: the pool made them. They are kept
    and go first, in order, in the next write that works (`decision_unwritten`); the
    writer retries every `unwritten_retry_s`, and `write_unwritten()` lets a caller retry
    before it makes more. A log closed with some still unwritten says so: those are lost.
  * if the writer thread itself ever stops on an error, the commits waiting on it and every
    later one fail with DecisionLogError at once (`_run_or_fail`), rather than hang.
  * a file removed or renamed while the daemon has it open is still written through the
    open descriptors, but nobody can read it and it is gone when the daemon exits (a
    restart starts a new, empty log at `path`). So a write first checks, at most every
    `FILE_CHECK_S` (one stat), that `path` is still the file it opened; when it is not,
    the write fails like one to a full disk (its decisions kept, the caller told "not
    committed", retried every `unwritten_retry_s`), and it works again once the file is
    back at `path` (renamed back). Gone for good: a restart starts a new log there.
  * a WAL file removed (or replaced by another file) while the daemon has it open is the
    same trouble for the decisions not checkpointed yet: the daemon commits into the
    unlinked file, readers see only what was checkpointed (or an I/O error, reading frames
    from a new, empty `-wal`), and those decisions are gone when the daemon exits or
    crashes. But the daemon's own connection still reads every frame of it, so the same
    check stats `<path>-wal` too, and a write that finds it gone or another file heals the
    log before it commits (`_heal_wal`): checkpoints everything into the database file,
    closes both connections on the old WAL (writer and checkpointer) and opens them again,
    which makes SQLite start a new WAL at `<path>-wal`, and says so in a warning. Nothing
    acknowledged is lost (what was committed since the file went is in the checkpoint) unless
    the daemon dies before the next write checks. While the log cannot heal (a reader holds a
    snapshot of the old WAL, so the checkpoint cannot finish), writes fail as above and the
    heal is tried again at most every `FILE_CHECK_S`. (SQLite itself deletes the WAL only when
    the last connection closes, and a checkpoint truncates it in place: while the log is open,
    the WAL at `<path>-wal` is the one it opened.)
    The WAL's index `<path>-shm` removed or replaced (`rm decisions.db-*`) is healed the same
    way, and must be: SQLite shares one index among a process's connections to a file, so
    the daemon kept the removed one while readers in other processes made a new one at that
    name; neither saw the other's changes (a reader that stayed open, Datasette or
    `kvbudget log -f`, saw the log stop where its first read found it, and the two sides'
    locks did not meet, so a checkpoint could start the WAL over under a reader). So the
    heal closes the old connection before it opens the new one: the process's last
    connection to the file lets go of the old index, and the new one opens the index at its
    name. (Closing the last connection deletes `<path>-wal` and `<path>-shm` by name only
    when no other process has the file open: then nobody uses what is there.)

Checkpoints. SQLite's automatic checkpoint runs inside a commit every 1000 WAL pages and
fsyncs the database file, which shows up as a latency spike for whichever engine step
triggered it. The log turns it off and runs PASSIVE checkpoints every
`checkpoint_interval_s` on a connection of its own (`checkpoint_interval_s=None` restores
SQLite's default). Under steady commits the WAL would never start over (a PASSIVE pass
never catches up with what is written meanwhile) and grew without bound; past
`wal_limit_bytes` the checkpoint thread catches up and starts it over, holding commits off for
the last frames only (`decision_upkeep.checkpoint`).

One writer: the daemon holds `log_lock.WriterLock` for its whole life (two daemons on one
file would number their rows over each other).

Pacing the upkeep against the commits (fold and purge chunks, the write stall past
`max_unfolded_rows`, retention while behind) is in `decision_pacing`; folding, purging and
checkpointing themselves are in `decision_upkeep`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from itertools import chain
from pathlib import Path

import sqlite_utils

from kvbudget.daemon.log import upkeep
from kvbudget.daemon.log.pacing import UpkeepPacing
from kvbudget.daemon.log.schema import (
    COLUMNS,
    RECENT,
    DecisionLogError,
    check_meta,
    create_or_upgrade,
    decision_row,
)
from kvbudget.daemon.log.unwritten import KeepsUnwritten, Unwritten
from kvbudget.daemon.log.writer import STOP, WAKE, Pending, WriterThread
from kvbudget.daemon.core.records import Decision

_log = logging.getLogger("kvbudget.daemon.log.decision_log")

_ROW_MARKS = f"({', '.join('?' * (1 + len(COLUMNS)))})"
# Rows go in as multi-row INSERTs: one statement binds many rows and runs once. A commit
# of 1-8 rows or of a power of two up to _CHUNK_ROWS is one such statement in autocommit
# mode: one sqlite3_step, so one hand-back of the GIL and no BEGIN / COMMIT round trips
# through the sqlite3 module; another is a transaction of a few statements (powers of
# two, then the rest). Against executemany (a statement run per row, each run
# letting go of the GIL and taking it back) this keeps a batch's commit from trading
# the GIL with the event loop hundreds of times. Sizes: 1.._SMALL_ROWS exactly, then
# powers of two, so the sqlite3 statement cache holds a dozen statements at most.
_SMALL_ROWS = 8
_CHUNK_ROWS = 1024  # x 23 columns: under SQLite's 32,766 bound parameters
_INSERT_SQL: dict[int, str] = {
    n: f"INSERT INTO {RECENT} VALUES {', '.join([_ROW_MARKS] * n)}"
    for n in (*range(1, _SMALL_ROWS + 1), 16, 32, 64, 128, 256, 512, _CHUNK_ROWS)
}
_POWERS = (512, 256, 128, 64, 32, 16, 8)


def _chunk_sizes(num_rows: int) -> list[int]:
    """How `_insert` cuts `num_rows` rows into statements (sizes in _INSERT_SQL)."""
    sizes = [_CHUNK_ROWS] * (num_rows // _CHUNK_ROWS)
    rest = num_rows % _CHUNK_ROWS
    for size in _POWERS:
        if rest > _SMALL_ROWS and rest >= size:
            sizes.append(size)
            rest -= size
    if rest:
        sizes.append(rest)
    return sizes


PAGE_SIZE = 1024  # for new files; see start()
# The WAL's size bound: past it the checkpoint thread starts the WAL over (under steady
# commits it would otherwise never start over: decision_upkeep.checkpoint), and a WAL
# SQLite starts over is cut back to it.
WAL_LIMIT_BYTES = 64 * 2**20


# How often a write checks that `path` is still the file the log opened (one stat: a few
# microseconds, so not on every commit). Decisions committed in the interval after the file
# was removed go to the removed file, with the ones before them.
FILE_CHECK_S = 0.1


class FileMovedError(sqlite3.OperationalError):
    """`path` is no longer the file the log has open (removed, renamed or replaced)."""


class WalLostError(sqlite3.OperationalError):
    """`<path>-wal` is no longer the WAL the log writes to, and the log could not heal yet."""


def _file_identity(path: str) -> tuple[int, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def _leave_wal(conn: sqlite3.Connection) -> None:
    """At a clean close, the file back in rollback-journal mode (`start` puts it in WAL
    again). Closing the last connection deletes `-wal` and `-shm`, and SQLite opens a WAL
    file read-only only if its `-shm` is there or can be made: an operator with read
    permission on the file but none on its directory (`/var/lib/kvbudget`) could then not
    read a stopped daemon's log, with `kvbudget log` or `sqlite3` alike. Best effort: with
    another connection reading, the file stays in WAL mode (complete either way)."""
    try:
        conn.execute("PRAGMA busy_timeout=200")  # (a reader mid-query: give up, not hold the stop)
        conn.execute("PRAGMA journal_mode=DELETE")
    except sqlite3.Error:
        pass


def _file_bytes(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


@dataclasses.dataclass(frozen=True)
class LogFigures:
    """What the metrics show of the log: its files' sizes and its upkeep's counts."""

    database_bytes: int
    wal_bytes: int
    rows_written: int
    rows_folded: int
    wal_resets: int
    stalls: int  # times commits waited for the upkeep (past max_unfolded_rows: decision_pacing)
    stall_seconds: float  # time they waited, in all
    # The file system holding the log, for the daemon's user (statvfs f_bavail): when it
    # fills, commits fail. 0 and 0 when it cannot be read.
    disk_free_bytes: int = 0
    disk_total_bytes: int = 0
    max_bytes: int = 0  # the retention bound on the database file; 0: none
    # Decisions a failed write left, waiting to go first in the next write (0: none), the
    # failure, and when the first of this spell failed.
    num_unwritten: int = 0
    write_error: str = ""
    unwritten_since_unix_s: float = 0.0


class DecisionLog(UpkeepPacing, KeepsUnwritten, WriterThread):
    """See the module docstring. Thread-safe `append`; one writer thread owns the connection."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        retention_s: float | None = None,
        max_rows: int | None = None,
        max_bytes: int | None = None,
        max_batch: int = 2000,
        retention_interval_s: float = 60.0,
        retention_chunk_rows: int = 1024,
        checkpoint_interval_s: float | None = 1.0,
        fold_interval_s: float = 0.05,
        fold_rows: int = 4096,
        fold_chunk_rows: int = 512,
        inline_wait_s: float = 0.05,
        wal_limit_bytes: int = WAL_LIMIT_BYTES,
        max_unfolded_rows: int = 131_072,
        unwritten_retry_s: float = 1.0,
        on_failure: Callable[[str], None] | None = None,
        on_write_trouble: Callable[[str | None], None] | None = None,
    ) -> None:
        if retention_s is not None and retention_s <= 0:
            raise ValueError(f"retention_s must be positive or None, got {retention_s}")
        if max_rows is not None and max_rows <= 0:
            raise ValueError(f"max_rows must be positive or None, got {max_rows}")
        if max_bytes is not None and max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive or None, got {max_bytes}")
        if max_batch <= 0:
            raise ValueError(f"max_batch must be positive, got {max_batch}")
        if wal_limit_bytes <= 0:
            raise ValueError(f"wal_limit_bytes must be positive, got {wal_limit_bytes}")
        if max_unfolded_rows <= 0:
            raise ValueError(f"max_unfolded_rows must be positive, got {max_unfolded_rows}")
        if unwritten_retry_s <= 0:
            raise ValueError(f"unwritten_retry_s must be positive, got {unwritten_retry_s}")
        if inline_wait_s < 0:  # (a negative lock timeout would mean: wait for ever)
            raise ValueError(f"inline_wait_s must be >= 0, got {inline_wait_s}")
        if fold_interval_s < 0 or fold_rows <= 0 or fold_chunk_rows <= 0:
            raise ValueError(
                "fold_interval_s must be >= 0, fold_rows and fold_chunk_rows positive, "
                f"got {fold_interval_s}, {fold_rows}, {fold_chunk_rows}"
            )
        self.path = Path(path)
        self.retention_s = retention_s
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.max_batch = max_batch
        self.retention_interval_s = retention_interval_s
        self.retention_chunk_rows = retention_chunk_rows
        self.checkpoint_interval_s = checkpoint_interval_s
        self.fold_interval_s = fold_interval_s
        self.fold_rows = fold_rows
        self.fold_chunk_rows = fold_chunk_rows
        self.inline_wait_s = inline_wait_s
        self.wal_limit_bytes = wal_limit_bytes
        # ~2 s of folding with random ids: what a stop or start-up may have left to fold
        self.max_unfolded_rows = max_unfolded_rows
        self.stalls = 0
        self.stall_seconds = 0.0
        self.wal_resets = 0  # times the checkpoint thread started over a WAL past wal_limit_bytes
        self.rows_written = 0
        self.rows_deleted = 0
        self.rows_folded = 0
        self.batches_committed = 0
        self._queue: queue.SimpleQueue[Pending | object] = queue.SimpleQueue()
        self._db: sqlite_utils.Database | None = None
        self._cursor: sqlite3.Cursor | None = None
        self._thread: threading.Thread | None = None
        self._checkpointer: threading.Thread | None = None
        self._stop_checkpoints = threading.Event()
        self._closed = False
        self._lock = threading.Lock()  # orders append() against close()
        self._carry: Pending | None = None  # taken from the queue but over max_batch
        self._in_flight: list[Pending] = []  # the batch the writer is committing
        self._failure: str | None = None  # why the writer thread stopped, if it did
        self._on_failure = on_failure  # told why, from the writer thread, once
        # Told the error when writes start failing, None when they work again; from
        # whichever thread wrote (so: hand it over to a loop with call_soon_threadsafe).
        self._on_write_trouble = on_write_trouble
        self.unwritten_retry_s = unwritten_retry_s
        # Guarded by _conn_lock; num_unwritten mirrors its length, read without a lock by
        # callers about to make decisions (one attribute read per engine step).
        self._unwritten = Unwritten()
        self.num_unwritten = 0
        self._unwritten_retry_at = 0.0  # (monotonic) the writer's next retry
        # The connection has one user at a time: the writer thread, or a caller of
        # commit_inline when nothing is queued ahead of it (see there).
        self._conn_lock = threading.Lock()
        self._queued = 0  # appended, not yet committed (or failed); guarded by _lock
        self._inline_waiting = 0  # commit_inline callers waiting for the connection
        # Guarded by _conn_lock: the next row id, and rows committed but not folded yet
        # (ids _next_id - _unfolded .. _next_id - 1).
        self._next_id = 1
        self._unfolded = 0
        self._unfolded_since = 0.0  # monotonic time of the first unfolded commit
        self._purge_owed = 0  # (writer thread) rows a purge round still owes: folded while behind, + a chunk
        # Guarded by _conn_lock: (st_dev, st_ino) of the file opened, and when a write checks it next.
        self._identity: tuple[int, int] | None = None
        self._stat_path = os.path.abspath(self.path)  # (a later chdir does not move the log)
        self._file_check_at = 0.0  # (monotonic; 0: at the next write)
        # Guarded by _conn_lock: the WAL the connections opened (None: no WAL to check), and
        # when a heal that failed may be tried again (monotonic).
        self._wal_path = f"{self._stat_path}-wal"
        self._wal_identity: tuple[int, int] | None = None
        self._shm_path = f"{self._stat_path}-shm"  # (the WAL's index; same as _wal_identity)
        self._shm_identity: tuple[int, int] | None = None
        self._wal_heal_at = 0.0
        self._heal_frames = 0  # what the heal's checkpoint found in the old WAL (a retry says it too)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Open (WAL, synchronous=NORMAL), create, upgrade or check the schema, fold rows a
        crash left unfolded, start the writer."""
        if self._thread is not None:
            raise RuntimeError("DecisionLog.start() called twice")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: transactions are explicit (BEGIN/COMMIT) and nothing else.
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db = sqlite_utils.Database(conn)
            if db.table_names():
                # Refuse someone else's file before changing anything in it (even its journal mode).
                check_meta(conn, str(self.path))
            else:
                # A new file: small pages make a commit's WAL frames small (one 1 KiB page
                # for a step's rows instead of 4 KiB): ~20% off a commit. Only possible
                # before the first write.
                conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
            db.enable_wal()
            self._tune(conn)
            create_or_upgrade(db, str(self.path))
            self._next_id = upkeep.newest_id(conn) + 1
            self.rows_folded += upkeep.fold(conn)  # rows a crash left in the recent table
            upkeep.prepare_fold_below(conn)
            # The schema (and what the fold moved) into the file itself: until the first
            # checkpoint a new log's tables were only in the WAL, and a reader that opened it
            # after an `rm decisions.db-wal` found no KVBudget log there at all.
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise DecisionLogError(f"{self.path}: {exc}") from exc
        except DecisionLogError:
            conn.close()
            raise
        self._identity = _file_identity(self._stat_path)
        self._wal_identity = _file_identity(self._wal_path)  # (the reads above opened it)
        self._shm_identity = _file_identity(self._shm_path)
        self._db = db
        # One cursor for every insert: conn.execute makes (and registers, and frees) a
        # cursor per call, a few microseconds of a step's commit.
        self._cursor = conn.cursor()
        self._thread = threading.Thread(target=self._run_or_fail, name="kvbudget-decision-log", daemon=True)
        self._thread.start()
        if self.checkpoint_interval_s is not None:
            self._start_checkpointer()

    def _tune(self, conn: sqlite3.Connection) -> None:
        """The writer connection's settings (the file is in WAL mode already)."""
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=5000")  # a reader's checkpoint may hold the lock briefly
        conn.execute(f"PRAGMA journal_size_limit={self.wal_limit_bytes}")  # WAL shrinks back after a burst
        if self.checkpoint_interval_s is not None:
            # Checkpoints (copying the WAL into the file, with an fsync) move off the
            # commit path onto their own thread; see decision_upkeep.checkpoint_loop.
            conn.execute("PRAGMA wal_autocheckpoint=0")

    def _start_checkpointer(self) -> None:
        """Starts the checkpoint thread, on a connection of its own (start(), and a healed WAL)."""
        assert self.checkpoint_interval_s is not None
        self._stop_checkpoints = threading.Event()
        self._checkpointer = threading.Thread(
            target=upkeep.checkpoint_loop,
            args=(self.path, self.checkpoint_interval_s, self._stop_checkpoints),
            kwargs={"wal_reset_bytes": self.wal_limit_bytes, "on_reset": self._count_wal_reset},
            name="kvbudget-decision-log-checkpoint",
            daemon=True,
        )
        self._checkpointer.start()

    def _stop_checkpointer(self) -> None:
        """Stops the checkpoint thread and waits for it (its connection is closed then)."""
        self._stop_checkpoints.set()
        if self._checkpointer is not None:
            self._checkpointer.join()
            self._checkpointer = None

    def append(self, decisions: Sequence[Decision]) -> concurrent.futures.Future[None]:
        """Queue rows; the future resolves once they are committed (or fails with the error)."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            if self._closed or self._thread is None:
                raise RuntimeError("decision log is not running (start() not called, or closed)")
            if self._failure is not None:
                raise DecisionLogError(self._failure)
            self._queue.put(Pending(decisions, time.time(), future))
            self._queued += 1
        return future

    def commit_inline(self, decisions: Sequence[Decision], max_rows: int = 1024) -> bool:
        """Commits in the caller's thread when that keeps the order; the daemon's path.

        True: the rows are committed (one transaction). False: nothing was written, the
        caller must `append` instead, because something is queued ahead, there are more
        than `max_rows` rows, or the writer kept the connection (a fold, purge or queued
        batch) past `inline_wait_s`. Raises DecisionLogError when the write failed:
        nothing was written, and the decisions are kept to go first in the next write
        (`UnwrittenError`). RuntimeError when the log is not running. A small step's
        decisions then cost one commit and no thread hand-off, wake-up or Future (about
        half the latency of the writer round trip). The durability contract is the same
        as `append`'s.

        Waiting for the writer (the GIL released meanwhile) beats queueing behind it: a
        queued batch is written by the writer thread, which must win the GIL back from the
        event loop for every statement (up to the 5 ms switch interval each), so under
        batched load queued commits took ~18 ms and left the loop idle a third of the time.
        The writer holds the connection for one bounded chunk at a time and lets a waiting
        caller in between chunks.
        """
        if len(decisions) > max_rows:
            return False
        with self._lock:
            if self._closed or self._thread is None:
                raise RuntimeError("decision log is not running (start() not called, or closed)")
            if self._failure is not None:
                raise DecisionLogError(self._failure)
            if self._queued or max(self._unfolded, self._purge_owed) >= self.max_unfolded_rows:
                return False  # (past the bound the writer folds before it commits: _stall_for_upkeep)
            conn_lock = self._conn_lock
            if not conn_lock.acquire(False):  # (positional: no keyword parsing per commit)
                self._inline_waiting += 1
                try:
                    if not conn_lock.acquire(timeout=self.inline_wait_s):
                        return False
                finally:
                    self._inline_waiting -= 1
            try:
                assert self._db is not None
                logged_at = time.time()
                if self.num_unwritten:
                    first_to_fold = self._write_behind_unwritten(decisions, logged_at)
                else:
                    first_id = self._next_id
                    if len(decisions) == 1:  # most steps of a live engine: no comprehension frame
                        rows = [decision_row(first_id, decisions[0], logged_at)]
                    else:
                        rows = [decision_row(first_id + i, d, logged_at) for i, d in enumerate(decisions)]
                    try:
                        first_to_fold = self._insert(rows)
                    except sqlite3.Error as exc:
                        raise self._keep_unwritten(decisions, exc) from exc
            finally:
                conn_lock.release()
        if first_to_fold:
            self._queue.put(WAKE)  # the first rows to fold: the writer starts its timer
        return True

    def append_inline(self, decisions: Sequence[Decision], max_rows: int = 1024) -> concurrent.futures.Future[None]:
        """`commit_inline` with `append`'s interface: a future, already settled when the
        rows went inline, else the one `append` returns."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        try:
            if not self.commit_inline(decisions, max_rows):
                return self.append(decisions)
        except DecisionLogError as exc:
            future.set_exception(exc)
            return future
        future.set_result(None)
        return future

    def flush(self) -> None:
        """Block until everything appended so far is committed (folded or not)."""
        # FIFO queue + one writer: once this empty batch is done, all before it are too.
        try:
            self.append(()).result()
        except DecisionLogError:
            if self._failure is None:
                raise
            # the writer stopped: every append was settled (failed) then, none is left waiting

    def close(self) -> None:
        """Flush, fold, stop the writer, close the file. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            if thread is not None:
                self._queue.put(STOP)
        if thread is not None:
            thread.join()
        with self._conn_lock:  # (a heal under way starts no checkpointer once this ran: _heal_wal)
            self._stop_checkpoints.set()
            checkpointer = self._checkpointer
        if checkpointer is not None:
            checkpointer.join()
        if self.num_unwritten:
            with self._conn_lock:
                why = f"{self._unwritten.error}; the log closed before they could be written"
                lost = self._unwritten.abandon(why)
                self.num_unwritten = 0
            _log.error("decision log: %d decisions were never written (%s)", lost, why)
        if self._db is not None:
            self._cursor = None
            _leave_wal(self._db.conn)
            self._db.conn.close()
            self._db = None

    def figures(self) -> LogFigures:
        """The files' sizes and their disk's space now (three system calls) and the counts so far."""
        try:
            disk = os.statvfs(self.path.parent)
            free, total = disk.f_bavail * disk.f_frsize, disk.f_blocks * disk.f_frsize
        except OSError:
            free = total = 0
        return LogFigures(
            database_bytes=_file_bytes(self.path),
            wal_bytes=_file_bytes(Path(f"{self.path}-wal")),
            rows_written=self.rows_written,
            rows_folded=self.rows_folded,
            wal_resets=self.wal_resets,
            stalls=self.stalls,
            stall_seconds=self.stall_seconds,
            disk_free_bytes=free,
            disk_total_bytes=total,
            max_bytes=self.max_bytes or 0,
            num_unwritten=self.num_unwritten,
            write_error=self._unwritten.error,
            unwritten_since_unix_s=self._unwritten.since_unix_s,
        )

    def _check_file(self) -> None:
        """Raises FileMovedError when `path` is no longer the file the log has open (caller
        holds _conn_lock): rows written now would reach no reader and be gone at exit. Checked
        on every write while it is so, at most every FILE_CHECK_S otherwise. A WAL that is no
        longer at `<path>-wal` is healed first (`_heal_wal`), or raises WalLostError."""
        identity = _file_identity(self._stat_path)
        if identity is not None and identity == self._identity:
            if self._wal_identity is not None:
                wal_identity = _file_identity(self._wal_path)
                shm_identity = _file_identity(self._shm_path) if self._shm_identity is not None else None
                if wal_identity != self._wal_identity or shm_identity != self._shm_identity:
                    self._file_check_at = 0.0  # (until healed: every write)
                    self._heal_wal(self._what_became(wal_identity, shm_identity))
            self._file_check_at = time.monotonic() + FILE_CHECK_S
            return
        self._file_check_at = 0.0
        what = "removed or renamed" if identity is None else "replaced by another file"
        raise FileMovedError(
            f"the file was {what} while the daemon had it open (what is written now would be lost): "
            "put it back, or restart the daemon to start a new log there"
        )

    def _what_became(self, wal_identity: tuple[int, int] | None, shm_identity: tuple[int, int] | None) -> str:
        """What became of the WAL and/or its index, as the journal says it."""
        said = []
        for name, path, identity, opened in (
            ("the WAL file", self._wal_path, wal_identity, self._wal_identity),
            ("the WAL index file", self._shm_path, shm_identity, self._shm_identity),
        ):
            if identity != opened:
                said.append(f"{name} {path} was {'removed' if identity is None else 'replaced by another file'}")
        return f"{' and '.join(said)} while the daemon had {'them' if len(said) > 1 else 'it'} open"

    def _heal_wal(self, what: str) -> None:
        """The WAL at `<path>-wal`, or its index at `<path>-shm`, is not the one the
        connections use (`what` became of them): puts everything committed into the database
        file and starts a new WAL and index there.
        Caller holds _conn_lock. Raises WalLostError when it cannot (yet): the write must not
        go on into a WAL nobody else reads; the checkpoint thread stays stopped until a heal
        works (opened now, it would read the frames the writer puts in the old WAL from the new).

        The writer connection still reads the old WAL through its descriptor, so a TRUNCATE
        checkpoint on it copies every committed frame into the file (and syncs it) and marks
        the WAL empty in the shared index. A connection opens the WAL and the index by name
        only when it opens, so both are opened again. The checkpointer's goes first and comes
        back only once the writer's is on the new WAL: it reads frames through its own
        descriptor, and on the old one would copy the wrong pages (or fail on every round).
        The old writer connection closes before the new one opens: a process's connections to
        a file share one index, kept while any of them is open, and the new one would join the
        old (removed) one (module docstring). While a reader holds a snapshot of the old WAL,
        the checkpoint cannot finish: writes fail until it is gone, the heal tried again at
        most every FILE_CHECK_S."""
        wal = self._wal_path
        trouble = f"{what} and the log cannot heal yet"
        now = time.monotonic()
        if now < self._wal_heal_at:
            raise WalLostError(f"{trouble}: writes are refused until it can, retrying")
        assert self._db is not None
        self._stop_checkpointer()
        old = self._db.conn
        try:
            if self._cursor is not None:  # (None: a heal that failed after closing it)
                # (bounded like the checkpoint thread's RESTART: this holds up a commit)
                old.execute(f"PRAGMA busy_timeout={upkeep.RESET_WAIT_MS}")
                try:
                    _, self._heal_frames, _ = old.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    (busy, _, _) = old.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                finally:
                    old.execute("PRAGMA busy_timeout=5000")
                if busy:
                    raise sqlite3.OperationalError("a reader holds a snapshot of it (a long read transaction)")
                # Everything is in the file now. The cursor holds the last statement, which
                # would keep the connection (and the old index) open past close().
                self._cursor = None
                old.close()
            new = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            try:
                self._tune(new)
                upkeep.prepare_fold_below(new)
                new.execute("SELECT count(*) FROM sqlite_master").fetchone()  # opens the WAL at its name
                wal_identity = _file_identity(wal)
                if wal_identity is None:
                    raise sqlite3.OperationalError("no WAL at its name after opening it again")
            except BaseException:
                new.close()
                raise
        except sqlite3.Error as exc:
            self._wal_heal_at = now + FILE_CHECK_S
            raise WalLostError(f"{trouble} ({exc}): writes are refused until it can, retrying") from exc
        self._db = sqlite_utils.Database(new)
        self._cursor = new.cursor()
        self._wal_identity = wal_identity
        self._shm_identity = _file_identity(self._shm_path)
        self._wal_heal_at = 0.0
        if self.checkpoint_interval_s is not None and not self._closed:
            self._start_checkpointer()
        _log.warning(
            "decision log: %s; its %d frames (every decision committed) are checkpointed into %s and a new WAL "
            "is started: nothing was lost",
            what, self._heal_frames, self.path,
        )

    def _count_wal_reset(self) -> None:
        self.wal_resets += 1  # (only the checkpoint thread writes it)

    def __enter__(self) -> DecisionLog:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


    def _insert(self, rows: list[tuple]) -> bool:
        """Inserts rows numbered from `_next_id` into the recent table, in one transaction.

        Caller holds _conn_lock. Raises sqlite3.Error with nothing written. Returns True
        when these are the first rows waiting to be folded."""
        if not rows:
            return False
        if self._file_check_at <= time.monotonic():
            self._check_file()
        cursor = self._cursor
        assert cursor is not None
        if len(rows) == 1:  # the row is the parameter sequence
            cursor.execute(_INSERT_SQL[1], rows[0])
        else:
            sizes = _chunk_sizes(len(rows))
            if len(sizes) == 1:  # one statement: a transaction of its own
                cursor.execute(_INSERT_SQL[sizes[0]], list(chain.from_iterable(rows)))
            else:
                cursor.execute("BEGIN IMMEDIATE")
                try:
                    start = 0
                    for size in sizes:
                        cursor.execute(_INSERT_SQL[size], list(chain.from_iterable(rows[start : start + size])))
                        start += size
                    cursor.execute("COMMIT")
                except BaseException:
                    # A COMMIT that fails for a full disk has already rolled back: a ROLLBACK
                    # then fails too ("no transaction is active") and would hide why.
                    if cursor.connection.in_transaction:
                        cursor.execute("ROLLBACK")
                    raise
        self._next_id += len(rows)
        self.rows_written += len(rows)
        self.batches_committed += 1
        first_to_fold = not self._unfolded
        if first_to_fold:
            self._unfolded_since = time.monotonic()
        self._unfolded += len(rows)
        return first_to_fold
