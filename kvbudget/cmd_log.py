"""`kvbudget log`: query the decision log, with or without the daemon running.

    kvbudget log --request req-42                  every decision about one request
    kvbudget log --kind preempt --since 10m        preemptions in the last ten minutes
    kvbudget log --engine vllm-0 --json | jq .     JSON lines, one decision per line
    kvbudget log --since 2026-11-29T08:00Z --csv   CSV with a header row
    kvbudget log --disk-usage                      how big the log is, how far back it reaches

Rows are printed oldest first; `--limit` keeps the newest N that match (0: all).
Times are unix seconds, ISO 8601 (naive means local time, like journalctl), or relative
to now (`30s`, `10m`, `2h`, `1d`).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import sys
import time
from datetime import datetime
from typing import Any

from kvbudget.daemon.config import DEFAULT_DB_PATH
from kvbudget.errors import CLIError
from kvbudget.units import format_bytes

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
KINDS = ("admit", "queue", "reject", "grow", "deny", "preempt", "reclaim", "release", "expire", "policy")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "\n".join((__doc__ or "").splitlines()[2:])  # the examples above
    parser.add_argument("--db", default=DEFAULT_DB_PATH, help=f"decision log file (default {DEFAULT_DB_PATH})")
    parser.add_argument("--request", metavar="ID", help="only this request id")
    parser.add_argument("--engine", metavar="ID", help="only this engine id")
    parser.add_argument("--tenant", metavar="NAME", help="only this tenant")
    parser.add_argument("--kind", metavar="KIND", help=f"only this kind: {', '.join(KINDS)}")
    parser.add_argument("--since", metavar="TIME", help="from this time on (unix s, ISO 8601, or 10m / 2h / 1d ago)")
    parser.add_argument("--until", metavar="TIME", help="before this time (same forms as --since)")
    parser.add_argument("--limit", metavar="N", default="100", help="newest N matching rows (default 100; 0: all)")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="JSON lines: one object per decision")
    output.add_argument("--csv", action="store_true", help="CSV with a header row")
    parser.add_argument("--disk-usage", action="store_true",
                        help="the file's size and the span of decisions it holds, not the decisions (--json: one object)")


def parse_time(text: str, *, option: str, now: float | None = None) -> float:
    """Unix seconds from unix seconds, ISO 8601, `now`, or a relative `10m` (ago)."""
    now = time.time() if now is None else now
    value = text.strip()
    if value == "now":
        return now
    relative = _RELATIVE.match(value)
    if relative:
        return now - float(relative[1]) * _UNIT_S[relative[2]]
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise CLIError(
            f"{option}: cannot read {text!r} as a time "
            "(use unix seconds, ISO 8601 like 2026-11-29T08:00:00Z, or relative like 10m, 2h, 1d)"
        ) from None


def _parse_limit(text: str) -> int:
    try:
        limit = int(text)
    except ValueError:
        raise CLIError(f"--limit: expected a whole number, got {text!r}") from None
    if limit < 0:
        raise CLIError(f"--limit: must be 0 (all) or more, got {limit}")
    return limit


def run(args: argparse.Namespace) -> int:
    from kvbudget.daemon.decision_query import query_decisions
    from kvbudget.daemon.decision_schema import DecisionLogError

    if args.disk_usage:
        return _disk_usage(args)
    if args.kind is not None and args.kind not in KINDS:
        raise CLIError(f"--kind: unknown kind {args.kind!r} (expected one of {', '.join(KINDS)})")
    now = time.time()
    since = parse_time(args.since, option="--since", now=now) if args.since else None
    until = parse_time(args.until, option="--until", now=now) if args.until else None
    if since is not None and until is not None and since >= until:
        raise CLIError("--since must be earlier than --until")
    limit = _parse_limit(args.limit)
    try:
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
        )
    except DecisionLogError as exc:
        raise CLIError(str(exc)) from None
    rows.reverse()  # newest N selected; shown oldest first, like a log
    if args.json:
        _print_json_lines(rows)
    elif args.csv:
        _print_csv(rows)
    else:
        _print_table(rows, args.db)
    return 0


_FILTERS = ("request", "engine", "tenant", "kind", "since", "until")


def _disk_usage(args: argparse.Namespace) -> int:
    """Like `journalctl --disk-usage`, and how far back the log reaches (what retention kept)."""
    import dataclasses

    from kvbudget.daemon.decision_query import log_usage
    from kvbudget.daemon.decision_schema import DecisionLogError

    given = [f"--{name}" for name in _FILTERS if getattr(args, name) is not None]
    if given or args.csv:
        raise CLIError(f"--disk-usage: describes the whole log; drop {', '.join(given or ['--csv'])}")
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


def _print_csv(rows: list[dict[str, Any]]) -> None:
    from kvbudget.daemon.decision_schema import COLUMNS, JSON_FIELDS

    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(["id", *COLUMNS])
    for row in rows:
        writer.writerow(
            [json.dumps(row[c], separators=(",", ":")) if c in JSON_FIELDS else row[c] for c in ("id", *COLUMNS)]
        )


def _format_time(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s).isoformat(sep=" ", timespec="milliseconds")


def _print_table(rows: list[dict[str, Any]], db: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=200)  # piped: 80 columns would fold every cell
    if not rows:
        console.print(f"no matching decisions in {db}")
        return
    table = Table(show_edge=False, header_style="bold", pad_edge=False)
    for name, justify in (
        ("time", "left"), ("seq", "right"), ("kind", "left"), ("reason", "left"), ("request", "left"),
        ("engine", "left"), ("tenant", "left"), ("tokens", "right"), ("held", "right"),
        ("+new/-freed", "right"), ("free", "right"), ("run/wait", "right"), ("detail", "left"),
    ):
        wraps = name == "detail"
        table.add_column(name, justify=justify, overflow="fold" if wraps else "ellipsis",  # type: ignore[arg-type]
                         no_wrap=not wraps)
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
    console.print(f"{len(rows)} decision(s) from {db}", style="dim")
