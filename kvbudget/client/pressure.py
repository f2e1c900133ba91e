"""When the KV pool counts as full: the one bar `kvbudget doctor` and the dashboard share,
so that an operator who runs both gets one answer to "is the pool full, or the budget?".
Imports nothing of the project: the dashboard and the doctor may both import it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# The pool counts as full at this share of its usable blocks *held*, the held share being
# the mean over the moments requests were held back ("under pressure": some waited, or the
# preemption count rose), not one instant: under a steady saturated load usage swings around
# the bar from one sample to the next. Pool-bound at or above it, with pressure, and below
# it when the daemon says the queue waits for room in the pool (`waits_for_pool`).
# 0.90 is also where the dashboard's usage gauges turn red.
#
# Where the two still differ, on purpose:
# - the window: the dashboard judges the queue over its last 10 s and preemptions over
#   its last 30 s; the doctor judges over the samples it takes (5, 1 s apart, by default:
#   inside both). Both take a daemon with nothing running and nothing waiting now for
#   idle (the doctor: healthy), whatever pressure came before.
# - below the bar, with the queue not waiting for the pool: the dashboard calls any such
#   pressure budget-bound. The doctor says
#   budget-bound when held + reserved (committed, the same mean) reaches the bar, that is
#   free blocks are promised away, or a tenant's quota holds the queue; a queue that still
#   moves with neither is healthy; one that does not move is "stuck queue" on a pool
#   mostly free, else pool-bound (too full for the request at its head). The dashboard
#   has no stuck-queue or quota verdict.
POOL_FULL_SHARE = 0.90

# Why the waiting requests wait, as the daemon says (Snapshot.waiting_by_reason, each
# request's last try): for blocks the pool does not have (pool_full: fewer free blocks than
# it needs; watermark: it would take the pool below the optimistic watermark), or for
# blocks that are free but promised to running requests, or a tenant's share (budget_full,
# tenant_quota). The daemon's own word outranks the usage figure: under optimistic
# admission a full pool preempts and its usage dips right after, so a pool that kept
# running out read 84-89 % held on the mean, under the bar, while every waiting request
# waited for free blocks. (queue_ahead: not tried yet, behind the others: says nothing.)
POOL_WAIT_REASONS = ("pool_full", "watermark")
BUDGET_WAIT_REASONS = ("budget_full", "tenant_quota")


def waits_for_pool(waiting_by_reason: Iterable[Mapping[str, int]]) -> bool:
    """Whether, over these moments, more waiting requests waited for room in the pool than
    for the budget. False when the daemon gave no reasons (an older one)."""
    pool = budget = 0
    for reasons in waiting_by_reason:
        pool += sum(reasons.get(reason, 0) for reason in POOL_WAIT_REASONS)
        budget += sum(reasons.get(reason, 0) for reason in BUDGET_WAIT_REASONS)
    return pool > budget
