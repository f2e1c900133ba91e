"""find_prefix_hit's shortcuts (full-attention run first, C-loop lookups) give exactly the
answer of the straightforward scan of every prompt block in every group."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvbudget.daemon.core.budget import blocks_out_of_window, cache_hit_tokens
from kvbudget.daemon.core.pool import NULL_BLOCK, BlockPool
from kvbudget.daemon.core.prefix_hits import (
    _PREFIX_KINDS,
    _WINDOW_KINDS,
    PrefixHit,
    cache_keys,
    find_prefix_hit,
    no_hit,
)

from test_admission_support import B, SMALL_LAYOUTS

LAYOUTS = ("full", "hybrid", "chunked", "mla")


def key(layout, g: int, h: int):
    """The pool key of prompt block hash h in group g (cache_keys, one at a time)."""
    return cache_keys(len(layout.groups), g, [h])[0]


def straightforward_hit(pool: BlockPool, layout, hashes, prompt_tokens: int) -> PrefixHit:
    """Look up every prompt block in every group, then apply the rules of prefix_hits.py."""
    k_max = min(len(hashes), (prompt_tokens - 1) // B)
    groups = layout.groups
    if k_max <= 0:
        return no_hit(len(groups))
    ids_per_group = []
    for g in range(len(groups)):
        ids, seen = [], set()
        for h in hashes[:k_max]:
            block_id = pool.lookup(key(layout, g, h))
            ids.append(None if block_id in seen else block_id)
            if block_id is not None:
                seen.add(block_id)
        ids_per_group.append(ids)

    def group_ok(g: int, k: int) -> bool:
        ids = ids_per_group[g]
        if groups[g].kind in _PREFIX_KINDS:
            return all(b is not None for b in ids[:k])
        assert groups[g].kind in _WINDOW_KINDS
        return all(b is not None for b in ids[blocks_out_of_window(groups[g].spec, k * B) : k])

    k = max((k for k in range(k_max + 1) if all(group_ok(g, k) for g in range(len(groups)))), default=0)
    if k == 0:
        return no_hit(len(groups), k_max)
    hit_tokens = cache_hit_tokens(groups, [k] * len(groups), prompt_tokens)
    k = hit_tokens // B
    tables, shared, evictable = [], [], 0
    for g, group in enumerate(groups):
        out = min(blocks_out_of_window(group.spec, hit_tokens), k)
        table = (NULL_BLOCK,) * out + tuple(ids_per_group[g][out:k])
        others = sum(1 for b in table if b != NULL_BLOCK and pool.ref_count(b) > 0)
        shared.append(others)
        evictable += sum(1 for b in table if b != NULL_BLOCK) - others
        tables.append(table)
    return PrefixHit(k, hit_tokens, tuple(tables), tuple(shared), evictable, k_max)


@settings(max_examples=150, deadline=None)
@given(
    layout_name=st.sampled_from(LAYOUTS),
    # small hash alphabet: repeated hashes within a prompt and across groups do happen
    hashes=st.lists(st.integers(0, 5), min_size=0, max_size=12),
    extra_tokens=st.integers(1, B),
    # per (group, hash): cached? and then held (ref > 0) or evictable
    cached=st.lists(st.sampled_from(("miss", "held", "evictable")), min_size=4 * 6, max_size=4 * 6),
)
def test_fast_prefix_hit_equals_the_straightforward_scan(layout_name, hashes, extra_tokens, cached):
    layout = SMALL_LAYOUTS[layout_name]
    pool = BlockPool(64)
    evict_later = []
    for g in range(len(layout.groups)):
        for h in range(6):
            state = cached[g * 6 + h]
            if state == "miss":
                continue
            (block_id,) = pool.allocate(1)
            assert pool.cache_block(block_id, key(layout, g, h))
            if state == "evictable":
                evict_later.append(block_id)
    pool.free(evict_later)
    prompt_tokens = len(hashes) * B + extra_tokens - 1 if hashes else extra_tokens
    fast = find_prefix_hit(pool, layout, hashes, prompt_tokens)
    assert fast == straightforward_hit(pool, layout, hashes, prompt_tokens)
    pool.check_integrity()


def test_a_long_prompt_with_a_short_full_attention_run_stops_there():
    """hybrid layout (two sliding W=16 groups, one full): 40 prompt blocks all cached in the
    sliding groups but only the first 3 in the full group: the hit is 3 blocks (24 tokens;
    the last prompt token is never a hit, and 3·8 = 24 < 40·8), and in view of W = 16 after
    24 tokens are slots 24-16+1 = 9.. -> out of window = 9 // 8 = 1 block, so each sliding
    table is (0, id, id)."""
    layout = SMALL_LAYOUTS["hybrid"]
    pool = BlockPool(200)
    full_g = next(g for g, group in enumerate(layout.groups) if group.kind in _PREFIX_KINDS)
    for g in range(len(layout.groups)):
        for h in range(40 if g != full_g else 3):
            (block_id,) = pool.allocate(1)
            pool.cache_block(block_id, key(layout, g, h))
    hit = find_prefix_hit(pool, layout, list(range(40)), 40 * B + 1)
    assert (hit.num_blocks, hit.num_tokens, hit.queried) == (3, 24, 40)
    out = blocks_out_of_window(layout.groups[1 - full_g if full_g < 2 else 0].spec, 24)
    assert out == 1
    for g, table in enumerate(hit.tables):
        assert len(table) == 3
        assert (table[0] == NULL_BLOCK) == (g != full_g)
    assert hit == straightforward_hit(pool, layout, list(range(40)), 40 * B + 1)
    pool.check_integrity()


def test_one_window_groups_cut_is_rechecked_by_the_others():
    """hybrid (W = 16, B = 8; groups 0 and 1 sliding, 2 full), prompt 41 tokens -> at most
    (41 - 1) // 8 = 5 blocks. Full group: all 5 cached. In view after k blocks: [out, k)
    with out = (8k - 16 + 1) // 8: k=5 -> [3, 5), k=4 -> [2, 4), k=3 -> [1, 3), k=2 -> [0, 2).
    Group 0 misses block 2: fine at k=5, not at 4 or 3, fine at 2. Group 1 misses block 4:
    not fine at 5, fine at 4. Group 1 cuts k to 4, which brings group 0's miss into view:
    the hit is 2 blocks (16 tokens), with nothing out of window yet."""
    layout = SMALL_LAYOUTS["hybrid"]
    assert [g.kind.value for g in layout.groups][:2] == ["sliding_window"] * 2
    pool = BlockPool(64)
    misses = {0: {2}, 1: {4}, 2: set()}
    for g in range(3):
        for h in range(5):
            if h not in misses[g]:
                (block_id,) = pool.allocate(1)
                pool.cache_block(block_id, key(layout, g, h))
    hit = find_prefix_hit(pool, layout, list(range(5)), 41)
    assert (hit.num_blocks, hit.num_tokens) == (2, 16)
    assert all(len(t) == 2 and NULL_BLOCK not in t for t in hit.tables)
    assert hit == straightforward_hit(pool, layout, list(range(5)), 41)
    pool.check_integrity()


@settings(max_examples=100, deadline=None)
@given(
    taken=st.lists(st.integers(0, 7), max_size=4, unique=True),  # hashes others published
    hashes=st.lists(st.integers(0, 7), min_size=1, max_size=10),  # ours, repeats allowed
    null_at=st.one_of(st.none(), st.integers(0, 9)),
)
def test_cache_blocks_publishes_like_one_cache_block_per_pair(taken, hashes, null_at):
    """Batch publishing (the C-loop fast path, or its fallback) leaves both pools in the
    same state as cache_block called pair by pair: first publisher of a hash wins."""
    pools = [BlockPool(32), BlockPool(32)]
    for pool in pools:
        for h in taken:
            (block_id,) = pool.allocate(1)
            assert pool.cache_block(block_id, h)
    ids = pools[0].allocate(len(hashes))
    assert pools[1].allocate(len(hashes)) == ids
    if null_at is not None and null_at < len(ids):
        ids[null_at] = NULL_BLOCK
    pools[0].cache_blocks(ids, hashes)
    for block_id, h in zip(ids, hashes):
        if block_id != NULL_BLOCK:
            pools[1].cache_block(block_id, h)
    for h in range(8):
        assert pools[0].lookup(h) == pools[1].lookup(h)
    live = [b for b in ids if b != NULL_BLOCK]
    for pool in pools:
        pool.free(live)  # cached ones become evictable, the rest free: same in both
        pool.check_integrity()
    assert pools[0].num_evictable_blocks == pools[1].num_evictable_blocks
