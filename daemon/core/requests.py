"""One request's life in the core: its numbers, its block table per KV-cache group.

A running request holds, per group, a block table whose length is
`budget.block_slots(spec, num_tokens)`; slots that left a sliding window or chunk hold the
null block 0. The non-null entries are exactly `budget.blocks_held(spec, num_tokens,
num_computed)`: every change below goes through those two formulas, never a local copy.

`base` is the policy's reservation per group, fixed at admission; the request may hold
more than that (it then reserves nothing extra), so its promise per group is
`max(held, base)` and it is owed `max(0, base - held)` blocks it does not hold yet.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvbudget.daemon.core.budget import block_slots, blocks_out_of_window
from kvbudget.daemon.core.pool import NULL_BLOCK, BlockPool
from kvbudget.daemon.core.prefix_hits import cache_keys
from kvbudget.daemon.core.records import Reason, RequestSpec
from kvbudget.daemon.core.spec import LayerSpec


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"


@dataclass(slots=True, eq=False)
class RequestState:
    spec: RequestSpec
    max_len: int  # L: prompt + max new tokens, capped at max_model_len
    order: int  # arrival order in this controller (queue ties)
    num_groups: int
    status: Status = Status.WAITING
    policy: str = ""  # the policy it was admitted under
    num_tokens: int = 0
    num_computed: int = 0
    tables: list[list[int]] = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    base: list[int] = field(default_factory=list)
    charged: int = 0  # Σ max(held, base): what its tenant is charged
    owed: int = 0  # Σ max(0, base - held): reserved, not yet held
    hit_blocks: int = 0
    cached_upto: int = 0  # prompt blocks published to (or found in) the prefix cache
    resume_len: int = 0  # preempted: the length it had reached, recomputed on return
    queued: bool = False
    queued_at: float = 0.0
    wait_reason: Reason = Reason.NONE  # why the last admission attempt failed
    # The last attempt failed for want of blocks with `failed_spare` unpromised blocks,
    # under controller epoch `failed_epoch`: not worth retrying until spare grows.
    failed_spare: int = -1
    failed_epoch: int = -1
    queue_key: tuple[int, int, int] = (0, 1, 0)
    predicted_output: int = 0  # predictive policy: the output length reserved for
    admitted: int = 0  # admission order, renewed on each admission (victim choice)
    # Most slots it may hold past its computed tokens (0: no bound). Guaranteed: F, what its
    # reservation was sized for; a grow further ahead is the engine's error (validation.py).
    ahead_limit: int = 0

    @property
    def request_id(self) -> str:
        return self.spec.request_id

    @property
    def tenant(self) -> str:
        return self.spec.tenant

    def reserved(self) -> tuple[int, ...]:
        return tuple(map(max, self.held, self.base))

    def recount(self) -> None:
        """Refresh `charged` and `owed` from `held` and `base` (callers diff the totals)."""
        charged = owed = 0
        for h, b in zip(self.held, self.base):
            if b > h:
                charged += b
                owed += b - h
            else:
                charged += h
        self.charged = charged
        self.owed = owed


def grow_table(
    pool: BlockPool, spec: LayerSpec, table: list[int], num_tokens: int
) -> list[int]:
    """Append fresh blocks so the table has `block_slots(num_tokens)` slots; returns them."""
    missing = block_slots(spec, num_tokens) - len(table)
    if missing <= 0:
        return []
    ids = pool.allocate(missing)
    table.extend(ids)
    return ids


def release_out_of_window(
    pool: BlockPool, spec: LayerSpec, table: list[int], num_computed: int
) -> int:
    """Null the leading slots no future token attends to; returns how many blocks went back."""
    out = min(blocks_out_of_window(spec, num_computed), len(table))
    freed: list[int] = []
    for slot in range(out - 1, -1, -1):  # tail of the released range first
        block_id = table[slot]
        if block_id == NULL_BLOCK:
            break  # everything before was released earlier
        freed.append(block_id)
        table[slot] = NULL_BLOCK
    if freed:
        pool.free(freed)
    return len(freed)


def release_table(pool: BlockPool, table: list[int]) -> tuple[int, int]:
    """Drop the table's references, tail first so shared prefix heads stay cached longest.

    Returns (references dropped, blocks that stopped being held: not shared with others)."""
    returned = pool.free(reversed(table))  # the pool skips null (released) slots
    # Released slots are the leading ones: most tables have none to count.
    dropped = len(table) - (table.count(NULL_BLOCK) if table and table[0] == NULL_BLOCK else 0)
    table.clear()
    return dropped, returned


def publish_prompt_blocks(
    pool: BlockPool,
    num_groups: int,
    group_index: int,
    table: Sequence[int],
    hashes: Sequence[int],
    start: int,
    stop: int,
) -> None:
    """Put computed full prompt blocks [start, stop) into the prefix cache (see
    prefix_hits.cache_keys for the key)."""
    stop = min(stop, len(table), len(hashes))
    if start < stop and table[start] == NULL_BLOCK:  # out of a window: null slots lead
        start = max(start, table.count(NULL_BLOCK))
    if stop <= start:
        return
    # A hash another request published first stays theirs: ours stays private.
    pool.cache_blocks(table[start:stop], cache_keys(num_groups, group_index, hashes[start:stop]))
