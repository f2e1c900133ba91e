"""`kvbudget log -f` while the log is removed and a restarted daemon starts a new one there.

The new log numbers its decisions from 1 again: a follower that went by ids alone would
wait for it to pass the old log's newest id, and show nothing meanwhile; and one that gave
up while the file was gone would follow nothing at all.
"""

from __future__ import annotations

from pathlib import Path

from kvbudget.daemon.log.decision_log import DecisionLog

from test_cmd_log_follow import decision, following, seqs


def test_follow_goes_on_into_a_new_log_made_where_the_old_one_was_removed(tmp_path: Path) -> None:
    path = tmp_path / "decisions.db"
    old = DecisionLog(path, fold_interval_s=0.01)
    old.start()
    old.append([decision(seq) for seq in range(1, 21)]).result()
    with following(path, "--json") as follower:
        assert seqs(follower.take(10)) == list(range(11, 21))
        old.close()
        for name in ("decisions.db", "decisions.db-wal", "decisions.db-shm"):
            (tmp_path / name).unlink(missing_ok=True)
        new = DecisionLog(path, fold_interval_s=0.01)
        new.start()
        try:
            new.append([decision(seq) for seq in (100, 101, 102)]).result()
            assert seqs(follower.take(3)) == [100, 101, 102]
            new.commit_inline([decision(103)])
            assert seqs(follower.take(1)) == [103]
        finally:
            new.close()
    assert "is a new log" in follower.stderr_at_end
    assert follower.lines.empty()


def test_follow_before_the_daemon_made_its_log_waits_for_it(tmp_path: Path) -> None:
    """`kvbudget log -f` started before the daemon (or with the daemon's folder not made
    yet) waits for the log to be made there, as it waits when a followed log is removed,
    instead of "no decision log at" and exit 2; then shows it from its first decision."""
    path = tmp_path / "state" / "decisions.db"
    with following(path, "--json") as follower:
        assert follower.process.stderr is not None
        assert follower.process.stderr.readline() == f"kvbudget log: no decision log at {path} yet: waiting for one there\n"
        assert follower.process.poll() is None
        log = DecisionLog(path, fold_interval_s=0.01)
        log.start()
        try:
            log.append([decision(seq) for seq in (1, 2, 3)]).result()
            assert seqs(follower.take(3)) == [1, 2, 3]
        finally:
            log.close()
    assert follower.lines.empty()
