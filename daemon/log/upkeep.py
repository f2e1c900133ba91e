"""The decision log's upkeep SQL, run behind the commits: folding, retention, checkpoints.

Each function takes a connection and works in bounded transactions of its own (a commit
waits for one chunk at most); `pacing.Upkeep` decides when to call them.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvbudget.daemon.log.schema import INDEXED, RECENT

_FOLD_ALL = (f"INSERT INTO {INDEXED} SELECT * FROM {RECENT}", f"DELETE FROM {RECENT}")
# A chunk is folded by ONE statement: the row inserted into this connection's TEMP table
# fires a TEMP trigger that moves the rows (TEMP objects are private to the connection:
# other readers of the file never see them). One statement is one autocommit transaction
# and one sqlite3_step, so the write lock is taken and released inside C with the GIL let
# go. As four statements (BEGIN, INSERT, DELETE, COMMIT) the writer thread had to win the
# GIL back from the busy event loop between them, up to the 5 ms switch interval each,
# holding the write lock all the while, and the loop's next commit waited for that.
_FOLD_TRIGGER = (
    "CREATE TEMP TABLE IF NOT EXISTS kvbudget_fold_request (below_id INTEGER NOT NULL)",
    f"""CREATE TEMP TRIGGER IF NOT EXISTS kvbudget_fold AFTER INSERT ON kvbudget_fold_request BEGIN
        INSERT INTO {INDEXED} SELECT * FROM {RECENT} WHERE id < NEW.below_id;
        DELETE FROM {RECENT} WHERE id < NEW.below_id;
        DELETE FROM kvbudget_fold_request;
    END""",
)
_FOLD_CHUNK = "INSERT INTO kvbudget_fold_request VALUES (?)"


def fold(conn: sqlite3.Connection) -> int:
    """Moves every recent row into the indexed table, in one transaction; returns how many
    moved. Raises sqlite3.Error, nothing moved. (Start-up and tests: the writer's own
    folds go by `fold_below`.) The DELETE has no WHERE, which SQLite runs as a truncation
    of the table (its pages freed at once, not row by row)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        moved = conn.execute(_FOLD_ALL[0]).rowcount
        conn.execute(_FOLD_ALL[1])
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return max(0, moved)


def prepare_fold_below(conn: sqlite3.Connection) -> None:
    """Creates the connection's TEMP table and trigger `fold_below` uses (idempotent).
    The TEMP schema is kept in memory: no temporary file to create under a hardened unit."""
    conn.execute("PRAGMA temp_store=MEMORY")
    for sql in _FOLD_TRIGGER:
        conn.execute(sql)


def fold_below(conn: sqlite3.Connection, below_id: int) -> None:
    """Moves the recent rows with `id < below_id` into the indexed table: one statement,
    one transaction. Raises sqlite3.Error, nothing moved."""
    conn.execute(_FOLD_CHUNK, (below_id,))


# A purge chunk is ONE statement, like a fold chunk (the write lock taken and let go inside
# one sqlite3_step, the GIL released), and every bound in it is found in O(chunk), never by
# a scan: `max(id)` over the `decisions` view, or `min(id)` over every row newer than the
# age cut-off, read the whole table (the view's UNION ALL defeats the primary key, and the
# logged_at index yields the newer rows in time order, not id order). Under those scans a
# pass took ~0.5 s on a log of 1 million rows and 1.7 s on 3.7 million, holding the
# connection, even with nothing to delete; while retention was behind, the daemon's
# batched throughput fell from ~50k to 1-3k decisions/s (bench/bench_retention.py).
#   head       the oldest `chunk_rows` indexed rows (primary key order: no scan);
#   age bound  the first of them logged inside the age window (all older: past the head;
#              no age limit: 0);
#   rows bound the first id the row limit keeps, newest id - max_rows + 1, the newest id
#              from each table's primary key (no row limit: far below any id).
# Rows below the larger bound go (either limit deletes), but no more than the head.
_PURGE_CHUNK = f"""DELETE FROM {INDEXED} WHERE id < (
    WITH head AS (SELECT id, logged_at FROM {INDEXED} ORDER BY id LIMIT :chunk_rows)
    SELECT min(
        (SELECT max(id) FROM head) + 1,
        max(
            CASE WHEN :cutoff IS NULL THEN 0 ELSE coalesce(
                (SELECT min(id) FROM head WHERE logged_at >= :cutoff), (SELECT max(id) FROM head) + 1) END,
            max(coalesce((SELECT max(id) FROM {INDEXED}), 0), coalesce((SELECT max(id) FROM {RECENT}), 0))
                - :max_rows + 1
        )
    )
)"""
_NO_ROW_LIMIT = 2**62  # (SQLite integers are 64-bit: `newest - 2**62` cannot overflow)


def purge_oldest(
    conn: sqlite3.Connection,
    *,
    retention_s: float | None,
    max_rows: int | None,
    chunk_rows: int,
    now: float,
) -> tuple[int, bool]:
    """Deletes the oldest indexed rows beyond the age / size limits, at most `chunk_rows`,
    in one statement whose cost does not grow with the log (see _PURGE_CHUNK).

    Returns (rows deleted, whether more may be due: a whole chunk went). The age limit
    keeps every row from the oldest one logged inside the window on, in id order. Rows
    not folded yet are the newest; they count toward `max_rows` but are not purged
    before they are folded."""
    deleted = conn.execute(
        _PURGE_CHUNK,
        {
            "chunk_rows": chunk_rows,
            "cutoff": None if retention_s is None else now - retention_s,
            "max_rows": _NO_ROW_LIMIT if max_rows is None else max_rows,
        },
    ).rowcount
    return deleted, deleted >= chunk_rows


def newest_id(conn: sqlite3.Connection) -> int:
    """The log's highest row id (0 when empty), from each table's primary key: `max(id)` on
    the `decisions` view would read every row (a long start-up for a big log)."""
    (newest,) = conn.execute(
        f"SELECT max(coalesce((SELECT max(id) FROM {INDEXED}), 0), coalesce((SELECT max(id) FROM {RECENT}), 0))"
    ).fetchone()
    return int(newest)


def oldest_id(conn: sqlite3.Connection) -> int:
    """The log's lowest row id (0 when empty), from the primary keys (no scan): retention
    deletes the oldest indexed rows, and the recent table holds only newer ones."""
    (oldest,) = conn.execute(
        f"SELECT coalesce((SELECT min(id) FROM {INDEXED}), (SELECT min(id) FROM {RECENT}), 0)"
    ).fetchone()
    return int(oldest)


def rows_within_bytes(conn: sqlite3.Connection, max_bytes: int) -> int | None:
    """How many of the newest rows to keep for the file's pages in use to come under
    `max_bytes`, at the log's bytes per row now (None: already under it).

    Pages in use are the file's pages less its free list: a purge moves pages to the free
    list and later commits reuse them, so the file stops growing at about the bound (SQLite
    never shrinks it; VACUUM would, holding every reader and writer out meanwhile). Bytes
    per row are the pages in use past an empty log's over the rows held (ids are
    contiguous: rows are only ever deleted from the oldest end), indexes, half-empty pages
    and block tables of long prompts included, so the estimate follows what the rows
    really cost, and a pass that leaves the file over the bound (rows bigger than the
    average went) is followed by another. Reads a few header fields, the schema's b-tree
    count and two primary-key ends: no scan."""
    used = used_bytes(conn)
    newest = newest_id(conn)
    rows = newest - oldest_id(conn) + 1 if newest else 0
    if used <= max_bytes or rows <= 0:
        return None
    # What an empty log takes (page 1 and a root page per table and index) stays whatever
    # is deleted: left in the average, it makes a small log's passes fall short. And pages
    # are freed whole (the request_id index's pages only thin out as old rows go), so the
    # purge aims 2% under the bound rather than at it.
    (trees,) = conn.execute("SELECT count(*) FROM sqlite_master WHERE rootpage > 0").fetchone()
    (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    fixed = (trees + 1) * page_size
    target = max_bytes * 49 // 50
    if target <= fixed:
        return 0
    return rows * (target - fixed) // max(1, used - fixed)


def used_bytes(conn: sqlite3.Connection) -> int:
    """The file's pages in use (all but the free list), in bytes: three header fields."""
    (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    (page_count,) = conn.execute("PRAGMA page_count").fetchone()
    (free_pages,) = conn.execute("PRAGMA freelist_count").fetchone()
    return (page_count - free_pages) * page_size


# A RESTART checkpoint stops the writer while it finishes: it gives up after this long
# waiting for the write lock or for readers of the old WAL (an operator's long query),
# rather than hold the daemon's commits longer. The next interval tries again.
RESET_WAIT_MS = 100
_CATCH_UP_PASSES = 8


_log = logging.getLogger("kvbudget.daemon.log.decision_log")
WAL_HELD_FACTOR = 4  # the WAL this many times past its limit: a reader holds it (WalWatch)
WAL_WARN_EVERY_S = 60.0


@dataclass
class WalWatch:
    """Says, at most every `warn_every_s`, when the WAL keeps growing past its limit because
    it cannot start over: a reader holds a snapshot of it (a long read transaction, such as
    an sqlite3 shell left in BEGIN). Commits go on, but the file grows for as long as that
    reader stays (6.5 MB/s under a 5k decisions/s load), and only the
    `kvbudget_decision_log_bytes{file="wal"}` metric showed it. Says so too once it is over."""

    wal_reset_bytes: int
    warn_every_s: float = WAL_WARN_EVERY_S
    warned_at: float | None = None  # monotonic; None: nothing said (or said over)

    def after_checkpoint(self, reset: bool, wal_bytes: int, now: float) -> tuple[int, str] | None:
        """(logging level, message) to log after a checkpoint round, or None."""
        if reset or wal_bytes <= self.wal_reset_bytes:
            if self.warned_at is None:
                return None
            self.warned_at = None
            return logging.INFO, "decision log: the WAL started over again (the reader holding it is gone)"
        if wal_bytes < WAL_HELD_FACTOR * self.wal_reset_bytes:
            return None
        if self.warned_at is not None and now - self.warned_at < self.warn_every_s:
            return None
        self.warned_at = now
        return logging.WARNING, (
            f"decision log: the WAL is {wal_bytes / 2**20:,.0f} MiB, past its {self.wal_reset_bytes / 2**20:,.0f} MiB "
            "limit, and cannot start over while a reader holds an old snapshot of it (a long read transaction: an "
            "open sqlite3 shell in BEGIN, a stuck query); commits go on, the file grows until that reader ends"
        )


def checkpoint_loop(
    path: str | os.PathLike[str],
    interval_s: float,
    stop: threading.Event,
    *,
    wal_reset_bytes: int,
    on_reset: Callable[[], None] = lambda: None,
) -> None:
    """`checkpoint` every `interval_s` until `stop` is set, on a connection of its own;
    `on_reset` after each that started the WAL over. The last connection to close checkpoints
    the rest."""
    conn, page_size = connect_checkpointer(path)
    watch = WalWatch(wal_reset_bytes)
    wal_path = f"{path}-wal"
    try:
        while not stop.wait(interval_s):
            try:
                reset = checkpoint(conn, page_size, wal_reset_bytes)
            except sqlite3.Error:
                continue  # busy or I/O trouble: the next round tries again
            if reset:
                on_reset()
            try:
                wal_bytes = os.path.getsize(wal_path)
            except OSError:
                wal_bytes = 0
            said = watch.after_checkpoint(reset, wal_bytes, time.monotonic())
            if said is not None:
                _log.log(*said)
    finally:
        conn.close()


def connect_checkpointer(path: str | os.PathLike[str]) -> tuple[sqlite3.Connection, int]:
    """A connection for `checkpoint`, and the file's page size."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout={RESET_WAIT_MS}")
    (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    return conn, page_size


def checkpoint(conn: sqlite3.Connection, page_size: int, wal_reset_bytes: int) -> bool:
    """Copies the WAL into the database file; returns True when it also started it over.

    PASSIVE never blocks the writer (or readers), so a commit never pays for a
    checkpoint's fsync, and sqlite3 releases the GIL meanwhile. But SQLite starts the WAL
    over only when a commit finds every frame copied, and under steady commits a PASSIVE
    pass never catches up with the frames written while it ran: under bench_roundtrip's
    batched load the WAL grew by ~31 MiB/s (1.9 GB in a minute, a 64 GiB disk in about
    half an hour). So once the WAL is past `wal_reset_bytes`, further PASSIVE passes copy
    what came meanwhile (each has less to do), and a RESTART, which holds the writer off
    while it runs (and for at most RESET_WAIT_MS while readers of the old WAL finish),
    copies the last frames: the next commit writes at the start of the WAL again (over
    the same file blocks, which is cheaper than growing a truncated file back;
    `journal_size_limit` cuts a larger file back to the limit).

    A pass reports the WAL's frames as it found them, and how many of those it copied; the
    frames written while it ran show only in the next pass's count. So the catch-up goes on
    while the last pass found many new frames, or could not copy what it found (a reader's
    snapshot holds them). Judging by the copied count alone, which a pass that finished
    always matches, the catch-up stopped after the first pass, and the RESTART copied
    and synced everything written during it (random index pages), holding every commit
    off meanwhile: 0.1-0.4 s, every 1.5 s, under bench_sustained's load, and the longer,
    the bigger the file."""
    _, wal_frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    if wal_frames * page_size <= wal_reset_bytes:
        return False
    small = wal_reset_bytes // 64  # what the writer may wait for: ~1 MiB of the default 64
    for _ in range(_CATCH_UP_PASSES):  # the writer waits only for what is left after these
        found_before = wal_frames
        _, wal_frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        written_meanwhile = max(0, wal_frames - found_before)  # (< 0: the WAL started over)
        if (written_meanwhile + wal_frames - copied) * page_size <= small:
            break
    (busy, _, _) = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
    return not busy
