"""Azure LLM inference CSV: `TIMESTAMP,ContextTokens,GeneratedTokens`, CRLF line ends,
timestamps like `2023-11-16 18:15:46.6805900`; arrivals become seconds from the earliest row."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path

from kvbudget.traces.trace_request import Trace, TraceRequest
from kvbudget.traces.trace_rows import BadRow, Collector, int_field, request_id

AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

# `%Y-%m-%d %H:%M:%S` as strptime reads it (1-2 digit fields), at a fraction of its cost:
# strptime was most of the time of loading the 19k-row Azure file, which every replay
# now reads whole (rows are sorted before --start/--limit).
_AZURE_BASE = re.compile(r"(\d{4})-(\d{1,2})-(\d{1,2}) (\d{1,2}):(\d{1,2}):(\d{1,2})", re.ASCII)
_EPOCH = datetime(1970, 1, 1)
_SECOND = timedelta(seconds=1)


def azure_ticks(stamp: str) -> int:
    """`2023-11-16 18:15:46.6805900` -> 100 ns ticks since 1970 (zone unknown, taken as UTC).

    Integers, because a float of epoch seconds keeps only ~0.2 us and would blur the
    7-digit fractions. A malformed stamp is a ValueError."""
    base, _, fraction = stamp.strip().partition(".")
    if fraction and (not fraction.isdigit() or len(fraction) > 7):
        raise ValueError(stamp)
    match = _AZURE_BASE.fullmatch(base)
    if match is None:
        raise ValueError(stamp)
    moment = datetime(*map(int, match.groups()))  # checks ranges (month 13, Feb 30, ...)
    whole = (moment - _EPOCH) // _SECOND
    return whole * 10**7 + (int(fraction.ljust(7, "0")) if fraction else 0)


def read_azure(file: Path, lines: list[str], skip: bool, start: int, limit: int | None) -> Trace:
    out = Collector(file, skip, start, limit)
    rows: list[tuple[int, int, int, int]] = []  # (ticks, prompt, output, line)
    header_seen = False
    for index, text in enumerate(lines):
        if not text.strip():
            continue
        if not header_seen:
            header_seen = True
            continue
        line = index + 1
        cells = text.split(",")
        try:
            if len(cells) != 3:
                raise BadRow("row", f"expected 3 columns, got {len(cells)}")
            try:
                ticks = azure_ticks(cells[0])
            except ValueError:
                raise BadRow("TIMESTAMP", f"expected YYYY-MM-DD HH:MM:SS.fffffff, got {cells[0]!r}") from None
            prompt = int_field(cells[1], "ContextTokens", 1)
            output = int_field(cells[2], "GeneratedTokens", 1)
        except BadRow as exc:
            out.bad(line, exc)
            continue
        rows.append((ticks, prompt, output, line))
    # Arrivals count from the earliest good row, not the first: in a file out of time
    # order, the first row is not where the trace starts.
    origin = min((row[0] for row in rows), default=0)
    for ticks, prompt, output, line in rows:
        out.add(
            TraceRequest(
                arrival_s=(ticks - origin) / 10**7,
                prompt_tokens=prompt,
                output_tokens=output,
                line=line,
                request_id=request_id(file, line),
            )
        )
    return out.trace("azure")
