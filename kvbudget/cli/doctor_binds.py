"""`kvbudget doctor`'s verdict line: which limit binds, with the figures that show it.

A verdict alone ("pool-bound") left the operator to square it with the lines above it
("51% of the pool held"); each clause here names the one limit that holds the queue back
(the pool's free blocks, blocks promised to running requests, a tenant's quota, the
optimistic watermark) and the counts of the last sample that show it, so that the knob
under it reads as its consequence. Pure text from plain figures: `doctor.diagnose` picks
the limit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvbudget.cli.doctor_samples import PoolSample, TenantSample

# What `Diagnosis.binds` may say (and `--json`'s "binds"): the limit that holds the queue.
BINDS = ("pool", "promises", "quota", "watermark", "gpu memory", "decision log", "nothing")

# How the verdict line names each.
BINDS_WORDS = {
    "pool": "the pool binds",
    "promises": "promises bind",
    "quota": "a tenant quota binds",
    "watermark": "the watermark binds",
    "gpu memory": "GPU memory outside the pool binds",
    "decision log": "the decision log binds",
    "nothing": "nothing binds",
}


def binds_clause(limit: str, because: str) -> str:
    """"the pool binds: 251 requests waiting (...); ..." (the verdict line after the verdict)."""
    return f"{BINDS_WORDS.get(limit, limit)}: {because}" if because else BINDS_WORDS.get(limit, limit)


# Why a waiting request waits, in the words of the verdict line (the daemon's reasons,
# Snapshot.waiting_by_reason).
WAIT_WORDS = {
    "pool_full": "for free blocks",
    "budget_full": "for blocks promised to running requests",
    "watermark": "for the watermark",
    "tenant_quota": "for a tenant quota",
    "queue_ahead": "behind them",
}


def waiting_text(sample: PoolSample) -> str:
    """"251 requests waiting (230 for free blocks, 21 behind them)"; the reasons in the
    daemon's order of weight, most first."""
    text = f"{sample.waiting} request{'' if sample.waiting == 1 else 's'} waiting"
    reasons = sorted(sample.waiting_by_reason.items(), key=lambda item: (-item[1], item[0]))
    parts = [f"{count} {WAIT_WORDS.get(reason, reason)}" for reason, count in reasons if count]
    return f"{text} ({', '.join(parts)})" if parts and sample.waiting else text


def pool_because(last: PoolSample, held_share: float, committed_share: float, full_share: float) -> str:
    """The pool binds: requests need more free blocks than there are."""
    text = f"{_of_pool(last.held, last)} held now, {_share(held_share)} on the mean; {last.free} free"
    if held_share < full_share and committed_share >= full_share:
        # Free blocks ran out while promises, not holdings, filled the pool: both shares.
        text += (f"; {last.reserved} of them promised ({_share(committed_share - held_share)} promised on "
                 f"the mean, {_share(committed_share)} held or promised)")
    return text


def promises_because(last: PoolSample, held_share: float, committed_share: float) -> str:
    """Promises bind: blocks are free, but owed to running requests."""
    committed = last.held + last.reserved
    return (f"{last.held} held + {last.reserved} promised to running requests = {_of_pool(committed, last)} "
            f"({_share(committed_share)} on the mean, {_share(held_share)} held); "
            f"{last.free} free, {min(last.reserved, last.free)} of them promised")


def quota_because(last: PoolSample, tenants: Sequence[str]) -> str:
    """A quota binds: the named tenants' requests wait for their share of the pool."""
    by_name: Mapping[str, TenantSample] = {t.tenant: t for t in last.tenants}
    parts = []
    for name in tenants:
        t = by_name[name]
        parts.append(f"{name} has {t.held + t.reserved} of its {t.quota_blocks}-block quota "
                     f"({t.held} held, {t.reserved} promised), {t.waiting} waiting")
    return "; ".join(parts) + f"; {last.free} of the pool's {last.num_blocks} blocks free"


def watermark_because(last: PoolSample) -> str:
    """The watermark binds: admitting would leave fewer free blocks than the optimistic
    policy keeps back ([admission] watermark, a share of the pool)."""
    spare = max(0, last.free - last.reserved)
    return (f"{spare} free blocks not promised, and admitting the next request would take them below the "
            f"share the watermark keeps free; {_of_pool(last.held, last)} held")


def stuck_because(last: PoolSample, held_share: float, committed_share: float) -> str:
    """Promises bind a queue that does not move on a pool mostly free: admission charges
    far more than requests hold."""
    return (f"nothing admitted through the window with {_share(1 - held_share)} of the pool free: "
            f"{last.reserved} blocks promised for {last.held} held ({_share(committed_share)} held or promised)")


def _of_pool(blocks: int, sample: PoolSample) -> str:
    return f"{blocks} of {sample.num_blocks} blocks"


def _share(share: float) -> str:
    return f"{share:.0%}"
