"""What every trace reader shares: field parsers that name the field, the skip-or-raise of
bad rows, and the sort by arrival before start/limit."""

from __future__ import annotations

import json
from collections.abc import Iterator
from operator import attrgetter
from pathlib import Path

from kvbudget.traces.trace_request import Trace, TraceError, TraceRequest


MAX_INT = 2**64 - 1  # the widest a trace's counts and hashes can be on the wire


class BadRow(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")


def _shown(value: object) -> str:
    """`value!r`, cut to a readable length (a 5,001-digit number made a 5,000-character line)."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text):,} characters)"


def int_field(value: object, field: str, minimum: int) -> int:
    if isinstance(value, bool):
        raise BadRow(field, f"expected an integer, got {_shown(value)}")
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise BadRow(field, f"expected an integer, got {_shown(value)}") from None
    if not isinstance(value, int):
        raise BadRow(field, f"expected an integer, got {_shown(value)}")
    if value < minimum:
        raise BadRow(field, f"must be >= {minimum}, got {value}")
    if value > MAX_INT:  # (a 4,000-digit count went on into the simulation)
        raise BadRow(field, f"must be at most {MAX_INT:,} (an unsigned 64-bit integer), got {len(str(value))} digits")
    return value


def float_field(value: object, field: str) -> float:
    if isinstance(value, bool):
        raise BadRow(field, f"expected a number, got {_shown(value)}")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):  # (OverflowError: an int past float's range)
        raise BadRow(field, f"expected a number, got {_shown(value)}") from None
    if not number >= 0.0 or number == float("inf"):
        raise BadRow(field, f"must be a finite number >= 0, got {_shown(value)}")
    return number


def hash_list(value: object, field: str) -> tuple[int, ...]:
    if isinstance(value, str):
        value = value.split()
    if not isinstance(value, list | tuple):
        raise BadRow(field, f"expected a list of integers, got {type(value).__name__}")
    return tuple(int_field(item, field, 0) for item in value)


class Collector:
    """Skip-or-raise for bad rows as a reader yields them; keeps every good one, then
    sorts them by arrival and applies start/limit (`trace`)."""

    def __init__(self, file: Path, skip_bad_rows: bool, start: int, limit: int | None) -> None:
        self.file = file
        self.skip_bad_rows = skip_bad_rows
        self.start = start
        self.limit = limit
        self.skipped = 0
        self.requests: list[TraceRequest] = []

    def bad(self, line: int, error: BadRow | str) -> None:
        if self.skip_bad_rows:
            self.skipped += 1
            return
        raise TraceError(f"{self.file}:{line}: {error}")

    def add(self, request: TraceRequest) -> None:
        self.requests.append(request)

    def trace(self, format_name: str) -> Trace:
        # Stable: rows sharing a time keep their file order. Already-sorted files (the
        # shipped ones) cost one linear pass.
        ordered = sorted(self.requests, key=attrgetter("arrival_s"))
        end = None if self.limit is None else self.start + self.limit
        return Trace(
            self.file.name, format_name, tuple(ordered[self.start : end]), self.skipped,
            rows=len(ordered), max_output_tokens=max((r.output_tokens for r in ordered), default=0),
        )  # fmt: skip


def request_id(file: Path, line: int) -> str:
    # `conv.jsonl.gz` and `conv.jsonl` name the same trace: `conv:<line>` for both.
    return f"{Path(file.name.removesuffix('.gz')).stem}:{line}"


def json_problem(exc: Exception) -> str:
    """Why json.loads failed beyond a syntax error: nesting deeper than the parser recurses,
    or an integer of more digits than int() takes (4,300 by default)."""
    return "nested too deeply" if isinstance(exc, RecursionError) else "a number with too many digits"


def json_rows(lines: list[str], out: Collector) -> Iterator[tuple[int, dict]]:
    """(line number, JSON object) for each non-blank line; bad JSON is reported to `out`."""
    for index, text in enumerate(lines):
        if not text.strip():
            continue
        line = index + 1
        try:
            row = json.loads(text)
        except json.JSONDecodeError as exc:
            out.bad(line, f"not valid JSON ({exc.msg})")
            continue
        except (RecursionError, ValueError) as exc:  # (not a traceback: issue 30)
            out.bad(line, f"not valid JSON ({json_problem(exc)})")
            continue
        if not isinstance(row, dict):
            out.bad(line, BadRow("row", "expected a JSON object"))
            continue
        yield line, row
