"""A snapshot's pool as four parts that add up to it (held, reserved, cached, free): the
one split `kvbudget admin status` and the dashboard share, so that no block is shown twice.
Imports nothing of the project: the dashboard and the CLI may both import it.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol


class PoolCounts(Protocol):
    """What is read of a `Snapshot` (duck-typed: the proto message, or a test's stand-in)."""

    @property
    def num_blocks(self) -> int: ...

    @property
    def num_held_blocks(self) -> int: ...

    @property
    def num_reserved_blocks(self) -> int: ...

    @property
    def num_evictable_blocks(self) -> int: ...


class PoolParts(NamedTuple):
    """held + reserved + cached + free == the pool's usable blocks (a tuple, so that
    `held, reserved, cached, free = pool_parts(s)` reads as it did)."""

    held: int  # blocks requests hold
    reserved: int  # promised to running requests, not yet held
    cached: int  # evictable cached blocks no promise has taken
    free: int  # neither held, promised nor cached


def pool_parts(s: PoolCounts) -> PoolParts:
    """(held, reserved, cached, free): promises are kept out of the cached and free blocks,
    so that what a promise has taken is not shown as cached or free too (a reservation
    larger than the uncached free blocks drew 2,053 of a 2,047-block pool). A promise takes
    uncached free blocks before cached ones: what is left of the cached ones is shown."""
    held, reserved = s.num_held_blocks, s.num_reserved_blocks
    cached = min(s.num_evictable_blocks, max(0, s.num_blocks - held - reserved))
    free = max(0, s.num_blocks - held - reserved - cached)
    return PoolParts(held, reserved, cached, free)


def blocks_at_max_model_len(plan: object) -> int:
    """What the daemon charges one request of max_model_len tokens, summed over the plan's
    KV-cache groups (its admission formula, budget.request_worst_case); 0 when the plan does
    not say (no groups, or one not understood). More than the pool's blocks: no request of
    max_model_len fits, and each is rejected never_fits (doctor and the dashboard say so).
    `plan`: a PoolPlan message. Imports lazily: this module loads nothing of the project."""
    from kvbudget.daemon.core.budget import request_worst_case
    from kvbudget.daemon.wire.layout import layout_from_plan

    if not plan.groups or not plan.max_model_len_tokens:  # type: ignore[attr-defined]
        return 0
    try:
        layout = layout_from_plan(plan)  # type: ignore[arg-type]
    except ValueError:
        return 0
    return request_worst_case(layout, plan.max_model_len_tokens, plan.max_num_batched_tokens or 8192).total  # type: ignore[attr-defined]
