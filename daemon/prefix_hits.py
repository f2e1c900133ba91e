"""How much of a prompt the prefix cache already holds, per KV-cache group.

The engine sends chained hashes of the prompt's full blocks; the pool caches a computed
block under `(group_index, hash)`. A hit of k blocks lets the request skip k·B tokens, so
every group must be able to serve position k:
  full / MLA       all of the first k blocks are cached;
  sliding / chunk  only the blocks still in view after k·B computed tokens
                   (`budget.blocks_out_of_window` decides which); earlier ones may be gone.
Layouts with state (Mamba), cross-attention or capped groups get no hits: their pages are
not a function of the prompt's blocks alone.

A hit on a block another request holds costs nothing; a hit on an evictable block costs
one block of the free count (it leaves the LRU when touched) and is charged that once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvbudget.daemon.budget import blocks_out_of_window, cache_hit_tokens
from kvbudget.daemon.pool import NULL_BLOCK, BlockPool
from kvbudget.daemon.spec import KVCacheLayout, LayerKind

_PREFIX_KINDS = frozenset({LayerKind.FULL, LayerKind.MLA})
_WINDOW_KINDS = frozenset({LayerKind.SLIDING, LayerKind.CHUNKED})


def layout_supports_prefix_cache(layout: KVCacheLayout) -> bool:
    return all(g.kind in _PREFIX_KINDS or g.kind in _WINDOW_KINDS for g in layout.groups)


@dataclass(frozen=True)
class PrefixHit:
    num_blocks: int  # k: leading prompt blocks reused
    num_tokens: int  # k·B tokens the request need not compute
    tables: tuple[tuple[int, ...], ...]  # per group: the first k slots (0 = out of window)
    shared: tuple[int, ...]  # per group: hit blocks held by others (cost nothing)
    evictable: int  # hit blocks nobody holds: each costs one free block, once
    queried: int  # prompt blocks looked up


def no_hit(num_groups: int, queried: int = 0) -> PrefixHit:
    return PrefixHit(0, 0, ((),) * num_groups, (0,) * num_groups, 0, queried)


def _cached_ids(pool: BlockPool, group_index: int, hashes: Sequence[int], stop_at_miss: bool) -> list[int | None]:
    ids: list[int | None] = []
    seen: set[int] = set()
    for h in hashes:
        block_id = pool.lookup((group_index, h))
        if block_id in seen:  # a repeated hash: never put one block twice in a table
            block_id = None
        ids.append(block_id)
        if block_id is None:
            if stop_at_miss:
                break
        else:
            seen.add(block_id)
    return ids


def find_prefix_hit(
    pool: BlockPool, layout: KVCacheLayout, hashes: Sequence[int], prompt_tokens: int
) -> PrefixHit:
    B = layout.block_size
    # The last prompt token is always recomputed, so at most (prompt - 1) // B blocks.
    k_max = min(len(hashes), (prompt_tokens - 1) // B)
    groups = layout.groups
    if k_max <= 0:
        return no_hit(len(groups))

    ids_per_group: list[list[int | None]] = []
    k = k_max
    for g, group in enumerate(groups):
        full = group.kind in _PREFIX_KINDS
        ids = _cached_ids(pool, g, hashes[:k_max], stop_at_miss=full)
        ids_per_group.append(ids)
        if full:
            run = len(ids) if ids[-1] is not None else len(ids) - 1
            k = min(k, run)

    # Window groups: the largest k whose in-view blocks [out(k·B), k) are all cached.
    for g, group in enumerate(groups):
        if group.kind not in _WINDOW_KINDS:
            continue
        ids = ids_per_group[g]
        last_miss = [-1] * (k_max + 1)  # last_miss[j]: last uncached index below j
        for j, block_id in enumerate(ids):
            last_miss[j + 1] = j if block_id is None else last_miss[j]
        while k > 0 and last_miss[k] >= blocks_out_of_window(group.spec, k * B):
            k -= 1
    if k == 0:
        return no_hit(len(groups), k_max)

    hit_tokens = cache_hit_tokens(groups, [k] * len(groups), prompt_tokens)
    k = hit_tokens // B
    tables: list[tuple[int, ...]] = []
    shared: list[int] = []
    evictable = 0
    for g, group in enumerate(groups):
        out = min(blocks_out_of_window(group.spec, hit_tokens), k)
        table = (NULL_BLOCK,) * out + tuple(ids_per_group[g][out:k])  # type: ignore[arg-type]
        held_by_others = sum(1 for b in table if b != NULL_BLOCK and pool.ref_count(b) > 0)
        shared.append(held_by_others)
        evictable += sum(1 for b in table if b != NULL_BLOCK) - held_by_others
        tables.append(table)
    return PrefixHit(k, hit_tokens, tuple(tables), tuple(shared), evictable, k_max)
