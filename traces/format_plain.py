"""Plain CSV or JSONL: `arrival_s, prompt_tokens, output_tokens` and optionally `tenant`,
`priority`, `prefix_hashes` (a JSON array, or space-separated in CSV) and `hash_block_size`
(default 16)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from kvbudget.traces.trace_request import Trace, TraceRequest
from kvbudget.traces.trace_rows import (
    BadRow,
    Collector,
    float_field,
    hash_list,
    int_field,
    json_rows,
    request_id,
)

PLAIN_DEFAULT_HASH_BLOCK_SIZE = 16


def plain_request(row: dict, file: Path, line: int) -> TraceRequest:
    for key in ("arrival_s", "prompt_tokens", "output_tokens"):
        if row.get(key) in (None, ""):
            raise BadRow(key, "missing")
    hashes_raw = row.get("prefix_hashes")
    hashes = hash_list(hashes_raw, "prefix_hashes") if hashes_raw not in (None, "") else ()
    block_raw = row.get("hash_block_size")
    block = (
        int_field(block_raw, "hash_block_size", 1)
        if block_raw not in (None, "")
        else PLAIN_DEFAULT_HASH_BLOCK_SIZE
    )
    priority_raw = row.get("priority")
    tenant = row.get("tenant")
    if tenant is not None and not isinstance(tenant, str):
        raise BadRow("tenant", f"expected a string, got {tenant!r}")
    return TraceRequest(
        arrival_s=float_field(row["arrival_s"], "arrival_s"),
        prompt_tokens=int_field(row["prompt_tokens"], "prompt_tokens", 1),
        output_tokens=int_field(row["output_tokens"], "output_tokens", 1),
        prefix_hashes=hashes,
        hash_block_size=block if hashes else 0,
        tenant=tenant or "",
        priority=int_field(priority_raw, "priority", -(2**31)) if priority_raw not in (None, "") else 0,
        line=line,
        request_id=request_id(file, line),
    )


def read_plain_jsonl(file: Path, lines: list[str], skip: bool, start: int, limit: int | None) -> Trace:
    out = Collector(file, skip, start, limit)
    for line, row in json_rows(lines, out):
        try:
            request = plain_request(row, file, line)
        except BadRow as exc:
            out.bad(line, exc)
            continue
        out.add(request)
    return out.trace("plain-jsonl")


def read_plain_csv(file: Path, lines: list[str], skip: bool, start: int, limit: int | None) -> Trace:
    out = Collector(file, skip, start, limit)
    header: list[str] | None = None
    for index, text in enumerate(lines):
        if not text.strip():
            continue
        cells = next(csv.reader(io.StringIO(text)))
        if header is None:
            header = [cell.strip() for cell in cells]
            continue
        line = index + 1
        try:
            if len(cells) != len(header):
                raise BadRow("row", f"expected {len(header)} columns, got {len(cells)}")
            request = plain_request(dict(zip(header, cells)), file, line)
        except BadRow as exc:
            out.bad(line, exc)
            continue
        out.add(request)
    return out.trace("plain-csv")
