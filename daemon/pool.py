"""The block pool: fixed block ids, reference counts, a prefix-cache map and LRU eviction.

Block 0 is the null block: it is never handed out, so a block table can use it for
slots that left a sliding window. A block is in exactly one state:
  free       on the free stack, no hash;
  held       ref count > 0 (it may carry a hash and be shared);
  evictable  ref count 0 but cached under a hash, kept in LRU order; it counts as free
             for admission and is charged exactly once, when a request takes it
             (by a cache hit, `touch`) or when an allocation evicts it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from functools import partial
from itertools import islice, takewhile
from operator import is_not

NULL_BLOCK = 0


_is_block = partial(is_not, None)  # a lookup hit (C-callable, for takewhile)


def _exhaust(iterator: Iterable[object]) -> None:
    """Run an iterator of side effects (map over a bound method) at C speed."""
    deque(iterator, maxlen=0)


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be at least 2 (one is the null block), got {num_blocks}")
        self.num_blocks = num_blocks  # including the null block
        # A stack, lowest ids on top so a fresh pool hands out 1, 2, 3, ...
        # A list, not an array("i"): a release pushes each block and a list append takes
        # no int conversion, and an allocation's slice needs no tolist(); together ~4% of
        # a submit + finish. The price is memory: ~36 bytes per free block instead of 4
        # (36 MB for a 1M-block pool; vLLM keeps a whole Python object per block).
        self._free = list(range(num_blocks - 1, 0, -1))
        # A list, not an array: indexing it (and map over its __getitem__) is 2-3x faster.
        self._ref = [0] * num_blocks
        # LRU order is insertion order: a plain dict (3.7+) inserts ~5x faster than an
        # OrderedDict, and eviction takes its oldest entries with islice.
        self._evictable: dict[int, None] = {}
        self._hash_of: dict[int, Hashable] = {}
        self._block_of: dict[Hashable, int] = {}
        self._num_held = 0
        # Blocks an allocation can take now: free plus evictable cached (read-only outside
        # the pool). A counter, not a property over len(free) + len(evictable): every
        # decision reads it. Each block being exactly one of free, held or evictable, it
        # moves opposite to _num_held.
        self.num_free_blocks = num_blocks - 1

    # ------------------------------------------------------------------ counts
    @property
    def capacity(self) -> int:
        """Blocks that can ever be handed out (the null block excluded)."""
        return self.num_blocks - 1

    @property
    def num_unhashed_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_evictable_blocks(self) -> int:
        return len(self._evictable)

    @property
    def num_held_blocks(self) -> int:
        return self._num_held

    @property
    def num_cached_blocks(self) -> int:
        return len(self._block_of)

    def usage(self) -> float:
        return self._num_held / self.capacity

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    # -------------------------------------------------------------- allocation
    def can_allocate(self, n: int) -> bool:
        return 0 <= n <= self.num_free_blocks

    def allocate(self, n: int) -> list[int]:
        """Take n blocks (ref count 1), from the free stack first, then evicting LRU."""
        free = self._free
        num_free = len(free)
        if not 0 <= n <= self.num_free_blocks:
            raise ValueError(f"cannot allocate {n} blocks, {self.num_free_blocks} free")
        take = n if n <= num_free else num_free
        # One slice off the top of the stack (C speed), top first.
        ids = free[num_free - take :]
        del free[num_free - take :]
        ids.reverse()
        if n > take:  # evict the n - take least recently used cached blocks, in C loops
            evictable = self._evictable
            victims = list(islice(evictable, n - take))
            _exhaust(map(evictable.pop, victims))
            _exhaust(map(self._block_of.pop, map(self._hash_of.pop, victims)))
            ids += victims
        ref = self._ref
        for block_id in ids:
            ref[block_id] = 1
        self._num_held += n
        self.num_free_blocks -= n
        return ids

    def free(self, block_ids: Iterable[int]) -> int:
        """Drop one reference from each block; cached blocks that reach 0 become evictable.

        Null blocks are skipped. Returns how many blocks stopped being held (reached 0).
        Pass a request's blocks tail first so its tail is evicted before its shared head.
        """
        ref = self._ref
        hash_of = self._hash_of
        free, evictable = self._free, self._evictable
        push = free.append
        before = len(free) + len(evictable)
        try:
            # Two copies of one loop: with nothing cached (prefix caching off or unused) no
            # block can become evictable, so the loop skips a dict lookup per block.
            if not hash_of:
                for block_id in block_ids:
                    count = ref[block_id]
                    if count == 1:
                        ref[block_id] = 0
                        push(block_id)
                    elif count > 1:
                        ref[block_id] = count - 1
                    elif block_id != NULL_BLOCK:
                        raise ValueError(f"block {block_id} freed more often than referenced")
            else:
                for block_id in block_ids:
                    count = ref[block_id]
                    if count == 1:
                        ref[block_id] = 0
                        if block_id in hash_of:
                            evictable[block_id] = None
                        else:
                            push(block_id)
                    elif count > 1:
                        ref[block_id] = count - 1
                    elif block_id != NULL_BLOCK:  # the null block's count is always 0: skipped
                        raise ValueError(f"block {block_id} freed more often than referenced")
        finally:  # blocks that reached 0 are on the stack or in the LRU, even if a bad id stopped us
            released = len(free) + len(evictable) - before
            self._num_held -= released
            self.num_free_blocks += released
        return released

    # ------------------------------------------------------------ prefix cache
    def lookup(self, block_hash: Hashable) -> int | None:
        return self._block_of.get(block_hash)

    def lookup_all(self, block_hashes: Iterable[Hashable]) -> list[int | None]:
        """`lookup` of each hash, in one C loop."""
        return list(map(self._block_of.get, block_hashes))

    def cached_run(self, block_hashes: Iterable[Hashable]) -> list[int]:
        """The cached ids of the leading hashes, up to the first that is not cached."""
        return list(takewhile(_is_block, map(self._block_of.get, block_hashes)))

    def num_held_among(self, block_ids: Iterable[int]) -> int:
        """How many of these blocks have a reference (the null block never does)."""
        ref = self._ref
        counts = [ref[block_id] for block_id in block_ids]  # faster than map(ref.__getitem__)
        return len(counts) - counts.count(0)

    def touch(self, block_ids: Sequence[int]) -> None:
        """Take a reference on cache hits; an evictable block leaves the LRU (charged once)."""
        ref, evictable = self._ref, self._evictable
        taken = 0  # counted locally, not two attribute updates per hit block
        try:
            for block_id in block_ids:
                count = ref[block_id]
                if count == 0:
                    if block_id not in evictable:
                        raise ValueError(f"block {block_id} is neither held nor cached")
                    del evictable[block_id]
                    taken += 1
                ref[block_id] = count + 1
        finally:  # the blocks before a bad id stay taken, and counted
            self._num_held += taken
            self.num_free_blocks -= taken

    def cache_block(self, block_id: int, block_hash: Hashable) -> bool:
        """Publish a held, full block under its chained hash. False if the hash is taken."""
        if self._ref[block_id] <= 0:
            raise ValueError(f"block {block_id} is not held")
        if block_hash in self._block_of or block_id in self._hash_of:
            return False
        self._block_of[block_hash] = block_id
        self._hash_of[block_id] = block_hash
        return True

    def cache_blocks(self, block_ids: Sequence[int], block_hashes: Sequence[Hashable]) -> None:
        """`cache_block` for each pair in order (null ids skipped), in C loops when it can:
        a long prompt publishes hundreds of blocks per engine step."""
        block_of, hash_of, ref = self._block_of, self._hash_of, self._ref
        # "All held" is "no count is 0" (counts never go negative), and it also rules out
        # the null block, whose count is always 0. A list comprehension over the counts
        # beats map(ref.__getitem__) by half on 3.11 (specialized list indexing).
        if not (
            0 not in [ref[block_id] for block_id in block_ids]
            and hash_of.keys().isdisjoint(block_ids)
            and len(set(block_ids)) == len(block_ids)
        ):
            for block_id, block_hash in zip(block_ids, block_hashes):
                if block_id != NULL_BLOCK:
                    self.cache_block(block_id, block_hash)
            return
        # Held, distinct, unhashed blocks: a hash already taken (by another request, or
        # earlier in this prompt) keeps its block, and setdefault hands that one back.
        kept = list(map(block_of.setdefault, block_hashes, block_ids))
        if kept == block_ids:
            hash_of.update(zip(block_ids, block_hashes))
        else:
            hash_of.update((b, h) for b, h, k in zip(block_ids, block_hashes, kept) if b == k)

    def evict_all_cached(self) -> int:
        """Drop every evictable block back to the free stack (e.g. after a model reload)."""
        n = len(self._evictable)
        for block_id in self._evictable:
            del self._block_of[self._hash_of.pop(block_id)]
            self._free.append(block_id)
        self._evictable.clear()
        return n

    # ---------------------------------------------------------------- integrity
    def check_integrity(self) -> None:
        """free + held + evictable == capacity; ref counts ≥ 0; the cache maps agree."""
        ref = self._ref
        assert ref[NULL_BLOCK] == 0, "null block was referenced"
        assert min(ref) >= 0, "negative ref count"
        held = self.num_blocks - ref.count(0)
        assert held == self._num_held, f"held counter {self._num_held} != {held}"
        free_now = len(self._free) + len(self._evictable)
        assert self.num_free_blocks == free_now, f"free counter {self.num_free_blocks} != {free_now}"
        # One byte per block instead of Python sets keeps the check cheap on 1M-block pools.
        seen = bytearray(self.num_blocks)
        for block_id in self._free:
            assert block_id != NULL_BLOCK, "null block on the free stack"
            assert not seen[block_id], f"block {block_id} twice on the free stack"
            assert ref[block_id] == 0 and block_id not in self._hash_of, f"free block {block_id} held or hashed"
            seen[block_id] = 1
        for block_id in self._evictable:
            assert not seen[block_id], f"block {block_id} both free and evictable"
            assert ref[block_id] == 0 and block_id in self._hash_of, f"bad evictable block {block_id}"
        assert len(self._free) + held + len(self._evictable) == self.capacity, (
            f"free {len(self._free)} + held {held} + evictable {len(self._evictable)}"
            f" != {self.capacity}"
        )
        assert all(self._block_of[h] == b for b, h in self._hash_of.items()), "cache maps disagree"
        assert len(self._block_of) == len(self._hash_of), "cache maps differ in size"
