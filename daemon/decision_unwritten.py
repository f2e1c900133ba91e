"""Decisions a failed write left behind: kept in order, written first by the next write.

A write fails when the disk is full or the file cannot be written. By then the pool has
made those decisions (an admit took blocks, a release gave them back), so dropping them
would leave the log with gaps: a release with no admit, blocks held with no decision to
say why. They wait here instead, in the order made, and the next write that works puts
them in front of its own rows, in the same transaction, so the log's order stays the
pool's. Their callers were told "not committed" (UNAVAILABLE) and were promised nothing;
`written` resolves once they are in the file, so that watchers, Events streams and the
metrics hear of them then, in order.

The decision log guards this with its connection lock; the count is mirrored in
`DecisionLog.num_unwritten` for a lock-free check on every engine step.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Sequence

from kvbudget.daemon.decision_schema import DecisionLogError
from kvbudget.daemon.records import Decision


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
