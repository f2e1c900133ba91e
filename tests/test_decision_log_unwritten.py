"""A write that fails (a full disk) keeps its decisions and writes them first once it can.

The disk is "filled" the way SQLite sees a full disk: `PRAGMA max_page_count` pinned to
the file's current size on the log's own connection, so a write that needs a new page
fails with SQLITE_FULL ("database or disk is full"), folds and purges included.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbudget.daemon.log.decision_log import DecisionLog
from kvbudget.daemon.log.query import query_decisions
from kvbudget.daemon.log.schema import DecisionLogError
from kvbudget.daemon.log.unwritten import UnwrittenError

from full_disk import fill
from test_decision_log import make_decision


class Disk:
    """Fills and empties the disk under one DecisionLog, as SQLite would see it."""

    def __init__(self, log: DecisionLog) -> None:
        self.log = log
        with self._cursor() as cursor:
            self.room = cursor.execute("PRAGMA max_page_count").fetchone()[0]

    @contextlib.contextmanager
    def _cursor(self):
        with self.log.store.lock:  # (the connection has one user at a time)
            yield self.log.store.connection

    def fill(self) -> None:
        with self._cursor() as cursor:
            pages = cursor.execute("PRAGMA page_count").fetchone()[0]
            cursor.execute(f"PRAGMA max_page_count={pages}")

    def empty(self) -> None:
        with self._cursor() as cursor:
            cursor.execute(f"PRAGMA max_page_count={self.room}")


def seqs(db_path: Path) -> list[int]:
    rows = query_decisions(db_path, limit=None, newest_first=False)
    ids = [r["id"] for r in rows]
    assert ids == list(range(1, len(ids) + 1))  # no gap, no reuse
    return [r["seq"] for r in rows]


def batch(first: int, count: int) -> list:
    """Decisions big enough that a batch of them needs pages the full disk does not have."""
    block_ids = (tuple(range(1, 76)),)
    return [make_decision(seq, new_block_ids=block_ids, blocks_held=(75,)) for seq in range(first, first + count)]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "decisions.db"


@pytest.fixture
def troubles() -> list:
    return []


@pytest.fixture
def log(db_path: Path, troubles: list):
    decision_log = DecisionLog(db_path, unwritten_retry_s=3600.0, on_write_trouble=troubles.append)
    decision_log.start()
    yield decision_log
    decision_log.close()


def test_a_write_to_a_full_disk_keeps_its_decisions_and_the_next_write_puts_them_first(
    log: DecisionLog, db_path: Path, troubles: list
) -> None:
    log.commit_inline([make_decision(0)])
    disk = Disk(log)
    disk.fill()
    with pytest.raises(UnwrittenError, match="database or disk is full") as first:
        log.commit_inline(batch(1, 100))
    assert log.num_unwritten == 100
    # A later write, disk still full: refused too, and kept behind the first.
    with pytest.raises(UnwrittenError) as second:
        log.commit_inline(batch(101, 100))
    assert second.value.written is first.value.written  # one spell, written together
    figures = log.figures()
    assert (figures.num_unwritten, figures.unwritten_since_unix_s > 0) == (200, True)
    assert "database or disk is full" in figures.write_error
    assert seqs(db_path) == [0]
    assert log.write_unwritten() is False  # still full
    assert not first.value.written.done()
    disk.empty()
    log.commit_inline([make_decision(201)])
    assert seqs(db_path) == list(range(202))  # the kept ones first, in the order made
    assert first.value.written.result(timeout=0) is None
    assert log.num_unwritten == 0 and log.figures().write_error == ""
    assert troubles == [f"{db_path}: write failed: database or disk is full", None]  # once each way


def test_the_writer_retries_by_itself_once_there_is_room(db_path: Path, troubles: list) -> None:
    with DecisionLog(db_path, unwritten_retry_s=0.05, on_write_trouble=troubles.append) as log:
        log.commit_inline([make_decision(0)])
        disk = Disk(log)
        disk.fill()
        with pytest.raises(UnwrittenError) as failed:
            log.commit_inline(batch(1, 100))
        disk.empty()
        assert failed.value.written.result(timeout=30) is None  # nobody wrote meanwhile: the writer did
        assert log.num_unwritten == 0
        assert seqs(db_path) == list(range(101))
        assert troubles[-1] is None


def test_a_queued_batch_that_fails_keeps_its_place_before_later_ones(log: DecisionLog, db_path: Path) -> None:
    log.append(batch(0, 1)).result(timeout=10)
    disk = Disk(log)
    disk.fill()
    with pytest.raises(UnwrittenError):
        log.append(batch(1, 100)).result(timeout=10)
    later = log.append(batch(101, 100))  # behind the kept ones, and the disk still full
    with pytest.raises(UnwrittenError):
        later.result(timeout=10)
    disk.empty()
    log.append(batch(201, 1)).result(timeout=10)
    assert seqs(db_path) == list(range(202))


def test_closing_with_decisions_unwritten_says_they_are_lost(db_path: Path, caplog) -> None:
    log = DecisionLog(db_path, unwritten_retry_s=3600.0)
    log.start()
    log.commit_inline([make_decision(0)])
    Disk(log).fill()
    with pytest.raises(UnwrittenError) as failed:
        log.commit_inline(batch(1, 100))
    log.close()
    assert "100 decisions were never written" in caplog.text
    with pytest.raises(DecisionLogError, match="closed before they could be written"):
        failed.value.written.result(timeout=0)
    assert seqs(db_path) == [0]


def test_readers_see_every_written_row_while_writes_fail(log: DecisionLog, db_path: Path) -> None:
    """Readers (kvbudget log, sqlite3) see every written row while writes fail."""
    log.commit_inline(batch(0, 10))
    Disk(log).fill()
    with pytest.raises(UnwrittenError):
        log.commit_inline(batch(10, 100))
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        assert conn.execute("SELECT count(*) FROM decisions").fetchone() == (10,)
    finally:
        conn.close()


def test_a_transaction_that_fails_on_a_really_full_disk_says_why(small_disk: Path) -> None:
    """On a full disk the COMMIT of a many-statement write fails and SQLite has rolled the
    transaction back already; the error is the disk's, not the ROLLBACK's that followed."""
    db_path = small_disk / "decisions.db"
    with DecisionLog(db_path, unwritten_retry_s=3600.0) as log:
        log.commit_inline([make_decision(0)])
        fill(small_disk)
        with pytest.raises(UnwrittenError, match="database or disk is full"):
            log.commit_inline(batch(1, 100))  # (100 rows: statements of 64, 32 and 4 in one transaction)
        assert log.num_unwritten == 100
        (small_disk / "filler").unlink()
        assert log.write_unwritten() is True
        assert seqs(db_path) == list(range(101))


# Each step: ("write", how many, inline?) / ("fill",) / ("empty",) / ("retry",)
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(1, 60), st.booleans()),
        st.just(("fill",)),
        st.just(("empty",)),
        st.just(("retry",)),
    ),
    max_size=12,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=_steps)
def test_the_file_and_the_kept_decisions_are_always_every_decision_in_order(tmp_path: Path, steps) -> None:
    """After any mix of writes on a full or roomy disk: rows in the file, then the ones
    kept, are exactly the decisions made, in order; and a write or retry on a roomy disk
    leaves none kept."""
    db_path = tmp_path / f"prop-{time.monotonic_ns()}.db"
    with DecisionLog(db_path, unwritten_retry_s=3600.0) as log:
        disk = Disk(log)
        made = 0
        full = False
        for step in steps:
            if step[0] == "fill":
                disk.fill()
                full = True
            elif step[0] == "empty":
                disk.empty()
                full = False
            elif step[0] == "retry":
                assert log.write_unwritten() or full
            else:
                _, count, inline = step
                decisions = batch(made, count)
                made += count
                try:
                    if not inline or not log.commit_inline(decisions):
                        log.append(decisions).result(timeout=10)
                except UnwrittenError:
                    assert full  # only a full disk refuses (a small write may still fit)
            kept = [d.seq for d in log.store.unwritten.decisions]
            assert seqs(db_path) + kept == list(range(made))
            assert log.num_unwritten == len(kept)
            if not full and step[0] in ("write", "retry"):
                assert kept == []
        disk.empty()
        assert log.write_unwritten()
        assert seqs(db_path) == list(range(made))
