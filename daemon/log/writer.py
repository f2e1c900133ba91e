"""The decision log's writer thread: queued steps committed in batches (group commit).

`DecisionLog.append` queues a step's decisions with a future (`Pending`); this thread
takes everything queued (up to `max_batch` rows), writes it in one transaction and then
settles the futures, so concurrent callers share one commit. Between batches it runs the
upkeep that `decision_pacing` paces: folds into the indexed table, retention purges, and
the retry of a failed write's decisions (`decision_unwritten`). `WriterThread` is that
loop, mixed into `DecisionLog` (as `UpkeepPacing` and `KeepsUnwritten` are), whose state
it shares; the inline commit, which bypasses this thread when nothing is queued, is in
`decision_log`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import sqlite_utils

from kvbudget.daemon.log.schema import DecisionLogError, decision_row
from kvbudget.daemon.core.records import Decision

_log = logging.getLogger("kvbudget.daemon.log.decision_log")  # (the log's own messages)

STOP = object()  # close(): drain, fold, stop
WAKE = object()  # an inline commit left rows to fold: the writer sets its fold timer


@dataclasses.dataclass
class Pending:
    """One appended step: its decisions, when it was logged, and the future its caller waits on."""

    decisions: Sequence[Decision]
    logged_at: float
    future: concurrent.futures.Future[None]


class WriterThread:
    """The writer thread's loop; mixed into `DecisionLog`, whose state it shares (the
    attributes below are set up by its __init__)."""

    path: Path
    max_batch: int
    fold_rows: int
    fold_interval_s: float
    retention_interval_s: float
    retention_s: float | None
    max_rows: int | None
    max_bytes: int | None
    rows_folded: int
    num_unwritten: int
    unwritten_retry_s: float
    _db: sqlite_utils.Database | None
    _queue: queue.SimpleQueue[Pending | object]
    _lock: threading.Lock
    _conn_lock: threading.Lock
    _carry: Pending | None
    _in_flight: list[Pending]
    _failure: str | None
    _on_failure: Callable[[str], None] | None
    _queued: int
    _closed: bool
    _next_id: int
    _unfolded: int
    _unfolded_since: float
    _unwritten_retry_at: float
    # and the rest of DecisionLog: `_insert(rows)`, the upkeep turns (`decision_pacing`),
    # and the unwritten decisions' keeping (`decision_unwritten`)

    def _run_or_fail(self) -> None:
        """The writer; if it ever stops on an error (a bug: SQLite's errors are handled
        where they happen), every commit waiting on it, and every later one, fails with
        DecisionLogError: engines are told "not committed" (UNAVAILABLE) at once, where
        they would otherwise wait out their deadlines, and nothing unlogged is promised."""
        try:
            self._run()
        except BaseException as exc:
            _log.exception("decision log writer stopped; every commit now fails")
            with self._lock:
                self._failure = f"{self.path}: the log's writer stopped: {exc!r}"
                waiting = [*self._in_flight, *([self._carry] if self._carry else [])]
                self._carry = None
                while True:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if isinstance(item, Pending):
                        waiting.append(item)
                self._queued = 0
            for pending in waiting:
                if not pending.future.done():
                    pending.future.set_exception(DecisionLogError(self._failure))
            if self._on_failure is not None:
                self._on_failure(self._failure)

    def _connection(self) -> sqlite3.Connection:
        """The log's connection now. Not kept across turns: healing a removed WAL opens a new
        one (decision_log._heal_wal), and an upkeep step that straddles it fails on the closed
        one, like any failed fold or purge, and is tried again."""
        assert self._db is not None
        return self._db.conn

    def _run(self) -> None:
        next_retention = time.monotonic()
        retention_behind = False
        stopping = False
        while not stopping:
            batch, stopping = self._take_batch(self._wait_s(next_retention, retention_behind))
            folded_before = self.rows_folded  # (a stall's folds too: retention owes them)
            if batch:
                self._in_flight = batch
                self._stall_for_upkeep(self._connection(), sum(len(p.decisions) for p in batch))
                self._commit_queued(self._connection(), batch)
            now = time.monotonic()
            if self._unfolded and (
                stopping or self._unfolded >= self.fold_rows or now >= self._unfolded_since + self.fold_interval_s
            ):
                self._fold_chunks(self._connection(), everything=stopping)
            # Not on the way out (close() called): a stop must be quick (systemd's
            # TimeoutStopSec), and the purge owed while behind can be a million rows (20 s);
            # the next start purges first.
            # Past the row or size bound, a pass is due at once (rows folded since the last
            # check can only have added to both): a minute's wait let a fast load take the
            # file 70% past its size bound before the first pass, and a log bound to 200,000
            # rows to 1.1 million before each (bench_soak.py).
            if self._has_retention and not self._closed and (
                retention_behind or now >= next_retention
                or (self.rows_folded > folded_before and self._over_bound(self._connection()))
            ):
                retention_behind = self._purge_chunks(self._connection(), folded=self.rows_folded - folded_before)
                next_retention = time.monotonic() + self.retention_interval_s
            if self.num_unwritten and time.monotonic() >= self._unwritten_retry_at:
                self.write_unwritten()
                self._unwritten_retry_at = time.monotonic() + self.unwritten_retry_s
        # Anything appended races with close() only before _closed was set; drain it.
        leftover, _ = self._take_batch(0.0)
        while leftover:
            self._in_flight = leftover
            self._commit_queued(self._connection(), leftover)
            leftover, _ = self._take_batch(0.0)
        self.write_unwritten()  # a last try (close() reports what is still left)
        self._fold_chunks(self._connection(), everything=True)  # a cleanly closed log has every row indexed
        # (nothing is committed after the drain above: close() has stopped appends and
        # the caller's inline commits)

    def _wait_s(self, next_retention: float, retention_behind: bool) -> float | None:
        """How long the writer may block for the next batch: until a fold or purge is due."""
        due: list[float] = []
        if self._unfolded:
            due.append(self._unfolded_since + self.fold_interval_s)
        if self._has_retention:
            due.append(next_retention)
        if self.num_unwritten:
            due.append(self._unwritten_retry_at)
        if retention_behind:
            return 0.0
        return max(0.0, min(due) - time.monotonic()) if due else None

    @property
    def _has_retention(self) -> bool:
        return self.retention_s is not None or self.max_rows is not None or self.max_bytes is not None

    def _take_batch(self, timeout: float | None) -> tuple[list[Pending], bool]:
        """Everything queued now (at least one item unless timed out), up to max_batch rows."""
        batch: list[Pending] = []
        rows = 0
        if self._carry is not None:
            batch.append(self._carry)
            rows = len(self._carry.decisions)
            self._carry = None
        else:
            while True:
                try:
                    item = self._queue.get(timeout=timeout) if timeout != 0.0 else self._queue.get_nowait()
                except queue.Empty:
                    return batch, False
                if item is STOP:
                    return batch, True
                if item is WAKE:
                    return batch, False  # the caller recomputes its wait, now with a fold due
                assert isinstance(item, Pending)
                batch.append(item)
                rows = len(item.decisions)
                break
        while rows < self.max_batch:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is STOP:
                return batch, True
            if item is WAKE:
                continue
            assert isinstance(item, Pending)
            if rows + len(item.decisions) > self.max_batch:
                self._carry = item  # next transaction starts with it: order is kept
                break
            batch.append(item)
            rows += len(item.decisions)
        return batch, False

    def _commit_queued(self, conn: sqlite3.Connection, batch: list[Pending]) -> None:
        """Commits a batch taken from the queue; the caller has set `_in_flight` to it (so
        that a writer stopping on an error fails its futures too)."""
        with self._conn_lock:
            self._commit(conn, batch)
        with self._lock:
            self._queued -= len(batch)
        self._in_flight = []

    def _commit(self, conn: sqlite3.Connection, batch: list[Pending]) -> None:
        """Writes a queued batch in one transaction and settles its futures. Caller holds _conn_lock."""
        # A future cancelled by its caller still gets its rows written: the decisions
        # happened. set_running_or_notify_cancel makes the rest uncancellable from here.
        live = [p.future for p in batch if p.future.set_running_or_notify_cancel()]
        rows = []
        if self.num_unwritten:  # a failed write's decisions go first
            rows = [decision_row(self._next_id + i, d, batch[0].logged_at)
                    for i, d in enumerate(self._unwritten.decisions)]
        for p in batch:
            for d in p.decisions:
                rows.append(decision_row(self._next_id + len(rows), d, p.logged_at))
        try:
            self._insert(rows)
        except sqlite3.Error as exc:  # disk full, I/O error: every caller of this batch hears it
            error = self._keep_unwritten([d for p in batch for d in p.decisions], exc)
            for future in live:
                future.set_exception(error)
            return
        if self.num_unwritten:
            self._settle_unwritten()
        for future in live:
            future.set_result(None)

    def _wake_writer(self) -> None:
        self._queue.put(WAKE)
