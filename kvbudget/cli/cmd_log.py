"""`kvbudget log`: query the decision log, with or without the daemon running.

Queries go to the log file itself (kvbudget.daemon.log.query); the examples, paging and
time forms are `--help`'s (EPILOG).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import sys
import time
from datetime import datetime
from typing import Any

from kvbudget.daemon.config.settings import DEFAULT_DB_PATH
from kvbudget.client.errors import CLIError
from kvbudget.units import format_bytes

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
KINDS = ("admit", "queue", "reject", "grow", "deny", "preempt", "reclaim", "release", "expire", "policy", "admin")


# `--help`'s epilog, shown as written (RawDescriptionHelpFormatter).
EPILOG = """\
    kvbudget log --request req-42                  every decision about one request
    kvbudget log --kind preempt --since 10m        preemptions in the last ten minutes
    kvbudget log --engine vllm-0 --json | jq .     JSON lines, one decision per line
    kvbudget log --since 2026-11-29T08:00Z --csv   CSV with a header row
    kvbudget log --disk-usage                      how big the log is, how far back it reaches
    kvbudget log -f --kind preempt                 the last 10 preemptions, then each new one
    kvbudget log --limit 50 --before-seq 9001      the 50 before those, when the first shown was seq 9001

Rows are printed oldest first; `--limit` keeps the newest N that match (0: all).
`--before-seq` pages back exactly: decisions of one step share a time, seqs do not.
`-f` (like journalctl -f) prints the newest 10 that match, then follows the file, printing
new matching decisions as the daemon commits them, until Ctrl-C.
Times are unix seconds, ISO 8601 (naive means local time, like journalctl), or relative
to now (`30s`, `10m`, `2h`, `1d`)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("--db-path", dest="db", default=DEFAULT_DB_PATH, metavar="FILE",
                        help=f"decision log file, as the daemon's --db-path (default {DEFAULT_DB_PATH})")
    parser.add_argument("--db", dest="db", default=DEFAULT_DB_PATH, help=argparse.SUPPRESS)  # (before 0.2)
    parser.add_argument("--request", metavar="ID", help="only this request id")
    parser.add_argument("--engine", metavar="ID", help="only this engine id")
    parser.add_argument("--tenant", metavar="NAME", help="only this tenant")
    parser.add_argument("--kind", metavar="KIND", help=f"only this kind: {', '.join(KINDS)}")
    parser.add_argument("--since", metavar="TIME", help="from this time on (unix s, ISO 8601, or 10m / 2h / 1d ago)")
    parser.add_argument("--until", metavar="TIME", help="before this time (same forms as --since)")
    parser.add_argument("--limit", metavar="N", help="newest N matching rows (default 100, 10 with -f; 0: all)")
    parser.add_argument("--before-seq", metavar="N",
                        help="only decisions with a seq below N (the next page: the first seq shown; 0: no bound)")
    parser.add_argument("-f", "--follow", action="store_true",
                        help="then print new matching decisions as they are committed, until Ctrl-C")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="JSON lines: one object per decision")
    output.add_argument("--csv", action="store_true", help="CSV with a header row")
    parser.add_argument("--disk-usage", action="store_true",
                        help="the file's size and the span of decisions it holds, not the decisions (--json: one object)")


_LATEST_S = 253_402_300_799.0  # 9999-12-31T23:59:59Z, datetime's last second


def parse_time(text: str, *, option: str, now: float | None = None) -> float:
    """Unix seconds from unix seconds, ISO 8601, `now`, or a relative `10m` (ago)."""
    now = time.time() if now is None else now
    value = text.strip()
    cannot_read = CLIError(
        f"{option}: cannot read {text!r} as a time "
        "(use unix seconds, ISO 8601 like 2026-11-29T08:00:00Z, or relative like 10m, 2h, 1d)"
    )
    out_of_range = CLIError(
        f"{option}: {text!r} is out of range (times from 1970-01-01T00:00:00Z to 9999-12-31T23:59:59Z)"
    )
    if value == "now":
        return now
    relative = _RELATIVE.match(value)
    if relative:
        # Further back than 1970 is "from the start": no decision is older (and a negative
        # unix time is none the absolute forms accept).
        return max(0.0, now - float(relative[1]) * _UNIT_S[relative[2]])
    try:
        seconds = float(value)
    except ValueError:
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise cannot_read from None
        # A date it reads can still be no unix time (0001-01-01 local has none) or one
        # before 1970: saying it cannot be read sent users hunting for a typo.
        try:
            seconds = moment.timestamp()
        except (ValueError, OverflowError):
            raise out_of_range from None
        if not 0 <= seconds <= _LATEST_S:
            raise out_of_range
        return seconds
    # nan and inf read as floats but are no number of seconds; -5 and 1e20 are, of no time a
    # log holds (datetime reaches year 9999, 253402300799 s)
    if not math.isfinite(seconds):
        raise cannot_read
    if not 0 <= seconds <= _LATEST_S:
        raise out_of_range
    return seconds


def _parse_count(text: str, flag: str, zero_means: str) -> int:
    """A whole number >= 0 for `flag` (0 is `zero_means`), at most SQLite's largest integer
    (more rows, or seqs, than any log holds)."""
    try:
        count = int(text)
    except ValueError:
        raise CLIError(f"{flag}: expected a whole number, got {text!r}") from None
    if count < 0:
        raise CLIError(f"{flag}: must be 0 ({zero_means}) or more, got {count}")
    return min(count, 2**63 - 1)


def run(args: argparse.Namespace) -> int:
    from kvbudget.daemon.log.query import log_identity, newest_id, query_decisions
    from kvbudget.daemon.log.schema import DecisionLogError

    if args.disk_usage:
        return _disk_usage(args)
    if args.kind is not None and args.kind not in KINDS:
        raise CLIError(f"--kind: unknown kind {args.kind!r} (expected one of {', '.join(KINDS)})")
    now = time.time()
    since = parse_time(args.since, option="--since", now=now) if args.since is not None else None
    until = parse_time(args.until, option="--until", now=now) if args.until is not None else None
    if since is not None and until is not None and since >= until:
        raise CLIError("--since must be earlier than --until")
    if args.follow and until is not None:
        raise CLIError("--follow: shows decisions as they come; drop --until")
    if args.follow and args.before_seq is not None:
        raise CLIError("--follow: shows decisions as they come; drop --before-seq")
    before_seq = None  # (0: no bound, as in QueryDecisions)
    if args.before_seq is not None:
        before_seq = _parse_count(args.before_seq, "--before-seq", "no bound") or None
    limit = _parse_count(args.limit, "--limit", "all") if args.limit is not None else (FOLLOW_LIMIT if args.follow else 100)
    if args.follow and not os.path.lexists(args.db):
        _wait_for_a_log(args.db)
    try:
        # (taken first: a row committed meanwhile is in the query's answer, or matches not)
        identity = log_identity(args.db) if args.follow else ""
        newest = newest_id(args.db) if args.follow else 0
        rows = query_decisions(
            args.db,
            request_id=args.request,
            engine_id=args.engine,
            tenant=args.tenant,
            kind=args.kind,
            since_s=since,
            until_s=until,
            limit=limit,
            newest_first=True,
            before_seq=before_seq,
        )
    except DecisionLogError as exc:
        raise CLIError(str(exc)) from None
    rows.reverse()  # newest N selected; shown oldest first, like a log
    if args.follow:
        return _follow(args, rows, after_id=max([newest, *(row["id"] for row in rows)]), identity=identity)
    if args.json:
        _print_json_lines(rows)
    elif args.csv:
        _print_csv(rows)
    else:
        _print_table(rows, args.db)
    return 0


FOLLOW_LIMIT = 10  # journalctl -f's
FOLLOW_POLL_S = 0.25


def _follow(args: argparse.Namespace, rows: list[dict[str, Any]], *, after_id: int, identity: str) -> int:
    """Prints `rows`, then, every FOLLOW_POLL_S, the matching rows committed since (by id:
    the daemon numbers them in commit order), until interrupted (the CLI's Ctrl-C).
    Reading takes no lock the daemon waits for (WAL readers never block the writer).
    A log started over at the same path (`identity`: removed, and a new one made by the
    restarted daemon) numbers from 1 again: it is followed from its first decision on."""
    from kvbudget.daemon.log.query import log_identity, query_decisions
    from kvbudget.daemon.log.schema import DecisionLogError

    first = True
    table_header = True  # over the first rows printed (none may match at first)
    gone = False  # the file is not there (removed; a restarted daemon makes a new one)
    while True:
        if rows or first:
            if args.json:
                _print_json_lines(rows)
            elif args.csv:
                _print_csv(rows, header=first)
            else:
                _print_table(rows, args.db, following=True, header=table_header)
                table_header = table_header and not rows
            sys.stdout.flush()  # (a pipe would otherwise hold them back)
            first = False
        time.sleep(FOLLOW_POLL_S)
        if not _has_content(args.db):  # (a new file is empty until its daemon makes the schema)
            if not gone:
                print(f"kvbudget log: {args.db} is gone: waiting for a log there", file=sys.stderr, flush=True)
            gone, rows = True, []
            continue
        gone = False
        try:
            now_identity = log_identity(args.db)
            if now_identity != identity:
                identity, after_id = now_identity, 0
                print(f"kvbudget log: {args.db} is a new log (the old one was removed): following it from its start",
                      file=sys.stderr, flush=True)
            rows = query_decisions(
                args.db, request_id=args.request, engine_id=args.engine, tenant=args.tenant, kind=args.kind,
                limit=None, newest_first=False, after_id=after_id,
            )
        except DecisionLogError as exc:
            raise CLIError(str(exc)) from None
        if rows:
            after_id = rows[-1]["id"]


# How long a file that appeared at the followed path may take to read as a decision log: a
# starting daemon makes the file, then its tables, a moment apart.
NEW_LOG_GRACE_S = 5.0


def _wait_for_a_log(db: str) -> None:
    """`-f` on a path with no log yet (a daemon not started, or started after its reader):
    wait for one there, as `-f` waits when a followed log is removed (`tail -F`'s way),
    saying so once; return once it reads as a decision log."""
    from kvbudget.daemon.log.query import open_read_only
    from kvbudget.daemon.log.schema import DecisionLogError

    print(f"kvbudget log: no decision log at {db} yet: waiting for one there", file=sys.stderr, flush=True)
    appeared_at: float | None = None
    while True:
        time.sleep(FOLLOW_POLL_S)
        if not _has_content(db):
            continue
        appeared_at = appeared_at or time.monotonic()
        try:
            open_read_only(db).close()
            return
        except DecisionLogError as exc:
            if time.monotonic() - appeared_at > NEW_LOG_GRACE_S:  # (someone else's file, not a daemon's)
                raise CLIError(str(exc)) from None


def _has_content(path: str) -> bool:
    try:
        return os.path.getsize(path) > 0
    except OSError:
        return False


_FILTERS = ("request", "engine", "tenant", "kind", "since", "until")


def _disk_usage(args: argparse.Namespace) -> int:
    """Like `journalctl --disk-usage`, and how far back the log reaches (what retention kept)."""
    import dataclasses

    from kvbudget.daemon.log.query import log_usage
    from kvbudget.daemon.log.schema import DecisionLogError

    given = [f"--{name}" for name in _FILTERS if getattr(args, name) is not None]
    given += ["--limit"] * (args.limit is not None) + ["--before-seq"] * (args.before_seq is not None)
    given += ["--csv"] * args.csv + ["--follow"] * args.follow
    if given:
        raise CLIError(f"--disk-usage: describes the whole log; drop {', '.join(given)}")
    try:
        usage = log_usage(args.db)
    except (DecisionLogError, OSError) as exc:
        raise CLIError(str(exc)) from None
    if args.json:
        print(json.dumps({"path": args.db, **dataclasses.asdict(usage)}, separators=(",", ":")))
        return 0
    free = usage.file_bytes - usage.used_bytes
    print(f"{args.db}: {format_bytes(usage.file_bytes, '.1f')}"
          + (f" ({format_bytes(free, '.1f')} of it free pages that new decisions reuse)" if free > 0 else "")
          + f", WAL {format_bytes(usage.wal_bytes, '.1f')}")
    if usage.oldest_unix_s is None or usage.newest_unix_s is None:
        print("no decisions")
    else:
        span_s = usage.newest_unix_s - usage.oldest_unix_s
        print(f"{usage.num_decisions:,} decisions from {_format_time(usage.oldest_unix_s)} "
              f"to {_format_time(usage.newest_unix_s)} ({_duration(span_s)})")
    return 0


def _duration(seconds: float) -> str:
    for unit, scale in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= scale:
            return f"{seconds / scale:.1f} {unit}"
    return f"{seconds:.1f} s"


def _print_json_lines(rows: list[dict[str, Any]]) -> None:
    out = sys.stdout
    for row in rows:
        out.write(json.dumps(row, separators=(",", ":")) + "\n")


def _print_csv(rows: list[dict[str, Any]], *, header: bool = True) -> None:
    from kvbudget.daemon.log.schema import COLUMNS, JSON_FIELDS

    writer = csv.writer(sys.stdout, lineterminator="\n")
    if header:
        writer.writerow(["id", *COLUMNS])
    for row in rows:
        writer.writerow(
            [json.dumps(row[c], separators=(",", ":")) if c in JSON_FIELDS else row[c] for c in ("id", *COLUMNS)]
        )


def _format_time(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s).isoformat(sep=" ", timespec="milliseconds")


# (name, justify, width when following: every batch then lines up under the one header)
_TABLE_COLUMNS = (
    ("time", "left", 23), ("seq", "right", 7), ("kind", "left", 7), ("reason", "left", 14),
    ("request", "left", 20), ("engine", "left", 12), ("tenant", "left", 10), ("tokens", "right", 11),
    ("held", "right", 9), ("+new/-freed", "right", 11), ("free", "right", 6), ("run/wait", "right", 8),
    ("detail", "left", None),
)


def _print_table(rows: list[dict[str, Any]], db: str, *, following: bool = False, header: bool = True) -> None:
    """A table, with a count under it; following, batch after batch in fixed widths, the
    header over the first only."""
    from rich.table import Table

    from kvbudget.cli.console import cli_console

    # Markup off: every cell is the log's data, which engines chose ("[/x]" in a request id
    # is text, not a closing tag that would stop the table or change the id shown).
    console = cli_console()
    if not rows:
        if following:
            console.print(f"following {db}: no matching decisions yet", style="dim")
        else:
            console.print(f"no matching decisions in {db}")
        return
    table = Table(show_edge=False, header_style="bold", pad_edge=False, show_header=header)
    for name, justify, width in _TABLE_COLUMNS:
        wraps = name == "detail"
        table.add_column(name, justify=justify, overflow="fold" if wraps else "ellipsis",  # type: ignore[arg-type]
                         no_wrap=not wraps, width=width if following else None)
    for row in rows:
        new_blocks = sum(len(ids) for ids in row["new_block_ids"])
        table.add_row(
            _format_time(row["logged_at"]),
            str(row["seq"]),
            row["kind"],
            row["reason"],
            row["request_id"],
            row["engine_id"],
            row["tenant"],
            f"{row['prompt_tokens']}+{row['max_new_tokens']}",
            "/".join(map(str, row["blocks_held"])) or "-",
            f"+{new_blocks}/-{row['freed_blocks']}",
            str(row["num_free_blocks"]),
            f"{row['num_running']}/{row['num_waiting']}",
            row["detail"],
        )
    console.print(table)
    if not following:
        console.print(f"{len(rows)} decision(s) from {db}", style="dim")
