"""The pool's LRU bookkeeping: hits on evictable blocks leave stale entries behind (or
take the tail entry), eviction skips stale entries, and `cache_blocks` is `cache_block`
pair by pair, misuse included."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbudget.daemon.core.pool import NULL_BLOCK, BlockPool


def cached_pool(num_blocks: int, n: int) -> tuple[BlockPool, list[int]]:
    pool = BlockPool(num_blocks)
    ids = pool.allocate(n)
    pool.cache_blocks(ids, [f"h{i}" for i in range(n)])
    return pool, ids


def test_hit_in_the_middle_of_the_lru_is_skipped_by_eviction() -> None:
    pool, ids = cached_pool(5, 4)  # 4 usable blocks, all cached
    pool.free(ids)  # LRU order: ids[0], ids[1], ids[2], ids[3]
    pool.touch([ids[1]])  # not the last released: its entry stays behind, stale
    pool.free([ids[1]])  # released again: now the most recent
    # Three victims, oldest first: ids[0], then ids[2] and ids[3]; ids[1]'s stale entry
    # is passed over, its live one is the newest.
    assert pool.allocate(3) == [ids[0], ids[2], ids[3]]
    assert pool.lookup("h1") == ids[1] and pool.num_evictable_blocks == 1
    pool.check_integrity()


def test_hit_on_the_last_released_block_takes_the_tail_entry() -> None:
    pool, ids = cached_pool(5, 2)
    pool.free(ids)
    pool.touch([ids[1]])  # the last released: its entry is taken off the tail
    assert pool._num_stale == 0
    pool.free([ids[1]])
    assert pool.allocate(4) == [3, 4, ids[0], ids[1]]  # 2 fresh, then oldest cached first
    pool.check_integrity()


def test_stale_entries_are_bounded_without_evictions() -> None:
    pool, ids = cached_pool(3001, 3000)
    pool.free(ids)
    for _ in range(3):  # each round: hit every block but the last released, release them
        pool.touch(ids[:-1])
        pool.free(ids[:-1])
    # 3 x 2,999 hits left stale entries; past 1024 + evictable/2 they are dropped.
    assert pool._num_stale <= 1024 + pool.num_evictable_blocks // 2
    assert len(pool._lru) - pool._lru_head <= pool.num_evictable_blocks + pool._num_stale
    pool.check_integrity()


@pytest.mark.parametrize(
    "ids_of, expect_error",
    [
        (lambda held, free: [held[0], held[0]], None),  # a block listed twice: first hash only
        (lambda held, free: [held[0], free], "not held"),  # an unheld block: the ones before it publish
        (lambda held, free: [held[1], NULL_BLOCK], None),  # null ids are skipped
    ],
)
def test_cache_blocks_misuse_matches_cache_block_one_by_one(ids_of, expect_error) -> None:
    bulk, one = BlockPool(8), BlockPool(8)
    for pool in (bulk, one):
        held = pool.allocate(3)
        free = pool.allocate(1)[0]
        pool.free([free])
    ids = ids_of(held, free)
    hashes = [f"k{i}" for i in range(len(ids))]
    outcomes = []
    for pool, call in ((bulk, lambda: bulk.cache_blocks(ids, hashes)),
                       (one, lambda: [one.cache_block(b, h) for b, h in zip(ids, hashes) if b != NULL_BLOCK])):
        try:
            call()
            outcomes.append(None)
        except ValueError as e:
            outcomes.append(str(e))
        pool.check_integrity()
    assert (outcomes[0] is None) == (expect_error is None) and outcomes[0] == outcomes[1]
    assert bulk.lookup_all(hashes) == one.lookup_all(hashes)


@settings(deadline=None, max_examples=60)
@given(st.lists(st.tuples(st.sampled_from("atfce"), st.integers(0, 40)), max_size=60))
def test_random_traffic_keeps_the_books(ops: list[tuple[str, int]]) -> None:
    pool = BlockPool(12)
    held: list[int] = []
    next_hash = 0
    for op, x in ops:
        if op == "a" and pool.can_allocate(x % 5):
            held += pool.allocate(x % 5)
        elif op == "f" and held:
            pool.free([held.pop(x % len(held))])
        elif op == "c" and held:
            block_ids = list(dict.fromkeys(held[x % len(held):][:3]))
            pool.cache_blocks(block_ids, [next_hash + i for i in range(len(block_ids))])
            next_hash += len(block_ids)
        elif op == "t":
            hits = [b for b in pool.lookup_all(range(max(0, next_hash - 6), next_hash)) if b is not None]
            pool.touch(hits)
            held += hits
        elif op == "e":
            pool.evict_all_cached()
        pool.check_integrity()
        assert pool.num_held_blocks == len(set(held))
