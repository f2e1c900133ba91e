"""Mooncake JSONL: `{"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}`,
prefix hash ids on 512-token blocks."""

from __future__ import annotations

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

MOONCAKE_BLOCK_SIZE = 512


def read_mooncake(file: Path, lines: list[str], skip: bool, start: int, limit: int | None) -> Trace:
    out = Collector(file, skip, start, limit)
    for line, row in json_rows(lines, out):
        try:
            for key in ("timestamp", "input_length", "output_length", "hash_ids"):
                if key not in row:
                    raise BadRow(key, "missing")
            arrival_ms = float_field(row["timestamp"], "timestamp")
            prompt = int_field(row["input_length"], "input_length", 1)
            output = int_field(row["output_length"], "output_length", 1)
            hashes = hash_list(row["hash_ids"], "hash_ids")
            if len(hashes) > -(-prompt // MOONCAKE_BLOCK_SIZE):
                raise BadRow(
                    "hash_ids",
                    f"{len(hashes)} blocks of {MOONCAKE_BLOCK_SIZE} tokens for a"
                    f" {prompt}-token prompt",
                )
        except BadRow as exc:
            out.bad(line, exc)
            continue
        out.add(
            TraceRequest(
                arrival_s=arrival_ms / 1000.0,
                prompt_tokens=prompt,
                output_tokens=output,
                prefix_hashes=hashes,
                hash_block_size=MOONCAKE_BLOCK_SIZE,
                line=line,
                request_id=request_id(file, line),
            )
        )
    return out.trace("mooncake")
