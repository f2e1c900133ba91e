"""How much of a prompt the prefix cache already holds, per KV-cache group.

A hit of k blocks lets a request skip k·B tokens, so every group must serve position k:
full / MLA groups need all k blocks cached, sliding / chunked ones only those still in
view. Layouts with state (Mamba), cross-attention or capped groups get no hits. What a
hit costs the pool and the tenant: docs/architecture/core.md.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import islice, repeat

from kvbudget.daemon.core.budget import blocks_out_of_window, cache_hit_tokens
from kvbudget.daemon.core.pool import NULL_BLOCK, BlockPool
from kvbudget.daemon.core.spec import KVCacheGroup, KVCacheLayout, LayerKind

_PREFIX_KINDS = frozenset({LayerKind.FULL, LayerKind.MLA})
_WINDOW_KINDS = frozenset({LayerKind.SLIDING, LayerKind.CHUNKED})


def cache_keys(num_groups: int, group_index: int, hashes: Sequence[int]) -> Sequence[Hashable]:
    """The pool's cache key of each prompt block of a group: `(group, hash)`, or with a
    single group the hash itself — an int is far cheaper to build and hash than a tuple,
    and a long prompt publishes and looks up hundreds of keys per call."""
    if num_groups == 1:
        return hashes
    return list(zip(repeat(group_index), hashes))


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


def hit_ids(hit: PrefixHit, groups: Sequence[int]) -> Sequence[int]:
    """The hit's blocks in these groups (distinct: a block is in one group), nulls left out."""
    tables = hit.tables
    if len(groups) == 1:
        table = tables[groups[0]]
        if not table or table[0] != NULL_BLOCK:
            return table  # one full-attention group (most models): the table itself
    return [block_id for g in groups for block_id in tables[g] if block_id != NULL_BLOCK]


def no_hit(num_groups: int, queried: int = 0) -> PrefixHit:
    return PrefixHit(0, 0, ((),) * num_groups, (0,) * num_groups, 0, queried)


def _leading_run(pool: BlockPool, num_groups: int, group_index: int, hashes: Sequence[int], k: int) -> list[int]:
    """Cached block ids of the first k hashes, up to the first miss (or repeated id).

    Lazily: the lookups stop at the first miss, so the work is the hit, not the prompt
    (a slice or a key list of the whole prompt would touch every one of its hashes)."""
    keys = islice(hashes if num_groups == 1 else zip(repeat(group_index), hashes), k)
    ids = pool.cached_run(keys)
    if len(set(ids)) < len(ids):  # a repeated hash (rare): never put one block twice in a table
        seen: set[int] = set()
        for j, block_id in enumerate(ids):
            if block_id in seen:
                return ids[:j]
            seen.add(block_id)
    return ids


def _cached_ids(pool: BlockPool, num_groups: int, group_index: int, hashes: Sequence[int]) -> list[int | None]:
    """Cached block id per hash (None: a miss, or a repeat of an id already in the list)."""
    ids = pool.lookup_all(cache_keys(num_groups, group_index, hashes))
    # Distinct ids plus one None for all misses.
    distinct = len(ids) - ids.count(None) + (None in ids)
    if len(set(ids)) < distinct:
        # A repeated hash (rare): never put one block twice in a table.
        seen: set[int] = set()
        for j, block_id in enumerate(ids):
            if block_id is None:
                continue
            if block_id in seen:
                ids[j] = None
            else:
                seen.add(block_id)
    return ids


def _window_hit(
    pool: BlockPool, groups: Sequence[KVCacheGroup], B: int, hashes: Sequence[int], k: int,
    ids_per_group: list[list[int | None]],
) -> int:
    """The largest hit (at most `k` blocks) whose in-view blocks [out(k·B), k) are all
    cached in every window group; fills in those groups' `ids_per_group`. A smaller k
    brings earlier blocks into view, so one group's cut can undo another's: repeat until
    no group cuts k further."""
    window = [g for g, group in enumerate(groups) if group.kind in _WINDOW_KINDS]
    last_miss_per_group: dict[int, list[int]] = {}
    for g in window:
        ids_per_group[g] = ids = _cached_ids(pool, len(groups), g, hashes[:k])
        last_miss = last_miss_per_group[g] = [-1] * (k + 1)  # last uncached index below j
        for j, block_id in enumerate(ids):
            last_miss[j + 1] = j if block_id is None else last_miss[j]
    settled = False
    while not settled and k > 0:
        settled = True
        for g in window:
            last_miss, spec = last_miss_per_group[g], groups[g].spec
            while k > 0 and last_miss[k] >= blocks_out_of_window(spec, k * B):
                k -= 1
                settled = False
    return k


def find_prefix_hit(
    pool: BlockPool, layout: KVCacheLayout, hashes: Sequence[int], prompt_tokens: int
) -> PrefixHit:
    B = layout.block_size
    # The last prompt token is always recomputed, so at most (prompt - 1) // B blocks.
    k_max = min(len(hashes), (prompt_tokens - 1) // B)
    groups = layout.groups
    if k_max <= 0:
        return no_hit(len(groups))
    if len(groups) == 1 and groups[0].kind in _PREFIX_KINDS:
        # One full-attention group (most models): the hit is the leading run itself. The
        # general path below gives the same, with lists per group around it.
        ids = _leading_run(pool, 1, 0, hashes, k_max)
        if not ids:
            return no_hit(1, k_max)
        shared = pool.num_held_among(ids)
        k = len(ids)  # <= k_max, so k·B leaves the last prompt token to compute
        return PrefixHit(k, k * B, (tuple(ids),), (shared,), k - shared, k_max)

    # Full-attention groups first: the hit can be no longer than their shortest cached run,
    # so window groups (which must look at every block, hits or not) look no further.
    # This bounds the work by the hit, not the prompt: Mooncake prompts are ~750 blocks.
    ids_per_group: list[list[int | None]] = [[] for _ in groups]
    k = k_max
    for g, group in enumerate(groups):
        if group.kind in _PREFIX_KINDS:
            ids_per_group[g] = ids = _leading_run(pool, len(groups), g, hashes, k)
            k = len(ids)
    if k == 0:
        return no_hit(len(groups), k_max)

    k = _window_hit(pool, groups, B, hashes, k, ids_per_group)
    if k == 0:
        return no_hit(len(groups), k_max)

    hit_tokens = cache_hit_tokens(groups, [k] * len(groups), prompt_tokens)
    k = hit_tokens // B
    tables: list[tuple[int, ...]] = []
    shared: list[int] = []
    evictable = 0
    for g, group in enumerate(groups):
        out = min(blocks_out_of_window(group.spec, hit_tokens), k)
        in_view: list[int] = ids_per_group[g][out:k]  # type: ignore[assignment]  # all hits
        held_by_others = pool.num_held_among(in_view)
        shared.append(held_by_others)
        evictable += len(in_view) - held_by_others
        tables.append((NULL_BLOCK,) * out + tuple(in_view))
    return PrefixHit(k, hit_tokens, tuple(tables), tuple(shared), evictable, k_max)
