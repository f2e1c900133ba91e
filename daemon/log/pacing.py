"""How the decision log's writer paces its upkeep against the commits.

`DecisionLog` (decision_log.py) commits; its writer thread also folds committed rows into
the indexed table and purges past the retention bounds (the statements are in
`decision_upkeep`). All of it goes through the one connection, so this is about turns:
how much upkeep the writer does before the next commit may have the connection.

A fold holds SQLite's one write lock, and so would keep commits waiting. So it moves at
most `fold_chunk_rows` rows per transaction, each chunk a single statement
(`decision_upkeep.fold_below`: the lock is taken and let go inside one sqlite3_step, the
GIL released, on the second core), lets an inline commit waiting for the connection in
between chunks, and gives way to queued commits. A commit then waits for one chunk of
512 rows (~3 ms) at most, not for a whole fold (~25 ms for 4,096 rows): under batched
load the whole-fold version left the event loop idle a third of the time (37-44k
decisions/s against 60k with folds off; 54-70k now, bench_roundtrip).

Write stall. A load faster than the upkeep (fold and purge share the connection with the
commits) would leave rows unfolded, and rows past the retention bound, for as long as it
lasted: with random ids at ~27k decisions/s and a bound of a million rows, 390,000 rows
unfolded and 2.4 million held after two and a half minutes (bench_sustained). Unfolded
rows have no index, so `kvbudget log --request` scans them, and a stop or start-up must
fold them all; the disk is what the retention bound protects. Past `max_unfolded_rows`
rows unfolded, or owed to a retention that is behind, commits wait: inline commits are
refused (the caller queues), and the writer folds and purges below the bound before it
commits a queued batch, the way an LSM store stalls writes while compaction catches up.
Engines see slower Steps, never a lost or refused decision; `stalls` and
`stall_seconds` count it. A stop folds what is left but leaves retention to the next start.

Retention by age (`retention_s`), rows (`max_rows`) and/or bytes (`max_bytes`: a row limit
worked out on each pass from the file's bytes per row, upkeep.rows_within_bytes) is
applied by the writer thread itself, every `retention_interval_s` and after any fold that
leaves the log past its row or byte bound (waiting for the interval let a load of 15k
rows/s take a log bound to 200,000 rows to 1.1 million before each pass), to the indexed table,
in chunks of `retention_chunk_rows` (~13 ms each for 1,024 rows with random request ids),
each one statement whose cost does not grow with the log, so a purge never holds up
commits for long. While behind, it deletes as many rows as the folds index meanwhile and
a chunk more: under a load faster than the upkeep the log keeps near its bound instead of
growing for as long as the load lasts.
"""

from __future__ import annotations

import sqlite3
import threading
import time

from kvbudget.daemon.log import upkeep


class UpkeepPacing:
    """The writer thread's upkeep turns; mixed into `DecisionLog`, whose state they share
    (the attributes below are set up by its __init__)."""

    max_unfolded_rows: int
    fold_chunk_rows: int
    inline_wait_s: float
    retention_s: float | None
    max_rows: int | None
    max_bytes: int | None
    retention_chunk_rows: int
    rows_folded: int
    rows_deleted: int
    stalls: int
    stall_seconds: float
    _conn_lock: threading.Lock
    _next_id: int
    _unfolded: int
    _unfolded_since: float
    _purge_owed: int
    _queued: int
    _inline_waiting: int
    _closed: bool

    def _stall_for_upkeep(self, conn: sqlite3.Connection, rows: int) -> None:
        """Past `max_unfolded_rows` rows unfolded, or owed to retention while it is behind,
        folds and purges toward it before the batch in hand (`rows` rows) is committed
        (inline commits are refused meanwhile): commits go at the upkeep's pace, and the
        rows unindexed and the rows past the retention bound stay bounded. It folds below
        the bound (commits are all that add unfolded rows, so that is about a batch), but
        purges at most the batch's rows and a chunk: a long fold pass can add a hundred
        thousand rows to what is owed at once, and paying that off in one stall held a
        Step for 1.6 s; this way it is paid a chunk a batch. Gives up on a fold or purge
        that fails (the commit goes on)."""
        bound = self.max_unfolded_rows
        if self._unfolded < bound and self._purge_owed < bound:
            return
        started = time.monotonic()
        self.stalls += 1
        while self._unfolded >= bound:
            folded_before = self.rows_folded
            with self._conn_lock:
                first_id = self._next_id - self._unfolded
                end_id = first_id + max(self.fold_chunk_rows, self._unfolded - bound + 1)
            self._fold_chunks(conn, everything=True, end_id=end_id)
            if self.rows_folded == folded_before:
                break
        purge_until = self.rows_deleted + rows + self.retention_chunk_rows
        while self._purge_owed >= bound and self.rows_deleted < purge_until:
            deleted_before = self.rows_deleted
            with self._conn_lock:
                behind = self._apply_retention_safely(conn)
            self._purge_owed -= self.rows_deleted - deleted_before
            if not behind or self.rows_deleted == deleted_before:
                self._purge_owed = 0  # caught up (or failing): nothing more is owed
                break
        self.stall_seconds += time.monotonic() - started

    def _fold_chunks(self, conn: sqlite3.Connection, *, everything: bool, end_id: int | None = None) -> None:
        """Folds the rows unfolded when called (below `end_id`, if given), at most
        `fold_chunk_rows` per transaction, then returns to the run loop, which checks the
        queue and retention before it folds what came meanwhile. It also returns early
        (unless `everything`) when a commit is queued: the loop commits it, then comes
        back (the fold is still due). An inline commit waiting for the connection goes in
        before the next chunk."""
        if end_id is None:
            end_id = self._next_id  # not beyond: under steady load new rows never stop coming
        while self._unfolded and self._next_id - self._unfolded < end_id:
            self._let_inline_in()
            with self._conn_lock:
                first_id = self._next_id - self._unfolded  # the recent table holds ids first_id..
                below_id = min(first_id + self.fold_chunk_rows, end_id)
                try:
                    upkeep.fold_below(conn, below_id)
                except sqlite3.Error:
                    # The rows stay in the recent table, visible through the view; try again soon.
                    self._unfolded_since = time.monotonic()
                    return
                self.rows_folded += below_id - first_id
                self._unfolded = self._next_id - below_id
            if self._queued and not everything:
                return

    def _let_inline_in(self) -> None:
        """Waits (briefly) while a commit_inline caller waits for the connection: a released
        lock is not handed over, and this thread would otherwise take it straight back."""
        deadline = time.monotonic() + self.inline_wait_s
        while self._inline_waiting and time.monotonic() < deadline:
            time.sleep(50e-6)

    def _purge_chunks(self, conn: sqlite3.Connection, *, folded: int) -> bool:
        """One purge chunk; while retention is behind, as many rows as the folds moved
        meanwhile and one chunk more, so a backlog shrinks (stopping early for a queued
        commit: the rest is owed to the next round). Under a load faster than the upkeep
        the log so keeps near its size bound, and commits wait a little longer, where one
        chunk per fold pass let it grow past the bound for as long as the load lasted (the
        disk is what the bound protects). Returns whether retention is still behind."""
        self._purge_owed += folded + self.retention_chunk_rows
        while True:
            self._let_inline_in()
            deleted_before = self.rows_deleted
            with self._conn_lock:  # (purges folded rows only: unfolded ones are the newest)
                behind = self._apply_retention_safely(conn)
            self._purge_owed -= self.rows_deleted - deleted_before
            if not behind or self._purge_owed <= 0:
                self._purge_owed = 0
                return behind
            if self._queued or self._closed:
                return True

    def _over_bound(self, conn: sqlite3.Connection) -> bool:
        """Whether the log is past `max_rows` or `max_bytes`: checked after every fold, so a
        pass is due at once rather than at the next interval (cheap: two index ends, three
        header fields)."""
        return self._over_rows(conn) or self._over_size(conn)

    def _over_rows(self, conn: sqlite3.Connection) -> bool:
        """Whether the log holds more than `max_rows` rows. Its ids run without a gap from
        the oldest kept to the newest (they are given in order, retention deletes the
        oldest), so that is the newest id less the oldest: two index ends."""
        if self.max_rows is None:
            return False
        with self._conn_lock:
            try:
                oldest = upkeep.oldest_id(conn)
            except sqlite3.Error:
                return False  # the interval's pass still comes
            return oldest > 0 and self._next_id - oldest > self.max_rows

    def _over_size(self, conn: sqlite3.Connection) -> bool:
        """Whether the pages in use are past `max_bytes` (three header fields: cheap after every fold)."""
        if self.max_bytes is None:
            return False
        with self._conn_lock:
            try:
                return upkeep.used_bytes(conn) > self.max_bytes
            except sqlite3.Error:
                return False  # the interval's pass still comes

    def _apply_retention_safely(self, conn: sqlite3.Connection) -> bool:
        try:
            return self.apply_retention(conn)
        except sqlite3.Error:
            return False  # a failed purge is retried at the next interval; writes go on

    def apply_retention(self, conn: sqlite3.Connection, now: float | None = None) -> bool:
        """Delete the oldest indexed rows beyond the age / size limits, one bounded chunk.

        Returns True when more rows are due (the writer runs it again right after the next
        batch). Only the writer thread calls this (tests call it on a stopped log's file);
        see `decision_upkeep.purge_oldest`.
        """
        max_rows = self.max_rows
        if self.max_bytes is not None:
            within = upkeep.rows_within_bytes(conn, self.max_bytes)
            if within is not None:
                max_rows = within if max_rows is None else min(max_rows, within)
        deleted, more = upkeep.purge_oldest(
            conn,
            retention_s=self.retention_s,
            max_rows=max_rows,
            chunk_rows=self.retention_chunk_rows,
            now=time.time() if now is None else now,
        )
        self.rows_deleted += deleted
        return more
