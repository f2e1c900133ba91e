"""The decision log's WAL file removed or replaced while the daemon has it open.

The daemon's connections keep committing into the unlinked WAL through their descriptors;
a reader opening the file finds no WAL, or another file, at `<db>-wal` and cannot see what
was committed since the last checkpoint (it gets an I/O error or a "malformed" database),
and those decisions are gone when the daemon dies. The log's own connection can still read
every frame, so the next write heals the log: checkpoints everything, opens a new WAL, and
commits there. Each test reads the file the way an outside tool does: a fresh sqlite3
connection.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

import pytest

from kvbudget.daemon.log import files
from kvbudget.daemon.log.decision_log import DecisionLog
from kvbudget.daemon.log.unwritten import UnwrittenError

from test_decision_log import make_decision


@pytest.fixture
def check_every_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """The files are checked on every write (the daemon checks at most every FILE_CHECK_S),
    and a heal that failed is tried again at the next write."""
    monkeypatch.setattr(files, "FILE_CHECK_S", 0.0)


def outside_seqs(path: Path) -> list[int]:
    """Every decision's seq as a new reader (an sqlite3 shell, `kvbudget log`) sees the file,
    after checking that the file is whole and the ids run 1, 2, ... (none lost or repeated)."""
    reader = sqlite3.connect(path)
    try:
        assert reader.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        rows = reader.execute("SELECT id, seq FROM decisions ORDER BY id").fetchall()
    finally:
        reader.close()
    assert [row_id for row_id, _ in rows] == list(range(1, len(rows) + 1))
    return [seq for _, seq in rows]


def wal_of(path: Path) -> Path:
    return Path(f"{path}-wal")


def log_with_one_decision_in_the_file(path: Path, **options: object) -> DecisionLog:
    """A started log whose file holds decision 1 (written and checkpointed by an earlier
    run), so a reader that cannot see the WAL still sees that one."""
    with DecisionLog(path) as first_run:
        assert first_run.commit_inline([make_decision(1)])
    log = DecisionLog(path, unwritten_retry_s=3600.0, **options)  # type: ignore[arg-type]
    log.start()
    return log


def test_a_removed_wal_is_healed_and_every_acknowledged_decision_stays_readable(
    tmp_path: Path, check_every_write: None, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "decisions.db"
    # No checkpoint before close (hour-long interval): decisions 2-4 are in the WAL only.
    log = log_with_one_decision_in_the_file(path, checkpoint_interval_s=3600.0)
    try:
        assert log.commit_inline([make_decision(2)])
        assert log.commit_inline([make_decision(3)])
        log.append([make_decision(4)]).result(timeout=30)  # (through the writer thread)
        wal_of(path).unlink()
        with caplog.at_level(logging.WARNING, logger="kvbudget.daemon.log.decision_log"):
            assert log.commit_inline([make_decision(5)])  # heals first, then commits
        log.append([make_decision(6)]).result(timeout=30)
        assert log.num_unwritten == 0
        assert wal_of(path).exists()
        new_wal = wal_of(path).stat().st_ino
        # 1 from the first run, 2-4 checkpointed out of the removed WAL, 5-6 since
        assert outside_seqs(path) == [1, 2, 3, 4, 5, 6]
        # The new WAL is the one the log writes to: a reader sees a commit made now.
        assert log.commit_inline([make_decision(7)])
        log.append([make_decision(8)]).result(timeout=30)
        assert outside_seqs(path) == [1, 2, 3, 4, 5, 6, 7, 8]
        assert wal_of(path).stat().st_ino == new_wal
    finally:
        log.close()
    assert outside_seqs(path) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert f"the WAL file {os.path.abspath(path)}-wal was removed while the daemon had it open" in caplog.text


def test_a_wal_replaced_by_another_file_is_healed(tmp_path: Path, check_every_write: None) -> None:
    path = tmp_path / "decisions.db"
    log = log_with_one_decision_in_the_file(path, checkpoint_interval_s=3600.0)
    try:
        assert log.commit_inline([make_decision(2)])
        assert log.commit_inline([make_decision(3)])
        wal_of(path).unlink()
        wal_of(path).write_bytes(b"not a WAL\n" * 1000)  # (a cleanup script's placeholder, a copy...)
        assert log.commit_inline([make_decision(4)])
        assert outside_seqs(path) == [1, 2, 3, 4]
        assert log.commit_inline([make_decision(5)])
        log.append([make_decision(6)]).result(timeout=30)
        assert outside_seqs(path) == [1, 2, 3, 4, 5, 6]
    finally:
        log.close()
    assert outside_seqs(path) == [1, 2, 3, 4, 5, 6]


def commit_until_the_wal_starts_over(log: DecisionLog, first_seq: int, times: int) -> int:
    """Commits decisions first_seq, first_seq + 1, ... until the checkpoint thread has started
    the WAL over `times` times more; returns the last seq."""
    resets_before = log.wal_resets
    for seq in range(first_seq, first_seq + 100_000):  # (the bound only ends a hang)
        assert log.commit_inline([make_decision(seq)])
        if log.wal_resets >= resets_before + times:
            return seq
    pytest.fail("the WAL never started over")


def test_the_checkpoint_thread_goes_on_with_the_new_wal(tmp_path: Path, check_every_write: None) -> None:
    path = tmp_path / "decisions.db"
    # A checkpoint every 10 ms that starts the WAL over past 4 KiB (4 pages of 1 KiB): a few
    # commits are enough. A checkpointer still on the removed WAL could copy nothing from it
    # (the heal truncated it: every round fails with an I/O error), and the WAL would never
    # start over again.
    log = log_with_one_decision_in_the_file(path, checkpoint_interval_s=0.01, wal_limit_bytes=4096)
    try:
        last = commit_until_the_wal_starts_over(log, 2, times=1)  # (the checkpointer has the WAL open)
        wal_of(path).unlink()
        assert log.commit_inline([make_decision(last + 1)])  # heals
        # Twice: rounds after the heal, not only one that may have been under way.
        last = commit_until_the_wal_starts_over(log, last + 2, times=2)
        assert wal_of(path).exists()
        assert outside_seqs(path) == list(range(1, last + 1))
    finally:
        log.close()
    assert outside_seqs(path) == list(range(1, last + 1))


def test_while_a_reader_holds_the_removed_wal_writes_fail_and_go_through_once_it_is_gone(
    tmp_path: Path, check_every_write: None
) -> None:
    path = tmp_path / "decisions.db"
    log = log_with_one_decision_in_the_file(path, checkpoint_interval_s=3600.0)
    try:
        assert log.commit_inline([make_decision(2)])
        reader = sqlite3.connect(path, isolation_level=None)
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM decisions").fetchone() == (2,)  # its snapshot: 1, 2
        wal_of(path).unlink()
        # The checkpoint cannot get past the reader's snapshot: nothing is acknowledged
        # into a WAL nobody else can read; the decisions are kept.
        with pytest.raises(UnwrittenError, match="was removed while the daemon had it open"):
            log.commit_inline([make_decision(3)])
        failed = log.append([make_decision(4)])
        with pytest.raises(UnwrittenError):
            failed.result(timeout=30)
        assert log.num_unwritten == 2
        reader.execute("COMMIT")
        reader.close()
        assert log.write_unwritten()
        assert log.num_unwritten == 0
        assert log.commit_inline([make_decision(5)])
        assert outside_seqs(path) == [1, 2, 3, 4, 5]
    finally:
        log.close()
    assert outside_seqs(path) == [1, 2, 3, 4, 5]


def test_a_new_log_holds_its_tables_in_the_file_itself(tmp_path: Path) -> None:
    # Before the first checkpoint a new log's schema was only in its WAL: with the WAL
    # removed (and no write since to heal it), a reader found "no meta table", no log at all.
    from kvbudget.daemon.log.query import open_read_only, query_decisions

    path = tmp_path / "decisions.db"
    log = DecisionLog(path, checkpoint_interval_s=3600.0)  # (no checkpoint of the thread's)
    log.start()
    try:
        wal_of(path).unlink()
        open_read_only(path).close()  # a KVBudget log, though empty
        assert query_decisions(path) == []
    finally:
        log.close()

