"""Paging back through the decision log by seq: every match once, none skipped or repeated,
where paging by time skips the rest of a step (its decisions share a time). On the log
file, through `kvbudget log`, and through QueryDecisions on a real daemon."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from kvbudget.client import EngineClient, ObserverClient
from kvbudget.cli.cmd_log import parse_time
from kvbudget.daemon.log.decision_log import DecisionLog
from kvbudget.daemon.log.query import query_decisions
from kvbudget.daemon.core.records import Decision, DecisionKind, Reason, RequestSpec
from kvbudget.client.errors import CLIError
from kvbudget.v1 import common_pb2, observer_pb2, observer_pb2_grpc

from daemon_harness import DaemonProcess


def kvbudget_log(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "220", "TZ": "UTC"}
    return subprocess.run(
        [sys.executable, "-m", "kvbudget", "log", *args], capture_output=True, text=True, timeout=60, env=env
    )


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """Seqs 102..108 at ids 2..8, over both tables, in three steps sharing a time each.

    Written as seqs 101..108 (a restarted daemon numbers on from the log's last seq, so seq
    is not the row id): step 1 = 101, 102, 103 at t=10; step 2 = 104, 105 at t=20; step 3 =
    106, 107, 108 at t=30. Odd seqs are engine e0's, even ones e1's. Then, as the daemon's
    own upkeep would leave it: retention removed the oldest row (id 1, seq 101), and ids
    6..8 (seqs 106..108) are not folded yet (in the recent table)."""
    path = tmp_path / "decisions.db"
    steps = [(101, 102, 103), (104, 105), (106, 107, 108)]
    with DecisionLog(path) as log:
        for time_s, seqs in zip((10.0, 20.0, 30.0), steps):
            log.append([
                Decision(seq=seq, time_s=time_s, kind=DecisionKind.ADMIT, reason=Reason.FITS, request_id=f"r{seq}",
                         engine_id="e1" if seq % 2 == 0 else "e0")
                for seq in seqs
            ]).result()
    conn = sqlite3.connect(path)
    with conn:  # (close() folded every row into the indexed table)
        conn.execute("INSERT INTO decisions_recent SELECT * FROM decisions_indexed WHERE id >= 6")
        conn.execute("DELETE FROM decisions_indexed WHERE id >= 6 OR id = 1")
    conn.close()
    return path


MAX_PAGES = 10  # more than any test here needs: a bound that is not honoured ends, not hangs


def pages(path: Path, limit: int, **filters: str) -> list[list[int]]:
    """Seqs of each page, newest first, each asked before the last page's oldest seq."""
    result: list[list[int]] = []
    before_seq = None
    for _ in range(MAX_PAGES):
        page = [row["seq"] for row in query_decisions(path, limit=limit, before_seq=before_seq, **filters)]
        if not page:
            break
        result.append(page)
        before_seq = page[-1]
    return result


def test_pages_by_seq_hold_every_decision_once(db: Path) -> None:
    # Newest first, two a page: 108 107 | 106 105 | 104 103 | 102 (101 was removed), the
    # steps cut across pages (105 shares t=20 with 104 on the next page).
    assert pages(db, 2) == [[108, 107], [106, 105], [104, 103], [102]]
    # Filters page the same way: e0 has the odd seqs left, 107 105 103.
    assert pages(db, 2, engine_id="e0") == [[107, 105], [103]]
    assert pages(db, 3, engine_id="e1") == [[108, 106, 104], [102]]
    # A bound between tables, past the newest, and below the oldest.
    assert [r["seq"] for r in query_decisions(db, before_seq=107, limit=0)] == [106, 105, 104, 103, 102]
    assert [r["seq"] for r in query_decisions(db, before_seq=10**6, limit=2)] == [108, 107]
    assert query_decisions(db, before_seq=102) == []


def test_cli_before_seq_pages_back(db: Path) -> None:
    # Rows print oldest first: the first seq shown is where the next page back ends.
    first = kvbudget_log("--db", str(db), "--json", "--limit", "3")
    assert first.returncode == 0, first.stderr
    assert [json.loads(line)["seq"] for line in first.stdout.splitlines()] == [106, 107, 108]
    second = kvbudget_log("--db", str(db), "--json", "--limit", "3", "--before-seq", "106")
    assert second.returncode == 0, second.stderr
    assert [json.loads(line)["seq"] for line in second.stdout.splitlines()] == [103, 104, 105]
    # 0 is no bound, as in QueryDecisions.
    every = kvbudget_log("--db", str(db), "--json", "--limit", "0", "--before-seq", "0")
    assert [json.loads(line)["seq"] for line in every.stdout.splitlines()] == list(range(102, 109))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--before-seq", "-1"], "--before-seq: must be 0 (no bound) or more, got -1"),
        (["--before-seq", "ten"], "--before-seq: expected a whole number, got 'ten'"),
        (["-f", "--before-seq", "5"], "--follow: shows decisions as they come; drop --before-seq"),
        (["--disk-usage", "--before-seq", "5"], "--disk-usage: describes the whole log; drop --before-seq"),
    ],
)
def test_cli_bad_before_seq_is_a_one_line_error(db: Path, args: list[str], message: str) -> None:
    result = kvbudget_log("--db", str(db), *args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert message in result.stderr


def test_a_date_without_a_unix_time_is_out_of_range_not_unreadable() -> None:
    result = kvbudget_log("--since", "0001-01-01")
    assert result.returncode == 2
    assert result.stderr == (
        "kvbudget log: error: --since: '0001-01-01' is out of range "
        "(times from 1970-01-01T00:00:00Z to 9999-12-31T23:59:59Z)\n"
    )
    # Read, and a unix time, but a negative one (it was taken as a bound before).
    with pytest.raises(CLIError, match=r"^--until: '1969-12-31T23:59:59Z' is out of range \(times from 1970"):
        parse_time("1969-12-31T23:59:59Z", option="--until")


@pytest.mark.slow
async def test_query_decisions_pages_by_before_seq_on_a_daemon(tmp_path: Path) -> None:
    with DaemonProcess(tmp_path) as daemon:
        async with EngineClient(daemon.target, "e") as engine, ObserverClient(daemon.target) as observer:
            # A fresh log numbers from 1: step 1 admits p0 p1 p2 (seqs 1 2 3), step 2
            # releases them (4 5 6); each step's decisions share a time_unix_s.
            await engine.step(submits=[RequestSpec(f"p{i}", 16, 16) for i in range(3)])
            await engine.step(finishes=["p0", "p1", "p2"])
            snapshot = await observer.snapshot()
            assert (snapshot.num_free_blocks, snapshot.num_held_blocks) == (64, 0)  # all 64 back
            # The Python client pages the same way (its before_seq reaches the daemon).
            pages, before = [], 0
            for _ in range(MAX_PAGES):
                page = await observer.query_decisions(limit=4, before_seq=before)
                if not page:
                    break
                pages.append([d.seq for d in page])
                before = page[-1].seq
            assert pages == [[6, 5, 4, 3], [2, 1]]
        async with grpc.aio.insecure_channel(daemon.target) as channel:
            stub = observer_pb2_grpc.ObserverServiceStub(channel)
            got: list[list[tuple[int, str]]] = []
            before_seq = 0
            for _ in range(MAX_PAGES):
                response = await stub.QueryDecisions(observer_pb2.QueryDecisionsRequest(limit=2, before_seq=before_seq))
                if not response.decisions:
                    break
                got.append([(d.seq, d.request_id) for d in response.decisions])
                before_seq = response.decisions[-1].seq
            assert got == [[(6, "p2"), (5, "p1")], [(4, "p0"), (3, "p2")], [(2, "p1"), (1, "p0")]]
            # 4 shares its step's time with 5: paging by time from page one would skip it.
            release = common_pb2.DECISION_KIND_RELEASE
            releases = await stub.QueryDecisions(observer_pb2.QueryDecisionsRequest(kind=release))
            assert len({d.time_unix_s for d in releases.decisions}) == 1
            # Past every seq SQLite can hold: no bound, not an error.
            every = await stub.QueryDecisions(observer_pb2.QueryDecisionsRequest(before_seq=2**64 - 1))
            assert [d.seq for d in every.decisions] == [6, 5, 4, 3, 2, 1]
