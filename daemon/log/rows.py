"""Rows into the recent table as multi-row INSERTs: few statements, one transaction.

A commit of 1-8 rows or of a power of two up to CHUNK_ROWS is one statement (one
sqlite3_step, one hand-back of the GIL); others are a transaction of a few statements.
"""

from __future__ import annotations

import sqlite3
from itertools import chain

from kvbudget.daemon.log.schema import COLUMNS, RECENT

_ROW_MARKS = f"({', '.join('?' * (1 + len(COLUMNS)))})"
# Sizes 1..SMALL_ROWS exactly, then powers of two: the sqlite3 statement cache holds a
# dozen statements at most. Against executemany (a run per row, each letting go of the GIL
# and taking it back) this keeps a batch's commit from trading the GIL with the event loop
# hundreds of times.
SMALL_ROWS = 8
CHUNK_ROWS = 1024  # x 23 columns: under SQLite's 32,766 bound parameters
INSERT_SQL: dict[int, str] = {
    n: f"INSERT INTO {RECENT} VALUES {', '.join([_ROW_MARKS] * n)}"
    for n in (*range(1, SMALL_ROWS + 1), 16, 32, 64, 128, 256, 512, CHUNK_ROWS)
}
_POWERS = (512, 256, 128, 64, 32, 16, 8)


def chunk_sizes(num_rows: int) -> list[int]:
    """How `insert` cuts `num_rows` rows into statements (sizes in INSERT_SQL)."""
    sizes = [CHUNK_ROWS] * (num_rows // CHUNK_ROWS)
    rest = num_rows % CHUNK_ROWS
    for size in _POWERS:
        if rest > SMALL_ROWS and rest >= size:
            sizes.append(size)
            rest -= size
    if rest:
        sizes.append(rest)
    return sizes


def insert(cursor: sqlite3.Cursor, rows: list[tuple]) -> None:
    """Inserts `rows` (at least one) in one transaction. Raises sqlite3.Error, nothing written."""
    if len(rows) == 1:  # the row is the parameter sequence
        cursor.execute(INSERT_SQL[1], rows[0])
        return
    sizes = chunk_sizes(len(rows))
    if len(sizes) == 1:  # one statement: a transaction of its own
        cursor.execute(INSERT_SQL[sizes[0]], list(chain.from_iterable(rows)))
        return
    cursor.execute("BEGIN IMMEDIATE")
    try:
        start = 0
        for size in sizes:
            cursor.execute(INSERT_SQL[size], list(chain.from_iterable(rows[start : start + size])))
            start += size
        cursor.execute("COMMIT")
    except BaseException:
        # A COMMIT that fails for a full disk has already rolled back: a ROLLBACK then
        # fails too ("no transaction is active") and would hide why.
        if cursor.connection.in_transaction:
            cursor.execute("ROLLBACK")
        raise
