"""How the decision log's writer paces its upkeep (folds, purges) against the commits.

Fold and purge share the one connection with the commits, so each goes in bounded chunks
and lets waiting commits in between; past `max_unfolded_rows` rows unfolded (or owed to
retention), commits wait for the upkeep (a write stall). See docs/architecture/log.md.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from typing import Protocol

from kvbudget.daemon.log import upkeep
from kvbudget.daemon.log.store import LogStore


@dataclasses.dataclass(frozen=True)
class Retention:
    """The log's bounds: by age (`retention_s`), rows (`max_rows`) and/or bytes (`max_bytes`:
    a row limit worked out on each pass from the file's bytes per row). None: no bound."""

    retention_s: float | None = None
    max_rows: int | None = None
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("retention_s", "max_rows", "max_bytes"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive or None, got {value}")

    @property
    def any(self) -> bool:
        return self.retention_s is not None or self.max_rows is not None or self.max_bytes is not None


class Commits(Protocol):
    """What the upkeep yields to: commits queued for the writer, and a log closing."""

    @property
    def queued(self) -> int: ...

    @property
    def closed(self) -> bool: ...


class Upkeep:
    """The writer thread's upkeep turns on `store`: bounded fold and purge chunks, the write
    stall, retention. Only the writer thread calls it (tests: a stopped log's file)."""

    def __init__(
        self,
        store: LogStore,
        commits: Commits,
        retention: Retention,
        *,
        fold_chunk_rows: int,
        retention_chunk_rows: int,
        max_unfolded_rows: int,
        inline_wait_s: float,
    ) -> None:
        self._store = store
        self._commits = commits
        self.retention = retention  # replaced whole on a reload; read at each pass
        self.fold_chunk_rows = fold_chunk_rows
        self.retention_chunk_rows = retention_chunk_rows
        self.max_unfolded_rows = max_unfolded_rows
        self._inline_wait_s = inline_wait_s
        self.rows_deleted = 0
        self.stalls = 0
        self.stall_seconds = 0.0
        self.purge_owed = 0  # rows a purge round still owes: folded while behind, + a chunk

    def stalling(self) -> bool:
        """Whether commits must wait for the upkeep (inline commits are refused meanwhile)."""
        return max(self._store.unfolded, self.purge_owed) >= self.max_unfolded_rows

    def owe(self, rows: int) -> None:
        """Rows the retention owes besides what it finds due (a round cut short by commits)."""
        self.purge_owed += rows

    def stall_for_upkeep(self, conn: sqlite3.Connection, rows: int) -> None:
        """Past `max_unfolded_rows` rows unfolded, or owed to retention while it is behind,
        folds and purges toward it before the batch in hand (`rows` rows) is committed
        (inline commits are refused meanwhile): commits go at the upkeep's pace, and the
        rows unindexed and the rows past the retention bound stay bounded. It folds below
        the bound (commits are all that add unfolded rows, so that is about a batch), but
        purges at most the batch's rows and a chunk: a long fold pass can add a hundred
        thousand rows to what is owed at once, and paying that off in one stall held a
        Step for 1.6 s; this way it is paid a chunk a batch. Gives up on a fold or purge
        that fails (the commit goes on)."""
        bound, store = self.max_unfolded_rows, self._store
        if store.unfolded < bound and self.purge_owed < bound:
            return
        started = time.monotonic()
        self.stalls += 1
        while store.unfolded >= bound:
            folded_before = store.rows_folded
            with store.lock:
                first_id = store.next_id - store.unfolded
                end_id = first_id + max(self.fold_chunk_rows, store.unfolded - bound + 1)
            self.fold_chunks(conn, everything=True, end_id=end_id)
            if store.rows_folded == folded_before:
                break
        purge_until = self.rows_deleted + rows + self.retention_chunk_rows
        while self.purge_owed >= bound and self.rows_deleted < purge_until:
            deleted_before = self.rows_deleted
            with store.lock:
                behind = self._apply_retention_safely(conn)
            self.purge_owed -= self.rows_deleted - deleted_before
            if not behind or self.rows_deleted == deleted_before:
                self.purge_owed = 0  # caught up (or failing): nothing more is owed
                break
        self.stall_seconds += time.monotonic() - started

    def fold_chunks(self, conn: sqlite3.Connection, *, everything: bool, end_id: int | None = None) -> None:
        """Folds the rows unfolded when called (below `end_id`, if given), at most
        `fold_chunk_rows` per transaction, then returns to the run loop, which checks the
        queue and retention before it folds what came meanwhile. It also returns early
        (unless `everything`) when a commit is queued: the loop commits it, then comes
        back (the fold is still due). An inline commit waiting for the connection goes in
        before the next chunk."""
        store = self._store
        if end_id is None:
            end_id = store.next_id  # not beyond: under steady load new rows never stop coming
        while store.unfolded and store.next_id - store.unfolded < end_id:
            store.let_inline_in(self._inline_wait_s)
            with store.lock:
                if not store.fold_chunk(conn, end_id, self.fold_chunk_rows):
                    return  # (the rows stay in the recent table, visible through the view; tried again soon)
            if self._commits.queued and not everything:
                return

    def purge_chunks(self, conn: sqlite3.Connection, *, folded: int) -> bool:
        """One purge chunk; while retention is behind, as many rows as the folds moved
        meanwhile and one chunk more, so a backlog shrinks (stopping early for a queued
        commit: the rest is owed to the next round). Under a load faster than the upkeep
        the log so keeps near its size bound, and commits wait a little longer, where one
        chunk per fold pass let it grow past the bound for as long as the load lasted (the
        disk is what the bound protects). Returns whether retention is still behind."""
        self.owe(folded + self.retention_chunk_rows)
        while True:
            self._store.let_inline_in(self._inline_wait_s)
            deleted_before = self.rows_deleted
            with self._store.lock:  # (purges folded rows only: unfolded ones are the newest)
                behind = self._apply_retention_safely(conn)
            self.purge_owed -= self.rows_deleted - deleted_before
            if not behind or self.purge_owed <= 0:
                self.purge_owed = 0
                return behind
            if self._commits.queued or self._commits.closed:
                return True

    def over_bound(self, conn: sqlite3.Connection) -> bool:
        """Whether the log is past `max_rows` or `max_bytes`: checked after every fold, so a
        pass is due at once rather than at the next interval (cheap: two index ends, three
        header fields)."""
        return self._over_rows(conn) or self._over_size(conn)

    def _over_rows(self, conn: sqlite3.Connection) -> bool:
        """Whether the log holds more than `max_rows` rows. Its ids run without a gap from
        the oldest kept to the newest (they are given in order, retention deletes the
        oldest), so that is the newest id less the oldest: two index ends."""
        max_rows = self.retention.max_rows
        if max_rows is None:
            return False
        with self._store.lock:
            try:
                oldest = upkeep.oldest_id(conn)
            except sqlite3.Error:
                return False  # the interval's pass still comes
            return oldest > 0 and self._store.next_id - oldest > max_rows

    def _over_size(self, conn: sqlite3.Connection) -> bool:
        """Whether the pages in use are past `max_bytes` (three header fields: cheap after every fold)."""
        max_bytes = self.retention.max_bytes
        if max_bytes is None:
            return False
        with self._store.lock:
            try:
                return upkeep.used_bytes(conn) > max_bytes
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
        see `upkeep.purge_oldest`.
        """
        retention = self.retention
        max_rows = retention.max_rows
        if retention.max_bytes is not None:
            within = upkeep.rows_within_bytes(conn, retention.max_bytes)
            if within is not None:
                max_rows = within if max_rows is None else min(max_rows, within)
        deleted, more = upkeep.purge_oldest(
            conn,
            retention_s=retention.retention_s,
            max_rows=max_rows,
            chunk_rows=self.retention_chunk_rows,
            now=time.time() if now is None else now,
        )
        self.rows_deleted += deleted
        return more
