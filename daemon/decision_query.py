"""Reading the decision log: a checked read-only connection and filtered queries.

WAL lets `sqlite3`, `sqlite-utils` and Datasette read the file while the daemon writes it;
`query_decisions` opens it read-only (`mode=ro`) and works with or without the daemon
running. A reader needs read permission only, not write access to the `-shm` file
(SQLite >= 3.22 maps the WAL index read-only), so an operator in the daemon's group can
read a file the daemon owns. Queries go to `decisions`: the view over folded and recent
rows in a version-2 file, the one table in a version-1 file.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

from kvbudget.daemon.decision_schema import JSON_FIELDS, VIEW, DecisionLogError, check_meta
from kvbudget.daemon.records import DecisionKind


def open_read_only(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """A read-only connection to a decision log, checked to be one. Raises DecisionLogError."""
    path = Path(path)
    if not path.exists():
        raise DecisionLogError(f"no decision log at {path}")
    if path.is_dir():
        raise DecisionLogError(f"{path} is a directory, not a decision log")
    if not os.access(path, os.R_OK):
        raise DecisionLogError(f"cannot read {path}: permission denied")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        conn.execute("PRAGMA busy_timeout=5000")
        check_meta(conn, str(path))
    except sqlite3.DatabaseError as exc:
        raise DecisionLogError(f"{path} is not a readable SQLite database ({exc})") from None
    return conn


def query_decisions(
    path: str | os.PathLike[str],
    *,
    request_id: str | None = None,
    engine_id: str | None = None,
    tenant: str | None = None,
    kind: str | DecisionKind | None = None,
    since_s: float | None = None,
    until_s: float | None = None,
    limit: int | None = 100,
    newest_first: bool = True,
) -> list[dict[str, Any]]:
    """Rows matching every given filter (time filters on `logged_at`, unix seconds, since
    inclusive, until exclusive), JSON columns decoded to lists. `limit=None` or 0: all."""
    where: list[str] = []
    params: list[Any] = []
    for column, value in (("request_id", request_id), ("engine_id", engine_id), ("tenant", tenant)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    if kind is not None:
        where.append("kind = ?")
        params.append(kind.value if isinstance(kind, DecisionKind) else kind)
    if since_s is not None:
        where.append("logged_at >= ?")
        params.append(since_s)
    if until_s is not None:
        where.append("logged_at < ?")
        params.append(until_s)
    sql = f"SELECT * FROM {VIEW}"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY id " + ("DESC" if newest_first else "ASC")
    if limit:
        sql += " LIMIT ?"
        params.append(int(limit))
    conn = open_read_only(path)
    try:
        conn.row_factory = sqlite3.Row
        try:
            rows = conn.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as exc:
            raise DecisionLogError(f"{path}: {exc}") from None
    finally:
        conn.close()
    result = []
    for row in rows:
        record = dict(row)
        for name in JSON_FIELDS:
            record[name] = json.loads(record[name])
        result.append(record)
    return result
