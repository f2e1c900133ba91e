"""What one vLLM step asks the daemon: read from the scheduler's state, no vLLM import.

`coming_tokens` runs vLLM's token budget over its running requests the way its
`schedule()` will (docs/vllm.md, "One step"), so the grows name exactly the slots vLLM's
`allocate_slots` is about to take, and `admit_tokens` / `admit_seqs` what is left of the
step for the waiting ones. `submit_spec` turns a vLLM request into the daemon's submit,
its prefix hashes from the block hashes vLLM computed.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter
from typing import NamedTuple

from kvbudget.daemon.core.records import RequestSpec

UINT64_BYTES = 8
_IS_NULL = attrgetter("is_null")  # (vLLM's one null block has it set)


class Coming(NamedTuple):
    """One running request's next step: tokens vLLM will schedule, slots it will hold.
    (A tuple: one is built per running request twice a step; a frozen dataclass costs more.)"""

    request_id: str
    num_new_tokens: int
    slots: int


def coming_tokens(scheduler, running) -> tuple[list[Coming], int]:
    """(each running request's coming step in vLLM's order, token budget left after them)."""
    config = scheduler.scheduler_config
    budget = scheduler.max_num_scheduled_tokens
    num_waiting = len(scheduler.waiting)
    threshold = config.long_prefill_token_threshold if len(running) + num_waiting > 1 else 0
    lookahead = scheduler.num_lookahead_tokens
    coming: list[Coming] = []
    for request in running:
        if budget <= 0:
            break
        computed = request.num_computed_tokens
        n = request.num_tokens_with_spec + request.num_output_placeholders - computed
        if 0 < threshold < n:
            n = threshold
        n = min(n, budget, scheduler.max_model_len - computed - 1)
        if n <= 0:
            continue
        coming.append(Coming(request.request_id, n, computed + n + lookahead))
        budget -= n
    return coming, budget


def prefix_hashes(request, block_size: int, hash_block_size: int) -> tuple[int, ...]:
    """The chained hashes of the prompt's full blocks as uint64 (vLLM's hash bytes, their
    first 8), or none when vLLM hashes at another granularity than the daemon's blocks."""
    hashes = getattr(request, "block_hashes", None) or ()
    if not hashes or hash_block_size != block_size:
        return ()
    full = request.num_prompt_tokens // block_size
    return tuple(int.from_bytes(bytes(h)[:UINT64_BYTES], "little") for h in hashes[:full])


def request_tenant(request, field: str, default: str) -> str:
    extra = getattr(request.sampling_params, "extra_args", None) if request.sampling_params else None
    value = (extra or {}).get(field) if field else None
    return str(value) if value else default


def submit_spec(request, engine_id: str, tenant: str, block_sizes: tuple[int, int], resume: bool = False) -> RequestSpec:
    """The daemon's submit for a vLLM request. `resume`: submitted again (a new session)
    while vLLM holds it, at the length it has reached. `block_sizes`: (the daemon's block
    size, vLLM's hash block size)."""
    prompt = request.num_tokens if resume else request.num_prompt_tokens
    max_new = max(request.max_tokens - (prompt - request.num_prompt_tokens), 1)
    return RequestSpec(
        request_id=request.request_id,
        prompt_tokens=prompt,
        max_new_tokens=max_new,
        prefix_hashes=prefix_hashes(request, *block_sizes),
        priority=int(request.priority),
        tenant=tenant,
        engine_id=engine_id,
    )


def vllm_held(kv_cache_manager, request_ids: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """Blocks vLLM holds for each request, per KV-cache group (the null block, which stands
    in for blocks that left a window, not counted)."""
    # This runs for every running request every step: each group's block lists are read
    # as they are (the manager's get_block_ids wraps them and copies every id).
    tables = [manager.req_to_blocks for manager in kv_cache_manager.coordinator.single_type_managers]
    if len(tables) == 1:
        (table,) = tables
        return {rid: (len(blocks) - sum(map(_IS_NULL, blocks)),)
                for rid in request_ids for blocks in (table.get(rid, ()),)}
    return {rid: tuple([len(blocks) - sum(map(_IS_NULL, blocks)) for blocks in [t.get(rid, ()) for t in tables]])
            for rid in request_ids}
