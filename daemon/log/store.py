"""The decision log's file and its one writing connection: rows numbered and written in order.

The connection has one user at a time (`lock`): the writer thread, or an inline commit.
A write first checks that the file (and its WAL) are still the ones opened, healing a
removed WAL; a failed write's decisions are kept to go first in the next one.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import sqlite_utils

from kvbudget.daemon.core.records import Decision
from kvbudget.daemon.log import files, rows, upkeep
from kvbudget.daemon.log.checkpointer import Checkpointer
from kvbudget.daemon.log.files import FileWatch, WalLostError, file_identity
from kvbudget.daemon.log.schema import DecisionLogError, check_meta, create_or_upgrade, decision_row
from kvbudget.daemon.log.unwritten import UnwrittenError, UnwrittenKeeper

_log = logging.getLogger("kvbudget.daemon.log.decision_log")  # (the log's own messages)

LOG_MODE = 0o640  # the daemon writes; its group (operators, `kvbudget log`) reads; others nothing
PAGE_SIZE = 1024  # for new files: a step's rows make one 1 KiB WAL frame, not 4 KiB (~20% off a commit)
_INSERT_ONE = rows.INSERT_SQL[1]

Step = tuple[Sequence[Decision], float]  # decisions, and when they were logged (unix s)


def _leave_wal(conn: sqlite3.Connection) -> None:
    """At a clean close, the file back in rollback-journal mode (`open` puts it in WAL
    again), so that a reader who may not write the directory can read a stopped daemon's
    log (SQLite opens a WAL file read-only only through its `-shm`). Best effort: with
    another connection reading, the file stays in WAL mode (complete either way)."""
    try:
        conn.execute("PRAGMA busy_timeout=200")  # (a reader mid-query: give up, not hold the stop)
        conn.execute("PRAGMA journal_mode=DELETE")
    except sqlite3.Error:
        pass


def _make_or_check_file(path: Path) -> bool:
    """Creates the log file itself, LOG_MODE whatever the umask (SQLite gives its -wal and
    -shm the file's mode) and never through a symbolic link; or refuses a path already
    there that cannot be a log: a link, not a regular file, or an empty file (SQLite would
    silently make a log in someone else's empty file); and a link at its -wal or -shm name,
    which SQLite would write through. True when it made the file."""
    for companion in (f"{path}-wal", f"{path}-shm"):
        if os.path.islink(companion):
            raise DecisionLogError(f"{companion} is a symbolic link; SQLite would write through it (remove it)")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, LOG_MODE)
    except FileExistsError:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            raise DecisionLogError(f"{path} is a symbolic link: give db_path the file itself") from None
        if not stat.S_ISREG(st.st_mode):
            raise DecisionLogError(f"{path} exists and is not a regular file") from None
        if st.st_size == 0:
            raise DecisionLogError(f"{path} exists and is empty, not a KVBudget decision log: remove it, "
                                   "or give db_path a file of its own") from None
        return False
    try:
        os.fchmod(fd, LOG_MODE)  # (a umask such as 0277 takes bits away: the docs say 0640)
    finally:
        os.close(fd)
    return True


def _forget(path: Path, made: bool) -> None:
    """The empty file `open` made, removed when the log could not be made in it (so that the
    next start does not find an empty file and refuse it)."""
    if made:
        try:
            if path.stat().st_size == 0:
                path.unlink()
        except OSError:
            pass


class LogStore:
    """Opens, writes, folds and closes the file. The public counters and ids are guarded
    by `lock`; `wake` tells the writer thread there is upkeep to schedule."""

    def __init__(
        self,
        path: Path,
        *,
        checkpointer: Checkpointer,
        unwritten: UnwrittenKeeper,
        wal_limit_bytes: int,
        wake: Callable[[], None],
    ) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.inline_waiting = 0  # commit_inline callers waiting for the connection
        # The next row id, and rows committed but not folded yet (ids next_id - unfolded .. next_id - 1).
        self.next_id = 1
        self.unfolded = 0
        self.unfolded_since = 0.0  # monotonic time of the first unfolded commit
        self.rows_written = 0
        self.rows_folded = 0
        self.batches_committed = 0
        self.checkpointer = checkpointer
        self.unwritten = unwritten
        self._wal_limit_bytes = wal_limit_bytes
        self._wake = wake
        self._files = FileWatch(path)
        self._conn: sqlite3.Connection | None = None
        # One cursor for every insert: conn.execute makes (and frees) a cursor per call.
        self._cursor: sqlite3.Cursor | None = None
        self._heal_frames = 0  # what the heal's checkpoint found in the old WAL (a retry says it too)

    @property
    def connection(self) -> sqlite3.Connection:
        """The writing connection now (a WAL heal opens a new one). Use it under `lock`."""
        assert self._conn is not None, "the log is not open"
        return self._conn

    @property
    def is_open(self) -> bool:
        return self._conn is not None

    # ------------------------------------------------------------------ open and close
    def open(self) -> None:
        """Open (WAL, synchronous=NORMAL), create, upgrade or check the schema, fold rows a
        crash left unfolded. Raises DecisionLogError."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        made = _make_or_check_file(self.path)
        # isolation_level=None: transactions are explicit (BEGIN/COMMIT) and nothing else.
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            self._prepare(conn)
        except sqlite3.DatabaseError as exc:
            conn.close()
            _forget(self.path, made)
            raise DecisionLogError(f"{self.path}: {exc}") from exc
        except DecisionLogError:
            conn.close()
            _forget(self.path, made)
            raise
        self._files.opened()  # (the reads above opened the WAL)
        self._conn = conn
        self._cursor = conn.cursor()

    def _prepare(self, conn: sqlite3.Connection) -> None:
        db = sqlite_utils.Database(conn)
        if db.table_names():
            # Refuse someone else's file before changing anything in it (even its journal mode).
            check_meta(conn, str(self.path))
        else:
            conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # (only possible before the first write)
        db.enable_wal()
        self._tune(conn)
        create_or_upgrade(db, str(self.path))
        self.next_id = upkeep.newest_id(conn) + 1
        self.rows_folded += upkeep.fold(conn)  # rows a crash left in the recent table
        upkeep.prepare_fold_below(conn)
        # The schema (and what the fold moved) into the file itself: until the first
        # checkpoint a new log's tables were only in the WAL, and a reader that opened it
        # after an `rm decisions.db-wal` found no KVBudget log there at all.
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def _tune(self, conn: sqlite3.Connection) -> None:
        """The writer connection's settings (the file is in WAL mode already)."""
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=5000")  # a reader's checkpoint may hold the lock briefly
        conn.execute(f"PRAGMA journal_size_limit={self._wal_limit_bytes}")  # WAL shrinks back after a burst
        if self.checkpointer.interval_s is not None:
            conn.execute("PRAGMA wal_autocheckpoint=0")  # checkpoints on their own thread instead

    def close(self) -> None:
        """After the writer thread stopped: stops the checkpoints, gives up what is still
        unwritten (saying so), closes the file."""
        with self.lock:  # (a heal under way starts no checkpointer once this ran)
            checkpoints = self.checkpointer.shut()
        if checkpoints is not None:
            checkpoints.join()
        if self.unwritten.count:
            with self.lock:
                self.unwritten.abandon()
        if self._conn is not None:
            self._cursor = None
            _leave_wal(self._conn)
            self._conn.close()
            self._conn = None

    # ------------------------------------------------------------------ writes
    def insert(self, rows_: list[tuple]) -> bool:
        """Inserts rows numbered from `next_id` into the recent table, in one transaction.

        Caller holds `lock`. Raises sqlite3.Error with nothing written. Returns True when
        these are the first rows waiting to be folded."""
        if not rows_:
            return False
        if self._files.check_at <= time.monotonic():
            self._check_files()
        cursor = self._cursor
        assert cursor is not None
        if len(rows_) == 1:
            cursor.execute(_INSERT_ONE, rows_[0])
        else:
            rows.insert(cursor, rows_)
        self.next_id += len(rows_)
        self.rows_written += len(rows_)
        self.batches_committed += 1
        first_to_fold = not self.unfolded
        if first_to_fold:
            self.unfolded_since = time.monotonic()
        self.unfolded += len(rows_)
        return first_to_fold

    def commit(self, decisions: Sequence[Decision], logged_at: float) -> bool:
        """`write_steps` of one step, the daemon's inline path. Caller holds `lock`."""
        if self.unwritten.count:
            return self.write_steps(((decisions, logged_at),))
        first_id = self.next_id
        if len(decisions) == 1:  # most steps of a live engine: no comprehension frame
            rows_ = [decision_row(first_id, decisions[0], logged_at)]
        else:
            rows_ = [decision_row(first_id + i, d, logged_at) for i, d in enumerate(decisions)]
        try:
            return self.insert(rows_)
        except sqlite3.Error as exc:
            raise self._keep(decisions, exc) from exc

    def write_steps(self, steps: Sequence[Step]) -> bool:
        """Writes what failed writes left (logged at the first step's time), then each
        step's decisions, in one transaction. Caller holds `lock`. Raises UnwrittenError
        (the steps' decisions kept too); returns `insert`'s answer."""
        rows_: list[tuple] = []
        first_id = self.next_id
        if self.unwritten.count:
            logged_at = steps[0][1]
            rows_ = [decision_row(first_id + i, d, logged_at) for i, d in enumerate(self.unwritten.decisions)]
        for decisions, logged_at in steps:
            for d in decisions:
                rows_.append(decision_row(first_id + len(rows_), d, logged_at))
        try:
            first_to_fold = self.insert(rows_)
        except sqlite3.Error as exc:
            raise self._keep([d for decisions, _ in steps for d in decisions], exc) from exc
        if self.unwritten.count:
            self.unwritten.settle()
        return first_to_fold

    def write_unwritten(self, wait_s: float) -> bool:
        """Writes now what failed writes left, if it can within `wait_s` for the connection;
        True when nothing is left unwritten."""
        if not self.unwritten.count:
            return True
        if not self.lock.acquire(timeout=wait_s):
            return False
        try:
            if self._conn is None:
                return False  # closed
            if self.unwritten.count:  # (the writer may have written them meanwhile)
                try:
                    first_to_fold = self.write_steps((((), time.time()),))
                except DecisionLogError:
                    return False
                if first_to_fold:
                    self._wake()
        finally:
            self.lock.release()
        return True

    def _keep(self, decisions: Sequence[Decision], exc: sqlite3.Error) -> UnwrittenError:
        error, first = self.unwritten.keep(decisions, exc)
        if first:
            self._wake()  # the writer may be blocked with no timeout: it retries from now on
        return error

    # ------------------------------------------------------------------ turns and folds
    def acquire_inline(self, wait_s: float) -> bool:
        """Takes `lock` for an inline commit, waiting at most `wait_s` (counted in
        `inline_waiting`, so that the writer lets it in between upkeep chunks)."""
        lock = self.lock
        if lock.acquire(False):  # (positional: no keyword parsing per commit)
            return True
        self.inline_waiting += 1
        try:
            return lock.acquire(timeout=wait_s)
        finally:
            self.inline_waiting -= 1

    def let_inline_in(self, wait_s: float) -> None:
        """Waits (at most `wait_s`) while a commit_inline caller waits for the connection: a
        released lock is not handed over, and the writer would otherwise take it straight back."""
        deadline = time.monotonic() + wait_s
        while self.inline_waiting and time.monotonic() < deadline:
            time.sleep(50e-6)

    def fold_chunk(self, conn: sqlite3.Connection, end_id: int, chunk_rows: int) -> bool:
        """Folds the oldest unfolded rows, at most `chunk_rows` and below `end_id`, in one
        statement. Caller holds `lock`. False when it failed (the rows stay where readers
        see them, and a fold is due again from now)."""
        first_id = self.next_id - self.unfolded  # the recent table holds ids first_id..
        below_id = min(first_id + chunk_rows, end_id)
        try:
            upkeep.fold_below(conn, below_id)
        except sqlite3.Error:
            self.unfolded_since = time.monotonic()
            return False
        self.rows_folded += below_id - first_id
        self.unfolded = self.next_id - below_id
        return True

    # ------------------------------------------------------------------ a file moved
    def _check_files(self) -> None:
        """Raises FileMovedError when `path` is no longer the file the log has open; heals
        a WAL (or index) no longer at its name first, or raises WalLostError."""
        what = self._files.check()
        if what is not None:
            self._heal_wal(what)
            self._files.check_at = time.monotonic() + files.FILE_CHECK_S

    def _heal_wal(self, what: str) -> None:
        """Checkpoints everything into the file (the old connection still reads the old WAL
        through its descriptor) and opens the connection again, which starts a new WAL and
        index at their names. The old connection closes before the new one opens: a
        process's connections to a file share one index. The checkpointer stops meanwhile.
        Caller holds `lock`. Raises WalLostError when it cannot (yet): a reader holds a
        snapshot of the old WAL; tried again at most every FILE_CHECK_S."""
        trouble = f"{what} and the log cannot heal yet"
        now = time.monotonic()
        if not self._files.may_heal(now):
            raise WalLostError(f"{trouble}: writes are refused until it can, retrying")
        old = self.connection
        self.checkpointer.stop()
        try:
            if self._cursor is not None:  # (None: a heal that failed after closing it)
                self._heal_frames = files.checkpoint_everything(old, upkeep.RESET_WAIT_MS)
                # The cursor holds the last statement, which would keep the connection (and
                # the old index) open past close().
                self._cursor = None
                old.close()
            new = self._connect_again()
        except sqlite3.Error as exc:
            self._files.heal_failed(now)
            raise WalLostError(f"{trouble} ({exc}): writes are refused until it can, retrying") from exc
        self._conn = new
        self._cursor = new.cursor()
        self._files.wal_opened()
        self.checkpointer.start()  # (on the new WAL only: on the old it would copy the wrong pages)
        _log.warning(
            "decision log: %s; its %d frames (every decision committed) are checkpointed into %s and a new WAL "
            "is started: nothing was lost",
            what, self._heal_frames, self.path,
        )

    def _connect_again(self) -> sqlite3.Connection:
        new = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            self._tune(new)
            upkeep.prepare_fold_below(new)
            new.execute("SELECT count(*) FROM sqlite_master").fetchone()  # opens the WAL at its name
            if file_identity(self._files.wal_path) is None:
                raise sqlite3.OperationalError("no WAL at its name after opening it again")
        except BaseException:
            new.close()
            raise
        return new
