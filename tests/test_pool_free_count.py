"""`BlockPool.free` returns how many blocks went back (stopped being held)."""

from __future__ import annotations

import pytest

from kvbudget.daemon.core.pool import NULL_BLOCK, BlockPool


def test_free_counts_every_block_that_reaches_zero() -> None:
    pool = BlockPool(11)  # 10 usable blocks + the null block
    ids = pool.allocate(4)
    assert pool.free(ids) == 4
    assert pool.num_free_blocks == 10 and pool.num_held_blocks == 0
    pool.check_integrity()


def test_shared_blocks_count_only_when_the_last_reference_goes() -> None:
    pool = BlockPool(11)
    ids = pool.allocate(3)
    pool.touch(ids[:2])  # two of them now have 2 references
    # First free: only the third block reaches 0 (the other two drop from 2 to 1).
    assert pool.free(ids) == 1
    assert pool.num_held_blocks == 2
    # Second free of the shared two: both reach 0.
    assert pool.free(ids[:2]) == 2
    assert pool.num_held_blocks == 0
    pool.check_integrity()


def test_cached_blocks_going_evictable_count_as_freed() -> None:
    pool = BlockPool(11)
    ids = pool.allocate(2)
    assert pool.cache_block(ids[0], "hash-a")
    # One becomes evictable (cached), one goes on the free stack: both stop being held.
    assert pool.free(ids) == 2
    assert pool.num_evictable_blocks == 1
    assert pool.num_free_blocks == 10  # 8 never used + 1 freed + 1 evictable
    pool.check_integrity()


def test_null_block_and_empty_input_count_zero() -> None:
    pool = BlockPool(5)
    assert pool.free([]) == 0
    assert pool.free([NULL_BLOCK, NULL_BLOCK]) == 0
    assert pool.num_free_blocks == 4
    pool.check_integrity()


def test_a_bad_id_still_counts_the_blocks_released_before_it() -> None:
    pool = BlockPool(11)
    ids = pool.allocate(2)
    spare = pool.allocate(1)[0]
    pool.free([spare])
    with pytest.raises(ValueError, match="freed more often"):
        pool.free([ids[0], spare])  # ids[0] goes back, then spare (ref 0) is refused
    # The one released before the error is accounted for: only ids[1] is still held.
    assert pool.num_held_blocks == 1
    assert pool.free([ids[1]]) == 1
    pool.check_integrity()
