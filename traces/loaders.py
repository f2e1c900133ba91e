"""Request traces in, one `TraceRequest` (trace_request.py) per row out, whatever the
file's format: Mooncake JSONL, Azure CSV, or a plain CSV/JSONL (one module each,
format_*.py), gzip-compressed or not, detected from the first line, not the file name.
(Bad rows, the sort by arrival, start/limit: docs/architecture/traces.md.)
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

from kvbudget.traces.format_azure import AZURE_HEADER, read_azure
from kvbudget.traces.format_mooncake import read_mooncake
from kvbudget.traces.format_plain import read_plain_csv, read_plain_jsonl
from kvbudget.traces.trace_request import Trace, TraceError
from kvbudget.traces.trace_rows import json_problem

SHIPPED_TRACES: dict[str, str] = {
    "mooncake": "mooncake_fast25_conversation_trace.jsonl",
    "azure": "azure_llm_2023_conv.csv",
}
_GZIP_MAGIC = b"\x1f\x8b"


def resolve_trace_path(name_or_path: str | Path) -> Path:
    """A shipped trace name (`mooncake`, `azure`) or a file path."""
    text = str(name_or_path)
    if text in SHIPPED_TRACES:
        return Path(__file__).resolve().parent / SHIPPED_TRACES[text]
    return Path(text)


def load_trace(
    path: str | Path, *, skip_bad_rows: bool = False, limit: int | None = None, start: int = 0
) -> Trace:
    """Read a trace (gzip-compressed or not). Its rows are sorted by arrival (stably), then
    `start` skips that many of the earliest requests and `limit` keeps at most that many."""
    file = resolve_trace_path(path)
    if start < 0:
        raise ValueError(f"start: must be >= 0, got {start}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit: must be >= 0, got {limit}")
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise TraceError(f"{file}: cannot read: {exc.strerror or exc}") from None
    if data.startswith(_GZIP_MAGIC):  # by content, not by name: `.gz` or not
        data = _gunzip(file, data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise TraceError(f"{file}:{line}: not UTF-8 text") from None
    lines = text.splitlines()  # handles CRLF and a missing final newline
    reader = _pick_reader(file, lines)
    return reader(file, lines, skip_bad_rows, start, limit)


def _gunzip(file: Path, data: bytes) -> bytes:
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
        raise TraceError(f"{file}: gzip-compressed but cannot be decompressed: {exc}") from None


def _pick_reader(file: Path, lines: list[str]):
    first_index = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first_index is None:
        raise TraceError(f"{file}:1: empty trace")
    first = lines[first_index].strip()
    if first.startswith("{"):
        try:
            keys = json.loads(first).keys()
        except (json.JSONDecodeError, AttributeError):
            raise TraceError(f"{file}:{first_index + 1}: not a JSON object") from None
        except (RecursionError, ValueError) as exc:  # (not a traceback: issue 30)
            raise TraceError(f"{file}:{first_index + 1}: not valid JSON ({json_problem(exc)})") from None
        if "input_length" in keys:
            return read_mooncake
        if "prompt_tokens" in keys:
            return read_plain_jsonl
        raise TraceError(
            f"{file}:{first_index + 1}: unknown JSONL trace: expected Mooncake fields"
            " (timestamp, input_length, output_length, hash_ids) or arrival_s, prompt_tokens,"
            " output_tokens"
        )
    header = tuple(cell.strip() for cell in first.split(","))
    if header == AZURE_HEADER:
        return read_azure
    if {"arrival_s", "prompt_tokens", "output_tokens"} <= set(header):
        return read_plain_csv
    raise TraceError(
        f"{file}:{first_index + 1}: unknown trace header {first[:80]!r}: expected"
        " TIMESTAMP,ContextTokens,GeneratedTokens or arrival_s,prompt_tokens,output_tokens"
    )
