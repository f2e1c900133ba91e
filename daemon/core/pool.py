"""The block pool: fixed block ids, reference counts, a prefix-cache map and LRU eviction.

Block 0 is the null block (never handed out: a table's slots out of a sliding window).
A block is free (no hash), held (ref count > 0) or evictable (ref count 0, cached, in
LRU order; free for admission). The per-block work is a few list and dict operations in
C loops: a replay moves millions of blocks (how: docs/architecture/core.md).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from functools import partial
from itertools import compress, islice, takewhile
from operator import countOf, is_not

NULL_BLOCK = 0


_is_block = partial(is_not, None)  # a lookup hit (C-callable, for takewhile)


def _take_one(counts: dict[int, int], key: int) -> None:
    """Count one `key` off (it is there); a count that reaches 0 leaves the dict."""
    if counts[key] == 1:
        del counts[key]
    else:
        counts[key] -= 1


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
        # The hashes of the evictable blocks, least recently released first, from
        # `_lru_head` on. Entries a cache hit took back stay in the list: `_stale[b]` counts
        # block b's stale entries (few blocks have any), and since a hit takes back b's
        # newest entry, they are always b's oldest ones. (A stale entry's hash still maps
        # to b: b is held, or evictable again with a newer entry, so it keeps its hash.)
        self._lru: list[Hashable] = []
        self._lru_head = 0
        self._stale: dict[int, int] = {}
        self._num_stale = 0
        self._num_evictable = 0
        self._hash_of: list[Hashable | None] = [None] * num_blocks  # per block, None: not cached
        self._block_of: dict[Hashable, int] = {}
        self._num_held = 0
        # Blocks an allocation can take now: free plus evictable cached (read-only outside
        # the pool). A counter, not a property over len(free) + evictable: every decision
        # reads it. Each block being exactly one of free, held or evictable, it moves
        # opposite to _num_held.
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
        return self._num_evictable

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
        ref = self._ref
        for block_id in ids:
            ref[block_id] = 1
        if n > take:
            ids += self._evict(n - take)
        self._num_held += n
        self.num_free_blocks -= n
        return ids

    def _evict(self, n: int) -> list[int]:
        """Take the n least recently released evictable blocks (ref count 1, no hash)."""
        lru, head, ref, hash_of = self._lru, self._lru_head, self._ref, self._hash_of
        if not self._num_stale:  # the usual case: the next n entries are the victims
            victims = list(map(self._block_of.pop, lru[head : head + n]))
            for block_id in victims:
                ref[block_id] = 1
                hash_of[block_id] = None
            head += n
        else:  # one entry at a time, skipping stale ones
            block_of, stale = self._block_of, self._stale
            victims = []
            while len(victims) < n:
                block_hash = lru[head]
                head += 1
                block_id = block_of[block_hash]
                if block_id in stale:
                    _take_one(stale, block_id)
                    self._num_stale -= 1
                    continue
                del block_of[block_hash]
                ref[block_id] = 1
                hash_of[block_id] = None
                victims.append(block_id)
        if head > 1024 and 2 * head > len(lru):  # drop the consumed front now and then
            del lru[:head]
            head = 0
        self._lru_head = head
        self._num_evictable -= n
        return victims

    def free(self, block_ids: Iterable[int]) -> int:
        """Drop one reference from each block; cached blocks that reach 0 become evictable.

        Null blocks are skipped. Returns how many blocks stopped being held (reached 0).
        Pass a request's blocks tail first so its tail is evicted before its shared head.
        """
        ref, hash_of = self._ref, self._hash_of
        free, lru = self._free, self._lru
        push = free.append
        num_free, num_lru = len(free), len(lru)
        try:
            # Two copies of one loop: with nothing cached (prefix caching off or unused) no
            # block can become evictable, so the loop skips a hash lookup per block.
            if not self._block_of:
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
                release = lru.append
                for block_id in block_ids:
                    count = ref[block_id]
                    if count == 1:
                        ref[block_id] = 0
                        block_hash = hash_of[block_id]
                        if block_hash is None:
                            push(block_id)
                        else:
                            release(block_hash)
                    elif count > 1:
                        ref[block_id] = count - 1
                    elif block_id != NULL_BLOCK:  # the null block's count is always 0: skipped
                        raise ValueError(f"block {block_id} freed more often than referenced")
        finally:  # blocks that reached 0 are on the stack or in the LRU, even if a bad id stopped us
            evictable = len(lru) - num_lru
            released = len(free) - num_free + evictable
            if evictable:
                self._num_evictable += evictable
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
        ref, hash_of, stale, lru = self._ref, self._hash_of, self._stale, self._lru
        taken = went_stale = 0  # counted locally, not attribute updates per hit block
        try:
            for block_id in block_ids:
                count = ref[block_id]
                if count == 0:
                    # Unreferenced and hashed is evictable: its LRU entry goes, from the
                    # tail if it is the last one released, else it stays behind as stale.
                    block_hash = hash_of[block_id]
                    if block_hash is None:
                        raise ValueError(f"block {block_id} is neither held nor cached")
                    if len(lru) > self._lru_head and lru[-1] is block_hash:
                        lru.pop()
                    else:
                        stale[block_id] = stale.get(block_id, 0) + 1
                        went_stale += 1
                    taken += 1
                ref[block_id] = count + 1
        finally:  # the blocks before a bad id stay taken, and counted
            self._num_stale += went_stale
            self._num_evictable -= taken
            self._num_held += taken
            self.num_free_blocks -= taken
            if self._num_stale > 1024 + self._num_evictable // 2:
                self._drop_stale_entries()

    def cache_block(self, block_id: int, block_hash: Hashable) -> bool:
        """Publish a held, full block under its chained hash. False if the hash is taken."""
        if self._ref[block_id] <= 0:
            raise ValueError(f"block {block_id} is not held")
        if block_hash in self._block_of or self._hash_of[block_id] is not None:
            return False
        self._block_of[block_hash] = block_id
        self._hash_of[block_id] = block_hash
        return True

    def cache_blocks(self, block_ids: Sequence[int], block_hashes: Sequence[Hashable]) -> None:
        """`cache_block` for each pair in order (null ids skipped), in C loops where it can:
        a long prompt publishes hundreds of blocks per engine step (fastest with a list of ids)."""
        block_of, hash_of, ref = self._block_of, self._hash_of, self._ref
        if len(block_hashes) != len(block_ids):
            self._cache_each(block_ids, block_hashes)
            return
        # Record each block's hash, checking on the way that the block is held (which also
        # rules out the null block, whose count is always 0) and had no hash yet (which
        # also catches a block listed twice). block_of is not touched yet: undoing is easy.
        done = 0
        for block_id, block_hash in zip(block_ids, block_hashes):
            if hash_of[block_id] is not None or not ref[block_id]:
                for undo in block_ids[:done]:
                    hash_of[undo] = None
                self._cache_each(block_ids, block_hashes)
                return
            hash_of[block_id] = block_hash
            done += 1
        # A hash already taken (by another request, or earlier in this prompt) keeps its
        # block, and setdefault hands that one back: ours stays private.
        kept = list(map(block_of.setdefault, block_hashes, block_ids))
        if kept != block_ids:
            for block_id, kept_id in zip(block_ids, kept):
                if block_id != kept_id:
                    hash_of[block_id] = None

    def _cache_each(self, block_ids: Sequence[int], block_hashes: Sequence[Hashable]) -> None:
        for block_id, block_hash in zip(block_ids, block_hashes):
            if block_id != NULL_BLOCK:
                self.cache_block(block_id, block_hash)

    def _evictable_in_order(self) -> list[int]:
        """The evictable blocks, least recently released first (stale entries skipped)."""
        entries = map(self._block_of.__getitem__, islice(self._lru, self._lru_head, None))
        if not self._num_stale:
            return list(entries)
        stale_left, out = self._stale.copy(), []
        for block_id in entries:
            if block_id in stale_left:  # b's stale entries come before its live one
                _take_one(stale_left, block_id)
            else:
                out.append(block_id)
        return out

    def _drop_stale_entries(self) -> None:
        """Rewrite the LRU without its stale entries (same order). Eviction drops them as it
        passes; this bounds them when hits keep coming and nothing is evicted."""
        block_of, stale, live = self._block_of, self._stale, []
        for block_hash in islice(self._lru, self._lru_head, None):
            block_id = block_of[block_hash]
            if block_id in stale:  # b's stale entries come before its live one
                _take_one(stale, block_id)
            else:
                live.append(block_hash)
        self._lru, self._lru_head, self._num_stale = live, 0, 0

    def evict_all_cached(self) -> int:
        """Drop every evictable block back to the free stack (e.g. after a model reload)."""
        n = self._num_evictable
        block_of, hash_of = self._block_of, self._hash_of
        for block_id in self._evictable_in_order():
            del block_of[hash_of[block_id]]
            hash_of[block_id] = None
            self._free.append(block_id)
        self._lru = []
        self._lru_head = self._num_evictable = self._num_stale = 0
        self._stale = {}
        return n

    # ---------------------------------------------------------------- integrity
    def check_integrity(self) -> None:
        """free + held + evictable == capacity; ref counts ≥ 0; the cache maps agree."""
        ref, hash_of, block_of = self._ref, self._hash_of, self._block_of
        assert ref[NULL_BLOCK] == 0, "null block was referenced"
        assert min(ref) >= 0, "negative ref count"
        held = self.num_blocks - ref.count(0)
        assert held == self._num_held, f"held counter {self._num_held} != {held}"
        assert sum(self._stale.values()) == self._num_stale and 0 not in self._stale.values(), "stale counter"
        try:
            evictable = self._evictable_in_order()
        except KeyError as e:
            raise AssertionError(f"LRU entry {e} not cached") from None
        assert len(evictable) == self._num_evictable, f"evictable counter {self._num_evictable} != {len(evictable)}"
        free_now = len(self._free) + len(evictable)
        assert self.num_free_blocks == free_now, f"free counter {self.num_free_blocks} != {free_now}"
        # One byte per block instead of Python sets keeps the check cheap on 1M-block pools.
        seen = bytearray(self.num_blocks)
        for block_id in self._free:
            assert block_id != NULL_BLOCK, "null block on the free stack"
            assert not seen[block_id], f"block {block_id} twice on the free stack"
            assert ref[block_id] == 0 and hash_of[block_id] is None, f"free block {block_id} held or hashed"
            seen[block_id] = 1
        for block_id in evictable:
            assert not seen[block_id], f"block {block_id} twice free or evictable"
            assert ref[block_id] == 0 and hash_of[block_id] is not None, f"bad evictable block {block_id}"
            seen[block_id] = 1
        assert len(self._free) + held + len(evictable) == self.capacity, (
            f"free {len(self._free)} + held {held} + evictable {len(evictable)}"
            f" != {self.capacity}"
        )
        # Every hashed block is held or in the LRU (none lost behind a stale entry), and is
        # the block its hash maps to.
        num_hashed = self.num_blocks - hash_of.count(None)
        num_held_hashed = held - countOf(compress(hash_of, ref), None)
        assert num_hashed == num_held_hashed + len(evictable), "a cached block is neither held nor in the LRU"
        # block_of maps each hash to a block that carries it, and has one entry per hashed
        # block: the two maps are inverse.
        assert [hash_of[block_id] for block_id in block_of.values()] == list(block_of), "cache maps disagree"
        assert len(block_of) == num_hashed, "cache maps differ in size"
