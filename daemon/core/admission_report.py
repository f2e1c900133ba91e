"""What the admission controller says about itself: its snapshot.

The snapshot reads counters kept as decisions happen (the decisions', the ledger's, the
queue's), so it never walks the pool; only the waiting requests' reasons are counted when
it is taken. (integrity.py recounts everything from scratch.)
"""

from __future__ import annotations

import heapq
from collections import Counter
from operator import attrgetter

from kvbudget.daemon.core.ledger import BlockLedger
from kvbudget.daemon.core.decisions import DecisionRecorder
from kvbudget.daemon.core.records import (
    MAX_SNAPSHOT_TENANTS,
    OTHER_TENANTS,
    GroupSnapshot,
    Snapshot,
    TenantSnapshot,
)
from kvbudget.daemon.core.waiting_queue import TenantAccount, WaitingQueue

_wait_reason = attrgetter("wait_reason")  # (a C call per waiting request: snapshots)
_HELD, _CHARGED, _RUNNING, _WAITING = map(attrgetter, ("held", "charged", "running", "waiting"))


def snapshot(
    now: float, ledger: BlockLedger, queue: WaitingQueue, num_running: int, decisions: DecisionRecorder
) -> Snapshot:
    """The controller's state now; the counters are keyed by enum member, reported by value."""
    pool = ledger.pool
    preemptions = decisions.preemptions
    capacity = pool.capacity
    # The queue may hold tens of thousands: counted in C (a reason changes at each try,
    # so it is not kept as they come and go, as the counts per engine are).
    by_reason = Counter(map(_wait_reason, queue.all()))
    return Snapshot(
        time_s=now,
        policy=decisions.policy,
        num_blocks=capacity,
        num_free_blocks=pool.num_free_blocks,
        num_held_blocks=pool.num_held_blocks,
        num_reserved_blocks=ledger.owed + ledger.window_share_reserve,
        num_evictable_blocks=pool.num_evictable_blocks,
        num_running=num_running,
        num_waiting=len(queue),
        num_preemptions=sum(preemptions.values()),
        preemptions_by_reason={k.value: n for k, n in preemptions.items()},
        rejections_by_reason={k.value: n for k, n in decisions.rejections.items()},
        decisions_by_kind={k.value: n for k, n in decisions.by_kind.items()},
        groups=group_snapshots(ledger),
        tenants=tenant_snapshots(ledger),  # bounded: records.MAX_SNAPSHOT_TENANTS
        num_tenants=len(ledger.tenants),
        prefix_hit_blocks=decisions.prefix_hit_blocks,
        prefix_query_blocks=decisions.prefix_query_blocks,
        waiting_by_reason={reason.value: n for reason, n in by_reason.items()},
        waiting_by_engine=dict(queue.num_by_engine),
    )


def group_snapshots(ledger: BlockLedger) -> tuple[GroupSnapshot, ...]:
    return tuple(
        GroupSnapshot(
            kind=g.kind.value,
            description=g.spec.describe(),
            num_layers=len(g.layer_ids),
            blocks_held=ledger.held_per_group[i],
            blocks_reserved=ledger.owed_per_group[i] + ledger.share_reserve_per_group[i],
            blocks_reclaimed=ledger.reclaimed_per_group[i],
        )
        for i, g in enumerate(ledger.layout.groups)
    )


def _rank(a: TenantAccount) -> tuple[int, int, str]:
    """Smallest first: most blocks held and reserved, then most requests, then by name."""
    return -a.charged, -(a.running + a.waiting), a.name


def tenant_snapshots(ledger: BlockLedger, limit: int = MAX_SNAPSHOT_TENANTS) -> tuple[TenantSnapshot, ...]:
    """Every tenant the config names, and at most `limit` entries for the others: all of
    them when that many or fewer (as they came), else the named ones, then the `limit - 1`
    largest others (each largest first) and one OTHER_TENANTS entry summing the rest.
    See records.MAX_SNAPSHOT_TENANTS."""
    accounts = ledger.tenants.values()
    capacity = ledger.pool.capacity
    if len(accounts) <= limit:  # the common case: no cut, no extra pass
        return tuple(_tenant_snapshot(a, capacity) for a in accounts)
    configured, others = [], []
    for a in accounts:
        if a.name == OTHER_TENANTS:  # a tenant of that name joins the sum (as in /metrics)
            continue
        (configured if a.max_share is not None or a.weight != 1.0 else others).append(a)
    if len(others) <= limit:
        return tuple(_tenant_snapshot(a, capacity) for a in accounts)
    # O(n log limit); the same order as metrics._tenant_rank, ties by name.
    kept = sorted(configured, key=_rank) + heapq.nsmallest(limit - 1, others, key=_rank)
    # The rest's figures: the totals (summed in C) less what the kept ones have.
    held = sum(map(_HELD, accounts)) - sum(map(_HELD, kept))
    charged = sum(map(_CHARGED, accounts)) - sum(map(_CHARGED, kept))
    running = sum(map(_RUNNING, accounts)) - sum(map(_RUNNING, kept))
    waiting = sum(map(_WAITING, accounts)) - sum(map(_WAITING, kept))
    rest = TenantSnapshot(
        tenant=OTHER_TENANTS, blocks_held=held, blocks_reserved=charged - held, quota_blocks=None,
        weight=1.0, running=running, waiting=waiting,
    )
    return (*(_tenant_snapshot(a, capacity) for a in kept), rest)


def _tenant_snapshot(a: TenantAccount, capacity: int) -> TenantSnapshot:
    return TenantSnapshot(
        tenant=a.name,
        blocks_held=a.held,
        blocks_reserved=a.charged - a.held,
        quota_blocks=a.quota_blocks(capacity),
        weight=a.weight,
        running=a.running,
        waiting=a.waiting,
    )
