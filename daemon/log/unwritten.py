"""Decisions a failed write left behind: kept in order, written first by the next write.

The pool made them already, so dropping them would leave gaps in the log; their callers
were told "not committed" and promised nothing. `written` resolves once they are in the file.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from kvbudget.daemon.log.schema import DecisionLogError
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


class UnwrittenKeeper:
    """Keeps a failed write's decisions until a write works, says so (log, `on_write_trouble`)
    and schedules the writer's retries. Used under the log's connection lock; `count`
    mirrors how many are kept, for a lock-free check on every engine step."""

    def __init__(
        self,
        path: Path,
        retry_s: float,
        on_write_trouble: Callable[[str | None], None] | None = None,
    ) -> None:
        self._path = path
        self.retry_s = retry_s
        # Told the error when writes start failing, None when they work again; from
        # whichever thread wrote (so: hand it over to a loop with call_soon_threadsafe).
        self._on_write_trouble = on_write_trouble
        self._kept = Unwritten()
        self.count = 0
        self.retry_at = 0.0  # (monotonic) the writer's next retry

    @property
    def decisions(self) -> tuple[Decision, ...]:
        """The kept decisions, oldest first."""
        return tuple(self._kept.decisions)

    @property
    def error(self) -> str:
        return self._kept.error

    @property
    def since_unix_s(self) -> float:
        return self._kept.since_unix_s

    def retry_due(self, now: float) -> bool:
        return bool(self.count) and now >= self.retry_at

    def retried(self, now: float) -> None:
        self.retry_at = now + self.retry_s

    def keep(self, decisions: Sequence[Decision], exc: sqlite3.Error) -> tuple[UnwrittenError, bool]:
        """A write failed: its decisions wait, after any already waiting. The error to raise,
        and whether these are the first (the writer must start retrying: wake it)."""
        first = not self.count
        error = self._kept.keep(decisions, f"{self._path}: write failed: {exc}")
        self.count = len(self._kept)
        if first:
            self.retry_at = time.monotonic() + self.retry_s
            _log.error(
                "decision log: %s; %d decisions kept to be written first once writes work again "
                "(retrying every %g s)", self._kept.error, self.count, self.retry_s,
            )
            if self._on_write_trouble is not None:
                self._on_write_trouble(self._kept.error)
        return error, first

    def settle(self) -> None:
        """What failed writes left has just been written."""
        since = self._kept.since_unix_s
        self.count = 0
        _log.warning(
            "decision log: writes work again; the %d decisions kept since %s are written",
            len(self._kept), time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)),
        )
        if self._on_write_trouble is not None:
            self._on_write_trouble(None)
        self._kept.settle()  # last: whoever waits on `written` finds the log whole

    def abandon(self) -> None:
        """The log closes with some unwritten: they are lost, and it says so."""
        if not self.count:
            return
        why = f"{self._kept.error}; the log closed before they could be written"
        lost = self._kept.abandon(why)
        self.count = 0
        _log.error("decision log: %d decisions were never written (%s)", lost, why)
