"""Operator changes in the decision log (issue 32, point 4): a quota set with `kvbudget
admin set-quota` is an `admin` row saying who, before -> after, which `kvbudget log` and
QueryDecisions show; a log of the previous schema is upgraded in place; an older kvbudget
refuses the new version by name. (A reload's rows: test_server_reload.py.)

The daemon is the harness's: llama-3.1-8b, 16-token blocks, 64 usable blocks.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from kvbudget.client import ObserverClient
from kvbudget.daemon.core.records import Decision, DecisionKind, Reason
from kvbudget.daemon.log import schema
from kvbudget.daemon.log.decision_log import DecisionLog
from kvbudget.daemon.log.query import query_decisions
from kvbudget.daemon.log.schema import DecisionLogError, decision_from_row

from daemon_harness import DaemonProcess, free_port

ADMIN_TOKEN = "admin-token-456"


def kvbudget(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "250"}  # (the table's width: the detail on one line)
    return subprocess.run([sys.executable, "-m", "kvbudget", *argv], capture_output=True, text=True, timeout=60,
                          env=env)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("admin-rows")
    tokens = workdir / "tokens.toml"
    tokens.write_text(f'admin = ["{ADMIN_TOKEN}"]\n')
    address = f"127.0.0.1:{free_port()}"
    with DaemonProcess(workdir, "--tokens-file", str(tokens), listen=(f"unix://{workdir}/kvbudget.sock", address)) as p:
        yield p, address


def admin_rows(process: DaemonProcess) -> list[dict]:
    return process.decision_rows("kind = 'admin' ORDER BY seq")


@pytest.mark.slow
async def test_set_quota_writes_who_and_before_after_and_kvbudget_log_shows_it(daemon) -> None:
    process, address = daemon
    set_a = kvbudget("admin", "--target", process.target, "set-quota", "team-q", "--max-share", "0.25", "--weight", "2")
    assert set_a.returncode == 0, set_a.stderr
    again = kvbudget("admin", "--target", process.target, "set-quota", "team-q", "--max-share", "0.25", "--weight", "2")
    assert again.returncode == 0, again.stderr  # the same quota again: no change, no row
    cleared = kvbudget("admin", "--target", address, "--token", ADMIN_TOKEN, "set-quota", "team-q", "--max-share", "0")
    assert cleared.returncode == 0, cleared.stderr

    rows = admin_rows(process)
    assert [(r["kind"], r["reason"], r["tenant"], r["request_id"]) for r in rows] == [("admin", "quota", "team-q", "")] * 2
    assert rows[0]["detail"] == "by unix socket (admin): no quota weight 1 -> max_share 0.25 weight 2"
    # Over TCP the caller is its token's digest (never the token) and its peer.
    digest = hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest()[:16]
    first, _, rest = rows[1]["detail"].partition(" at ipv4:127.0.0.1:")
    assert first == f"by token:{digest}"
    assert rest.split(" ", 1)[1] == "(admin): max_share 0.25 weight 2 -> no quota weight 1"
    assert ADMIN_TOKEN not in rows[1]["detail"]
    assert rows[0]["seq"] < rows[1]["seq"]  # numbered with the decisions

    # `kvbudget log` reads them without the daemon: filtered by kind, as JSON and as a table.
    as_json = kvbudget("log", "--db", str(process.db_path), "--kind", "admin", "--json")
    assert as_json.returncode == 0, as_json.stderr
    logged = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [(r["seq"], r["detail"]) for r in logged] == [(r["seq"], r["detail"]) for r in rows]
    table = kvbudget("log", "--db", str(process.db_path), "--kind", "admin", "--tenant", "team-q")
    assert table.returncode == 0, table.stderr
    lines = [line for line in table.stdout.splitlines() if " admin " in line]
    assert len(lines) == 2 and all(" quota " in line and " team-q " in line for line in lines)
    assert lines[0].rstrip().endswith("by unix socket (admin): no quota weight 1 -> max_share 0.25 weight 2")
    assert "2 decision(s) from" in table.stdout

    # QueryDecisions pages them like any kind: newest first, one per page.
    async with ObserverClient(process.target) as observer:
        newest = await observer.query_decisions(kind="admin", limit=1)
        older = await observer.query_decisions(kind="admin", limit=1, before_seq=newest[0].seq)
        last = await observer.query_decisions(kind="admin", limit=1, before_seq=older[0].seq)
    assert [d.seq for d in (*newest, *older)] == [rows[1]["seq"], rows[0]["seq"]]
    assert (older[0].kind, older[0].reason, older[0].detail) == (DecisionKind.ADMIN, Reason.QUOTA, rows[0]["detail"])
    assert last == []


@pytest.mark.slow
def test_a_drain_is_an_admin_row_once(tmp_path: Path) -> None:
    with DaemonProcess(tmp_path) as process:
        for _ in range(2):  # the second drain changes nothing: no row
            drained = kvbudget("admin", "--target", process.target, "drain")
            assert drained.returncode == 0, drained.stderr
        rows = admin_rows(process)
    assert [(r["reason"], r["tenant"], r["detail"]) for r in rows] == [
        ("draining", "", "by unix socket (admin): admitting -> draining")]


def admin_decision(seq: int) -> Decision:
    return Decision(seq=seq, time_s=1000.0 + seq, kind=DecisionKind.ADMIN, reason=Reason.QUOTA, request_id="",
                    tenant="team-a", policy="optimistic", detail="by config reload: no quota weight 1 -> "
                    "max_share 0.5 weight 1")


def release(seq: int) -> Decision:
    return Decision(seq=seq, time_s=1000.0 + seq, kind=DecisionKind.RELEASE, reason=Reason.FINISHED,
                    request_id=f"req-{seq}", engine_id="e", policy="optimistic")


def schema_version(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
    finally:
        conn.close()


def test_a_version_2_log_is_read_as_it_is_and_upgraded_when_the_daemon_opens_it(tmp_path: Path) -> None:
    path = tmp_path / "decisions.db"
    with DecisionLog(path) as log:
        log.append_inline([release(1), release(2)]).result()
    conn = sqlite3.connect(path)  # version 2 had these very tables: only its version differs
    with conn:
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    conn.close()

    assert [r["seq"] for r in query_decisions(path, newest_first=False)] == [1, 2]
    assert schema_version(path) == "2"  # a reader changes nothing

    with DecisionLog(path) as log:  # the daemon's writer opens it
        log.append_inline([admin_decision(3)]).result()
    assert schema_version(path) == "3"
    rows = query_decisions(path, limit=None, newest_first=False)
    assert [(r["id"], r["seq"], r["kind"]) for r in rows] == [(1, 1, "release"), (2, 2, "release"), (3, 3, "admin")]
    assert decision_from_row(rows[2]) == admin_decision(3)


def test_a_kvbudget_that_reads_versions_1_and_2_refuses_a_version_3_log_by_name(tmp_path, monkeypatch) -> None:
    path = tmp_path / "decisions.db"
    with DecisionLog(path) as log:
        log.append_inline([admin_decision(1)]).result()
    monkeypatch.setattr(schema, "READABLE_VERSIONS", frozenset({"1", "2"}))  # what a kvbudget before 3 knows
    with pytest.raises(DecisionLogError, match="has schema version 3, this kvbudget reads versions 1, 2"):
        query_decisions(path)


def test_the_dashboards_decision_list_shows_an_admin_row_with_its_who(tmp_path: Path) -> None:
    pytest.importorskip("textual")
    from tui_helpers import state_of, snapshot, text_of

    from kvbudget.daemon.wire import convert
    from kvbudget.tui import decisions
    from kvbudget.tui.state import DecisionRow

    message = convert.decision_to_proto(admin_decision(7))
    row = DecisionRow.from_proto(message)
    assert [c.plain for c in decisions.decision_cells(row)] == ["7", "admin", "quota", "", "", "team-a", "—"]
    assert "by config reload: no quota weight 1 -> max_share 0.5 weight 1" in text_of(
        decisions.decision_detail(row), width=120)
    # The `/` filter finds it by its kind and tenant.
    state = state_of(snapshot(), decisions=[message])
    assert [r.row.seq for r in decisions.visible_decisions(state, "admin team-a", 10)] == [7]
