"""The block ledger: the pool plus running totals of who holds and who is owed what.

Every change to a running request's blocks goes through here, so the totals a snapshot
reads are counters and a snapshot never walks the pool (integrity.py recounts them). Why
shared window-group blocks keep a `window_share_reserve`, and how a tenant is charged for
blocks its requests share: docs/architecture/core.md.
"""

from __future__ import annotations

from kvbudget.daemon.core.admission_config import AdmissionError
from kvbudget.daemon.core.budget import blocks_held, blocks_out_of_window
from kvbudget.daemon.core.pool import NULL_BLOCK, BlockPool
from kvbudget.daemon.core.prefix_hits import PrefixHit, hit_ids
from kvbudget.daemon.core.requests import (
    RequestState,
    Status,
    grow_table,
    publish_prompt_blocks,
    release_out_of_window,
    release_table,
)
from kvbudget.daemon.core.spec import KVCacheLayout, LayerKind
from kvbudget.daemon.core.waiting_queue import TenantAccount

_WINDOW_KINDS = (LayerKind.SLIDING, LayerKind.CHUNKED)
RUNNING, WAITING = Status.RUNNING, Status.WAITING  # enum member lookups are slow on 3.11


def _prefix_ids(tables, upto: int) -> list[int]:
    """The blocks in the first `upto` slots of each table (null slots, leading, left out)."""
    if len(tables) == 1:  # one group (most models): the slice itself
        ids = tables[0][:upto]
        return ids[ids.count(NULL_BLOCK):] if ids and ids[0] == NULL_BLOCK else ids
    ids = []
    for table in tables:
        part = table[:upto]
        if part and part[0] == NULL_BLOCK:
            part = part[part.count(NULL_BLOCK):]
        ids += part
    return ids


def _refer(account: TenantAccount, ids) -> int:
    """One more reference of `account`'s on each of `ids` (one request's prefix blocks:
    distinct, no null); returns how many it referenced already (not charged again)."""
    blocks = account.prefix_blocks
    again = blocks.intersection(ids)
    if not again:  # nothing shared within the tenant
        blocks.update(ids)
        return 0
    extra = account.extra_refs
    get = extra.get
    for block_id in again:
        extra[block_id] = get(block_id, 0) + 1
    if len(again) < len(ids):
        blocks.update(ids)
    return len(again)


def _unrefer(account: TenantAccount, ids) -> int:
    """Drop one reference of `account`'s on each of `ids`; returns how many of them its
    other requests still reference (still charged)."""
    blocks, extra = account.prefix_blocks, account.extra_refs
    kept = extra.keys() & ids if extra else ()
    if not kept:
        blocks.difference_update(ids)
        return 0
    for block_id in kept:
        n = extra[block_id]
        if n == 1:
            del extra[block_id]
        else:
            extra[block_id] = n - 1
    if len(kept) < len(ids):  # (all kept: the system prompt of a tenant's other requests)
        blocks.difference_update(ids)
        blocks.update(kept)
    return len(kept)


class BlockLedger:
    def __init__(self, layout: KVCacheLayout, num_blocks: int) -> None:
        self.layout = layout
        self.pool = BlockPool(num_blocks + 1)  # + the null block
        self.specs = tuple(g.spec for g in layout.groups)
        self.num_groups = len(self.specs)
        self.window_groups = tuple(i for i, s in enumerate(self.specs) if s.kind in _WINDOW_KINDS)
        self.prefix_groups = tuple(i for i in range(self.num_groups) if i not in self.window_groups)
        self.held_per_group = [0] * self.num_groups  # distinct pool blocks
        self.owed_per_group = [0] * self.num_groups
        self.reclaimed_per_group = [0] * self.num_groups
        self.owed = 0  # Σ reserved-not-held over running requests
        # Tenants with requests waiting whose charge moved: their place in the queue
        # (fair share) is looked at again before the next pass (WaitingQueue.in_order).
        self.usage_changed: set[str] = set()
        # Σ over window-group blocks of (references - 1): see the module docstring.
        self.window_share_reserve = 0
        self.share_reserve_per_group = [0] * self.num_groups
        self.tenants: dict[str, TenantAccount] = {}
        # The last account dropped by `forget_idle_tenant`, reused if its tenant comes back:
        # one tenant submitting and finishing one request at a time (the common case) would
        # otherwise build and drop an account on every request.
        self._retired: TenantAccount | None = None

    @property
    def spare(self) -> int:
        """Free blocks nobody has been promised: what a new promise may take."""
        return self.pool.num_free_blocks - self.owed - self.window_share_reserve

    def _dropped_shared(self, g: int, refs_dropped: int, blocks_freed: int) -> None:
        """References dropped on blocks others still hold release their share reserve."""
        if g in self.window_groups:
            shared = refs_dropped - blocks_freed
            self.window_share_reserve -= shared
            self.share_reserve_per_group[g] -= shared

    def tenant(self, name: str) -> TenantAccount:
        account = self.tenants.get(name)
        if account is None:
            retired = self._retired
            if retired is not None and retired.name == name:
                self._retired = None
                account = self.tenants[name] = retired  # idle accounts are all defaults
            else:
                account = self.tenants[name] = TenantAccount(name)
        return account

    def forget_idle_tenant(self, name: str) -> None:
        """Drop the account of a tenant with nothing running or waiting and default settings
        (its snapshot row would be all zeros)."""
        account = self.tenants.get(name)
        if account and not (account.running or account.waiting or account.max_share) and account.weight == 1.0:
            del self.tenants[name]
            self._retired = account

    def set_quota(self, name: str, max_share: float | None, weight: float) -> None:
        """A tenant's maximum share of the pool (None or 0: no quota) and fair-share weight;
        AdmissionError, changing nothing, for a share or weight out of range."""
        if max_share is not None and not 0.0 <= max_share <= 1.0:
            raise AdmissionError("max_share", f"must be in [0, 1] (0: no quota), got {max_share}")
        capacity = self.pool.capacity
        if max_share and int(max_share * capacity) == 0:  # (a quota of 0 blocks refuses everything)
            raise AdmissionError("max_share", f"{max_share:g} of the {capacity} blocks is less than one block")
        if not weight > 0.0:
            raise AdmissionError("weight", f"must be positive, got {weight}")
        account = self.tenant(name)
        account.max_share = max_share or None
        account.weight = weight
        if account.waiting:  # a new weight is a new place in the queue
            self.usage_changed.add(name)

    # ------------------------------------------------------------ totals
    def _tally(self, r: RequestState, sign: int) -> TenantAccount:
        """Add (sign +1) or take out (-1) `r`'s share of the totals; returns its tenant's account."""
        if r.owed:
            self.owed += sign * r.owed
            self._owe_per_group(r, sign)
        account = self.tenants[r.spec.tenant]
        account.charged += sign * r.charged
        account.held += sign * sum(r.held)
        if account.waiting:
            self.usage_changed.add(account.name)
        return account

    def _owe_per_group(self, r: RequestState, sign: int) -> None:
        """Add (+1) or take out (-1) what `r` is owed, per group (its `owed` is not 0)."""
        per_group = self.owed_per_group
        if len(per_group) == 1:  # owed is Σ max(0, base - held): one group owes it all
            per_group[0] += sign * r.owed
        else:
            for g, (h, b) in enumerate(zip(r.held, r.base)):
                if b > h:
                    per_group[g] += sign * (b - h)

    # ------------------------------------------------------------ changes
    def admit(
        self, r: RequestState, hit: PrefixHit, base: tuple[int, ...], num_tokens: int, held: list[int],
        charge: int,
    ) -> None:
        """Take the hits, allocate the first chunk; the caller checked that it fits and
        passes `held` = budget.blocks_held per group for (num_tokens, hit tokens) and
        `charge` = Σ max(held, base), which it computed to test the fit."""
        pool = self.pool
        r.num_tokens = num_tokens
        r.num_computed = hit.num_tokens
        r.hit_blocks = r.cached_upto = hit.num_blocks
        r.base = list(base)
        account = self.tenants[r.spec.tenant]
        # Hit blocks the tenant's other requests hold: held once already, and charged once
        # already in full-attention groups (window groups: see the module docstring).
        again = again_full = 0
        if hit.num_blocks:
            again = again_full = _refer(account, hit_ids(hit, self.prefix_groups))
            if self.window_groups:
                again += _refer(account, hit_ids(hit, self.window_groups))
            tables = [list(t) for t in hit.tables]
            # Take every group's hits before allocating anything: an allocation evicts LRU
            # blocks and must not evict a hit another group is about to use.
            for g, table in enumerate(tables):
                before = pool.num_held_blocks
                # Out-of-window slots (null) lead the table; full-attention tables have none.
                pool.touch(table if not table or table[0] != NULL_BLOCK else [b for b in table if b != NULL_BLOCK])
                self.held_per_group[g] += pool.num_held_blocks - before
                if g in self.window_groups:
                    self.window_share_reserve += hit.shared[g]
                    self.share_reserve_per_group[g] += hit.shared[g]
            # Every allocated block is newly held (fresh or evicted from the LRU).
            for g, spec in enumerate(self.specs):
                self.held_per_group[g] += len(grow_table(pool, spec, tables[g], num_tokens))
        elif len(held) == 1:  # the common case, one group: its table is one allocation
            tables = [pool.allocate(held[0])]
            self.held_per_group[0] += held[0]
        else:  # fresh tables are the allocations themselves
            tables = self._fresh_tables(held)
        r.tables = tables
        r.held = held
        # r.recount() from the sums the caller has: Σ max(0, b - h) = Σ max(h, b) - Σ h.
        r.charged = charge
        held_total = sum(held)
        r.owed = owed = charge - held_total
        r.status = RUNNING
        # self._tally(r, +1), inlined (every admission) with the sums at hand.
        if owed:
            self.owed += owed
            if self.num_groups == 1:  # one group owes it all (see _owe_per_group)
                self.owed_per_group[0] += owed
            else:
                self._owe_per_group(r, +1)
        account.charged += charge - again_full
        account.held += held_total - again
        account.running += 1
        if account.waiting:
            self.usage_changed.add(account.name)

    def _fresh_tables(self, held: list[int]) -> list[list[int]]:
        """New block tables of `held[g]` blocks per group, counted as held. With nothing
        computed yet nothing is out of a window, so blocks_held == block_slots: the tables
        have no null slots."""
        pool, held_per_group = self.pool, self.held_per_group
        tables = []
        for g, n in enumerate(held):
            tables.append(pool.allocate(n))
            held_per_group[g] += n
        return tables

    def grow(self, r: RequestState, num_tokens: int, new_held: list[int]) -> tuple[tuple[int, ...], ...]:
        """Extend to `num_tokens` slots (the caller checked it fits); returns new ids per group."""
        pool = self.pool
        self._tally(r, -1)
        new_ids = []
        held_per_group = self.held_per_group
        for g, spec in enumerate(self.specs):
            ids = grow_table(pool, spec, r.tables[g], num_tokens)
            held_per_group[g] += len(ids)
            new_ids.append(tuple(ids))
        r.num_tokens = num_tokens
        r.held = new_held
        r.recount()
        self._tally(r, +1)
        return tuple(new_ids)

    def progress(self, r: RequestState, num_computed: int, hashes: tuple[int, ...], caching: bool) -> int:
        """Record computed tokens: publish full prompt blocks, free what left the window."""
        pool = self.pool
        r.num_computed = num_computed
        if caching and hashes:
            full = min(num_computed, r.spec.prompt_tokens) // self.layout.block_size
            cached_upto = r.cached_upto
            if full > cached_upto:
                published: list[int] = []
                for g, table in enumerate(r.tables):
                    publish_prompt_blocks(pool, self.num_groups, g, table, hashes, cached_upto, full)
                    published += table[cached_upto:full]
                # The request's own blocks: no other table holds them, so none is shared yet.
                self.tenants[r.spec.tenant].prefix_blocks.update(published)
                r.cached_upto = full
        if not self.window_groups:
            return 0
        freed_total = 0
        account = self._tally(r, -1)
        kept = 0  # window blocks let go that the tenant's other requests still hold
        for g in self.window_groups:
            spec = self.specs[g]
            table = r.tables[g]
            cached_upto = r.cached_upto
            if cached_upto and table[cached_upto - 1] != NULL_BLOCK:  # prefix slots still held
                # The prefix slots release_out_of_window is about to null (nulls lead).
                gone = []
                for slot in range(min(blocks_out_of_window(spec, num_computed), cached_upto) - 1, -1, -1):
                    block_id = table[slot]
                    if block_id == NULL_BLOCK:
                        break
                    gone.append(block_id)
                if gone:
                    kept += _unrefer(account, gone)
            before = pool.num_held_blocks
            freed = release_out_of_window(pool, spec, table, num_computed)
            if freed:
                returned = before - pool.num_held_blocks
                self.held_per_group[g] -= returned
                self.reclaimed_per_group[g] += returned
                self._dropped_shared(g, freed, returned)
                r.held[g] = blocks_held(spec, r.num_tokens, num_computed)
                freed_total += freed
        r.recount()
        self._tally(r, +1)
        if kept:  # still held by the tenant; their share reserve (in its charge) goes
            account.held += kept
        return freed_total

    def release(self, r: RequestState) -> int:
        """Drop every block the request holds; returns how many references went back."""
        pool = self.pool
        owed = r.owed
        if owed:  # self._tally(r, -1), inlined (every finish)
            self.owed -= owed
            if self.num_groups == 1:  # one group owes it all (see _owe_per_group)
                self.owed_per_group[0] -= owed
            else:
                self._owe_per_group(r, -1)
        account = self.tenants[r.spec.tenant]
        tables = r.tables
        # Prefix blocks the tenant's other requests still hold stay its own (and charged
        # to it; in window groups their share reserve goes, as for the pool).
        kept = kept_full = 0
        if r.cached_upto:
            if self.window_groups:
                kept = _unrefer(account, _prefix_ids([tables[g] for g in self.window_groups], r.cached_upto))
                kept_full = _unrefer(account, _prefix_ids([tables[g] for g in self.prefix_groups], r.cached_upto))
            else:
                kept_full = _unrefer(account, _prefix_ids(tables, r.cached_upto))
            kept += kept_full
        account.charged -= r.charged - kept_full
        account.held -= sum(r.held) - kept
        account.running -= 1
        if account.waiting:
            self.usage_changed.add(account.name)
        held_per_group = self.held_per_group
        window_groups = self.window_groups
        if not window_groups and len(tables) == 1:
            # The common case, one full-attention group: no null slots (only windows
            # release leading blocks) and no share reserve, so release_table's counting
            # and its tuple are not needed.
            table = tables[0]
            freed = len(table)
            held_per_group[0] -= pool.free(reversed(table))
            table.clear()
        else:
            freed = 0
            for g, table in enumerate(tables):
                dropped, returned = release_table(pool, table)
                held_per_group[g] -= returned
                if g in window_groups:
                    self._dropped_shared(g, dropped, returned)
                freed += dropped
        r.tables = []
        r.held = [0] * self.num_groups
        r.base = r.held.copy()
        r.charged = r.owed = 0
        r.num_tokens = r.num_computed = r.cached_upto = 0
        r.status = WAITING
        return freed
