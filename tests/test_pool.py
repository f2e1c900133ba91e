"""Block pool: free / held / evictable accounting, prefix cache, LRU, integrity."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvbudget.daemon.core.pool import NULL_BLOCK, BlockPool


def test_fresh_pool_hands_out_low_ids_never_the_null_block() -> None:
    pool = BlockPool(5)  # ids 1..4 usable, 0 is the null block
    assert pool.capacity == 4 and pool.num_free_blocks == 4
    assert pool.allocate(3) == [1, 2, 3]
    assert pool.num_held_blocks == 3 and pool.num_free_blocks == 1
    assert pool.allocate(1) == [4]
    assert not pool.can_allocate(1)
    with pytest.raises(ValueError, match="cannot allocate 1 blocks, 0 free"):
        pool.allocate(1)
    pool.check_integrity()


def test_free_returns_blocks_and_null_block_is_ignored() -> None:
    pool = BlockPool(4)
    ids = pool.allocate(3)
    pool.free([NULL_BLOCK, *reversed(ids)])
    assert pool.num_free_blocks == 3 and pool.num_held_blocks == 0
    with pytest.raises(ValueError, match="freed more often than referenced"):
        pool.free([ids[0]])
    pool.check_integrity()


def test_cached_block_becomes_evictable_and_counts_as_free() -> None:
    pool = BlockPool(4)  # 3 usable
    a, b = pool.allocate(2)
    assert pool.cache_block(a, "h0")
    pool.free([b, a])
    # a is cached with no reference: evictable, still free for admission.
    assert pool.num_evictable_blocks == 1
    assert pool.num_free_blocks == 3
    assert pool.lookup("h0") == a
    pool.check_integrity()


def test_hit_on_evictable_block_is_charged_once() -> None:
    pool = BlockPool(4)  # 3 usable
    (a,) = pool.allocate(1)
    pool.cache_block(a, "h0")
    pool.free([a])
    assert pool.num_free_blocks == 3  # 2 free + 1 evictable
    # A request hits "h0": touching takes it out of the evictable set. That is the one charge:
    # free-for-admission drops from 3 to 2, and it is not allocated again.
    pool.touch([pool.lookup("h0")])
    assert pool.num_free_blocks == 2 and pool.num_held_blocks == 1
    # The request needs 2 more fresh blocks: exactly what is left, nothing double counted.
    assert pool.can_allocate(2) and not pool.can_allocate(3)
    pool.allocate(2)
    assert pool.num_free_blocks == 0
    pool.check_integrity()


def test_hit_on_held_block_costs_nothing() -> None:
    pool = BlockPool(4)
    (a,) = pool.allocate(1)
    pool.cache_block(a, "h0")
    before = pool.num_free_blocks
    pool.touch([a])  # a second request shares it
    assert pool.num_free_blocks == before and pool.ref_count(a) == 2
    pool.free([a])
    assert pool.num_held_blocks == 1  # still held by the first
    pool.free([a])
    assert pool.num_evictable_blocks == 1
    pool.check_integrity()


def test_allocation_evicts_lru_cached_blocks_last() -> None:
    pool = BlockPool(5)  # 4 usable
    ids = pool.allocate(4)
    for i, block_id in enumerate(ids):
        pool.cache_block(block_id, f"h{i}")
    pool.free([ids[3], ids[2]])  # tail first: h3 becomes least recently used
    pool.free([ids[1], ids[0]])
    # All four are evictable; allocating 2 evicts the two least recent: h3, h2.
    taken = pool.allocate(2)
    assert taken == [ids[3], ids[2]]
    assert pool.lookup("h3") is None and pool.lookup("h2") is None
    assert pool.lookup("h0") == ids[0]
    pool.check_integrity()


def test_fresh_free_blocks_are_used_before_evicting_cache() -> None:
    pool = BlockPool(4)
    (a,) = pool.allocate(1)
    pool.cache_block(a, "keep")
    pool.free([a])
    pool.allocate(2)
    assert pool.lookup("keep") == a  # the two never-cached blocks went first
    pool.check_integrity()


def test_cache_block_rules() -> None:
    pool = BlockPool(4)
    a, b = pool.allocate(2)
    assert pool.cache_block(a, "h")
    assert not pool.cache_block(b, "h")  # hash already published by another block
    assert not pool.cache_block(a, "other")  # a block carries one hash
    pool.free([b])
    with pytest.raises(ValueError, match="not held"):
        pool.cache_block(b, "x")
    with pytest.raises(ValueError, match="neither held nor cached"):
        pool.touch([b])
    pool.check_integrity()


def test_evict_all_cached() -> None:
    pool = BlockPool(4)
    a, b = pool.allocate(2)
    pool.cache_block(a, "h")
    pool.free([a, b])
    assert pool.evict_all_cached() == 1
    assert pool.num_evictable_blocks == 0 and pool.num_unhashed_free_blocks == 3
    pool.check_integrity()


def test_pool_needs_room_beyond_the_null_block() -> None:
    with pytest.raises(ValueError, match="num_blocks must be at least 2"):
        BlockPool(1)


class PoolMachine(RuleBasedStateMachine):
    """Random allocate / free / cache / touch / evict sequences keep the books balanced."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(33)
        self.refs: list[int] = []  # one entry per reference we hold
        self.next_hash = 0

    @rule(n=st.integers(0, 8))
    def allocate(self, n: int) -> None:
        if self.pool.can_allocate(n):
            ids = self.pool.allocate(n)
            assert len(set(ids)) == n and NULL_BLOCK not in ids
            self.refs.extend(ids)
        else:
            with pytest.raises(ValueError):
                self.pool.allocate(n)

    @precondition(lambda self: self.refs)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.refs) - 1))
        self.pool.free([self.refs.pop(i)])

    @precondition(lambda self: self.refs)
    @rule(data=st.data())
    def cache(self, data: st.DataObject) -> None:
        block_id = data.draw(st.sampled_from(self.refs))
        self.pool.cache_block(block_id, self.next_hash)
        self.next_hash += 1

    @rule(data=st.data())
    def hit(self, data: st.DataObject) -> None:
        if self.next_hash == 0:
            return
        block_id = self.pool.lookup(data.draw(st.integers(0, self.next_hash - 1)))
        if block_id is not None:
            free_before = self.pool.num_free_blocks
            was_evictable = self.pool.ref_count(block_id) == 0
            self.pool.touch([block_id])
            self.refs.append(block_id)
            # Charged once: an evictable hit costs exactly one free block, a shared one none.
            assert self.pool.num_free_blocks == free_before - (1 if was_evictable else 0)

    @rule()
    def evict_all(self) -> None:
        self.pool.evict_all_cached()

    @invariant()
    def books_balance(self) -> None:
        self.pool.check_integrity()
        assert self.pool.num_held_blocks == len(set(self.refs))
        for block_id in set(self.refs):
            assert self.pool.ref_count(block_id) == self.refs.count(block_id)


TestPoolMachine = PoolMachine.TestCase
