"""Decisions a failed write left behind: kept in order, written first by the next write.

A write fails when the disk is full or the file cannot be written. By then the pool has
made those decisions (an admit took blocks, a release gave them back), so dropping them
would leave the log with gaps: a release with no admit, blocks held with no decision to
say why. They wait here instead, in the order made, and the next write that works puts
them in front of its own rows, in the same transaction, so the log's order stays the
pool's. Their callers were told "not committed" (UNAVAILABLE) and were promised nothing;
`written` resolves once they are in the file, so that watchers, Events streams and the
metrics hear of them then, in order.

`KeepsUnwritten` is the decision log's half that does it, mixed into `DecisionLog` (as
`UpkeepPacing` is); it works under the log's connection lock, and mirrors the count in
`num_unwritten` for a lock-free check on every engine step.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from kvbudget.daemon.log.schema import DecisionLogError, decision_row
from kvbudget.daemon.core.records import Decision

_log = logging.getLogger("kvbudget.daemon.log.decision_log")  # (the log's own messages)


class UnwrittenError(DecisionLogError):
    """A write failed; its decisions are kept to go first next time. `written` resolves
    when they are finally in the file (or fails if the log closes first)."""

    def __init__(self, message: str, written: concurrent.futures.Future[None]) -> None:
        super().__init__(message)
        self.written = written


@dataclasses.dataclass
class Unwritten:
    decisions: list[Decision] = dataclasses.field(default_factory=list)
    error: str = ""  # the latest failed write's
    since_unix_s: float = 0.0  # the first failed write of this spell
    written: concurrent.futures.Future[None] | None = None

    def __len__(self) -> int:
        return len(self.decisions)

    def keep(self, decisions: Sequence[Decision], error: str) -> UnwrittenError:
        """Keeps decisions whose write failed, after those already kept; the error to raise."""
        if self.written is None:
            self.written = concurrent.futures.Future()
            self.since_unix_s = time.time()
        self.decisions.extend(decisions)
        self.error = error
        return UnwrittenError(error, self.written)

    def settle(self) -> int:
        """They are in the file now: resolves `written`, forgets them; how many there were."""
        count, written = len(self.decisions), self.written
        self.decisions, self.error, self.since_unix_s, self.written = [], "", 0.0, None
        if written is not None and written.set_running_or_notify_cancel():
            written.set_result(None)
        return count

    def abandon(self, why: str) -> int:
        """The log closes with them unwritten: they are lost (no caller was told otherwise)."""
        count, written = len(self.decisions), self.written
        self.decisions, self.written = [], None
        if written is not None and written.set_running_or_notify_cancel():
            written.set_exception(DecisionLogError(why))
        return count


class KeepsUnwritten:
    """Keeping a failed write's decisions and writing them first; mixed into `DecisionLog`,
    whose state it shares (the attributes below are set up by its __init__)."""

    path: Path
    inline_wait_s: float
    unwritten_retry_s: float
    num_unwritten: int
    _unwritten: Unwritten
    _unwritten_retry_at: float
    _conn_lock: threading.Lock
    _db: object | None
    _next_id: int
    _on_write_trouble: Callable[[str | None], None] | None
    # and DecisionLog's `_insert(rows)` (one transaction) and `_wake_writer()`

    def write_unwritten(self) -> bool:
        """Writes now what failed writes left, if it can; True when nothing is left unwritten.

        The writer retries every `unwritten_retry_s` by itself; a caller about to make
        more decisions calls this first, so that the first call after the disk has room
        again goes through."""
        if not self.num_unwritten:
            return True
        if not self._conn_lock.acquire(timeout=self.inline_wait_s):
            return False
        try:
            if self._db is None:
                return False  # closed
            if self.num_unwritten:  # (the writer may have written them meanwhile)
                try:
                    first_to_fold = self._write_behind_unwritten((), time.time())
                except DecisionLogError:
                    return False
                if first_to_fold:
                    self._wake_writer()
        finally:
            self._conn_lock.release()
        return True

    def _write_behind_unwritten(self, decisions: Sequence[Decision], logged_at: float) -> bool:
        """Writes the decisions failed writes left, then these, in one transaction. Caller
        holds _conn_lock. Raises UnwrittenError (these kept too); returns `_insert`'s answer."""
        everything = [*self._unwritten.decisions, *decisions]
        first_id = self._next_id
        rows = [decision_row(first_id + i, d, logged_at) for i, d in enumerate(everything)]
        try:
            first_to_fold = self._insert(rows)
        except sqlite3.Error as exc:
            raise self._keep_unwritten(decisions, exc) from exc
        self._settle_unwritten()
        return first_to_fold

    def _keep_unwritten(self, decisions: Sequence[Decision], exc: sqlite3.Error) -> UnwrittenError:
        """A write failed: its decisions wait, after any already waiting. Caller holds _conn_lock."""
        first = not self.num_unwritten
        error = self._unwritten.keep(decisions, f"{self.path}: write failed: {exc}")
        self.num_unwritten = len(self._unwritten)
        if first:
            self._unwritten_retry_at = time.monotonic() + self.unwritten_retry_s
            self._wake_writer()  # the writer may be blocked with no timeout: it retries from now on
            _log.error(
                "decision log: %s; %d decisions kept to be written first once writes work again "
                "(retrying every %g s)", self._unwritten.error, self.num_unwritten, self.unwritten_retry_s,
            )
            if self._on_write_trouble is not None:
                self._on_write_trouble(self._unwritten.error)
        return error

    def _settle_unwritten(self) -> None:
        """What failed writes left has just been written. Caller holds _conn_lock."""
        since = self._unwritten.since_unix_s
        self.num_unwritten = 0
        _log.warning(
            "decision log: writes work again; the %d decisions kept since %s are written",
            len(self._unwritten), time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)),
        )
        if self._on_write_trouble is not None:
            self._on_write_trouble(None)
        self._unwritten.settle()  # last: whoever waits on `written` finds the log whole
