"""What the decision log takes in: steps queued for the writer thread, until it closes or fails.

`lock` orders appends and inline commits against close(); `queued` counts the steps
appended and not yet committed (or failed), which inline commits must not overtake.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import queue
import threading
from collections.abc import Sequence

from kvbudget.daemon.core.records import Decision
from kvbudget.daemon.log.schema import DecisionLogError

STOP = object()  # close(): drain, fold, stop
WAKE = object()  # rows to fold or decisions to retry: the writer sets its timers


@dataclasses.dataclass
class Pending:
    """One appended step: its decisions, when it was logged, and the future its caller waits on."""

    decisions: Sequence[Decision]
    logged_at: float
    future: concurrent.futures.Future[None]


class Gate:
    """The writer thread's queue, and whether the log takes more."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queue: queue.SimpleQueue[Pending | object] = queue.SimpleQueue()
        self.queued = 0  # appended, not yet committed (or failed); guarded by lock
        self.closed = False
        self.running = False  # the writer thread was started
        self.failure: str | None = None  # why the writer thread stopped, if it did

    def check_open(self) -> None:
        """Caller holds `lock`. RuntimeError when not running, DecisionLogError when the writer failed."""
        if self.closed or not self.running:
            raise RuntimeError("decision log is not running (start() not called, or closed)")
        if self.failure is not None:
            raise DecisionLogError(self.failure)

    def put(self, pending: Pending) -> None:
        """Caller holds `lock` and checked it open."""
        self.queue.put(pending)
        self.queued += 1

    def wake(self) -> None:
        self.queue.put(WAKE)

    def close(self) -> bool:
        """Takes no more, and stops the writer if it runs; True the first time."""
        with self.lock:
            if self.closed:
                return False
            self.closed = True
            if self.running:
                self.queue.put(STOP)
            return True

    def done(self, count: int) -> None:
        """`count` queued steps are committed (or failed)."""
        with self.lock:
            self.queued -= count

    def fail(self, why: str) -> list[Pending]:
        """The writer stopped: every later append fails; the steps still queued (to fail too)."""
        with self.lock:
            self.failure = why
            waiting: list[Pending] = []
            while True:
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, Pending):
                    waiting.append(item)
            self.queued = 0
        return waiting
