"""Retention by size: the decision log's file stops growing at about `max_bytes`.

The row limit a byte bound sets is worked out on each pass from the file's pages in use
and the rows it holds (upkeep.rows_within_bytes), so it follows what rows
really cost: an ADMIT carries its request's whole block table, so rows range from ~300
bytes to several KiB.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbudget.daemon.log import upkeep
from kvbudget.daemon.log.decision_log import DecisionLog
from kvbudget.daemon.log.schema import INDEXED, RECENT
from kvbudget.daemon.core.records import Decision, DecisionKind, Reason, new_decision


def admit(seq: int, num_blocks: int) -> Decision:
    """An ADMIT whose row holds a block table of `num_blocks` ids (its size varies with it)."""
    return new_decision(
        seq, float(seq), DecisionKind.ADMIT, Reason.FITS, f"cmpl-{seq:08d}-{'x' * 24}", "engine-0", "",
        "optimistic", 16 * num_blocks, 16, 16 * num_blocks, 0, (num_blocks,), (num_blocks,),
        (tuple(range(1000, 1000 + num_blocks)),), 0, 0, 5000, 0, 1, "",
    )


def batch(first_seq: int, size: int) -> list[Decision]:
    return [admit(seq, 1 + seq % 40) for seq in range(first_seq, first_seq + size)]


def page_figures(conn: sqlite3.Connection) -> tuple[int, int, int]:
    return tuple(conn.execute(f"PRAGMA {name}").fetchone()[0] for name in ("page_size", "page_count", "freelist_count"))


def used_bytes(conn: sqlite3.Connection) -> int:
    page_size, page_count, free_pages = page_figures(conn)
    return (page_count - free_pages) * page_size


def ids(conn: sqlite3.Connection) -> list[int]:
    return [row[0] for row in conn.execute("SELECT id FROM decisions ORDER BY id")]


def a_log_of(path: Path, num_rows: int) -> sqlite3.Connection:
    with DecisionLog(path) as log:  # no limits; close() folds every row
        for first in range(0, num_rows, 500):
            log.append(batch(first, min(500, num_rows - first))).result()
    return sqlite3.connect(path, isolation_level=None)


def expected_rows(conn: sqlite3.Connection, rows: int, bound: int) -> int:
    """rows_within_bytes by hand: the rows held, scaled by what the bound leaves past an
    empty log's pages (page 1, a root page per table and index), aiming 2% under it."""
    page_size = page_figures(conn)[0]
    (trees,) = conn.execute("SELECT count(*) FROM sqlite_master WHERE rootpage > 0").fetchone()
    assert trees == 10  # meta (+ its key's index), decisions_indexed, its 6 indexes, decisions_recent
    fixed = (trees + 1) * page_size
    return rows * (bound * 49 // 50 - fixed) // (used_bytes(conn) - fixed)


def test_rows_within_bytes_is_the_rows_held_scaled_by_the_bound(tmp_path: Path) -> None:
    conn = a_log_of(tmp_path / "scale.db", 3000)
    used = used_bytes(conn)
    assert upkeep.oldest_id(conn) == 1 and upkeep.newest_id(conn) == 3000
    assert upkeep.rows_within_bytes(conn, used) is None  # at the bound: nothing to delete
    assert upkeep.rows_within_bytes(conn, 10 * used) is None
    half = upkeep.rows_within_bytes(conn, used // 2)
    assert half == expected_rows(conn, 3000, used // 2)
    assert 1400 < half < 1500  # a little under half: the fixed pages stay, and the 2% margin
    assert upkeep.rows_within_bytes(conn, used // 4) == expected_rows(conn, 3000, used // 4)
    assert upkeep.rows_within_bytes(conn, 4096) == 0  # under an empty log's pages: every row goes
    # Ids stay contiguous (retention deletes the oldest only), so the rows held are
    # newest - oldest + 1 whatever was deleted before.
    conn.execute(f"DELETE FROM {INDEXED} WHERE id <= 1000")
    assert upkeep.oldest_id(conn) == 1001
    after = used_bytes(conn)
    assert upkeep.rows_within_bytes(conn, after // 2) == expected_rows(conn, 2000, after // 2)
    conn.close()


def test_an_empty_log_or_one_with_only_unfolded_rows(tmp_path: Path) -> None:
    with DecisionLog(tmp_path / "empty.db"):
        pass
    conn = sqlite3.connect(tmp_path / "empty.db", isolation_level=None)
    assert upkeep.oldest_id(conn) == 0
    assert upkeep.rows_within_bytes(conn, 1) is None  # no rows: nothing a purge could do
    conn.execute(f"INSERT INTO {RECENT} (id, logged_at, seq) VALUES (7, 1.0, 1), (8, 1.0, 2)")
    assert (upkeep.oldest_id(conn), upkeep.newest_id(conn)) == (7, 8)
    conn.close()


@pytest.mark.parametrize("share", [2, 4])
def test_a_purge_brings_the_pages_in_use_under_the_bound_keeping_the_newest(tmp_path: Path, share: int) -> None:
    path = tmp_path / f"half-{share}.db"
    conn = a_log_of(path, 4000)
    bound = used_bytes(conn) // share
    purger = DecisionLog(path, max_bytes=bound, retention_chunk_rows=256)
    passes = 0
    while purger.apply_retention(conn):
        passes += 1
        assert passes < 100
    kept = ids(conn)
    assert kept == list(range(kept[0], 4001))  # the newest, contiguous; the oldest went
    assert used_bytes(conn) <= bound
    while purger.apply_retention(conn):  # the next interval's pass: under the bound, nothing to do
        pass
    assert used_bytes(conn) <= bound
    kept = ids(conn)
    assert kept == list(range(kept[0], 4001))
    # Rows cost about the same throughout, so about 1 / share of them stay (a little less:
    # the purge aims 2% under the bound, and an empty log's pages stay).
    assert 4000 / share * 0.85 <= len(kept) <= 4000 / share
    assert purger.rows_deleted == 4000 - len(kept)
    conn.close()


def test_the_tighter_of_rows_and_bytes_applies(tmp_path: Path) -> None:
    path = tmp_path / "both.db"
    conn = a_log_of(path, 2000)
    bound = used_bytes(conn) // 2  # about 1,000 rows
    by_rows = DecisionLog(path, max_rows=300, max_bytes=bound, retention_chunk_rows=5000)
    assert by_rows.apply_retention(conn) is False
    assert ids(conn) == list(range(1701, 2001))  # 300 rows: tighter than the bytes
    by_bytes = DecisionLog(path, max_rows=2000, max_bytes=used_bytes(conn) // 3, retention_chunk_rows=5000)
    by_bytes.apply_retention(conn)
    assert 80 <= len(ids(conn)) <= 100  # a third of 300 by size, not 2,000 by rows
    conn.close()


@pytest.mark.parametrize("interval_s", [0.0, 3600.0], ids=["every-round", "interval-an-hour"])
def test_under_commits_the_file_stops_growing_at_about_the_bound(tmp_path: Path, interval_s: float) -> None:
    # 20,000 rows of ~600 bytes would take ~12 MiB; bound 1 MiB. SQLite reuses the pages a
    # purge frees, so the file plateaus: it passes the bound by what one pass lets in.
    # With passes an hour apart (a minute in the daemon) it must plateau all the same: a
    # pass is due as soon as the file is past the bound (waiting for the minute let a fast
    # load take the file 70% past it before the first pass).
    path = tmp_path / "capped.db"
    bound = 2**20
    with DecisionLog(path, max_bytes=bound, retention_interval_s=interval_s, fold_interval_s=0.0) as log:
        for first in range(0, 20_000, 100):
            log.append(batch(first, 100)).result()
        log.flush()
        deleted = log.rows_deleted
    assert deleted > 15_000
    assert path.stat().st_size <= 1.1 * bound
    conn = sqlite3.connect(path, isolation_level=None)
    kept = ids(conn)
    assert kept == list(range(deleted + 1, 20_001))  # every row kept is one of the newest, in order
    conn.close()


@settings(max_examples=15)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=300), min_size=1000, max_size=2500),
    share=st.floats(min_value=0.1, max_value=0.9),
)
def test_any_log_comes_under_any_bound_keeping_its_newest_rows(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], share: float
) -> None:
    # Rows of any mix of sizes (block tables of 1 to 300 ids): two retention rounds (the
    # second being the next interval's) bring the pages in use under the bound, and what
    # stays is the newest rows, contiguous, whatever the sizes of those that went.
    path = tmp_path_factory.mktemp("any") / "d.db"
    with DecisionLog(path) as log:
        log.append([admit(seq, num_blocks) for seq, num_blocks in enumerate(sizes)]).result()
    conn = sqlite3.connect(path, isolation_level=None)
    bound = int(used_bytes(conn) * share)
    purger = DecisionLog(path, max_bytes=bound, retention_chunk_rows=128)
    for _ in range(2):
        while purger.apply_retention(conn):
            pass
    kept = ids(conn)
    assert kept and kept == list(range(kept[0], len(sizes) + 1))
    assert used_bytes(conn) <= bound
    conn.close()


def test_max_bytes_must_be_positive(tmp_path: Path) -> None:
    for bad in (0, -1):
        with pytest.raises(ValueError, match="max_bytes"):
            DecisionLog(tmp_path / "bad.db", max_bytes=bad)


@pytest.mark.slow
def test_a_daemon_started_on_a_big_log_brings_it_to_its_size_bound(tmp_path: Path) -> None:
    from daemon_harness import DaemonProcess, wait_until

    daemon = DaemonProcess(tmp_path, "--retention-max-bytes", str(2**20))
    conn = a_log_of(daemon.db_path, 6000)  # ~2.3 MB of rows: the file an earlier daemon left
    assert used_bytes(conn) > 2 * 2**20
    conn.close()
    with daemon:
        def within() -> bool:
            reader = sqlite3.connect(daemon.db_path)
            try:
                return used_bytes(reader) <= 1.02 * 2**20
            finally:
                reader.close()

        wait_until(within)  # the writer's first retention pass runs at start
        # The newest rows are the ones kept: an unbroken run of ids up to the newest. (The
        # start first closes the requests the old log left open, a row each after row 6000.)
        ids = [row["id"] for row in daemon.decision_rows("1 ORDER BY id")]
        assert ids == list(range(ids[0], ids[0] + len(ids))) and ids[-1] > 6000
    assert daemon.process.returncode == 0


@pytest.mark.slow
def test_a_daemon_whose_log_may_outgrow_its_disk_says_so_at_start(tmp_path: Path) -> None:
    from daemon_harness import DaemonProcess, wait_until

    bound = 2**60  # far past any disk's free space
    with DaemonProcess(tmp_path, "--retention-max-bytes", str(bound)) as daemon:
        line = wait_until(lambda: next(
            (line for line in daemon.stderr().splitlines() if "may grow to retention_max_bytes" in line), None))
        assert line.startswith("kvbudget daemon: WARNING: db_path: the decision log (")
        assert f"retention_max_bytes ({bound}) but {tmp_path} has " in line
        assert line.endswith("bytes free: set a lower retention_max_bytes, or move db_path")
    with DaemonProcess(tmp_path, "--retention-max-bytes", str(2**20), "--log-level", "info") as daemon:
        wait_until(lambda: "heap settled" in daemon.stderr())  # start-up is over
        assert "may grow to retention_max_bytes" not in daemon.stderr()  # a bound the disk holds
