"""A reader that holds an old snapshot keeps the WAL from starting over: the log says so
(throttled), and says when it is over, where only a metric showed it."""

from __future__ import annotations

import logging

from kvbudget.daemon.log.upkeep import WalWatch

MIB = 2**20


def test_a_wal_held_past_its_limit_is_said_once_a_minute_and_when_it_is_over() -> None:
    watch = WalWatch(wal_reset_bytes=64 * MIB, warn_every_s=60.0)
    assert watch.after_checkpoint(False, 60 * MIB, 0.0) is None  # within the limit
    assert watch.after_checkpoint(False, 200 * MIB, 1.0) is None  # past it, being caught up
    level, message = watch.after_checkpoint(False, 290 * MIB, 2.0)  # 4x: a reader holds it
    assert level == logging.WARNING
    assert message.startswith("decision log: the WAL is 290 MiB, past its 64 MiB limit")
    assert "reader" in message
    assert watch.after_checkpoint(False, 400 * MIB, 30.0) is None  # not again within the minute
    assert watch.after_checkpoint(False, 500 * MIB, 62.5)[0] == logging.WARNING  # a minute later
    level, message = watch.after_checkpoint(True, 64 * MIB, 63.0)  # the reader left
    assert level == logging.INFO and "started over" in message
    assert watch.after_checkpoint(True, 1 * MIB, 64.0) is None  # said once


def test_a_wal_that_starts_over_as_usual_says_nothing() -> None:
    watch = WalWatch(wal_reset_bytes=64 * MIB)
    for second in range(100):
        assert watch.after_checkpoint(second % 3 == 0, (second % 5) * 20 * MIB, float(second)) is None


def test_a_log_whose_wal_a_reader_holds_says_so_in_its_journal(tmp_path, caplog) -> None:
    """A real log, its WAL limit made 64 KiB, and a reader left in a read transaction."""
    import sqlite3
    import time

    from kvbudget.daemon.log.decision_log import DecisionLog
    from test_decision_log import make_decision

    path = tmp_path / "d.db"
    caplog.set_level(logging.INFO, logger="kvbudget.daemon.log.decision_log")
    with DecisionLog(path, checkpoint_interval_s=0.05, wal_limit_bytes=64 * 1024) as log:
        log.append([make_decision(0)]).result()
        reader = sqlite3.connect(path)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM decisions").fetchone()  # holds its snapshot
        seq = 1
        end = time.monotonic() + 60  # (a bound on waiting, not a figure asserted)
        while "cannot start over while a reader holds" not in caplog.text:
            assert time.monotonic() < end, "never said"
            log.append([make_decision(seq + i) for i in range(200)]).result()
            seq += 200
            time.sleep(0.01)
        reader.rollback()  # the reader ends: the WAL starts over, and that is said too
        reader.close()
        while "the WAL started over again" not in caplog.text:
            assert time.monotonic() < end, "the end never said"
            log.append([make_decision(seq)]).result()
            seq += 1
            time.sleep(0.05)
