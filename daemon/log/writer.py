"""The decision log's writer thread: queued steps committed in batches (group commit).

It takes everything queued (up to `max_batch` rows), writes it in one transaction and
then settles the futures, so concurrent callers share one commit. Between batches it runs
the upkeep (`pacing.Upkeep`) and retries a failed write's decisions.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable

from kvbudget.daemon.log.gate import STOP, WAKE, Gate, Pending
from kvbudget.daemon.log.pacing import Upkeep
from kvbudget.daemon.log.schema import DecisionLogError
from kvbudget.daemon.log.store import LogStore

_log = logging.getLogger("kvbudget.daemon.log.decision_log")  # (the log's own messages)


@dataclasses.dataclass(frozen=True)
class WriterTimes:
    """When the writer folds, purges and retries (seconds), and how big a batch may be."""

    max_batch: int
    fold_rows: int
    fold_interval_s: float
    retention_interval_s: float
    inline_wait_s: float


class Writer:
    """The writer thread: takes batches from `gate`, commits them on `store`, paces the
    upkeep. `on_failure` is told why, from its thread, if it ever stops on an error."""

    def __init__(
        self, gate: Gate, store: LogStore, upkeep: Upkeep, times: WriterTimes,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self._gate = gate
        self._store = store
        self._upkeep = upkeep
        self._times = times
        self._on_failure = on_failure
        self._carry: Pending | None = None  # taken from the queue but over max_batch
        self._in_flight: list[Pending] = []  # the batch being committed
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run_or_fail, name="kvbudget-decision-log", daemon=True)
        self._thread.start()

    def join(self) -> None:
        assert self._thread is not None
        self._thread.join()

    def _run_or_fail(self) -> None:
        """The writer; if it ever stops on an error (a bug: SQLite's errors are handled
        where they happen), every commit waiting on it, and every later one, fails with
        DecisionLogError: engines are told "not committed" (UNAVAILABLE) at once, where
        they would otherwise wait out their deadlines, and nothing unlogged is promised."""
        try:
            self._run()
        except BaseException as exc:
            _log.exception("decision log writer stopped; every commit now fails")
            why = f"{self._store.path}: the log's writer stopped: {exc!r}"
            waiting = [*self._in_flight, *([self._carry] if self._carry else [])]
            self._carry = None
            waiting += self._gate.fail(why)
            for pending in waiting:
                if not pending.future.done():
                    pending.future.set_exception(DecisionLogError(why))
            if self._on_failure is not None:
                self._on_failure(why)

    def _run(self) -> None:
        next_retention = time.monotonic()
        retention_behind = False
        stopping = False
        store, upkeep = self._store, self._upkeep
        while not stopping:
            batch, stopping = self._take_batch(self._wait_s(next_retention, retention_behind))
            folded_before = store.rows_folded  # (a stall's folds too: retention owes them)
            if batch:
                self._in_flight = batch
                upkeep.stall_for_upkeep(store.connection, sum(len(p.decisions) for p in batch))
                self._commit_queued(batch)
            now = time.monotonic()
            if store.unfolded and (
                stopping or store.unfolded >= self._times.fold_rows
                or now >= store.unfolded_since + self._times.fold_interval_s
            ):
                upkeep.fold_chunks(store.connection, everything=stopping)
            # Not on the way out (close() called): a stop must be quick (systemd's
            # TimeoutStopSec), and the purge owed while behind can be a million rows (20 s);
            # the next start purges first. Past the row or size bound, a pass is due at once:
            # a minute's wait let a fast load take a log far past its bound (bench_soak.py).
            if upkeep.retention.any and not self._gate.closed and (
                retention_behind or now >= next_retention
                or (store.rows_folded > folded_before and upkeep.over_bound(store.connection))
            ):
                retention_behind = upkeep.purge_chunks(store.connection, folded=store.rows_folded - folded_before)
                next_retention = time.monotonic() + self._times.retention_interval_s
            if store.unwritten.retry_due(time.monotonic()):
                store.write_unwritten(self._times.inline_wait_s)
                store.unwritten.retried(time.monotonic())
        self._drain()

    def _drain(self) -> None:
        """On the way out: anything appended raced with close() only before it closed the gate."""
        leftover, _ = self._take_batch(0.0)
        while leftover:
            self._in_flight = leftover
            self._commit_queued(leftover)
            leftover, _ = self._take_batch(0.0)
        self._store.write_unwritten(self._times.inline_wait_s)  # a last try (close() says what is left)
        # A cleanly closed log has every row indexed (nothing is committed after the drain:
        # close() has stopped appends and the callers' inline commits).
        self._upkeep.fold_chunks(self._store.connection, everything=True)

    def _wait_s(self, next_retention: float, retention_behind: bool) -> float | None:
        """How long the writer may block for the next batch: until a fold or purge is due."""
        store = self._store
        due: list[float] = []
        if store.unfolded:
            due.append(store.unfolded_since + self._times.fold_interval_s)
        if self._upkeep.retention.any:
            due.append(next_retention)
        if store.unwritten.count:
            due.append(store.unwritten.retry_at)
        if retention_behind:
            return 0.0
        return max(0.0, min(due) - time.monotonic()) if due else None

    def _take_batch(self, timeout: float | None) -> tuple[list[Pending], bool]:
        """Everything queued now (at least one item unless timed out), up to max_batch rows;
        and whether the stop came."""
        batch: list[Pending] = []
        rows = 0
        get, get_nowait = self._gate.queue.get, self._gate.queue.get_nowait
        if self._carry is not None:
            batch.append(self._carry)
            rows = len(self._carry.decisions)
            self._carry = None
        else:
            try:
                item = get(timeout=timeout) if timeout != 0.0 else get_nowait()
            except queue.Empty:
                return batch, False
            if item is STOP:
                return batch, True
            if item is WAKE:
                return batch, False  # the caller recomputes its wait, now with a fold due
            assert isinstance(item, Pending)
            batch.append(item)
            rows = len(item.decisions)
        while rows < self._times.max_batch:
            try:
                item = get_nowait()
            except queue.Empty:
                break
            if item is STOP:
                return batch, True
            if item is WAKE:
                continue
            assert isinstance(item, Pending)
            if rows + len(item.decisions) > self._times.max_batch:
                self._carry = item  # next transaction starts with it: order is kept
                break
            batch.append(item)
            rows += len(item.decisions)
        return batch, False

    def _commit_queued(self, batch: list[Pending]) -> None:
        """Commits a batch taken from the queue, set `_in_flight` (so that a writer stopping
        on an error fails its futures too)."""
        with self._store.lock:
            self._commit(batch)
        self._gate.done(len(batch))
        self._in_flight = []

    def _commit(self, batch: list[Pending]) -> None:
        """Writes a queued batch in one transaction and settles its futures. Caller holds the store's lock."""
        # A future cancelled by its caller still gets its rows written: the decisions
        # happened. set_running_or_notify_cancel makes the rest uncancellable from here.
        live = [p.future for p in batch if p.future.set_running_or_notify_cancel()]
        try:
            self._store.write_steps([(p.decisions, p.logged_at) for p in batch])
        except DecisionLogError as error:  # disk full, I/O error: every caller of this batch hears it
            for future in live:
                future.set_exception(error)
            return
        for future in live:
            future.set_result(None)
