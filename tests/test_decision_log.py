"""The SQLite decision log: schema, durability ordering (group commit), retention, queries,
and that the file is readable by other tools while the daemon writes it."""

from __future__ import annotations

import functools
import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvbudget.daemon.log import query as decision_query
from kvbudget.daemon.log import upkeep
from kvbudget.daemon.log.decision_log import DecisionLog
from kvbudget.daemon.log.pacing import Retention, Upkeep
from kvbudget.daemon.log.query import open_read_only, query_decisions
from kvbudget.daemon.log.schema import (
    COLUMNS,
    INDEXED,
    INDEXED_COLUMNS,
    RECENT,
    SCHEMA_VERSION,
    VIEW,
    DecisionLogError,
    decision_from_row,
)
from kvbudget.daemon.core.records import Decision, DecisionKind, Reason


def make_decision(seq: int, **fields: object) -> Decision:
    values: dict[str, object] = dict(
        seq=seq,
        time_s=1000.0 + seq,
        kind=DecisionKind.ADMIT,
        reason=Reason.FITS,
        request_id=f"req-{seq}",
        engine_id="engine-a",
        tenant="t1",
        policy="optimistic",
        prompt_tokens=100,
        max_new_tokens=50,
        num_tokens=100,
        blocks_reserved=(7, 3),
        blocks_held=(7, 3),
        new_block_ids=((1, 2, 3, 4, 5, 6, 7), (8, 9, 10)),
        num_free_blocks=90,
        num_running=1,
    )
    values.update(fields)
    return Decision(**values)  # type: ignore[arg-type]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "decisions.db"


@pytest.fixture
def log(db_path: Path):
    decision_log = DecisionLog(db_path)
    decision_log.start()
    yield decision_log
    decision_log.close()


def count_rows(path: Path, where: str = "1", table: str = "decisions") -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(f"SELECT count(*) FROM {table} WHERE {where}").fetchone()[0]
    finally:
        conn.close()


def _writer_pragma(log: DecisionLog, name: str) -> object:
    """A setting of the log's own (writing) connection, read while nothing else uses it."""
    with log.store.lock:
        return log.store.connection.execute(f"PRAGMA {name}").fetchone()[0]


def update_rows(path: Path, sql_set: str, params: list[tuple]) -> None:
    """`UPDATE ... SET sql_set` on both tables in ONE transaction: the view cannot be
    updated, and a fold moving rows between the updates would dodge one of them."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        for table in (INDEXED, RECENT):
            conn.executemany(f"UPDATE {table} SET {sql_set}", params)
        conn.execute("COMMIT")
    finally:
        conn.close()


def break_writes(path: Path) -> sqlite3.Connection:
    """Renames the table commits go to, so the next write fails; `mend_writes` undoes it."""
    other = sqlite3.connect(path)
    other.execute(f"ALTER TABLE {RECENT} RENAME TO decisions_moved")
    other.commit()
    return other


def mend_writes(other: sqlite3.Connection) -> None:
    other.execute(f"ALTER TABLE decisions_moved RENAME TO {RECENT}")
    other.commit()
    other.close()


# ----------------------------------------------------------------------- schema
def test_schema_has_one_column_per_decision_field_meta_and_indexes(log: DecisionLog, db_path: Path) -> None:
    conn = sqlite3.connect(db_path)
    # Readers see one name, the view; both tables behind it have the same columns.
    for name in ("decisions", INDEXED, RECENT):
        columns = [row[1] for row in conn.execute(f"PRAGMA table_info({name})")]
        assert columns == ["id", *COLUMNS]
    assert conn.execute("SELECT type FROM sqlite_master WHERE name = 'decisions'").fetchone() == ("view",)
    assert COLUMNS[1:] == tuple(Decision.__dataclass_fields__)  # every Decision field, in order
    meta = dict(conn.execute("SELECT key, value FROM meta"))
    assert meta["app"] == "kvbudget"
    assert meta["schema_version"] == str(SCHEMA_VERSION) == "3"
    indexes = {row[1]: row for row in conn.execute(f"PRAGMA index_list({INDEXED})")}
    for column in INDEXED_COLUMNS:
        index_name = f"idx_decisions_{column}"
        assert index_name in indexes
        assert [r[2] for r in conn.execute(f"PRAGMA index_info({index_name})")] == [column]
    assert {"logged_at", "request_id", "kind", "engine_id", "tenant"} <= set(INDEXED_COLUMNS)
    # Commits go to the unindexed table: that is what keeps them cheap.
    assert list(conn.execute(f"PRAGMA index_list({RECENT})")) == []
    # WAL is a property of the file: a second connection sees it.
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    assert _writer_pragma(log, "synchronous") == 1  # 1 = NORMAL


def test_reopening_an_existing_log_keeps_rows(db_path: Path) -> None:
    with DecisionLog(db_path) as first:
        first.append([make_decision(1)]).result()
    with DecisionLog(db_path) as second:
        second.append([make_decision(2)]).result()
    assert count_rows(db_path) == 2


def test_refuses_a_foreign_or_newer_database(tmp_path: Path) -> None:
    foreign = tmp_path / "other.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE customers (id INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(DecisionLogError, match="not a KVBudget decision log"):
        DecisionLog(foreign).start()
    with pytest.raises(DecisionLogError, match="not a KVBudget decision log"):
        query_decisions(foreign)

    newer = tmp_path / "newer.db"
    with DecisionLog(newer):
        pass
    conn = sqlite3.connect(newer)
    conn.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(DecisionLogError, match="schema version 999"):
        DecisionLog(newer).start()


def test_not_sqlite_at_all(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database, just some text " * 100)
    with pytest.raises(DecisionLogError, match="junk.db"):
        DecisionLog(junk).start()
    with pytest.raises(DecisionLogError, match="not a readable SQLite database"):
        query_decisions(junk)
    with pytest.raises(DecisionLogError, match="no decision log at"):
        query_decisions(tmp_path / "missing.db")


# ----------------------------------------------------------------------- round trip
decision_strategy = st.builds(
    Decision,
    seq=st.integers(0, 2**62),
    time_s=st.floats(0, 2e9, allow_nan=False),
    kind=st.sampled_from(DecisionKind),
    reason=st.sampled_from(Reason),
    request_id=st.text(max_size=20),
    engine_id=st.text(max_size=8),
    tenant=st.text(max_size=8),
    policy=st.sampled_from(["optimistic", "guaranteed", ""]),
    prompt_tokens=st.integers(0, 10**6),
    max_new_tokens=st.integers(0, 10**6),
    num_tokens=st.integers(0, 10**6),
    num_computed=st.integers(0, 10**6),
    blocks_reserved=st.lists(st.integers(0, 10**6), max_size=4).map(tuple),
    blocks_held=st.lists(st.integers(0, 10**6), max_size=4).map(tuple),
    new_block_ids=st.lists(st.lists(st.integers(0, 10**6), max_size=6).map(tuple), max_size=4).map(tuple),
    freed_blocks=st.integers(0, 10**6),
    cached_hit_blocks=st.integers(0, 10**6),
    num_free_blocks=st.integers(0, 10**6),
    num_waiting=st.integers(0, 10**4),
    num_running=st.integers(0, 10**4),
    detail=st.text(max_size=30),
)


@given(decisions=st.lists(decision_strategy, min_size=1, max_size=5))
def test_every_decision_reads_back_equal(tmp_path_factory: pytest.TempPathFactory, decisions: list[Decision]) -> None:
    path = tmp_path_factory.mktemp("roundtrip") / "d.db"
    with DecisionLog(path) as log:
        log.append(decisions).result()
    rows = query_decisions(path, limit=None, newest_first=False)
    assert [decision_from_row(row) for row in rows] == decisions
    # Tuples are stored as JSON text that other tools can parse.
    conn = sqlite3.connect(path)
    stored = conn.execute("SELECT new_block_ids FROM decisions ORDER BY id").fetchall()
    conn.close()
    assert [json.loads(s) for (s,) in stored] == [[list(g) for g in d.new_block_ids] for d in decisions]


# ----------------------------------------------------------------------- group commit
def test_future_resolves_only_after_commit(log: DecisionLog, db_path: Path) -> None:
    seen_at_resolution: list[int] = []

    def on_done(request_id: str) -> None:
        # Runs in the writer thread as the future resolves: a second connection must
        # already see the row, i.e. the commit happened before the resolution.
        seen_at_resolution.append(count_rows(db_path, f"request_id = '{request_id}'"))

    futures = []
    for seq in range(20):
        future = log.append([make_decision(seq)])
        future.add_done_callback(lambda _f, rid=f"req-{seq}": on_done(rid))
        futures.append(future)
    # result() may return before the writer ran the callbacks; the writer runs them in
    # order before taking the next batch, so a flush after them has seen them all.
    log.flush()
    assert seen_at_resolution == [1] * 20


def test_appends_queued_while_the_writer_waits_share_one_transaction(log: DecisionLog, db_path: Path) -> None:
    # Another connection holds the write lock, so the writer cannot commit anything.
    blocker = sqlite3.connect(db_path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    futures = [log.append([make_decision(seq)]) for seq in range(10)]
    # Nothing can be committed while the lock is held, so no future can be done.
    assert not any(f.done() for f in futures)
    blocker.execute("ROLLBACK")
    blocker.close()
    for future in futures:
        future.result()
    assert count_rows(db_path) == 10
    # The writer may have taken the first append before it met the lock; everything
    # queued behind it went in one transaction: 10 appends, at most 2 commits.
    assert log.batches_committed <= 2
    assert log.rows_written == 10


def test_max_batch_bounds_a_transaction(db_path: Path) -> None:
    with DecisionLog(db_path, max_batch=3) as log:
        blocker = sqlite3.connect(db_path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        futures = [log.append([make_decision(2 * i), make_decision(2 * i + 1)]) for i in range(5)]
        blocker.execute("ROLLBACK")
        blocker.close()
        for future in futures:
            future.result()
        # 2 + 2 > 3: every append is its own transaction, in order.
        assert log.batches_committed == 5
    assert [r["seq"] for r in query_decisions(db_path, limit=None, newest_first=False)] == list(range(10))


def test_write_failure_reaches_every_caller_and_the_writer_goes_on(log: DecisionLog, db_path: Path) -> None:
    log.append([make_decision(1)]).result()
    other = break_writes(db_path)
    failed = log.append([make_decision(2)])
    with pytest.raises(DecisionLogError, match="write failed"):
        failed.result()
    mend_writes(other)
    # The failed row was kept (the pool made that decision): it goes first, then the new one.
    log.append([make_decision(3)]).result()
    assert [r["seq"] for r in query_decisions(db_path, limit=None, newest_first=False)] == [1, 2, 3]
    assert failed.exception().written.result(timeout=10) is None


def test_close_flushes_and_is_idempotent(db_path: Path) -> None:
    log = DecisionLog(db_path)
    log.start()
    futures = [log.append([make_decision(seq)]) for seq in range(50)]
    log.close()
    assert all(f.done() and f.exception() is None for f in futures)
    assert count_rows(db_path) == 50
    log.close()
    with pytest.raises(RuntimeError, match="not running"):
        log.append([make_decision(99)])


def test_flush_waits_for_everything_appended_before(log: DecisionLog, db_path: Path) -> None:
    appenders = [
        threading.Thread(target=lambda base=base: [log.append([make_decision(base + i)]) for i in range(25)])
        for base in (0, 100, 200, 300)
    ]
    for thread in appenders:
        thread.start()
    for thread in appenders:
        thread.join()
    log.flush()
    assert count_rows(db_path) == 100  # 4 threads x 25 appends of one decision
    assert log.rows_written == 100


# ----------------------------------------------------------------------- retention
def test_retention_by_rows_keeps_the_newest(db_path: Path) -> None:
    # Retention purges folded rows only (unfolded ones are the newest); folding at once
    # (fold_interval_s=0) makes the pass after the 25-row batch see all of them.
    with DecisionLog(db_path, max_rows=10, retention_interval_s=0.0, fold_interval_s=0.0) as log:
        log.append([make_decision(seq) for seq in range(25)]).result()
        log.flush()  # the pass after the 25-row batch has run before the flush batch
        # ids 1..25; keep the newest 10 -> ids 16..25 (25 - 10 + 1 = 16), seqs 15..24.
        assert [r["seq"] for r in query_decisions(db_path, limit=None, newest_first=False)] == list(range(15, 25))
        assert log.rows_deleted == 15


def test_retention_by_rows_keeps_up_between_passes(db_path: Path) -> None:
    # Passes an hour apart (a minute in the daemon): a fold that leaves the log past
    # max_rows makes a pass due at once. Waiting for the interval let 15k rows/s take a
    # log bound to 200,000 rows to 1.1 million before each pass (bench_soak.py).
    with DecisionLog(db_path, max_rows=500, retention_interval_s=3600.0, fold_interval_s=0.0,
                     retention_chunk_rows=64, checkpoint_interval_s=None) as log:

        def deleted_once_caught_up(due: int) -> int:
            deadline = time.monotonic() + 30.0
            while log.rows_deleted < due and time.monotonic() < deadline:
                time.sleep(0.001)
            return log.rows_deleted

        for first in range(0, 5_000, 100):
            rows = [make_decision(seq) for seq in range(first, first + 100)]
            if not log.commit_inline(rows):  # (the daemon's path: nothing queued to yield to)
                log.append(rows).result()
            assert count_rows(db_path) <= 500 + 100  # the bound, and the batch just committed
            due = max(0, first + 100 - 500)
            assert deleted_once_caught_up(due) == due  # the fold's pass, down to the bound exactly
    conn = sqlite3.connect(db_path)
    assert [r[0] for r in conn.execute("SELECT id FROM decisions ORDER BY id")] == list(range(4_501, 5_001))
    conn.close()


def test_retention_by_age_in_chunks(db_path: Path) -> None:
    with DecisionLog(db_path) as log:
        log.append([make_decision(seq) for seq in range(10)]).result()
    conn = sqlite3.connect(db_path, isolation_level=None)
    assert count_rows(db_path, table=RECENT) == 0  # close() folded every row
    conn.execute(f"UPDATE {INDEXED} SET logged_at = 1000.0 WHERE id <= 5")
    conn.execute(f"UPDATE {INDEXED} SET logged_at = 2000.0 WHERE id > 5")
    purger = DecisionLog(db_path, retention_s=100.0, retention_chunk_rows=3)
    # now = 2050, keep 100 s -> keep logged_at >= 1950 -> ids 6..10 survive.
    assert purger.apply_retention(conn, now=2050.0) is True  # chunk of 3: ids 1..3 gone, more due
    assert purger.apply_retention(conn, now=2050.0) is False  # ids 4, 5 gone, done
    assert purger.apply_retention(conn, now=2050.0) is False  # nothing left to do
    assert [r[0] for r in conn.execute("SELECT id FROM decisions ORDER BY id")] == [6, 7, 8, 9, 10]
    assert purger.rows_deleted == 5
    # Everything older than the window: all 5 rows go, in chunks of 3 then 2.
    assert purger.apply_retention(conn, now=10_000.0) is True
    assert purger.apply_retention(conn, now=10_000.0) is False
    assert count_rows(db_path) == 0
    conn.close()


def _log_of(path: Path, num_rows: int, *, old_rows: int) -> sqlite3.Connection:
    """A closed log of `num_rows` folded rows, the first `old_rows` logged at t=1000, the
    rest at t=2000; one unfolded row on top (its id is the newest)."""
    with DecisionLog(path) as log:
        log.append([make_decision(seq) for seq in range(num_rows)]).result()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"UPDATE {INDEXED} SET logged_at = CASE WHEN id <= ? THEN 1000.0 ELSE 2000.0 END", (old_rows,))
    conn.execute(f"INSERT INTO {RECENT} SELECT * FROM {INDEXED} WHERE id = ?", (num_rows,))
    conn.execute(f"UPDATE {RECENT} SET id = ?, logged_at = 2000.0", (num_rows + 1,))
    return conn


def _vm_steps(conn: sqlite3.Connection, call) -> tuple[object, int]:
    """What `call()` returns, and how many SQLite VM instructions it ran (in 100s)."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    conn.set_progress_handler(count, 100)
    try:
        return call(), steps
    finally:
        conn.set_progress_handler(None, 100)


@pytest.mark.parametrize("limit", ["age", "rows"])
def test_a_purge_chunk_costs_the_same_in_a_big_log(tmp_path: Path, limit: str) -> None:
    # Each purge chunk holds the connection the daemon's commits need. Finding its bounds
    # by a scan (max(id) over the view, min(id) over every newer row) made a chunk of a
    # 3-million-row log take ~0.5 s and the daemon's throughput fall ~15x while retention
    # was behind. A chunk must cost what its rows cost, whatever the log's size.
    costs = {}
    for num_rows in (2_000, 20_000):
        conn = _log_of(tmp_path / f"{limit}-{num_rows}.db", num_rows, old_rows=num_rows // 2)
        limits = {"retention_s": 100.0, "max_rows": None} if limit == "age" else {
            "retention_s": None, "max_rows": num_rows // 2}
        (deleted, more), costs[num_rows] = _vm_steps(
            conn, lambda: upkeep.purge_oldest(conn, chunk_rows=50, now=2050.0, **limits))
        assert (deleted, more) == (50, True)  # half the log is due, 50 at a time
        assert [r[0] for r in conn.execute(f"SELECT id FROM {INDEXED} ORDER BY id LIMIT 1")] == [51]
        conn.close()
    assert costs[20_000] < 1.5 * costs[2_000], costs  # a scan would cost ~10x


def test_a_purge_keeps_the_rows_the_limits_keep(tmp_path: Path) -> None:
    conn = _log_of(tmp_path / "limits.db", 20, old_rows=8)  # ids 1..8 old, 9..20 young, 21 unfolded
    purge = functools.partial(upkeep.purge_oldest, conn, chunk_rows=100, now=2050.0)
    assert purge(retention_s=None, max_rows=None) == (0, False)
    assert purge(retention_s=100.0, max_rows=None) == (8, False)  # ids 1..8
    # 21 ids, keep the newest 10 (ids 12..21: the unfolded row counts): ids 9..11 go.
    assert purge(retention_s=100.0, max_rows=10) == (3, False)
    assert purge(retention_s=10_000.0, max_rows=10) == (0, False)
    assert [r[0] for r in conn.execute("SELECT id FROM decisions ORDER BY id")] == list(range(12, 22))
    # Everything is older than 1 s, but the unfolded row is not purged before it is folded.
    assert purge(retention_s=1.0, max_rows=None) == (9, False)
    assert [r[0] for r in conn.execute("SELECT id FROM decisions")] == [21]
    conn.close()


def test_a_purge_behind_keeps_pace_with_the_folds(tmp_path: Path) -> None:
    # While retention is behind, each round deletes as many rows as the folds indexed and
    # one chunk more (whole chunks), so a backlog shrinks under load; what a round could
    # not delete is owed to the next one. One chunk a round let a log under sustained load
    # grow past its bound for as long as the load lasted.
    conn = _log_of(tmp_path / "pace.db", 100, old_rows=0)  # ids 1..100 folded, 101 unfolded
    log = DecisionLog(tmp_path / "pace.db")  # (not started: its store is the file's bookkeeping)
    commits = types.SimpleNamespace(queued=0, closed=False)
    purger = Upkeep(log.store, commits, Retention(max_rows=11), fold_chunk_rows=512,  # keep 91..101
                    retention_chunk_rows=8, max_unfolded_rows=131_072, inline_wait_s=0.05)
    assert purger.purge_chunks(conn, folded=20) is True  # 20 + 8 owed: 4 chunks
    assert purger.rows_deleted == 32
    assert purger.purge_owed == 0  # the overshoot is not carried: the next round does its own
    assert purger.purge_chunks(conn, folded=0) is True  # nothing folded: the extra chunk
    assert purger.rows_deleted == 40
    commits.queued = 1  # a commit waits: one chunk, the rest owed
    assert purger.purge_chunks(conn, folded=16) is True
    assert (purger.rows_deleted, purger.purge_owed) == (48, 16)
    commits.queued = 0
    assert purger.purge_chunks(conn, folded=100) is False  # owed 124: the 42 left, then done
    assert purger.rows_deleted == 90
    assert [r[0] for r in conn.execute(f"SELECT id FROM {INDEXED} ORDER BY id LIMIT 1")] == [91]
    assert purger.purge_owed == 0  # no debt carried once caught up
    conn.close()


def test_the_newest_id_is_read_without_a_scan(tmp_path: Path) -> None:
    # A log opens on the id after its newest: max(id) over the view read every row.
    costs = {}
    for num_rows in (2_000, 20_000):
        conn = _log_of(tmp_path / f"newest-{num_rows}.db", num_rows, old_rows=0)
        newest, costs[num_rows] = _vm_steps(conn, lambda: upkeep.newest_id(conn))
        assert newest == num_rows + 1  # the unfolded row
        conn.execute(f"DELETE FROM {RECENT}")
        assert upkeep.newest_id(conn) == num_rows
        conn.close()
    assert costs[20_000] <= costs[2_000] + 1, costs
    with DecisionLog(tmp_path / "empty.db"):  # (first: an empty file at db_path is refused)
        empty = sqlite3.connect(tmp_path / "empty.db")
    assert upkeep.newest_id(empty) == 0
    empty.close()


def test_retention_limits_must_be_positive(db_path: Path) -> None:
    with pytest.raises(ValueError, match="retention_s"):
        DecisionLog(db_path, retention_s=0)
    with pytest.raises(ValueError, match="max_rows"):
        DecisionLog(db_path, max_rows=-1)


# ----------------------------------------------------------------------- queries
def test_query_filters(log: DecisionLog, db_path: Path) -> None:
    log.append(
        [
            make_decision(1, request_id="a", engine_id="e1", tenant="t1"),
            make_decision(2, request_id="b", engine_id="e2", tenant="t2", kind=DecisionKind.QUEUE,
                          reason=Reason.POOL_FULL),
            make_decision(3, request_id="a", engine_id="e1", tenant="t1", kind=DecisionKind.RELEASE,
                          reason=Reason.FINISHED),
        ]
    ).result()
    assert [r["seq"] for r in query_decisions(db_path, request_id="a")] == [3, 1]  # newest first
    assert [r["seq"] for r in query_decisions(db_path, request_id="a", newest_first=False)] == [1, 3]
    assert [r["seq"] for r in query_decisions(db_path, engine_id="e2")] == [2]
    assert [r["seq"] for r in query_decisions(db_path, tenant="t1", kind="release")] == [3]
    assert [r["seq"] for r in query_decisions(db_path, kind=DecisionKind.QUEUE)] == [2]
    assert query_decisions(db_path, kind="queue")[0]["reason"] == "pool_full"
    assert [r["seq"] for r in query_decisions(db_path, limit=2)] == [3, 2]
    # Time filters on logged_at: since inclusive, until exclusive.
    update_rows(db_path, "logged_at = ? WHERE seq = ?", [(100.0, 1), (200.0, 2), (300.0, 3)])
    assert [r["seq"] for r in query_decisions(db_path, since_s=200.0)] == [3, 2]
    assert [r["seq"] for r in query_decisions(db_path, until_s=200.0)] == [1]
    assert [r["seq"] for r in query_decisions(db_path, since_s=150.0, until_s=300.0)] == [2]


@pytest.mark.parametrize("sparse_below", [0, 10_000])  # 0: every window read through the view
def test_time_windows_give_exactly_the_rows_in_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sparse_below: int
) -> None:
    # The wall clock stepped back and forth: logged_at is not in id order. Both ways of
    # reading a window (the view newest-first, the time index for a sparse window) must
    # return exactly the rows inside it, newest id first, kinds filtered, limits applied.
    monkeypatch.setattr(decision_query, "SPARSE_WINDOW_ROWS", sparse_below)
    conn = _log_of(tmp_path / "clock.db", 60, old_rows=0)
    conn.execute(f"UPDATE {INDEXED} SET logged_at = (id * 37) % 60, kind = CASE WHEN id % 3 = 0 THEN 'queue' ELSE kind END")
    conn.execute(f"UPDATE {RECENT} SET logged_at = 30.5, kind = 'admit'")  # id 61, unfolded
    rows = {r[0]: (r[1], r[2]) for r in conn.execute("SELECT id, logged_at, kind FROM decisions")}
    conn.close()
    path = tmp_path / "clock.db"
    for since, until, kind, limit in [(10, 20, None, 100), (30, None, None, 5), (None, 7, "queue", 100),
                                      (59.5, None, None, 100), (25, 35, "admit", 3), (100, None, None, 100)]:
        expected = sorted(
            (i for i, (at, k) in rows.items()
             if (since is None or at >= since) and (until is None or at < until) and (kind is None or k == kind)),
            reverse=True,
        )[:limit]
        got = [r["id"] for r in query_decisions(path, since_s=since, until_s=until, kind=kind, limit=limit)]
        assert got == expected, (since, until, kind, limit)


def test_a_quiet_time_window_costs_the_same_in_a_big_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `kvbudget log --since 10m` on a daemon quiet for 10 minutes: read newest-first
    # through the view, the query went on through every older row (20 s on 3.7 million).
    steps = {"n": 0}
    real_open = decision_query.open_read_only

    def counting_open(path):
        conn = real_open(path)

        def count() -> int:
            steps["n"] += 1
            return 0

        conn.set_progress_handler(count, 100)
        return conn

    monkeypatch.setattr(decision_query, "open_read_only", counting_open)
    costs = {}
    for num_rows in (2_000, 20_000):
        conn = _log_of(tmp_path / f"quiet-{num_rows}.db", num_rows, old_rows=num_rows)
        conn.execute(f"UPDATE {INDEXED} SET logged_at = 3000.0 WHERE id > ?", (num_rows - 3,))
        conn.close()
        steps["n"] = 0
        got = query_decisions(tmp_path / f"quiet-{num_rows}.db", since_s=2500.0)
        assert [r["id"] for r in got] == [num_rows, num_rows - 1, num_rows - 2]
        costs[num_rows] = steps["n"]
    assert costs[20_000] < 1.5 * costs[2_000] + 10, costs  # reading on would cost ~10x


def test_query_opens_read_only(log: DecisionLog, db_path: Path) -> None:
    log.append([make_decision(1)]).result()
    # query_decisions and open_read_only use mode=ro: they can read but never write.
    rows = query_decisions(db_path)
    assert rows[0]["request_id"] == "req-1"
    conn = open_read_only(db_path)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        conn.execute(f"DELETE FROM {INDEXED}")
    conn.close()


# ----------------------------------------------------------------------- other readers
def test_readable_by_sqlite_utils_and_sqlite3_while_the_writer_runs(log: DecisionLog, db_path: Path) -> None:
    log.append([make_decision(seq) for seq in range(5)]).result()
    # The writer is still running (connection open, WAL not checkpointed).
    sqlite_utils_cli = Path(sys.executable).parent / "sqlite-utils"
    out = subprocess.run(
        [str(sqlite_utils_cli), "query", str(db_path), "select count(*) as n from decisions where kind = 'admit'"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout
    assert json.loads(out) == [{"n": 5}]
    conn = sqlite3.connect(db_path)
    assert conn.execute("SELECT count(*) FROM decisions").fetchone()[0] == 5
    conn.close()
    # More writes while a reader holds a read transaction: neither blocks the other.
    reader = sqlite3.connect(db_path, isolation_level=None)
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM decisions").fetchone()[0] == 5
    log.append([make_decision(5)]).result()
    assert reader.execute("SELECT count(*) FROM decisions").fetchone()[0] == 5  # its snapshot
    reader.execute("COMMIT")
    assert reader.execute("SELECT count(*) FROM decisions").fetchone()[0] == 6
    reader.close()
    sqlite3_cli = shutil.which("sqlite3")
    if sqlite3_cli:
        out = subprocess.run([sqlite3_cli, str(db_path), "select count(*) from decisions"],
                             capture_output=True, text=True, check=True, timeout=60).stdout
        assert out.strip() == "6"


def test_checkpoints_run_off_the_commit_path(db_path: Path) -> None:
    with DecisionLog(db_path, checkpoint_interval_s=0.05) as log:
        # The writer's connection never checkpoints inside a commit...
        assert _writer_pragma(log, "wal_autocheckpoint") == 0
        log.append([make_decision(seq) for seq in range(2000)]).result()
        # ...the checkpoint thread copies the WAL into the main file. Wait (bounded) until
        # a fresh connection that ignores the WAL sees the rows in the file itself.
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            probe = sqlite3.connect(f"file:{db_path}?immutable=1", uri=True)  # reads the file only
            try:
                in_file = probe.execute("SELECT count(*) FROM decisions").fetchone()[0]
            except sqlite3.DatabaseError:
                # Not even the schema checkpointed yet, or (immutable: no locks) a page read
                # while the checkpoint was copying it ("malformed"): look again.
                in_file = 0
            finally:
                probe.close()
            if in_file == 2000:
                break
            time.sleep(0.05)
        assert in_file == 2000
    with DecisionLog(db_path, checkpoint_interval_s=None) as log:
        assert _writer_pragma(log, "wal_autocheckpoint") == 1000  # SQLite's default


def _wal_bytes(db_path: Path) -> int:
    wal = Path(f"{db_path}-wal")
    return wal.stat().st_size if wal.exists() else 0


def _fill_wal(db_path: Path, rows: int) -> sqlite3.Connection:
    """A writer that never checkpoints, with `rows` decisions committed into the WAL."""
    with DecisionLog(db_path, checkpoint_interval_s=None):  # the schema, then closed
        pass
    writer = sqlite3.connect(db_path, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")  # (as the daemon's start does: a clean close left it)
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("PRAGMA journal_size_limit=-1")  # the WAL keeps its size when it starts over
    blob = json.dumps([0] * 50)
    for i in range(rows):
        writer.execute(f"INSERT INTO {RECENT} (id, logged_at, kind, request_id, detail) VALUES (?, ?, 'admit', ?, ?)",
                       (i + 1, 1.0, f"r{i}", blob))
    return writer


def _wal_frames(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]


def test_checkpoint_starts_a_wal_past_its_bound_over_and_keeps_every_row(db_path: Path) -> None:
    writer = _fill_wal(db_path, 2000)
    before = _wal_bytes(db_path)
    assert before > 256 * 1024
    conn, page_size = upkeep.connect_checkpointer(db_path)
    assert page_size == 1024
    assert _wal_frames(conn) * page_size > 256 * 1024
    assert upkeep.checkpoint(conn, page_size, wal_reset_bytes=256 * 1024) is True
    assert count_rows(db_path, table=RECENT) == 2000
    # The writer's next commit goes to the start of the WAL: the file does not grow, and
    # it holds that commit's frames only.
    writer.execute(f"INSERT INTO {RECENT} (id, logged_at, kind) VALUES (2001, 1.0, 'admit')")
    assert _wal_bytes(db_path) == before
    assert _wal_frames(conn) <= 4
    assert count_rows(db_path, table=RECENT) == 2001
    conn.close()
    writer.close()


class _CommitsDuringPasses:
    """The checkpointer's connection, with a busy writer: after PASSIVE pass k, `commits[k]`
    one-row commits land (none after the last), as they would while that pass ran.
    Records how many had landed since the last pass when the RESTART came.

    A reader's snapshot spans each pass and its commits, as the commits in flight would:
    without it the first commit after a pass that copied everything starts the WAL over
    by itself, which under a busy writer never happens."""

    def __init__(self, conn: sqlite3.Connection, writer: sqlite3.Connection, first_id: int, commits: list[int]) -> None:
        self.conn, self.writer, self.next_id = conn, writer, first_id
        self.reader = sqlite3.connect(writer.execute("PRAGMA database_list").fetchone()[2], isolation_level=None)
        self.commits = commits
        self.passes = 0
        self.since_last_pass = 0
        self.left_for_restart: int | None = None

    def execute(self, sql: str) -> sqlite3.Cursor:
        if "RESTART" in sql:
            self.left_for_restart = self.since_last_pass
        if "PASSIVE" in sql:
            self.reader.execute("BEGIN")
            self.reader.execute(f"SELECT count(*) FROM {RECENT}").fetchone()
        cursor = self.conn.execute(sql)
        if "PASSIVE" in sql:
            result = cursor.fetchone()
            landing = self.commits[self.passes] if self.passes < len(self.commits) else 0
            self.passes += 1
            for _ in range(landing):
                self.writer.execute(f"INSERT INTO {RECENT} (id, logged_at, kind) VALUES (?, 1.0, 'admit')", (self.next_id,))
                self.next_id += 1
            self.since_last_pass = landing
            self.reader.execute("COMMIT")
            cursor = self.conn.execute("SELECT ?, ?, ?", result)  # the pass's own figures
        return cursor


def test_checkpoint_catches_up_with_commits_made_during_its_passes(db_path: Path) -> None:
    # Every pass finishes (copies all the frames it found), but commits land meanwhile. The
    # RESTART holds every commit off while it copies and syncs what is left, so the passes
    # go on until one finds next to nothing new: 300 commits after the first pass, 30
    # after the second, none after the third. Counting only what each pass copied of what
    # it found, it stopped after one and left the RESTART all 300.
    writer = _fill_wal(db_path, 2000)
    checkpointer, page_size = upkeep.connect_checkpointer(db_path)
    conn = _CommitsDuringPasses(checkpointer, writer, first_id=2001, commits=[300, 30])
    assert upkeep.checkpoint(conn, page_size, wal_reset_bytes=256 * 1024) is True  # type: ignore[arg-type]
    assert conn.passes == 4  # the first, then one per batch of commits, then one that found none
    assert conn.left_for_restart == 0
    writer.execute(f"INSERT INTO {RECENT} (id, logged_at, kind) VALUES (2331, 1.0, 'admit')")
    assert _wal_frames(checkpointer) <= 4  # started over
    assert count_rows(db_path, table=RECENT) == 2331
    conn.reader.close()
    checkpointer.close()
    writer.close()


def test_checkpoint_catch_up_is_bounded_under_endless_commits(db_path: Path) -> None:
    # A writer that never lets up: the passes stop at _CATCH_UP_PASSES and the RESTART
    # takes what the last one left.
    writer = _fill_wal(db_path, 2000)
    checkpointer, page_size = upkeep.connect_checkpointer(db_path)
    conn = _CommitsDuringPasses(checkpointer, writer, first_id=2001, commits=[50] * 100)
    assert upkeep.checkpoint(conn, page_size, wal_reset_bytes=256 * 1024) is True  # type: ignore[arg-type]
    assert conn.passes == 1 + upkeep._CATCH_UP_PASSES
    assert conn.left_for_restart == 50
    assert count_rows(db_path, table=RECENT) == 2000 + 50 * conn.passes
    conn.reader.close()
    checkpointer.close()
    writer.close()


def test_checkpoint_leaves_a_wal_under_its_bound_alone(db_path: Path) -> None:
    writer = _fill_wal(db_path, 200)
    before = _wal_bytes(db_path)
    conn, page_size = upkeep.connect_checkpointer(db_path)
    # Nothing would stop a RESTART here (it would succeed and say True): it is not tried.
    assert upkeep.checkpoint(conn, page_size, wal_reset_bytes=before * 2) is False
    _, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    assert frames == copied > 0  # every frame copied into the file (PASSIVE)
    assert count_rows(db_path, table=RECENT) == 200
    conn.close()
    writer.close()


def test_checkpoint_gives_way_to_a_reader_of_the_old_wal(db_path: Path) -> None:
    writer = _fill_wal(db_path, 2000)
    reader = sqlite3.connect(db_path, isolation_level=None)
    reader.execute("BEGIN")
    assert reader.execute(f"SELECT count(*) FROM {RECENT}").fetchone()[0] == 2000  # holds its snapshot
    writer.execute(f"INSERT INTO {RECENT} (id, logged_at, kind) VALUES (2001, 1.0, 'admit')")
    conn, page_size = upkeep.connect_checkpointer(db_path)
    # The reader's snapshot needs the WAL: the RESTART gives up (after RESET_WAIT_MS) and
    # the writer goes on, appending; nothing is lost on either side.
    frames = _wal_frames(conn)
    assert upkeep.checkpoint(conn, page_size, wal_reset_bytes=256 * 1024) is False
    writer.execute(f"INSERT INTO {RECENT} (id, logged_at, kind) VALUES (2002, 1.0, 'admit')")
    assert _wal_frames(conn) > frames
    assert reader.execute(f"SELECT count(*) FROM {RECENT}").fetchone()[0] == 2000
    reader.execute("COMMIT")
    assert upkeep.checkpoint(conn, page_size, wal_reset_bytes=256 * 1024) is True  # the next round
    writer.execute(f"INSERT INTO {RECENT} (id, logged_at, kind) VALUES (2003, 1.0, 'admit')")
    assert _wal_frames(conn) <= 4
    assert count_rows(db_path, table=RECENT) == 2003
    conn.close()
    reader.close()
    writer.close()


def test_steady_commits_do_not_grow_the_wal_without_bound(db_path: Path) -> None:
    limit = 256 * 1024
    with DecisionLog(db_path, checkpoint_interval_s=0.01, wal_limit_bytes=limit) as log:
        # Commits without a pause: a PASSIVE checkpoint alone never finds the WAL all
        # copied, so it would never start over. Wait (bounded) for the thread to empty it.
        seq = 0
        deadline = time.monotonic() + 60.0
        while log.wal_resets < 2 and time.monotonic() < deadline:
            log.append([make_decision(seq + i) for i in range(200)]).result()
            seq += 200
        assert log.wal_resets >= 2
        log.flush()
        written = seq
    assert count_rows(db_path) == written
    assert count_rows(db_path, table=INDEXED) == written  # closed cleanly: every row folded


def test_figures_are_the_files_sizes_and_the_counts(log: DecisionLog, db_path: Path) -> None:
    log.append([make_decision(seq) for seq in range(50)]).result()
    figures = log.figures()
    assert figures.rows_written == 50
    assert figures.database_bytes == db_path.stat().st_size > 0
    assert figures.wal_bytes == Path(f"{db_path}-wal").stat().st_size > 0
    assert figures.wal_resets == 0


def test_wal_limit_must_be_positive(db_path: Path) -> None:
    with pytest.raises(ValueError, match="wal_limit_bytes"):
        DecisionLog(db_path, wal_limit_bytes=0)


# ----------------------------------------------------------------------- inline commits
def test_append_inline_commits_before_returning(log: DecisionLog, db_path: Path) -> None:
    future = log.append_inline([make_decision(1), make_decision(2)])
    # Already resolved when it comes back: no writer hand-off happened.
    assert future.done() and future.exception() is None
    # ...and committed: a second connection sees both rows.
    assert count_rows(db_path) == 2
    assert log.rows_written == 2 and log.batches_committed == 1


def test_append_inline_queues_behind_a_backlog_and_keeps_order(log: DecisionLog, db_path: Path) -> None:
    blocker = sqlite3.connect(db_path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # the writer cannot commit: appends pile up
    queued = [log.append([make_decision(seq)]) for seq in range(3)]
    inline = log.append_inline([make_decision(3)])
    # Something is queued ahead, so the inline append must not jump it: it queues too.
    assert not inline.done()
    blocker.execute("ROLLBACK")
    blocker.close()
    for future in [*queued, inline]:
        future.result(timeout=10)
    # With the backlog gone, the next one commits inline again, after the others.
    assert log.append_inline([make_decision(4)]).done()
    rows = query_decisions(db_path, limit=None, newest_first=False)
    assert [r["seq"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)


def test_append_inline_over_max_rows_goes_through_the_writer(log: DecisionLog, db_path: Path) -> None:
    future = log.append_inline([make_decision(seq) for seq in range(3)], max_rows=2)
    future.result(timeout=10)
    assert count_rows(db_path) == 3


def test_a_failed_inline_write_fails_its_future_with_decision_log_error(log: DecisionLog, db_path: Path) -> None:
    log.append_inline([make_decision(1)]).result()
    other = break_writes(db_path)
    failed = log.append_inline([make_decision(2)])
    assert failed.done()
    with pytest.raises(DecisionLogError, match="write failed"):
        failed.result()
    mend_writes(other)
    # The log goes on, inline; the failed row goes first (kept, not dropped).
    assert log.append_inline([make_decision(3)]).exception() is None
    assert [r["seq"] for r in query_decisions(db_path, limit=None, newest_first=False)] == [1, 2, 3]


def test_append_inline_refuses_a_closed_log(db_path: Path) -> None:
    decision_log = DecisionLog(db_path)
    decision_log.start()
    decision_log.close()
    with pytest.raises(RuntimeError, match="not running"):
        decision_log.append_inline([make_decision(1)])


# ----------------------------------------------------------------------- folding
def test_commits_land_unindexed_and_are_folded_into_the_indexed_table(db_path: Path) -> None:
    with DecisionLog(db_path, fold_interval_s=3600.0, fold_rows=5) as log:
        log.append_inline([make_decision(1), make_decision(2)]).result()
        # No fold is due yet (2 rows < 5, an hour to go): the rows wait in the recent table,
        # and readers of the view see them all the same.
        assert (count_rows(db_path, table=RECENT), count_rows(db_path, table=INDEXED)) == (2, 0)
        assert count_rows(db_path) == 2
        # 2 + 3 = 5 rows reach fold_rows: the writer folds (bounded wait, no timing asserted).
        log.append([make_decision(seq) for seq in (3, 4, 5)]).result()
        deadline = time.monotonic() + 30.0
        while count_rows(db_path, table=RECENT) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (count_rows(db_path, table=RECENT), count_rows(db_path, table=INDEXED)) == (0, 5)
        assert log.rows_folded == 5
        log.append_inline([make_decision(6)]).result()
        assert count_rows(db_path, table=RECENT) == 1
    # Closing folds the rest: a stopped daemon leaves every row indexed.
    assert (count_rows(db_path, table=RECENT), count_rows(db_path, table=INDEXED)) == (0, 6)
    assert [r["seq"] for r in query_decisions(db_path, limit=None, newest_first=False)] == [1, 2, 3, 4, 5, 6]


def test_a_fold_is_timed_from_the_first_unfolded_commit(db_path: Path) -> None:
    with DecisionLog(db_path, fold_interval_s=0.0) as log:
        # The inline commit wakes the idle writer, which folds once its timer (0 s) is up.
        log.append_inline([make_decision(1)]).result()
        deadline = time.monotonic() + 30.0
        while count_rows(db_path, table=INDEXED) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (count_rows(db_path, table=RECENT), count_rows(db_path, table=INDEXED)) == (0, 1)


def test_readers_see_every_committed_row_exactly_once_while_folds_run(db_path: Path) -> None:
    seen_counts: list[tuple[int, int]] = []
    with DecisionLog(db_path, fold_interval_s=0.0, fold_rows=1) as log:
        reader = sqlite3.connect(db_path, isolation_level=None)
        for seq in range(200):
            # Each commit is followed by a fold racing with the reader: a row counted twice
            # (in both tables) or not at all (in neither) would break count == seq + 1.
            log.append_inline([make_decision(seq)]).result()
            seen_counts.append(reader.execute("SELECT count(*), count(DISTINCT id) FROM decisions").fetchone())
        assert log.rows_folded > 0  # folds really did run meanwhile
        reader.close()
    assert seen_counts == [(n, n) for n in range(1, 201)]


def test_rows_a_crash_left_unfolded_are_folded_at_start_and_ids_go_on(db_path: Path) -> None:
    # A daemon killed between a commit and its fold leaves rows in the recent table.
    log = DecisionLog(db_path, fold_interval_s=3600.0)
    log.start()
    log.append_inline([make_decision(1), make_decision(2)]).result()
    assert count_rows(db_path, table=RECENT) == 2
    with log.store.lock:  # (the writer thread, an hour from its next fold, never uses it again)
        log.store.connection.close()  # no close(): as if the process died here (the WAL keeps the commit)
    with DecisionLog(db_path) as restarted:
        assert (count_rows(db_path, table=RECENT), count_rows(db_path, table=INDEXED)) == (0, 2)
        restarted.append_inline([make_decision(3)]).result()
    rows = query_decisions(db_path, limit=None, newest_first=False)
    assert [(r["id"], r["seq"]) for r in rows] == [(1, 1), (2, 2), (3, 3)]


def make_version_1_log(path: Path, decisions: list[Decision]) -> None:
    """A log as schema version 1 wrote it: one indexed table named `decisions`."""
    from kvbudget.daemon.log.schema import COLUMN_TYPES, decision_row

    conn = sqlite3.connect(path)
    body = ", ".join(f"[{name}] {'INTEGER PRIMARY KEY' if name == 'id' else ''}" for name in COLUMN_TYPES)
    conn.execute(f"CREATE TABLE decisions ({body})")
    for column in INDEXED_COLUMNS:
        conn.execute(f"CREATE INDEX idx_decisions_{column} ON decisions ({column})")
    conn.execute("CREATE TABLE meta ([key] TEXT PRIMARY KEY, [value] TEXT)")
    conn.executemany("INSERT INTO meta VALUES (?, ?)", [("app", "kvbudget"), ("schema_version", "1")])
    marks = ", ".join("?" * len(COLUMN_TYPES))
    conn.executemany(f"INSERT INTO decisions VALUES ({marks})",
                     [decision_row(i + 1, d, 1000.0) for i, d in enumerate(decisions)])
    conn.commit()
    conn.close()


def test_a_version_1_log_is_readable_and_upgraded_in_place_by_the_daemon(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    make_version_1_log(db_path, [make_decision(1), make_decision(2)])
    # Readers (kvbudget log, the Observer service) read it as it is, without changing it.
    assert [r["seq"] for r in query_decisions(db_path, newest_first=False)] == [1, 2]
    conn = sqlite3.connect(db_path)
    with conn:
        conn.execute("UPDATE decisions SET logged_at = 100.0 * seq")
    # Time windows (sparse: read through the one table's time index).
    assert [r["seq"] for r in query_decisions(db_path, since_s=150.0)] == [2]
    assert [r["seq"] for r in query_decisions(db_path, until_s=150.0)] == [1]
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("1",)
    conn.close()
    # The daemon's writer upgrades it: rows and indexes kept, ids go on from 3.
    with DecisionLog(db_path) as log:
        log.append_inline([make_decision(3)]).result()
    conn = sqlite3.connect(db_path)
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("3",)
    indexes = {row[1] for row in conn.execute(f"PRAGMA index_list({INDEXED})")}
    assert indexes == {f"idx_decisions_{column}" for column in INDEXED_COLUMNS}
    conn.close()
    rows = query_decisions(db_path, limit=None, newest_first=False)
    assert [(r["id"], r["seq"]) for r in rows] == [(1, 1), (2, 2), (3, 3)]
    assert decision_from_row(rows[0]) == make_decision(1)


def test_fold_settings_are_checked(db_path: Path) -> None:
    with pytest.raises(ValueError, match="fold_interval_s"):
        DecisionLog(db_path, fold_interval_s=-1)
    with pytest.raises(ValueError, match="fold_rows"):
        DecisionLog(db_path, fold_rows=0)
    with pytest.raises(ValueError, match="fold_chunk_rows"):
        DecisionLog(db_path, fold_chunk_rows=0)
    with pytest.raises(ValueError, match="inline_wait_s"):
        DecisionLog(db_path, inline_wait_s=-1)


def test_a_chunk_fold_moves_exactly_the_rows_below_its_bound(db_path: Path) -> None:
    with DecisionLog(db_path, fold_interval_s=3600.0) as log:
        log.commit_inline([make_decision(seq) for seq in range(1, 8)])  # ids 1..7, unfolded
    # (close() folded them; put them back to fold by hand on the writer's kind of connection)
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute(f"INSERT INTO {RECENT} SELECT * FROM {INDEXED}")
    conn.execute(f"DELETE FROM {INDEXED}")
    upkeep.prepare_fold_below(conn)
    upkeep.fold_below(conn, 4)  # ids 1, 2, 3 move; 4..7 stay
    assert [r for (r,) in conn.execute(f"SELECT id FROM {INDEXED} ORDER BY id")] == [1, 2, 3]
    assert [r for (r,) in conn.execute(f"SELECT id FROM {RECENT} ORDER BY id")] == [4, 5, 6, 7]
    upkeep.fold_below(conn, 8)
    assert (count_rows(db_path, table=INDEXED), count_rows(db_path, table=RECENT)) == (7, 0)
    conn.close()


def test_the_fold_trigger_is_private_to_the_writers_connection(db_path: Path) -> None:
    with DecisionLog(db_path) as log:
        log.commit_inline([make_decision(1)])
        other = sqlite3.connect(db_path)
        names = {name for (name,) in other.execute("SELECT name FROM sqlite_master")}
        other.close()
    # TEMP objects live in the connection's own temp schema, never in the file.
    assert not {n for n in names if "fold" in n}
    assert {"decisions", RECENT, INDEXED, "meta"} <= names


def test_a_fold_in_chunks_leaves_every_row_once(db_path: Path) -> None:
    with DecisionLog(db_path, fold_interval_s=0.0, fold_chunk_rows=3) as log:
        for seq in range(20):
            assert log.commit_inline([make_decision(seq), make_decision(100 + seq)])
        log.flush()
        deadline = time.monotonic() + 30
        while log.rows_folded < 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert log.rows_folded == 40
    rows = query_decisions(db_path, limit=None, newest_first=False)
    assert [r["id"] for r in rows] == list(range(1, 41))


def test_a_fold_takes_the_rows_there_when_it_starts(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Under steady load a commit lands between every two chunks; a fold that chased them
    # would never hand back to the writer's loop (queued batches wait, retention starves).
    from kvbudget.daemon.log.schema import decision_row

    with DecisionLog(db_path, fold_interval_s=3600.0, fold_chunk_rows=1) as log:
        for seq in range(3):
            assert log.commit_inline([make_decision(seq)])  # ids 1..3; no fold due for an hour
        real_fold_below = upkeep.fold_below
        folded_below: list[int] = []

        def fold_then_commit(conn: sqlite3.Connection, below_id: int) -> None:
            real_fold_below(conn, below_id)
            folded_below.append(below_id)
            if len(folded_below) <= 20:  # (bounded: a fold that chased them fails, not hangs)
                log.store.insert([decision_row(log.store.next_id, make_decision(100 + below_id), 0.0)])  # lock held

        monkeypatch.setattr(upkeep, "fold_below", fold_then_commit)
        log.upkeep.fold_chunks(log.store.connection, everything=False)
        assert folded_below == [2, 3, 4]  # one row a chunk, the three there at the start
        assert (log.rows_folded, log.store.unfolded) == (3, 3)  # the three committed meanwhile wait
        monkeypatch.setattr(upkeep, "fold_below", real_fold_below)
    assert count_rows(db_path, table=INDEXED) == 6 and count_rows(db_path, table=RECENT) == 0


def test_an_inline_commit_waits_for_the_writer_rather_than_queue_behind_it(db_path: Path) -> None:
    # The writer holds the connection (a fold chunk, say): commit_inline waits for it
    # (the GIL let go) and commits in the caller's thread; nothing goes through the queue.
    with DecisionLog(db_path, inline_wait_s=60.0) as log:
        log.store.lock.acquire()
        result: list[bool] = []
        caller = threading.Thread(target=lambda: result.append(log.commit_inline([make_decision(1)])))
        caller.start()
        deadline = time.monotonic() + 30
        while not log.store.inline_waiting and time.monotonic() < deadline:
            time.sleep(0.001)
        assert log.store.inline_waiting == 1 and count_rows(db_path) == 0
        log.store.lock.release()
        caller.join()
        assert result == [True] and log.gate.queued == 0
        assert count_rows(db_path) == 1


def test_an_inline_commit_gives_up_after_inline_wait_s_and_writes_nothing(db_path: Path) -> None:
    with DecisionLog(db_path, inline_wait_s=0.01) as log:
        log.store.lock.acquire()
        try:
            assert log.commit_inline([make_decision(1)]) is False  # the caller appends instead
            assert log.store.inline_waiting == 0
        finally:
            log.store.lock.release()
        assert count_rows(db_path) == 0
        log.append([make_decision(1)]).result()
    assert [r["seq"] for r in query_decisions(db_path, limit=None)] == [1]


@pytest.mark.parametrize(
    ("ids", "text"),
    [((), "[]"), (((),), "[[]]"), (((17,),), "[[17]]"), (((1, 2),), "[[1, 2]]"), (((1,), (2, 3)), "[[1], [2, 3]]")],
)
def test_block_ids_per_group_are_stored_as_json_text(ids, text) -> None:
    from kvbudget.daemon.log.schema import _int_list, _nested_int_list

    assert _nested_int_list(ids) == text and json.loads(text) == [list(g) for g in ids]
    assert _int_list((3, 4)) == "[3, 4]" and _int_list(()) == "[]"
    assert _int_list((3, 4)) is _int_list((3, 4))  # remembered


def test_a_new_log_uses_small_pages_and_an_existing_one_keeps_its_own(tmp_path: Path) -> None:
    from kvbudget.daemon.log.store import PAGE_SIZE

    fresh = tmp_path / "fresh.db"
    with DecisionLog(fresh):
        pass
    conn = sqlite3.connect(fresh)
    assert conn.execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE == 1024
    conn.close()
    # A version-1 file made with SQLite's default pages is upgraded, not rebuilt.
    old = tmp_path / "old.db"
    make_version_1_log(old, [make_decision(1)])
    with DecisionLog(old):
        pass
    conn = sqlite3.connect(old)
    assert conn.execute("PRAGMA page_size").fetchone()[0] == 4096
    conn.close()


def test_commit_inline_says_when_the_caller_must_queue_instead(log: DecisionLog, db_path: Path) -> None:
    assert log.commit_inline([make_decision(1)]) is True
    assert count_rows(db_path) == 1
    # Over max_rows: nothing written, the caller appends.
    assert log.commit_inline([make_decision(2), make_decision(3)], max_rows=1) is False
    # Behind a queued append: nothing written (order), the caller appends.
    blocker = sqlite3.connect(db_path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    queued = log.append([make_decision(2)])
    assert log.commit_inline([make_decision(3)]) is False
    blocker.execute("ROLLBACK")
    blocker.close()
    queued.result(timeout=10)
    # A failed write raises, names the file, and writes nothing; the row waits its turn.
    other = break_writes(db_path)
    with pytest.raises(DecisionLogError, match="decisions.db: write failed"):
        log.commit_inline([make_decision(99)])
    assert [r["seq"] for r in query_decisions(db_path, limit=None, newest_first=False)] == [1, 2]
    mend_writes(other)
    assert log.write_unwritten() is True
    assert [r["seq"] for r in query_decisions(db_path, limit=None, newest_first=False)] == [1, 2, 99]


@pytest.mark.parametrize("num_rows", [1, 2, 8, 9, 15, 16, 17, 127, 128, 129, 300, 512, 1000, 1024, 1025, 2500])
def test_a_large_commit_is_cut_into_bounded_statements_and_keeps_every_row_in_order(
    db_path: Path, num_rows: int
) -> None:
    from kvbudget.daemon.log.rows import CHUNK_ROWS, INSERT_SQL, SMALL_ROWS, chunk_sizes

    sizes = chunk_sizes(num_rows)
    assert sum(sizes) == num_rows and all(size in INSERT_SQL for size in sizes)
    assert all(size <= CHUNK_ROWS for size in sizes)
    if num_rows <= SMALL_ROWS:
        assert sizes == [num_rows]  # one statement: no BEGIN / COMMIT needed
    with DecisionLog(db_path) as log:
        assert log.commit_inline([make_decision(seq) for seq in range(num_rows)], max_rows=num_rows)
        assert log.batches_committed == 1  # one transaction, however many statements
    rows = query_decisions(db_path, limit=None, newest_first=False)
    assert [(r["id"], r["seq"]) for r in rows] == [(seq + 1, seq) for seq in range(num_rows)]


def testchunk_sizes_by_hand() -> None:
    from kvbudget.daemon.log.rows import chunk_sizes

    assert chunk_sizes(5) == [5]  # up to 8 rows: one statement of exactly that many
    assert chunk_sizes(9) == [8, 1]  # 9 = 8 + 1
    assert chunk_sizes(100) == [64, 32, 4]  # 100 = 64 + 32 + 4
    assert chunk_sizes(300) == [256, 32, 8, 4]  # 300 = 256 + 32 + 8 + 4
    assert chunk_sizes(512) == [512]  # a batched engine step (256 submits + 256 finishes): one statement
    assert chunk_sizes(2500) == [1024, 1024, 256, 128, 64, 4]  # 2 x 1024 + 452


def _ids(path: Path, table: str) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        return [row[0] for row in conn.execute(f"SELECT id FROM {table} ORDER BY id")]
    finally:
        conn.close()


def test_commits_past_the_unfolded_bound_wait_for_the_fold(db_path: Path) -> None:
    # No fold is due for an hour: only the bound makes the writer fold.
    with DecisionLog(db_path, max_unfolded_rows=100, fold_interval_s=3600.0, fold_rows=10**6,
                     fold_chunk_rows=16, checkpoint_interval_s=None) as log:
        assert log.commit_inline([make_decision(seq) for seq in range(60)])
        assert log.commit_inline([make_decision(seq) for seq in range(60, 120)])  # 60 < 100 before it
        # 120 unfolded: the next commit may not go inline...
        assert log.commit_inline([make_decision(120)]) is False
        assert (log.rows_written, log.rows_folded, log.stalls) == (120, 0, 0)  # ...and wrote nothing
        # ...it queues, and the writer folds 120 - 100 + 1 = 21 rows (chunks of 16, then 5)
        # before committing it: 99 unfolded, then 100 with it.
        log.append([make_decision(120)]).result()
        assert (log.rows_written, log.rows_folded, log.stalls) == (121, 21, 1)
        assert log.stall_seconds > 0
        assert _ids(db_path, INDEXED) == list(range(1, 22))
        assert _ids(db_path, RECENT) == list(range(22, 122))
        assert log.commit_inline([make_decision(121)]) is False  # 100 unfolded: still at the bound
        # One row over the bound: a whole chunk is folded (100 -> 84), then 50 rows go in (134).
        log.append([make_decision(seq) for seq in range(121, 171)]).result()
        assert (log.rows_written, log.rows_folded, log.stalls) == (171, 37, 2)
        # 134 - 100 + 1 = 35 rows over: all of them folded (16, 16, 3) before the next commit.
        log.append([make_decision(171)]).result()
        assert (log.rows_written, log.rows_folded, log.stalls) == (172, 72, 3)
        figures = log.figures()
        assert (figures.stalls, figures.stall_seconds) == (3, log.stall_seconds)
    assert _ids(db_path, INDEXED) == list(range(1, 173))  # closed: every row folded, none lost


@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=25))
def test_the_unfolded_rows_stay_within_the_bound_and_every_row_is_kept(batches: list[int]) -> None:
    # Whatever the steps, as many rows are committed as were sent, in order, and a commit
    # never leaves more than the bound + its own rows - 1 unfolded (the writer folds below
    # the bound before it commits past it).
    bound = 50
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "decisions.db"
        with DecisionLog(path, max_unfolded_rows=bound, fold_interval_s=3600.0, fold_rows=10**6,
                         fold_chunk_rows=7, checkpoint_interval_s=None) as log:
            sent = 0
            for size in batches:
                log.append_inline([make_decision(sent + i) for i in range(size)]).result()
                sent += size
                assert log.rows_written == sent
                assert log.rows_written - log.rows_folded <= bound - 1 + size
        assert _ids(path, INDEXED) == list(range(1, sent + 1))
        assert count_rows(path, table=RECENT) == 0


def test_max_unfolded_rows_must_be_positive(db_path: Path) -> None:
    with pytest.raises(ValueError, match="max_unfolded_rows"):
        DecisionLog(db_path, max_unfolded_rows=0)


def test_a_stop_folds_but_leaves_retention_to_the_next_start(db_path: Path) -> None:
    # Retention is due on every pass of the writer, and the last batch arrives with the stop:
    # the stop folds it (a cleanly closed log has every row indexed) but purges nothing.
    log = DecisionLog(db_path, max_rows=10, retention_interval_s=0.0, checkpoint_interval_s=None)
    log.start()
    # The writer waits for the connection: in its first retention pass (due at once), or with
    # the first batch taken. (Waiting here for it to take that batch waited out the deadline:
    # the pass comes first.) Either way the last batch and the stop queue up behind it.
    log.store.lock.acquire()
    log.append([make_decision(0)])
    deadline = time.monotonic() + 30.0
    log.append([make_decision(seq) for seq in range(1, 101)])
    closer = threading.Thread(target=log.close)
    closer.start()
    while not log.gate.closed and time.monotonic() < deadline:  # the batch, then the stop
        time.sleep(0.001)
    with log.gate.lock:  # (the stop is queued under it)
        pass
    log.store.lock.release()
    closer.join()
    assert _ids(db_path, INDEXED) == list(range(1, 102))
    with DecisionLog(db_path, max_rows=10, checkpoint_interval_s=None) as reopened:
        reopened.flush()
        deadline = time.monotonic() + 30.0
        while count_rows(db_path) > 10 and time.monotonic() < deadline:  # the first pass, at start
            time.sleep(0.01)
    assert _ids(db_path, INDEXED) == list(range(92, 102))


def test_commits_wait_for_a_retention_that_owes_past_the_bound(db_path: Path) -> None:
    # One pass at start (nothing to purge), then none for an hour: only a stall purges.
    # (By age: a fold past a row bound would start a pass at once.)
    with DecisionLog(db_path, retention_s=3600.0, retention_interval_s=3600.0, retention_chunk_rows=4,
                     max_unfolded_rows=20, fold_interval_s=0.0, checkpoint_interval_s=None) as log:
        log.append([make_decision(seq) for seq in range(100)]).result()
        deadline = time.monotonic() + 30.0
        while log.rows_folded < 100 and time.monotonic() < deadline:  # folded right after
            time.sleep(0.001)
        update_rows(db_path, "logged_at = ?", [(0.0,)])  # every row is past the age bound now
        assert (log.rows_folded, log.rows_deleted, log.stalls) == (100, 0, 0)
        log.upkeep.owe(50)  # as a retention that fell behind under load would owe
        assert log.commit_inline([make_decision(100)]) is False  # owed past the bound
        # Before committing it, the writer purges the batch's 1 row and a chunk (4), in chunks
        # of 4: 8 rows, 50 -> 42 owed. Each batch so pays off a little of what is owed, where
        # paying it all at once (down to the bound) would hold that one Step for long.
        log.append([make_decision(100)]).result()
        assert (log.rows_deleted, log.stalls, log.upkeep.purge_owed) == (8, 1, 42)
        assert _ids(db_path, INDEXED)[0] == 9
        for seq in range(101, 104):  # 42 -> 34 -> 26 -> 18
            assert log.commit_inline([make_decision(seq)]) is False
            log.append([make_decision(seq)]).result()
        assert (log.rows_deleted, log.stalls, log.upkeep.purge_owed) == (32, 4, 18)
        assert log.commit_inline([make_decision(104)])  # under the bound again: inline
    assert _ids(db_path, INDEXED) == list(range(33, 106))


def test_a_writer_that_stops_on_an_error_fails_every_commit_instead_of_hanging(
    db_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    told: list[str] = []
    stopped = threading.Event()
    log = DecisionLog(db_path, checkpoint_interval_s=None,
                      on_failure=lambda why: (told.append(why), stopped.set()))
    log.start()
    log.append([make_decision(0)]).result()

    class Broken:  # a decision whose row cannot be made: a bug, not an SQLite error (those are handled)
        @property
        def seq(self) -> int:
            raise RuntimeError("boom")

    log.store.lock.acquire()  # the writer takes the next batch, then waits for the connection
    in_flight = log.append([Broken()])  # type: ignore[list-item]
    deadline = time.monotonic() + 30.0
    while not log.gate.queue.empty() and time.monotonic() < deadline:
        time.sleep(0.001)
    queued = log.append([make_decision(2)])
    log.store.lock.release()
    assert stopped.wait(30.0)  # the writer stopped, and said so last
    for future in (in_flight, queued):  # told at once, not left waiting
        with pytest.raises(DecisionLogError, match="writer stopped: RuntimeError"):
            future.result(timeout=0)
    with pytest.raises(DecisionLogError, match="writer stopped"):
        log.append([make_decision(3)])
    with pytest.raises(DecisionLogError, match="writer stopped"):
        log.commit_inline([make_decision(3)])
    assert "decision log writer stopped" in caplog.text
    assert len(told) == 1 and "writer stopped: RuntimeError('boom')" in told[0]  # the daemon stops on it
    log.flush()  # nothing is left waiting: a stop's flush goes through
    log.close()
    assert _ids(db_path, "decisions") == [1]  # the one committed before; nothing else claimed


def _journal_mode(db_path: Path) -> str:
    reader = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return reader.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        reader.close()


def test_a_clean_close_leaves_the_file_out_of_wal_mode_and_a_start_puts_it_back(db_path: Path) -> None:
    """SQLite opens a WAL-mode file read-only only through its `-shm`, which a clean close
    deletes and a reader who may not write the directory cannot make again: the stopped
    daemon's log would be unreadable to an operator with read permission on the file. So a
    clean close leaves rollback-journal mode ("delete"), and a start WAL mode again."""
    with DecisionLog(db_path) as log:
        log.append([make_decision(1)]).result()
    assert not Path(f"{db_path}-wal").exists() and not Path(f"{db_path}-shm").exists()
    assert _journal_mode(db_path) == "delete"
    with DecisionLog(db_path) as log:
        assert _writer_pragma(log, "journal_mode") == "wal"
        log.append([make_decision(2)]).result()
        assert _journal_mode(db_path) == "wal"  # (a reader while it runs sees WAL mode)
    assert _journal_mode(db_path) == "delete"
    assert [r["seq"] for r in query_decisions(db_path, newest_first=False)] == [1, 2]


def test_a_reader_open_at_the_close_keeps_wal_mode_and_every_row(db_path: Path) -> None:
    """The switch out of WAL mode is best effort: a reader mid-read keeps the file in WAL
    mode, and the close neither waits for it long nor loses a row."""
    with DecisionLog(db_path) as log:
        log.append([make_decision(1)]).result()
        reader = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True)
        reader.execute("BEGIN")
        reader.execute(f"SELECT count(*) FROM {VIEW}").fetchone()  # a read transaction held
    try:
        assert reader.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        reader.close()
    assert [r["seq"] for r in query_decisions(db_path, newest_first=False)] == [1]
