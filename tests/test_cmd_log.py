"""`kvbudget log` as a user runs it: a subprocess on a real decision log."""

from __future__ import annotations

import csv
import io
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from kvbudget.cli.cmd_log import parse_time
from kvbudget.daemon.log.decision_log import DecisionLog
from kvbudget.daemon.core.records import Decision, DecisionKind, Reason
from kvbudget.client.errors import CLIError


def kvbudget(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "220", "TZ": "UTC"}
    return subprocess.run(
        [sys.executable, "-m", "kvbudget", "log", *args], capture_output=True, text=True, timeout=60, env=env
    )


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("log") / "decisions.db"
    decisions = [
        Decision(seq=1, time_s=1.0, kind=DecisionKind.ADMIT, reason=Reason.FITS, request_id="req-a",
                 engine_id="vllm-0", tenant="chat", prompt_tokens=300, max_new_tokens=200,
                 blocks_held=(19, 4), new_block_ids=((1, 2), (3,))),
        Decision(seq=2, time_s=2.0, kind=DecisionKind.QUEUE, reason=Reason.POOL_FULL, request_id="req-b",
                 engine_id="vllm-1", tenant="batch", prompt_tokens=9000, detail="needs 563 blocks"),
        Decision(seq=3, time_s=3.0, kind=DecisionKind.PREEMPT, reason=Reason.GROWTH, request_id="req-a",
                 engine_id="vllm-0", tenant="chat", freed_blocks=23),
        Decision(seq=4, time_s=4.0, kind=DecisionKind.RELEASE, reason=Reason.FINISHED, request_id="req-c",
                 engine_id="vllm-1", tenant="batch"),
    ]
    with DecisionLog(path) as log:
        log.append(decisions).result()
    # Known wall-clock times for the time filters: 2026-01-01T00:00:00Z = 1767225600.
    conn = sqlite3.connect(path)
    conn.executemany(
        "UPDATE decisions_indexed SET logged_at = ? WHERE seq = ?",  # close() folded every row into it
        [(1767225600.0 + 60 * (seq - 1), seq) for seq in (1, 2, 3, 4)],
    )
    conn.commit()
    conn.close()
    return path


def seqs_of_json(out: str) -> list[int]:
    return [json.loads(line)["seq"] for line in out.splitlines()]


def test_table_default(db: Path) -> None:
    result = kvbudget("--db", str(db))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "kind" in lines[0] and "reason" in lines[0] and "request" in lines[0]
    body = [line for line in lines if "req-" in line]
    assert [line.split("│")[4].strip() for line in body] == ["req-a", "req-b", "req-a", "req-c"]  # oldest first
    assert "2026-01-01 00:00:00.000" in body[0]  # TZ=UTC
    assert "needs 563 blocks" in body[1]
    assert "4 decision(s)" in result.stdout


def test_json_lines_carry_every_column(db: Path) -> None:
    result = kvbudget("--db", str(db), "--json")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["seq"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["new_block_ids"] == [[1, 2], [3]]
    assert rows[0]["blocks_held"] == [19, 4]
    assert rows[2]["kind"] == "preempt" and rows[2]["reason"] == "growth" and rows[2]["freed_blocks"] == 23


def test_csv(db: Path) -> None:
    result = kvbudget("--db", str(db), "--csv", "--kind", "queue")
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 1
    assert rows[0]["request_id"] == "req-b"
    assert rows[0]["prompt_tokens"] == "9000"
    assert rows[0]["reason"] == "pool_full"
    assert json.loads(rows[0]["new_block_ids"]) == []


@pytest.mark.parametrize(
    ("filters", "expected_seqs"),
    [
        (["--request", "req-a"], [1, 3]),
        (["--engine", "vllm-1"], [2, 4]),
        (["--tenant", "chat", "--kind", "preempt"], [3]),
        (["--limit", "2"], [3, 4]),  # the newest two, shown oldest first
        (["--limit", "0"], [1, 2, 3, 4]),
        (["--limit", "9" * 30], [1, 2, 3, 4]),  # past SQLite's integers: all of them
        # seq n was logged at 1767225600 + 60 (n - 1): since inclusive, until exclusive.
        (["--since", "1767225660"], [2, 3, 4]),
        (["--since", "2026-01-01T00:01:00Z", "--until", "2026-01-01T00:03:00+00:00"], [2, 3]),
        (["--until", "1767225660.5"], [1, 2]),
        (["--request", "nobody"], []),
    ],
)
def test_filters(db: Path, filters: list[str], expected_seqs: list[int]) -> None:
    result = kvbudget("--db", str(db), "--json", *filters)
    assert result.returncode == 0, result.stderr
    assert seqs_of_json(result.stdout) == expected_seqs


def test_relative_since_covers_recent_rows(db: Path) -> None:
    # The rows were logged in 2026-01; "100000d" ago reaches before that, "1s" does not.
    assert seqs_of_json(kvbudget("--db", str(db), "--json", "--since", "100000d").stdout) == [1, 2, 3, 4]
    assert seqs_of_json(kvbudget("--db", str(db), "--json", "--since", "1s").stdout) == []


def test_parse_time_forms() -> None:
    now = 1_000_000.0
    assert parse_time("10m", option="--since", now=now) == 1_000_000.0 - 600.0
    assert parse_time("1.5h", option="--since", now=now) == 1_000_000.0 - 5400.0
    assert parse_time("2d", option="--since", now=now) == 1_000_000.0 - 172_800.0
    assert parse_time("30s", option="--since", now=now) == 999_970.0
    # further back than 1970: from the start, not a negative time
    assert parse_time("12d", option="--since", now=now) == 0.0
    assert parse_time("1000000000000000000000000000d", option="--since", now=now) == 0.0
    assert parse_time("now", option="--since", now=now) == now
    assert parse_time("1767225600", option="--since") == 1767225600.0
    assert parse_time("2026-01-01T00:00:00Z", option="--since") == 1767225600.0
    assert parse_time("2026-01-01T01:00:00+01:00", option="--since") == 1767225600.0
    with pytest.raises(CLIError, match="--until: cannot read 'soon'"):
        parse_time("soon", option="--until")
    for not_a_time in ("nan", "inf", "-inf", ""):  # floats (but ""), but no number of seconds
        with pytest.raises(CLIError, match=f"--since: cannot read '{not_a_time}' as a time"):
            parse_time(not_a_time, option="--since")
    for out_of_range in ("1e20", "-5", "253402300800"):  # seconds, of no time a log holds (past 9999-12-31)
        with pytest.raises(CLIError, match=f"^--since: '{out_of_range}' is out of range \\(times from 1970"):
            parse_time(out_of_range, option="--since")
    assert parse_time("253402300799", option="--since") == 253402300799.0  # the last second of 9999


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "yesterday"], "--since: cannot read 'yesterday' as a time"),
        (["--kind", "admitted"], "--kind: unknown kind 'admitted'"),
        (["--limit", "-1"], "--limit: must be 0 (all) or more"),
        (["--limit", "ten"], "--limit: expected a whole number"),
        (["--since", "2026-01-02T00:00:00Z", "--until", "2026-01-01T00:00:00Z"], "--since must be earlier"),
        (["-f", "--until", "1h"], "--follow: shows decisions as they come; drop --until"),
    ],
)
def test_bad_options_are_one_line_errors(db: Path, args: list[str], message: str) -> None:
    result = kvbudget("--db", str(db), *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert message in result.stderr


def test_bad_databases_are_one_line_errors(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not sqlite at all " * 200)
    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    unreadable = tmp_path / "unreadable.db"
    with DecisionLog(unreadable):
        pass
    unreadable.chmod(0)
    cases = [
        (tmp_path / "missing.db", "no decision log at"),
        (junk, "is not a readable SQLite database"),
        (foreign, "is not a KVBudget decision log"),
        (tmp_path, "is a directory"),
    ]
    if os.geteuid() != 0:  # root reads anything
        cases.append((unreadable, "permission denied"))
    for path, message in cases:
        result = kvbudget("--db", str(path))
        assert result.returncode == 2, (path, result.stdout)
        assert result.stderr.startswith("kvbudget log: error: ")
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
        assert message in result.stderr, result.stderr


# ----------------------------------------------------------------------- --disk-usage
def test_disk_usage_says_how_big_the_log_is_and_how_far_back_it_reaches(db: Path) -> None:
    result = kvbudget("--db", str(db), "--disk-usage", "--json")
    assert result.returncode == 0, result.stderr
    usage = json.loads(result.stdout)
    assert usage["path"] == str(db)
    assert usage["file_bytes"] == db.stat().st_size
    assert 0 < usage["used_bytes"] <= usage["file_bytes"]
    assert usage["num_decisions"] == 4
    assert (usage["oldest_unix_s"], usage["newest_unix_s"]) == (1767225600.0, 1767225600.0 + 180)
    table = kvbudget("--db", str(db), "--disk-usage")
    assert table.returncode == 0, table.stderr
    first, second = table.stdout.splitlines()
    assert first.startswith(f"{db}: ") and first.endswith(", WAL 0 B")  # closed: no WAL left
    assert second == "4 decisions from 2026-01-01 00:00:00.000 to 2026-01-01 00:03:00.000 (3.0 min)"


def test_disk_usage_counts_what_retention_kept_and_rows_not_yet_indexed(tmp_path: Path) -> None:
    path = tmp_path / "kept.db"
    with DecisionLog(path) as log:
        log.append([Decision(seq=i, time_s=float(i), kind=DecisionKind.ADMIT, reason=Reason.FITS,
                             request_id=f"r{i}") for i in range(10)]).result()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE decisions_indexed SET logged_at = 1000.0 + id")
    conn.execute("DELETE FROM decisions_indexed WHERE id <= 4")  # what a purge of the oldest leaves
    conn.execute("INSERT INTO decisions_recent (id, logged_at, seq) VALUES (11, 2011.0, 10), (12, 2012.0, 11)")
    conn.commit()
    conn.close()
    from kvbudget.daemon.log.query import log_usage

    usage = log_usage(path)
    assert usage.num_decisions == 8  # ids 5..12: 6 indexed, 2 committed but not indexed yet
    assert (usage.oldest_unix_s, usage.newest_unix_s) == (1005.0, 2012.0)


def test_disk_usage_of_an_empty_log(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    with DecisionLog(path):
        pass
    result = kvbudget("--db", str(path), "--disk-usage")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1] == "no decisions"
    usage = json.loads(kvbudget("--db", str(path), "--disk-usage", "--json").stdout)
    assert (usage["num_decisions"], usage["oldest_unix_s"], usage["newest_unix_s"]) == (0, None, None)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--disk-usage", "--kind", "admit"], "--disk-usage: describes the whole log; drop --kind"),
        (["--disk-usage", "--request", "r1", "--since", "1h"], "drop --request, --since"),
        (["--disk-usage", "--csv"], "drop --csv"),
        (["--disk-usage", "--limit", "5"], "drop --limit"),
        (["--disk-usage", "--follow"], "drop --follow"),
    ],
)
def test_disk_usage_takes_no_filters(db: Path, args: list[str], message: str) -> None:
    result = kvbudget("--db", str(db), *args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr


def test_disk_usage_of_a_missing_log_is_a_one_line_error(tmp_path: Path) -> None:
    result = kvbudget("--db", str(tmp_path / "missing.db"), "--disk-usage")
    assert result.returncode == 2
    assert result.stderr == f"kvbudget log: error: no decision log at {tmp_path / 'missing.db'}\n"


def test_ids_that_look_like_markup_are_shown_as_they_are(tmp_path: Path) -> None:
    """Engines choose request, engine and tenant ids: "[/]" or "[red]...[/red]" in one is
    text. Read as Rich markup, the first stopped the table with a traceback and the second
    showed another id ("req-7 x") that --request then could not find. The log's path is
    the user's too."""
    path = tmp_path / "[b]logs" / "decisions.db"
    path.parent.mkdir()
    ids = [("close[/]tag", "eng,[/]1", 't,"[/]x'), ("[red]req-7[/red] x", "plain-eng", "team-[b]a")]
    decisions = [
        Decision(seq=i + 1, time_s=1.0, kind=DecisionKind.ADMIT, reason=Reason.FITS, request_id=request_id,
                 engine_id=engine_id, tenant=tenant, detail="[bold]as typed")
        for i, (request_id, engine_id, tenant) in enumerate(ids)
    ]
    with DecisionLog(path) as log:
        log.append(decisions).result()
    result = kvbudget("--db", str(path))
    assert result.returncode == 0, result.stderr
    body = [line.split("│") for line in result.stdout.splitlines() if "as typed" in line]
    assert [[cell.strip() for cell in row[4:7]] for row in body] == [list(i) for i in ids]
    assert all(row[-1].strip() == "[bold]as typed" for row in body)
    found = kvbudget("--db", str(path), "--request", "[red]req-7[/red] x")  # what the table showed finds it
    assert found.returncode == 0 and "plain-eng" in found.stdout and "1 decision(s)" in found.stdout
    missing = kvbudget("--db", str(path), "--request", "nothing")
    assert missing.returncode == 0 and f"no matching decisions in {path}" in missing.stdout


@pytest.mark.parametrize("output", [(), ("--csv",), ("--json",)])
def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path: Path, output: tuple[str, ...]) -> None:
    """`kvbudget log | head -1`: the table, like --csv and --json, exits 0 with nothing on
    stderr when the pipe closes (the table used to exit 1, a failure under pipefail).
    3,000 rows are far more than a pipe holds, so the write does meet the closed pipe."""
    path = tmp_path / "decisions.db"
    decisions = [
        Decision(seq=i + 1, time_s=float(i), kind=DecisionKind.ADMIT, reason=Reason.FITS, request_id=f"req-{i}",
                 engine_id="vllm-0", tenant="chat", detail="x" * 40)
        for i in range(3000)
    ]
    with DecisionLog(path) as log:
        log.append(decisions).result()
    env = {**os.environ, "COLUMNS": "220", "TZ": "UTC"}
    reader = subprocess.Popen([sys.executable, "-m", "kvbudget", "log", "--db", str(path), "--limit", "0", *output],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert reader.stdout is not None and reader.stderr is not None
    assert reader.stdout.readline()
    reader.stdout.close()
    assert reader.wait(60) == 0
    assert reader.stderr.read() == b""


def test_db_path_is_the_daemons_flag_name_and_db_still_works(db: Path) -> None:
    new, old = kvbudget("--db-path", str(db), "--json"), kvbudget("--db", str(db), "--json")
    assert (new.returncode, old.returncode) == (0, 0), new.stderr + old.stderr
    assert seqs_of_json(new.stdout) == [1, 2, 3, 4]
    assert new.stdout == old.stdout
