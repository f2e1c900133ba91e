"""What the admission controller says about itself: its snapshot, and its integrity check.

The snapshot reads counters kept as decisions happen (the controller's, the ledger's, the
queue's), so it never walks the pool; only the waiting requests' reasons are counted when
it is taken. The integrity check recounts everything from scratch (O(pool): tests only).
"""

from __future__ import annotations

from collections import Counter
from operator import attrgetter

from kvbudget.daemon.core.ledger import BlockLedger
from kvbudget.daemon.core.records import DecisionKind, Reason, Snapshot
from kvbudget.daemon.core.requests import RequestState, Status
from kvbudget.daemon.core.waiting_queue import WaitingQueue

_wait_reason = attrgetter("wait_reason")  # (a C call per waiting request: snapshots)
WAITING = Status.WAITING


def snapshot(
    now: float,
    policy: str,
    ledger: BlockLedger,
    queue: WaitingQueue,
    num_running: int,
    *,
    preemptions: dict[Reason, int],
    rejections: dict[Reason, int],
    decisions_by_kind: dict[DecisionKind, int],
    prefix_hit_blocks: int,
    prefix_query_blocks: int,
) -> Snapshot:
    """The controller's state now; the counters are keyed by enum member, reported by value."""
    pool = ledger.pool
    capacity = pool.capacity
    # The queue may hold tens of thousands: counted in C (a reason changes at each try,
    # so it is not kept as they come and go, as the counts per engine are).
    by_reason = Counter(map(_wait_reason, queue.all()))
    return Snapshot(
        time_s=now,
        policy=policy,
        num_blocks=capacity,
        num_free_blocks=pool.num_free_blocks,
        num_held_blocks=pool.num_held_blocks,
        num_reserved_blocks=ledger.owed + ledger.window_share_reserve,
        num_evictable_blocks=pool.num_evictable_blocks,
        num_running=num_running,
        num_waiting=len(queue),
        num_preemptions=sum(preemptions.values()),
        preemptions_by_reason={k.value: n for k, n in preemptions.items()},
        rejections_by_reason={k.value: n for k, n in rejections.items()},
        decisions_by_kind={k.value: n for k, n in decisions_by_kind.items()},
        groups=ledger.group_snapshots(),
        tenants=ledger.tenant_snapshots(),  # bounded: records.MAX_SNAPSHOT_TENANTS
        num_tenants=len(ledger.tenants),
        prefix_hit_blocks=prefix_hit_blocks,
        prefix_query_blocks=prefix_query_blocks,
        waiting_by_reason={reason.value: n for reason, n in by_reason.items()},
        waiting_by_engine=dict(queue.num_by_engine),
    )


def check_integrity(
    ledger: BlockLedger,
    requests: dict[str, RequestState],
    running: dict[str, RequestState],
    queue: WaitingQueue,
) -> None:
    """Pool, tables, budget formulas, counters and queue all agree (O(pool): tests only)."""
    ledger.check_integrity(running)
    waiting = list(queue.all())
    assert len(waiting) == len(queue), "queue length counter"
    assert len(waiting) + len(running) == len(requests), "a request is lost"
    for r in waiting:
        assert r.status is WAITING and r.queued and not r.tables, f"{r.request_id} waiting"
        assert requests.get(r.request_id) is r, f"{r.request_id} queued but unknown"
    for r in running.values():
        assert not r.queued and requests.get(r.request_id) is r, f"{r.request_id} running"
    for name, account in ledger.tenants.items():
        assert account.waiting == sum(1 for r in waiting if r.tenant == name), f"tenant {name!r} waiting"
    queue.check_order(ledger.tenants)
    if not running and queue:
        raise AssertionError("deadlock: nothing runs and the queue is not empty")
