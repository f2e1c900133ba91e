"""The checkpoint thread: PASSIVE checkpoints off the commit path, on a connection of its own.

SQLite's automatic checkpoint runs inside a commit and fsyncs, a latency spike for the
engine step that triggered it; `upkeep.checkpoint_loop` does it on this thread instead.
"""

from __future__ import annotations

import os
import threading

from kvbudget.daemon.log import upkeep


class Checkpointer:
    """Starts, stops and restarts (after a WAL heal) the checkpoint thread; counts the WAL
    resets. `interval_s=None`: no thread, SQLite's own checkpoints."""

    def __init__(self, path: str | os.PathLike[str], interval_s: float | None, wal_limit_bytes: int) -> None:
        self._path = path
        self.interval_s = interval_s
        self._wal_limit_bytes = wal_limit_bytes
        self.resets = 0  # times it started over a WAL past wal_limit_bytes (only its thread writes it)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shut = False

    def start(self) -> None:
        """Starts the thread (no-op without an interval, or once `shut`)."""
        if self.interval_s is None or self._shut:
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=upkeep.checkpoint_loop,
            args=(self._path, self.interval_s, self._stop),
            kwargs={"wal_reset_bytes": self._wal_limit_bytes, "on_reset": self._count_reset},
            name="kvbudget-decision-log-checkpoint",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stops the thread and waits for it (its connection is closed then)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def shut(self) -> threading.Thread | None:
        """Stops it for good (a heal under way starts none after this); the thread to join.
        Caller holds the log's connection lock, and joins outside it."""
        self._shut = True
        self._stop.set()
        return self._thread

    def _count_reset(self) -> None:
        self.resets += 1
