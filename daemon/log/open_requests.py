"""Requests the log leaves open, and the mark that says up to where none is.

A request is closed in the log once its newest row is a reject, release or expire; every
other kind (admit, queue, grow, deny, reclaim, preempt) leaves it open. A daemon that
stopped cleanly closed what was open (the server's `closing.py`); one killed did not, and
the next start closes what this module finds. The `meta` key CLOSED_THROUGH holds a seq
up to which every request is closed, so a start reads only the rows after it (a log
without the key, made before it existed, is read whole once). docs/log-schema.md.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from kvbudget.daemon.log.query import open_read_only
from kvbudget.daemon.log.schema import VIEW, DecisionLogError

CLOSED_THROUGH = "closed_through_seq"
CLOSING_KINDS = ("reject", "release", "expire")


@dataclass(frozen=True)
class OpenRequest:
    """What the newest row of a request still open said about it."""

    seq: int
    kind: str
    request_id: str
    engine_id: str
    tenant: str
    policy: str
    prompt_tokens: int
    max_new_tokens: int


def closed_through(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (CLOSED_THROUGH,)).fetchone()
    return int(row[0]) if row is not None else 0


def left_open(path: str | os.PathLike[str]) -> list[OpenRequest]:
    """The requests whose newest row, past the CLOSED_THROUGH mark, closes nothing; by seq."""
    conn = open_read_only(path)
    try:
        since = closed_through(conn)
        # The newest row of each request named after the mark (a request all of whose rows
        # are at or below it was closed: the mark says so).
        rows = conn.execute(
            f"""SELECT d.seq, d.kind, d.request_id, d.engine_id, d.tenant, d.policy,
                       d.prompt_tokens, d.max_new_tokens
                FROM {VIEW} AS d
                JOIN (SELECT request_id, MAX(seq) AS seq FROM {VIEW}
                      WHERE seq > ? AND request_id != '' GROUP BY request_id) AS newest
                  ON d.request_id = newest.request_id AND d.seq = newest.seq
                WHERE d.kind NOT IN ({", ".join("?" * len(CLOSING_KINDS))})
                ORDER BY d.seq""",
            (since, *CLOSING_KINDS),
        ).fetchall()
    except sqlite3.DatabaseError as exc:
        raise DecisionLogError(f"{path}: {exc}") from None
    finally:
        conn.close()
    return [OpenRequest(*row) for row in rows]


def mark_all_closed(path: str | os.PathLike[str]) -> int:
    """Sets CLOSED_THROUGH to the newest row's seq: call only once every request open in the
    log has its closing row committed. Returns the seq marked. Raises DecisionLogError."""
    try:
        conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=rw", uri=True, timeout=5.0)  # (never creates)
    except sqlite3.Error as exc:
        raise DecisionLogError(f"{path}: {exc}") from None
    try:
        with conn:
            newest = conn.execute(f"SELECT COALESCE(MAX(seq), 0) FROM {VIEW}").fetchone()[0]
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (CLOSED_THROUGH, str(newest)))
    except sqlite3.Error as exc:
        raise DecisionLogError(f"{path}: {exc}") from None
    finally:
        conn.close()
    return newest
