"""A trace as the loaders hand it out: one `TraceRequest` per row, whatever the format."""

from __future__ import annotations

from dataclasses import dataclass

MOONCAKE_TIMESTAMP_QUANTUM_S = 3.0  # Mooncake timestamps come in ~3 s buckets


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
