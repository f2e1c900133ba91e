"""The log's indexes serve what sqlite-utils and Datasette users ask of the `decisions` view.

Newest by seq, a page back by seq, a seq range, a time range: each read through an index
of the indexed table, not by sorting the whole log (1.5 s against 0.3 ms on a million rows:
bench/bench_log_indexes.py). A log made before the seq index gets it when the daemon
opens it, and stays schema version 2 (an older kvbudget reads it unchanged).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlite_utils

from kvbudget.daemon.log.decision_log import DecisionLog
from kvbudget.daemon.log.query import query_decisions

from test_decision_log import make_decision

QUERIES = {
    "idx_decisions_seq": [
        ("SELECT * FROM decisions ORDER BY seq DESC LIMIT 10", ()),
        ("SELECT * FROM decisions WHERE seq < ? ORDER BY seq DESC LIMIT 10", (20,)),
        ("SELECT * FROM decisions WHERE seq BETWEEN ? AND ?", (5, 9)),
    ],
    "idx_decisions_logged_at": [
        ("SELECT * FROM decisions WHERE logged_at >= ? AND logged_at < ? ORDER BY logged_at", (0, 2e9)),
    ],
}


def write_log(path: Path, seqs: range) -> None:
    log = DecisionLog(path)
    log.start()
    try:
        log.append([make_decision(seq) for seq in seqs]).result(timeout=30)
    finally:
        log.close()  # (folds the rows into the indexed table)


def plan(path: Path, sql: str, params: tuple) -> str:
    conn = sqlite3.connect(path)
    try:
        return "; ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))
    finally:
        conn.close()


@pytest.mark.parametrize("index, sql, params", [(i, s, p) for i, qs in QUERIES.items() for s, p in qs])
def test_seq_and_time_queries_on_the_view_use_an_index(tmp_path: Path, index: str, sql: str, params: tuple):
    path = tmp_path / "decisions.db"
    write_log(path, range(1, 41))
    assert f"USING INDEX {index}" in plan(path, sql, params)


def test_a_log_from_before_the_seq_index_gets_it_when_the_daemon_opens_it(tmp_path: Path):
    path = tmp_path / "decisions.db"
    write_log(path, range(1, 41))
    conn = sqlite3.connect(path)
    conn.execute("DROP INDEX idx_decisions_seq")  # as a kvbudget before the index left it
    conn.commit()
    conn.close()
    sql, params = QUERIES["idx_decisions_seq"][0]
    assert "idx_decisions_seq" not in plan(path, sql, params)

    write_log(path, range(41, 51))  # the daemon opens it (and writes on)

    assert "USING INDEX idx_decisions_seq" in plan(path, sql, params)
    db = sqlite_utils.Database(path)
    assert db["meta"].get("schema_version")["value"] == "3"  # (and upgrades a version-2 file)
    newest = [row["seq"] for row in db["decisions"].rows_where(order_by="seq desc", limit=3)]
    assert newest == [50, 49, 48]
    assert [row["seq"] for row in query_decisions(path, limit=3)] == [50, 49, 48]
