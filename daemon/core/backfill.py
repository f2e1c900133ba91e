"""The queue pass: which waiting requests the controller tries, in what order, and when it stops.

Bounded backfill: behind a head that does not fit, up to `backfill_depth` requests may be
admitted past it until it has waited `max_head_wait_s`; then nothing passes it (the
bound this gives: docs/architecture/core.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from kvbudget.daemon.core.ledger import BlockLedger
from kvbudget.daemon.core.records import Decision, Reason
from kvbudget.daemon.core.requests import RequestState
from kvbudget.daemon.core.waiting_queue import TenantAccount, WaitingQueue

TENANT_QUOTA = Reason.TENANT_QUOTA  # (an enum member lookup is slow on 3.11)


def candidates(
    queue: WaitingQueue,
    tenants: dict[str, TenantAccount],
    now: float,
    quota_held: set[str],
    backfill_depth: int,
    max_head_wait_s: float,
) -> Iterator[RequestState]:
    """The head, then (unless it has waited past max_head_wait_s) up to backfill_depth more.

    A request its tenant's quota holds back (refused `tenant_quota` when last tried)
    neither counts in the depth nor stops the pass by its age, and its tenant's later
    requests are passed over in this pass (its tenant is added to `quota_held`, which
    the queue leaves out as it goes): a tenant waits for its quota in its own order, and
    backfill and aging are about the pool's blocks, which passing it takes nothing
    from. Else a tenant at its quota held every other tenant back, behind
    backfill_depth of its requests or behind one that had waited max_head_wait_s,
    while most of the pool was free. (The consumer tries each candidate before asking
    for the next, so the reason read after a yield is that try's; a candidate not
    tried keeps its last one.)"""
    head: RequestState | None = None
    tried = 0
    for r in queue.in_order(tenants, skip=quota_held):
        if head is not None and tried >= backfill_depth:
            return
        yield r
        if r.wait_reason is TENANT_QUOTA:
            quota_held.add(r.spec.tenant)
        elif head is None:
            head = r
            # Aging guards the head of the queue; behind a request held by its quota,
            # backfill goes on (as it did while that request was young).
            if not quota_held and now - r.queued_at > max_head_wait_s:
                return
        else:
            tried += 1


def admit_from_queue(
    queue: WaitingQueue,
    ledger: BlockLedger,
    now: float,
    epoch: int,
    backfill_depth: int,
    max_head_wait_s: float,
    try_admit: Callable[[RequestState, float], Decision | None],
) -> list[Decision]:
    """One admission pass: try the candidates in order, and start over after each ADMIT or
    REJECT (the order changed) until a whole pass changes nothing.

    `epoch` is the controller's (bumped when a policy or quota change may change any
    answer); `try_admit` sets a request's `failed_spare` and `failed_epoch` when it
    lacked blocks."""
    decisions: list[Decision] = []
    tenants = ledger.tenants
    changed = True
    while changed and queue:
        changed = False
        for r in candidates(queue, tenants, now, set(), backfill_depth, max_head_wait_s):
            if r.failed_epoch == epoch and ledger.spare <= r.failed_spare:
                # Lacked blocks last time and none came back since: same answer, and
                # a prefix lookup of a long prompt is not free. (A prefix published
                # meanwhile is seen on the next release; an idle pool is always
                # retried, its spare being the whole pool.)
                continue
            decision = try_admit(r, now)
            if decision is not None:  # admitted or rejected: the order changed, start over
                decisions.append(decision)
                changed = True
                break
    return decisions
