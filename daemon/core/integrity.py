"""The integrity check: every counter the core keeps, recounted from scratch.

The ledger and the controller keep running totals so that no decision and no snapshot
walks the pool; this recounts them all from the block tables and checks them against the
pool, the budget formulas and the queue. O(pool): for tests and benches, never a hot path.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from kvbudget.daemon.core.budget import block_slots, blocks_held
from kvbudget.daemon.core.ledger import BlockLedger
from kvbudget.daemon.core.pool import NULL_BLOCK
from kvbudget.daemon.core.prefix_hits import cache_keys
from kvbudget.daemon.core.requests import RequestState, Status
from kvbudget.daemon.core.waiting_queue import WaitingQueue


def check_controller(
    ledger: BlockLedger,
    requests: dict[str, RequestState],
    running: dict[str, RequestState],
    queue: WaitingQueue,
) -> None:
    """Pool, tables, budget formulas, counters and queue all agree."""
    check_ledger(ledger, running)
    waiting = list(queue.all())
    assert len(waiting) == len(queue), "queue length counter"
    assert len(waiting) + len(running) == len(requests), "a request is lost"
    for r in waiting:
        assert r.status is Status.WAITING and r.queued and not r.tables, f"{r.request_id} waiting"
        assert requests.get(r.request_id) is r, f"{r.request_id} queued but unknown"
    for r in running.values():
        assert not r.queued and requests.get(r.request_id) is r, f"{r.request_id} running"
    for name, account in ledger.tenants.items():
        assert account.waiting == sum(1 for r in waiting if r.tenant == name), f"tenant {name!r} waiting"
    queue.check_order(ledger.tenants)
    if not running and queue:
        raise AssertionError("deadlock: nothing runs and the queue is not empty")


@dataclass
class _Recount:
    """The ledger's totals, counted again from the running requests' tables."""

    num_groups: int
    refs: Counter[int] = field(default_factory=Counter)  # block -> tables holding it
    held_per_group: list[set[int]] = field(default_factory=list)
    owed: int = 0
    owed_per_group: list[int] = field(default_factory=list)
    charged: Counter[str] = field(default_factory=Counter)  # tenant -> Σ reserved
    tenant_held: Counter[str] = field(default_factory=Counter)  # tenant -> Σ held
    tenant_running: Counter[str] = field(default_factory=Counter)
    tenant_blocks: dict[str, set[int]] = field(default_factory=dict)  # distinct blocks its requests hold
    prefix_refs: dict[str, Counter[int]] = field(default_factory=dict)  # its references in prefix slots

    def __post_init__(self) -> None:
        self.held_per_group = [set() for _ in range(self.num_groups)]
        self.owed_per_group = [0] * self.num_groups


def check_ledger(ledger: BlockLedger, running: dict[str, RequestState]) -> None:
    """The pool, every running request's tables and the ledger's totals agree."""
    ledger.pool.check_integrity()
    count = _Recount(ledger.num_groups)
    for r in running.values():
        _count_request(ledger, r, count)
    _check_totals(ledger, count)
    _check_tenants(ledger, count)
    _check_sharing(ledger, running, count.refs)


def _count_request(ledger: BlockLedger, r: RequestState, count: _Recount) -> None:
    """Checks `r`'s tables against the budget formulas and adds it to `count`."""
    assert r.status is Status.RUNNING, f"{r.request_id} listed running but {r.status}"
    assert 0 <= r.num_computed <= r.num_tokens <= r.max_len, f"{r.request_id}: token numbers"
    for g, spec in enumerate(ledger.specs):
        table = r.tables[g]
        expect = blocks_held(spec, r.num_tokens, r.num_computed)
        real = sum(1 for b in table if b != NULL_BLOCK)
        assert len(table) == block_slots(spec, r.num_tokens), f"{r.request_id} g{g}: slots"
        assert real == r.held[g] == expect, (
            f"{r.request_id} g{g}: holds {real}, says {r.held[g]}, budget says {expect}"
        )
        nulls = len(table) - real
        assert all(b == NULL_BLOCK for b in table[:nulls]), f"{r.request_id} g{g}: null not leading"
        for b in table:
            if b != NULL_BLOCK:
                count.refs[b] += 1
                count.held_per_group[g].add(b)
        if r.base[g] > r.held[g]:
            count.owed += r.base[g] - r.held[g]
            count.owed_per_group[g] += r.base[g] - r.held[g]
    reserved = r.reserved()
    assert all(res >= h for res, h in zip(reserved, r.held)), "reservation below held"
    count.charged[r.tenant] += sum(reserved)
    count.tenant_held[r.tenant] += sum(r.held)
    count.tenant_running[r.tenant] += 1
    count.tenant_blocks.setdefault(r.tenant, set()).update(b for t in r.tables for b in t if b != NULL_BLOCK)
    count.prefix_refs.setdefault(r.tenant, Counter()).update(
        b for t in r.tables for b in t[: r.cached_upto] if b != NULL_BLOCK
    )


def _check_totals(ledger: BlockLedger, count: _Recount) -> None:
    """The pool-wide counters: held, owed and the window share reserve."""
    pool, refs, held_per_group = ledger.pool, count.refs, count.held_per_group
    for b, n in refs.items():
        assert pool.ref_count(b) == n, f"block {b}: ref {pool.ref_count(b)}, tables {n}"
    assert len(refs) == pool.num_held_blocks, f"tables hold {len(refs)}, pool {pool.num_held_blocks}"
    assert [len(s) for s in held_per_group] == ledger.held_per_group, "held per group counter"
    assert sum(len(s) for s in held_per_group) == pool.num_held_blocks, "a block in two groups"
    assert count.owed == ledger.owed and count.owed_per_group == ledger.owed_per_group, "owed counters"
    extra_refs = [0] * ledger.num_groups
    for g in ledger.window_groups:
        extra_refs[g] = sum(refs[b] - 1 for b in held_per_group[g])
    assert extra_refs == ledger.share_reserve_per_group, "window share reserve per group"
    assert sum(extra_refs) == ledger.window_share_reserve, "window share reserve"
    assert pool.num_free_blocks >= ledger.owed + ledger.window_share_reserve, (
        f"promised {ledger.owed} + {ledger.window_share_reserve} blocks, only {pool.num_free_blocks} free"
    )


def _check_tenants(ledger: BlockLedger, count: _Recount) -> None:
    """Each tenant's account: its distinct blocks, its references and its charge."""
    pool = ledger.pool
    window_blocks = set().union(*(count.held_per_group[g] for g in ledger.window_groups))
    for name, account in ledger.tenants.items():
        # Each block once per tenant: Σ over its requests, less its extra references.
        distinct = len(count.tenant_blocks.get(name, ()))
        extra = count.tenant_held[name] - distinct
        assert account.held == distinct, f"tenant {name!r} holds {distinct} distinct blocks, says {account.held}"
        assert account.held <= pool.num_held_blocks, f"tenant {name!r} holds more than the pool"
        assert account.running == count.tenant_running[name], f"tenant {name!r} running"
        refs = count.prefix_refs.get(name, Counter())
        assert account.prefix_blocks == refs.keys(), f"tenant {name!r} prefix blocks"
        assert account.extra_refs == {b: n - 1 for b, n in refs.items() if n > 1}, f"tenant {name!r} extra refs"
        assert sum(account.extra_refs.values()) == extra, f"tenant {name!r}: a block shared outside prefix slots"
        # Charged: Σ reserved, less its extra references in full-attention groups.
        extra_full = sum(n for b, n in account.extra_refs.items() if b not in window_blocks)
        assert account.charged == count.charged[name] - extra_full, f"tenant {name!r} charge"


def _check_sharing(ledger: BlockLedger, running: dict[str, RequestState], refs: Counter[int]) -> None:
    """A block in more than one table must be the cached block of that prompt position."""
    for r in running.values():
        hashes = r.spec.prefix_hashes
        for g, table in enumerate(r.tables):
            keys = cache_keys(ledger.num_groups, g, hashes)
            for slot, b in enumerate(table):
                if b != NULL_BLOCK and refs[b] > 1:
                    assert slot < len(keys) and ledger.pool.lookup(keys[slot]) == b, (
                        f"block {b} shared by {refs[b]} tables but not a cached prefix block"
                    )
