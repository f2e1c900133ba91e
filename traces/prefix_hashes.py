"""A trace's prefix hashes on the pool's block size.

Trace prefix hashes live on the trace's block size (512 tokens for Mooncake); the pool's
block size is usually smaller. `pool_prefix_hashes` derives one chained hash per FULL pool
block of the prompt, so two requests share pool-block hashes exactly as far as they share
trace blocks.
"""

from __future__ import annotations

from itertools import repeat

from kvbudget.traces.trace_request import TraceRequest

_MASK64 = (1 << 64) - 1
CHAIN_ROOT = 0x6B76_6275_6467_6574  # any fixed value: the parent of a prompt's first block


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
    parent = CHAIN_ROOT
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
    parent = CHAIN_ROOT
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
