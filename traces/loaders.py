"""Request traces in, one `TraceRequest` per row out, whatever the file's format.

Formats (detected from the first line, not the file name):
- Mooncake JSONL: `{"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}`,
  prefix hash ids on 512-token blocks.
- Azure LLM inference CSV: `TIMESTAMP,ContextTokens,GeneratedTokens`, CRLF line ends,
  timestamps like `2023-11-16 18:15:46.6805900`; arrivals become seconds from the earliest row.
- Plain CSV or JSONL: `arrival_s, prompt_tokens, output_tokens` and optionally `tenant`,
  `priority`, `prefix_hashes` (a JSON array, or space-separated in CSV) and
  `hash_block_size` (default 16).

A file compressed with gzip (public traces often ship as `.jsonl.gz`) is read through it;
the format and line numbers are those of the decompressed text.

A malformed row is a `TraceError` naming the file, the line number and the field, or, with
`skip_bad_rows`, skipped and counted in `Trace.skipped`.

Rows need not be in time order: the whole file is read, its good rows are sorted by arrival
(stably: rows with equal times keep their file order), and only then are `start` requests
skipped and at most `limit` kept. So `start`/`limit` pick a window of the trace's timeline,
and a malformed row anywhere in the file counts, not only inside the window.

Trace prefix hashes live on the trace's block size (512 tokens for Mooncake); the pool's
block size is usually smaller. `pool_prefix_hashes` derives one chained hash per FULL pool
block of the prompt, so two requests share pool-block hashes exactly as far as they share
trace blocks.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import repeat
from operator import attrgetter
from pathlib import Path

MOONCAKE_BLOCK_SIZE = 512
MOONCAKE_TIMESTAMP_QUANTUM_S = 3.0  # Mooncake timestamps come in ~3 s buckets
PLAIN_DEFAULT_HASH_BLOCK_SIZE = 16
SHIPPED_TRACES: dict[str, str] = {
    "mooncake": "mooncake_fast25_conversation_trace.jsonl",
    "azure": "azure_llm_2023_conv.csv",
}
AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_MASK64 = (1 << 64) - 1
_CHAIN_ROOT = 0x6B76_6275_6467_6574  # any fixed value: the parent of a prompt's first block
_GZIP_MAGIC = b"\x1f\x8b"


class TraceError(ValueError):
    """A trace file that cannot be read; the message names file, line and field."""


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float  # seconds, as the file says (Azure: from its earliest row)
    prompt_tokens: int
    output_tokens: int
    prefix_hashes: tuple[int, ...] = ()  # on `hash_block_size`-token blocks
    hash_block_size: int = 0  # 0: the trace has no prefix information
    tenant: str = ""
    priority: int = 0
    line: int = 0  # 1-based line in the file
    request_id: str = ""  # "<trace name>:<line>"


@dataclass(frozen=True)
class Trace:
    name: str
    format: str  # "mooncake", "azure", "plain-csv" or "plain-jsonl"
    requests: tuple[TraceRequest, ...]  # sorted by arrival, after start/limit
    skipped: int = 0
    rows: int = 0  # good rows in the whole file, before start/limit
    # The longest output of the whole file (not only of the window `requests` holds): the
    # service's evident max_tokens, which a replay sends whatever slice it plays.
    max_output_tokens: int = 0

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def arrival_quantum_s(self) -> float:
        """How coarse the timestamps are: a replayer may spread a bucket over this."""
        return MOONCAKE_TIMESTAMP_QUANTUM_S if self.format == "mooncake" else 0.0

    @property
    def duration_s(self) -> float:
        if not self.requests:
            return 0.0
        return self.requests[-1].arrival_s - self.requests[0].arrival_s


# ------------------------------------------------------------------------ entry point


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
        if "input_length" in keys:
            return _read_mooncake
        if "prompt_tokens" in keys:
            return _read_plain_jsonl
        raise TraceError(
            f"{file}:{first_index + 1}: unknown JSONL trace: expected Mooncake fields"
            " (timestamp, input_length, output_length, hash_ids) or arrival_s, prompt_tokens,"
            " output_tokens"
        )
    header = tuple(cell.strip() for cell in first.split(","))
    if header == AZURE_HEADER:
        return _read_azure
    if {"arrival_s", "prompt_tokens", "output_tokens"} <= set(header):
        return _read_plain_csv
    raise TraceError(
        f"{file}:{first_index + 1}: unknown trace header {first[:80]!r}: expected"
        " TIMESTAMP,ContextTokens,GeneratedTokens or arrival_s,prompt_tokens,output_tokens"
    )


# ---------------------------------------------------------------------- row plumbing


class _BadRow(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")


def _int_field(value: object, field: str, minimum: int) -> int:
    if isinstance(value, bool):
        raise _BadRow(field, f"expected an integer, got {value!r}")
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise _BadRow(field, f"expected an integer, got {value!r}") from None
    if not isinstance(value, int):
        raise _BadRow(field, f"expected an integer, got {value!r}")
    if value < minimum:
        raise _BadRow(field, f"must be >= {minimum}, got {value}")
    return value


def _float_field(value: object, field: str) -> float:
    if isinstance(value, bool):
        raise _BadRow(field, f"expected a number, got {value!r}")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise _BadRow(field, f"expected a number, got {value!r}") from None
    if not number >= 0.0 or number == float("inf"):
        raise _BadRow(field, f"must be a finite number >= 0, got {value!r}")
    return number


def _hash_list(value: object, field: str) -> tuple[int, ...]:
    if isinstance(value, str):
        value = value.split()
    if not isinstance(value, list | tuple):
        raise _BadRow(field, f"expected a list of integers, got {type(value).__name__}")
    return tuple(_int_field(item, field, 0) for item in value)


class _Collector:
    """Skip-or-raise for bad rows as a reader yields them; keeps every good one, then
    sorts them by arrival and applies start/limit (`trace`)."""

    def __init__(self, file: Path, skip_bad_rows: bool, start: int, limit: int | None) -> None:
        self.file = file
        self.skip_bad_rows = skip_bad_rows
        self.start = start
        self.limit = limit
        self.skipped = 0
        self.requests: list[TraceRequest] = []

    def bad(self, line: int, error: _BadRow | str) -> None:
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


def _request_id(file: Path, line: int) -> str:
    # `conv.jsonl.gz` and `conv.jsonl` name the same trace: `conv:<line>` for both.
    return f"{Path(file.name.removesuffix('.gz')).stem}:{line}"


# ------------------------------------------------------------------------- readers


def _json_rows(lines: list[str], out: _Collector) -> Iterator[tuple[int, dict]]:
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
        if not isinstance(row, dict):
            out.bad(line, _BadRow("row", "expected a JSON object"))
            continue
        yield line, row


def _read_mooncake(file: Path, lines: list[str], skip: bool, start: int, limit: int | None) -> Trace:
    out = _Collector(file, skip, start, limit)
    for line, row in _json_rows(lines, out):
        try:
            for key in ("timestamp", "input_length", "output_length", "hash_ids"):
                if key not in row:
                    raise _BadRow(key, "missing")
            arrival_ms = _float_field(row["timestamp"], "timestamp")
            prompt = _int_field(row["input_length"], "input_length", 1)
            output = _int_field(row["output_length"], "output_length", 1)
            hashes = _hash_list(row["hash_ids"], "hash_ids")
            if len(hashes) > -(-prompt // MOONCAKE_BLOCK_SIZE):
                raise _BadRow(
                    "hash_ids",
                    f"{len(hashes)} blocks of {MOONCAKE_BLOCK_SIZE} tokens for a"
                    f" {prompt}-token prompt",
                )
        except _BadRow as exc:
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
                request_id=_request_id(file, line),
            )
        )
    return out.trace("mooncake")


# `%Y-%m-%d %H:%M:%S` as strptime reads it (1-2 digit fields), at a fraction of its cost:
# strptime was most of the time of loading the 19k-row Azure file, which every replay
# now reads whole (rows are sorted before --start/--limit).
_AZURE_BASE = re.compile(r"(\d{4})-(\d{1,2})-(\d{1,2}) (\d{1,2}):(\d{1,2}):(\d{1,2})", re.ASCII)
_EPOCH = datetime(1970, 1, 1)
_SECOND = timedelta(seconds=1)


def _azure_ticks(stamp: str) -> int:
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


def _read_azure(file: Path, lines: list[str], skip: bool, start: int, limit: int | None) -> Trace:
    out = _Collector(file, skip, start, limit)
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
                raise _BadRow("row", f"expected 3 columns, got {len(cells)}")
            try:
                ticks = _azure_ticks(cells[0])
            except ValueError:
                raise _BadRow("TIMESTAMP", f"expected YYYY-MM-DD HH:MM:SS.fffffff, got {cells[0]!r}") from None
            prompt = _int_field(cells[1], "ContextTokens", 1)
            output = _int_field(cells[2], "GeneratedTokens", 1)
        except _BadRow as exc:
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
                request_id=_request_id(file, line),
            )
        )
    return out.trace("azure")


def _plain_request(row: dict, file: Path, line: int) -> TraceRequest:
    for key in ("arrival_s", "prompt_tokens", "output_tokens"):
        if row.get(key) in (None, ""):
            raise _BadRow(key, "missing")
    hashes_raw = row.get("prefix_hashes")
    hashes = _hash_list(hashes_raw, "prefix_hashes") if hashes_raw not in (None, "") else ()
    block_raw = row.get("hash_block_size")
    block = (
        _int_field(block_raw, "hash_block_size", 1)
        if block_raw not in (None, "")
        else PLAIN_DEFAULT_HASH_BLOCK_SIZE
    )
    priority_raw = row.get("priority")
    tenant = row.get("tenant")
    if tenant is not None and not isinstance(tenant, str):
        raise _BadRow("tenant", f"expected a string, got {tenant!r}")
    return TraceRequest(
        arrival_s=_float_field(row["arrival_s"], "arrival_s"),
        prompt_tokens=_int_field(row["prompt_tokens"], "prompt_tokens", 1),
        output_tokens=_int_field(row["output_tokens"], "output_tokens", 1),
        prefix_hashes=hashes,
        hash_block_size=block if hashes else 0,
        tenant=tenant or "",
        priority=_int_field(priority_raw, "priority", -(2**31)) if priority_raw not in (None, "") else 0,
        line=line,
        request_id=_request_id(file, line),
    )


def _read_plain_jsonl(file: Path, lines: list[str], skip: bool, start: int, limit: int | None) -> Trace:
    out = _Collector(file, skip, start, limit)
    for line, row in _json_rows(lines, out):
        try:
            request = _plain_request(row, file, line)
        except _BadRow as exc:
            out.bad(line, exc)
            continue
        out.add(request)
    return out.trace("plain-jsonl")


def _read_plain_csv(file: Path, lines: list[str], skip: bool, start: int, limit: int | None) -> Trace:
    out = _Collector(file, skip, start, limit)
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
                raise _BadRow("row", f"expected {len(header)} columns, got {len(cells)}")
            request = _plain_request(dict(zip(header, cells)), file, line)
        except _BadRow as exc:
            out.bad(line, exc)
            continue
        out.add(request)
    return out.trace("plain-csv")


# ------------------------------------------------------------- pool block hashes


def pool_prefix_hashes(
    request: TraceRequest, block_size: int, memo: dict[tuple[int, int], tuple[int, ...]] | None = None
) -> tuple[int, ...]:
    """Chained hashes of the prompt's FULL pool blocks of `block_size` tokens.

    Pool block j ends at token (j+1)·B - 1, inside trace block k. Its hash is
    hash((parent, trace hash id k, j's index among the pool blocks ending in block k)),
    where `parent` is the hash of the last pool block before trace block k: a chain, so a
    pool block matches only when everything before it matches too.
    Pool blocks past the last known trace block, or not full in the prompt, get none.
    `memo` (keyed by the parent hash and the trace id) lets shared prefixes be hashed once:
    pass the same dict for every request of a trace (Mooncake's conversations share most
    of their blocks).
    """
    if block_size <= 0:
        raise ValueError(f"block_size: must be > 0, got {block_size}")
    trace_block = request.hash_block_size
    if not request.prefix_hashes or trace_block <= 0:
        return ()
    known_tokens = min(request.prompt_tokens, len(request.prefix_hashes) * trace_block)
    num_pool_blocks = known_tokens // block_size
    if memo is None:
        memo = {}
    if trace_block % block_size == 0:
        return _aligned_hashes(request.prefix_hashes, trace_block // block_size, num_pool_blocks, memo)
    out: list[int] = []
    parent = _CHAIN_ROOT
    first_pool_block = 0  # first pool block ending inside the current trace block
    for k, trace_id in enumerate(request.prefix_hashes):
        # Pool blocks j with k·T <= (j+1)·B - 1 < (k+1)·T.
        end = min(((k + 1) * trace_block) // block_size, num_pool_blocks)
        if end <= first_pool_block:
            if first_pool_block >= num_pool_blocks:
                break
            # No pool block ends inside this trace block (B > T): fold its id into the chain.
            parent = hash((parent, trace_id, -1)) & _MASK64
            continue
        key = (parent, trace_id)
        count = ((k + 1) * trace_block) // block_size - first_pool_block
        chunk = memo.get(key)
        if chunk is None or len(chunk) != count:
            chunk = memo[key] = _chain(parent, trace_id, count)
        out.extend(chunk[: end - first_pool_block])
        parent = out[-1]
        first_pool_block = end
        if end >= num_pool_blocks:
            break
    return tuple(out)


def _aligned_hashes(
    trace_ids: tuple[int, ...], per_trace_block: int, num_pool_blocks: int, memo: dict[tuple[int, int], tuple[int, ...]]
) -> tuple[int, ...]:
    """The common case, B divides T (16 into 512): every trace block holds exactly
    `per_trace_block` pool blocks, so the general loop's index arithmetic drops out and a
    trace block costs one memo lookup and one extend. Same values as the general loop."""
    if num_pool_blocks == 0:
        return ()
    out: list[int] = []
    parent = _CHAIN_ROOT
    get = memo.get
    for trace_id in trace_ids[: -(-num_pool_blocks // per_trace_block)]:
        chunk = get((parent, trace_id))
        if chunk is None or len(chunk) != per_trace_block:  # another block size shared the memo
            chunk = memo[(parent, trace_id)] = _chain(parent, trace_id, per_trace_block)
        out += chunk
        parent = chunk[-1]
    del out[num_pool_blocks:]  # the last trace block may be only partly full
    return tuple(out)


def _chain(parent: int, trace_id: int, count: int) -> tuple[int, ...]:
    # `parent` already stands for every token before this trace block, so the position
    # inside it completes the identity; no need to chain inside one trace block. zip hands
    # `hash` one reused tuple instead of allocating one per block.
    return tuple([h & _MASK64 for h in map(hash, zip(repeat(parent, count), repeat(trace_id), range(count)))])
