"""Whether the log's file, its WAL and the WAL's index are still the ones it opened.

A file removed or renamed under the daemon is still written through the open descriptors,
but nobody reads it and it is gone at exit; a WAL or index removed is healed by opening
them again (`LogStore`). The long story is in docs/architecture/log.md.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

# How often a write checks that `path` is still the file the log opened (one stat: a few
# microseconds, so not on every commit). Decisions committed in the interval after the file
# was removed go to the removed file, with the ones before them.
FILE_CHECK_S = 0.1

Identity = tuple[int, int]


class FileMovedError(sqlite3.OperationalError):
    """`path` is no longer the file the log has open (removed, renamed or replaced)."""


class WalLostError(sqlite3.OperationalError):
    """`<path>-wal` is no longer the WAL the log writes to, and the log could not heal yet."""


def file_identity(path: str) -> Identity | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def file_bytes(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


class FileWatch:
    """The (st_dev, st_ino) of the file, WAL and index opened, and when to look again.
    Used under the log's connection lock."""

    def __init__(self, path: Path) -> None:
        self.stat_path = os.path.abspath(path)  # (a later chdir does not move the log)
        self.wal_path = f"{self.stat_path}-wal"
        self.shm_path = f"{self.stat_path}-shm"
        self._identity: Identity | None = None
        self._wal_identity: Identity | None = None  # None: no WAL to check
        self._shm_identity: Identity | None = None
        self.check_at = 0.0  # (monotonic; 0: at the next write)
        self._heal_at = 0.0  # when a heal that failed may be tried again (monotonic)

    def opened(self) -> None:
        """The files at their names now are the ones the connection opened."""
        self._identity = file_identity(self.stat_path)
        self.wal_opened()

    def wal_opened(self) -> None:
        """A new WAL and index were opened (start, or a heal that worked)."""
        self._wal_identity = file_identity(self.wal_path)
        self._shm_identity = file_identity(self.shm_path)
        self._heal_at = 0.0

    def check(self) -> str | None:
        """None when all are as opened; else what became of the WAL and/or its index (the
        caller heals, and writes check every time until then). Raises FileMovedError when
        the file itself is gone or replaced: rows written now would reach no reader."""
        identity = file_identity(self.stat_path)
        if identity is not None and identity == self._identity:
            if self._wal_identity is not None:
                wal_identity = file_identity(self.wal_path)
                shm_identity = file_identity(self.shm_path) if self._shm_identity is not None else None
                if wal_identity != self._wal_identity or shm_identity != self._shm_identity:
                    self.check_at = 0.0  # (until healed: every write)
                    return self._what_became(wal_identity, shm_identity)
            self.check_at = time.monotonic() + FILE_CHECK_S
            return None
        self.check_at = 0.0
        what = "removed or renamed" if identity is None else "replaced by another file"
        raise FileMovedError(
            f"the file was {what} while the daemon had it open (what is written now would be lost): "
            "put it back, or restart the daemon to start a new log there"
        )

    def may_heal(self, now: float) -> bool:
        return now >= self._heal_at

    def heal_failed(self, now: float) -> None:
        self._heal_at = now + FILE_CHECK_S

    def _what_became(self, wal_identity: Identity | None, shm_identity: Identity | None) -> str:
        """What became of the WAL and/or its index, as the journal says it."""
        said = []
        for name, path, identity, opened in (
            ("the WAL file", self.wal_path, wal_identity, self._wal_identity),
            ("the WAL index file", self.shm_path, shm_identity, self._shm_identity),
        ):
            if identity != opened:
                said.append(f"{name} {path} was {'removed' if identity is None else 'replaced by another file'}")
        return f"{' and '.join(said)} while the daemon had {'them' if len(said) > 1 else 'it'} open"


def checkpoint_everything(conn: sqlite3.Connection, wait_ms: int) -> int:
    """Copies every committed frame of the WAL `conn` reads into the file (and syncs it);
    returns how many frames it found. Raises sqlite3.OperationalError when a reader holds a
    snapshot of it. Bounded by `wait_ms`: this holds up a commit."""
    conn.execute(f"PRAGMA busy_timeout={wait_ms}")
    try:
        _, frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        (busy, _, _) = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        conn.execute("PRAGMA busy_timeout=5000")
    if busy:
        raise sqlite3.OperationalError("a reader holds a snapshot of it (a long read transaction)")
    return int(frames)
