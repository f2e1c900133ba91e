"""The decision log: every Decision as one SQLite row, committed before the engine hears of it.

`DecisionLog` composes the pieces: the file and its connection (`store`), the queue and
the writer thread (`gate`, `writer`), the upkeep (`pacing`), the checkpoint thread and
the decisions a failed write left (`unwritten`). The durability contract and the file's
life are in docs/architecture/log.md.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from kvbudget.daemon.core.records import Decision
from kvbudget.daemon.log.checkpointer import Checkpointer
from kvbudget.daemon.log.files import file_bytes
from kvbudget.daemon.log.gate import Gate, Pending
from kvbudget.daemon.log.pacing import Retention, Upkeep
from kvbudget.daemon.log.schema import DecisionLogError
from kvbudget.daemon.log.store import LogStore
from kvbudget.daemon.log.unwritten import UnwrittenKeeper
from kvbudget.daemon.log.writer import Writer, WriterTimes

# The WAL's size bound: past it the checkpoint thread starts the WAL over (under steady
# commits it would otherwise never start over: upkeep.checkpoint), and a WAL SQLite
# starts over is cut back to it.
WAL_LIMIT_BYTES = 64 * 2**20


@dataclasses.dataclass(frozen=True)
class LogFigures:
    """What the metrics show of the log: its files' sizes and its upkeep's counts."""

    database_bytes: int
    wal_bytes: int
    rows_written: int
    rows_folded: int
    wal_resets: int
    stalls: int  # times commits waited for the upkeep (past max_unfolded_rows: pacing)
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


def _check_options(
    max_batch: int, wal_limit_bytes: int, max_unfolded_rows: int, unwritten_retry_s: float,
    inline_wait_s: float, fold_interval_s: float, fold_rows: int, fold_chunk_rows: int,
) -> None:
    for name, value in (("max_batch", max_batch), ("wal_limit_bytes", wal_limit_bytes),
                        ("max_unfolded_rows", max_unfolded_rows), ("unwritten_retry_s", unwritten_retry_s)):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    if inline_wait_s < 0:  # (a negative lock timeout would mean: wait for ever)
        raise ValueError(f"inline_wait_s must be >= 0, got {inline_wait_s}")
    if fold_interval_s < 0 or fold_rows <= 0 or fold_chunk_rows <= 0:
        raise ValueError(
            "fold_interval_s must be >= 0, fold_rows and fold_chunk_rows positive, "
            f"got {fold_interval_s}, {fold_rows}, {fold_chunk_rows}"
        )


class DecisionLog:
    """Thread-safe `append` and `commit_inline`; one writer thread owns the upkeep.

    `on_failure` is told why if the writer thread stops on an error; `on_write_trouble`
    the error when writes start failing and None when they work again (both from the
    log's threads: hand them over to a loop with call_soon_threadsafe)."""

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
        max_unfolded_rows: int = 131_072,  # ~2 s of folding with random ids: what a stop or start may leave
        unwritten_retry_s: float = 1.0,
        on_failure: Callable[[str], None] | None = None,
        on_write_trouble: Callable[[str | None], None] | None = None,
    ) -> None:
        retention = Retention(retention_s, max_rows, max_bytes)
        _check_options(max_batch, wal_limit_bytes, max_unfolded_rows, unwritten_retry_s,
                       inline_wait_s, fold_interval_s, fold_rows, fold_chunk_rows)
        self.path = Path(path)
        self.inline_wait_s = inline_wait_s
        self.gate = Gate()
        self.store = LogStore(
            self.path,
            checkpointer=Checkpointer(self.path, checkpoint_interval_s, wal_limit_bytes),
            unwritten=UnwrittenKeeper(self.path, unwritten_retry_s, on_write_trouble),
            wal_limit_bytes=wal_limit_bytes,
            wake=self.gate.wake,
        )
        self.upkeep = Upkeep(
            self.store, self.gate, retention, fold_chunk_rows=fold_chunk_rows,
            retention_chunk_rows=retention_chunk_rows, max_unfolded_rows=max_unfolded_rows,
            inline_wait_s=inline_wait_s,
        )
        times = WriterTimes(max_batch, fold_rows, fold_interval_s, retention_interval_s, inline_wait_s)
        self._writer = Writer(self.gate, self.store, self.upkeep, times, on_failure)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Open the file (see `LogStore.open`), start the writer and the checkpoints."""
        with self.gate.lock:
            if self.gate.running:
                raise RuntimeError("DecisionLog.start() called twice")
        self.store.open()
        self._writer.start()
        with self.gate.lock:
            self.gate.running = True
        self.store.checkpointer.start()

    def close(self) -> None:
        """Flush, fold, stop the writer, close the file. Idempotent."""
        if not self.gate.close():
            return
        if self.gate.running:
            self._writer.join()
        self.store.close()

    def __enter__(self) -> DecisionLog:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ commits
    def append(self, decisions: Sequence[Decision]) -> concurrent.futures.Future[None]:
        """Queue rows; the future resolves once they are committed (or fails with the error)."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        gate = self.gate
        with gate.lock:
            gate.check_open()
            gate.put(Pending(decisions, time.time(), future))
        return future

    def commit_inline(self, decisions: Sequence[Decision], max_rows: int = 1024) -> bool:
        """Commits in the caller's thread when that keeps the order; the daemon's path.

        True: the rows are committed (one transaction). False: nothing was written, the
        caller must `append` instead, because something is queued ahead, there are more
        than `max_rows` rows, commits wait for the upkeep, or the writer kept the
        connection past `inline_wait_s`. Raises DecisionLogError when the write failed
        (the decisions are kept to go first in the next write: `UnwrittenError`),
        RuntimeError when the log is not running. Same durability as `append`, about half
        its latency (no hand-off, wake-up or Future)."""
        if len(decisions) > max_rows:
            return False
        gate, store = self.gate, self.store
        with gate.lock:
            gate.check_open()
            if gate.queued or self.upkeep.stalling():
                return False  # (when stalling the writer folds before it commits)
            if not store.acquire_inline(self.inline_wait_s):
                return False
            try:
                first_to_fold = store.commit(decisions, time.time())
            finally:
                store.lock.release()
        if first_to_fold:
            gate.wake()  # the first rows to fold: the writer starts its timer
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
            if self.gate.failure is None:
                raise
            # the writer stopped: every append was settled (failed) then, none is left waiting

    def write_unwritten(self) -> bool:
        """Writes now what failed writes left, if it can; True when nothing is left unwritten.

        The writer retries every `unwritten_retry_s` by itself; a caller about to make
        more decisions calls this first, so that the first call after the disk has room
        again goes through."""
        return self.store.write_unwritten(self.inline_wait_s)

    @property
    def num_unwritten(self) -> int:
        """Decisions a failed write left, waiting to go first (read without a lock, per step)."""
        return self.store.unwritten.count

    # ------------------------------------------------------------------ retention (reload sets it)
    @property
    def retention_s(self) -> float | None:
        return self.upkeep.retention.retention_s

    @retention_s.setter
    def retention_s(self, value: float | None) -> None:
        self.upkeep.retention = dataclasses.replace(self.upkeep.retention, retention_s=value)

    @property
    def max_rows(self) -> int | None:
        return self.upkeep.retention.max_rows

    @max_rows.setter
    def max_rows(self, value: int | None) -> None:
        self.upkeep.retention = dataclasses.replace(self.upkeep.retention, max_rows=value)

    @property
    def max_bytes(self) -> int | None:
        return self.upkeep.retention.max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int | None) -> None:
        self.upkeep.retention = dataclasses.replace(self.upkeep.retention, max_bytes=value)

    def apply_retention(self, conn: sqlite3.Connection, now: float | None = None) -> bool:
        """One bounded purge chunk on `conn` (see `Upkeep.apply_retention`)."""
        return self.upkeep.apply_retention(conn, now)

    # ------------------------------------------------------------------ counts
    @property
    def rows_written(self) -> int:
        return self.store.rows_written

    @property
    def rows_folded(self) -> int:
        return self.store.rows_folded

    @property
    def batches_committed(self) -> int:
        return self.store.batches_committed

    @property
    def rows_deleted(self) -> int:
        return self.upkeep.rows_deleted

    @property
    def stalls(self) -> int:
        return self.upkeep.stalls

    @property
    def stall_seconds(self) -> float:
        return self.upkeep.stall_seconds

    @property
    def wal_resets(self) -> int:
        return self.store.checkpointer.resets

    def figures(self) -> LogFigures:
        """The files' sizes and their disk's space now (three system calls) and the counts so far."""
        try:
            disk = os.statvfs(self.path.parent)
            free, total = disk.f_bavail * disk.f_frsize, disk.f_blocks * disk.f_frsize
        except OSError:
            free = total = 0
        unwritten = self.store.unwritten
        return LogFigures(
            database_bytes=file_bytes(self.path),
            wal_bytes=file_bytes(Path(f"{self.path}-wal")),
            rows_written=self.rows_written,
            rows_folded=self.rows_folded,
            wal_resets=self.wal_resets,
            stalls=self.stalls,
            stall_seconds=self.stall_seconds,
            disk_free_bytes=free,
            disk_total_bytes=total,
            max_bytes=self.max_bytes or 0,
            num_unwritten=unwritten.count,
            write_error=unwritten.error,
            unwritten_since_unix_s=unwritten.since_unix_s,
        )
