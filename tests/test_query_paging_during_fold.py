"""QA of paging back by seq (`before_seq`) where the daemon changes the log while a page is
read: it folds recent rows into the indexed table a fraction of a second after each commit,
and a reader's query must still hold every matching decision once."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from kvbudget.daemon.log import query as decision_query
from kvbudget.daemon.log.decision_log import DecisionLog
from kvbudget.daemon.log.query import query_decisions
from kvbudget.daemon.log.schema import INDEXED, RECENT
from kvbudget.daemon.log.upkeep import fold
from kvbudget.daemon.core.records import Decision, DecisionKind, Reason


def make_log(path: Path, seqs: range, *, indexed_below_id: int) -> None:
    """Seqs in id order from id 1 (all at one time, as one step's), ids below
    `indexed_below_id` folded, the rest still in the recent table."""
    with DecisionLog(path) as log:
        log.append([
            Decision(seq=seq, time_s=5.0, kind=DecisionKind.ADMIT, reason=Reason.FITS, request_id=f"r{seq}")
            for seq in seqs
        ]).result()
    conn = sqlite3.connect(path)
    with conn:  # (close() folded every row)
        conn.execute(f"INSERT INTO {RECENT} SELECT * FROM {INDEXED} WHERE id >= ?", (indexed_below_id,))
        conn.execute(f"DELETE FROM {INDEXED} WHERE id >= ?", (indexed_below_id,))
    # As a running daemon's log is: in WAL mode, so the fold commits beside an open read.
    # (A clean close leaves the file in rollback mode; there the fold waited out its busy
    # timeout and failed unseen inside the trace, and only folds before a query's first
    # statement were tried.)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()


class FoldingDaemon:
    """Opens the log as `open_read_only` does, and commits the daemon's fold (every recent
    row into the indexed table, in one transaction, `upkeep.fold`) as the query's
    `fold_at`-th statement begins (before it reads: SQLite calls the trace first)."""

    def __init__(self) -> None:
        self.fold_at = 0
        self.folded = False
        self.failures: list[sqlite3.Error] = []
        self._opened = decision_query.open_read_only

    def open(self, path: str) -> sqlite3.Connection:
        conn = self._opened(path)
        statements = 0

        def trace(_sql: str) -> None:
            nonlocal statements
            statements += 1
            if statements == self.fold_at:
                writer = sqlite3.connect(path, isolation_level=None, timeout=0)
                try:
                    fold(writer)
                except sqlite3.Error as exc:  # (SQLite drops a trace callback's exception)
                    self.failures.append(exc)
                    return
                finally:
                    writer.close()
                self.folded = True

        conn.set_trace_callback(trace)
        return conn


@pytest.fixture
def folding_daemon(monkeypatch: pytest.MonkeyPatch) -> FoldingDaemon:
    daemon = FoldingDaemon()
    monkeypatch.setattr(decision_query, "open_read_only", daemon.open)
    return daemon


def test_a_page_read_while_the_daemon_folds_skips_no_decision(tmp_path: Path, folding_daemon: FoldingDaemon) -> None:
    # Seqs 101..112 at ids 1..12; ids 1..4 folded, 5..12 recent (a busy daemon's newest).
    # For every bound, and a fold before each statement of the query in turn, on a fresh
    # copy of the log: before_seq=B holds seqs B-1 down to 101, newest first (limit 0).
    # (Each probe of the seq search read one table, then the other: rows the fold moved
    # between them were in neither, the probe found no row, and the search stopped below
    # them: the page skipped the recent rows under the bound.)
    original = tmp_path / "original.db"
    make_log(original, range(101, 113), indexed_below_id=5)
    wrong: dict[tuple[int, int], list[int]] = {}
    folded: Path | None = None
    for before_seq in range(102, 114):
        want = list(range(before_seq - 1, 100, -1))
        for fold_at in range(1, MAX_STATEMENTS + 1):
            copy = tmp_path / f"copy-{before_seq}-{fold_at}.db"  # (a new name: no WAL left beside it)
            shutil.copyfile(original, copy)
            folding_daemon.fold_at, folding_daemon.folded = fold_at, False
            got = [row["seq"] for row in query_decisions(copy, before_seq=before_seq, limit=0)]
            if got != want:
                wrong[before_seq, fold_at] = got
            if not folding_daemon.folded:
                break  # the query ran fewer statements: every place of the fold was tried
            folded = copy
        else:
            pytest.fail(f"before_seq={before_seq}: a query of more than {MAX_STATEMENTS} statements")
    assert wrong == {}
    assert folding_daemon.failures == []
    assert folded is not None
    # Nothing lost by the folds themselves: every row still there, once, all folded.
    conn = sqlite3.connect(folded)
    assert conn.execute(f"SELECT count(*) FROM {RECENT}").fetchone() == (0,)
    assert conn.execute("SELECT count(*), min(seq), max(seq) FROM decisions").fetchone() == (12, 101, 112)
    conn.close()


MAX_STATEMENTS = 200  # the seq search over 12 ids takes about 2 x 4 probes
