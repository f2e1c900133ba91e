"""The waiting queue: priorities, tenants with quotas and weights, and deadlines.

Within a tenant: `(priority, class, arrival)`, a preempted request (class 0) before new
ones. Across tenants, with fair share: `(priority, class, charged / weight, arrival)`,
else arrival alone. Which candidates are tried is backfill.py's (docs/architecture/core.md).
"""

from __future__ import annotations

import heapq
from collections import Counter
from bisect import bisect_left, insort
from itertools import chain
from collections.abc import Iterator, Set as AbstractSet
from dataclasses import dataclass, field

from kvbudget.daemon.core.requests import RequestState


@dataclass(slots=True)
class TenantAccount:
    """What a tenant's running requests use, each block counted once for the tenant however
    many of its requests share it ("prefix-cache hits counted once"); a block requests of
    two tenants share counts once for each of them. `held` is the number of distinct blocks
    its requests hold; `charged` (what the quota and fair share read) is that plus what they
    are owed plus one block per extra reference of its own on a window-group block (their
    share reserve: ledger.py), i.e. Σ over its requests of max(held, base) per group less
    its extra references on full-attention blocks. Only prefix blocks (hits, or published
    by the request) can be in two tables, so only those are tracked, in `prefix_blocks` and
    `extra_refs` (see ledger.py)."""

    name: str
    max_share: float | None = None  # quota: share of the pool (reserved + held)
    weight: float = 1.0
    charged: int = 0  # distinct blocks held + owed + window share reserve (see above)
    held: int = 0  # distinct blocks held
    running: int = 0
    waiting: int = 0
    # The blocks in the prefix slots (below `cached_upto`) of its running requests' tables,
    # and, for those in more than one such table, how many references beyond the first.
    prefix_blocks: set[int] = field(default_factory=set)
    extra_refs: dict[int, int] = field(default_factory=dict)

    def quota_blocks(self, capacity: int) -> int | None:
        return None if self.max_share is None else int(self.max_share * capacity)

    def usage(self) -> float:
        return self.charged / self.weight


def _key(request: RequestState) -> tuple[int, int, int]:
    return request.queue_key


class WaitingQueue:
    """Each tenant's requests in a sorted list; the tenants' first requests in one sorted
    list of heads, so the best waiting requests are found without looking at every tenant.

    A tenant's place depends on its usage (`charged / weight`), which changes as its
    running requests grow and end: the ledger names such tenants in `usage_changed` (only
    those with requests waiting), and their heads are placed again before the next look.
    Merging every tenant's list on each look (as this did) cost O(tenants) per submit:
    3,000 one-request tenants in one step took 20 s, long enough for other engines'
    leases to lapse."""

    def __init__(self, fair_share: bool = True, usage_changed: set[str] | None = None) -> None:
        self.fair_share = fair_share
        self._by_tenant: dict[str, list[RequestState]] = {}
        self._deadlines: list[tuple[float, int, RequestState]] = []
        # Heads: ((priority, class, usage, order) of the tenant's first request, tenant),
        # sorted; `_head` maps a tenant to its entry, `_usage` to the usage in it.
        self._heads: list[tuple[tuple, str]] = []
        self._head: dict[str, tuple[tuple, str]] = {}
        self._usage: dict[str, float] = {}
        self.usage_changed = set() if usage_changed is None else usage_changed
        # Public so the controller's hot path reads an attribute, not a Python __len__ call.
        self.size = 0
        # Waiting requests per engine, kept as they come and go: a snapshot reads it rather
        # than count a queue of tens of thousands (4 ms for 20,000 here).
        self.num_by_engine: dict[str, int] = {}
        # Bumped whenever in_order's order may change (a request in or out, a tenant's
        # usage moving it among others): backfill's idle-pass memo is keyed on it.
        self.version = 0

    def __len__(self) -> int:
        return self.size

    def __contains__(self, request: RequestState) -> bool:
        waiting = self._by_tenant.get(request.tenant)
        if not waiting:
            return False
        i = bisect_left(waiting, request.queue_key, key=_key)
        return i < len(waiting) and waiting[i] is request

    def push(self, request: RequestState, preempted: bool, usage: float = 0.0) -> None:
        """`usage`: the tenant's charged / weight now (its place among tenants)."""
        request.queue_key = (request.spec.priority, 0 if preempted else 1, request.order)
        self.version += 1
        tenant = request.tenant
        waiting = self._by_tenant.get(tenant)
        if waiting is None:
            waiting = self._by_tenant[tenant] = []
        insort(waiting, request, key=_key)
        self.size += 1
        engine_id = request.spec.engine_id
        self.num_by_engine[engine_id] = self.num_by_engine.get(engine_id, 0) + 1
        if waiting[0] is request or tenant not in self._usage:
            self._place(tenant, usage)
        deadline = request.spec.deadline_s
        if deadline is not None and not preempted:
            heapq.heappush(self._deadlines, (deadline, request.order, request))

    def enter(self, request: RequestState, account: TenantAccount, preempted: bool, now: float) -> None:
        """`request` starts waiting, counted in its tenant's `account`."""
        self.push(request, preempted, account.usage())
        request.failed_epoch = -1
        request.queued = True
        request.queued_at = now
        account.waiting += 1

    def leave(self, request: RequestState, account: TenantAccount) -> None:
        """`request` stops waiting (admitted, rejected or gone)."""
        self.remove(request)
        request.queued = False
        account.waiting -= 1

    def remove(self, request: RequestState) -> None:
        tenant = request.tenant
        waiting = self._by_tenant[tenant]
        i = bisect_left(waiting, request.queue_key, key=_key)
        if i >= len(waiting) or waiting[i] is not request:
            raise KeyError(request.request_id)
        self.version += 1
        del waiting[i]
        if not waiting:
            del self._by_tenant[tenant]
        self.size -= 1
        engine_id = request.spec.engine_id
        left = self.num_by_engine[engine_id] - 1
        if left:
            self.num_by_engine[engine_id] = left
        else:
            del self.num_by_engine[engine_id]
        if i == 0:
            self._place(tenant, self._usage[tenant])

    def _place(self, tenant: str, usage: float) -> None:
        """(Re)place the tenant's head: after its first request changed, or its usage."""
        heads = self._heads
        old = self._head.pop(tenant, None)
        if old is not None:
            del heads[bisect_left(heads, old)]
        waiting = self._by_tenant.get(tenant)
        if not waiting:
            self._usage.pop(tenant, None)
            return
        if not self.fair_share:
            usage = 0.0  # merged by (priority, class, arrival) alone
        self._usage[tenant] = usage
        priority, klass, order = waiting[0].queue_key
        entry = ((priority, klass, usage, order), tenant)
        insort(heads, entry)
        self._head[tenant] = entry

    def expired(self, now: float) -> list[RequestState]:
        """Waiting requests whose deadline passed (stale heap entries are dropped)."""
        out: list[RequestState] = []
        heap = self._deadlines
        while heap and heap[0][0] < now:
            _, _, request = heapq.heappop(heap)
            # Only a request that was never admitted can miss its admission deadline.
            if request.queue_key[1] == 1 and request in self:
                out.append(request)
        return out

    def in_order(
        self, tenants: dict[str, TenantAccount], skip: AbstractSet[str] | None = None
    ) -> Iterator[RequestState]:
        """Waiting requests, best first (see the module docstring). Lazy: taking the first
        k costs O(k log k) once the heads are in place, whatever the number of tenants.
        A tenant put in `skip` while this runs is left out from then on (its remaining
        requests are not walked: a tenant with thousands waiting for its quota costs a
        pass nothing more)."""
        changed = self.usage_changed
        if changed:
            usage = self._usage
            for tenant in changed:
                if tenant in usage:
                    self._place(tenant, tenants[tenant].usage())
            changed.clear()
            if len(usage) > 1:
                self.version += 1
        lists = self._by_tenant
        if len(lists) == 1:
            waiting = next(iter(lists.values()))
            return iter(waiting) if skip is None else self._one_tenant(waiting, skip)
        return self._merged(skip)

    @property
    def num_tenants(self) -> int:
        """Tenants with requests waiting."""
        return len(self._by_tenant)

    def order_version(self) -> int | None:
        """`version`, or None while a tenant's usage moved and its place among others was
        not worked out yet (in_order does it): the order is then not known to be the same."""
        if self.usage_changed and len(self._usage) > 1:
            return None
        return self.version

    @staticmethod
    def _one_tenant(waiting: list[RequestState], skip: AbstractSet[str]) -> Iterator[RequestState]:
        for r in waiting:
            if r.spec.tenant in skip:
                return  # (every request here is of that tenant)
            yield r

    def _merged(self, skip: AbstractSet[str] | None = None) -> Iterator[RequestState]:
        """The tenants' lists merged by (priority, class, usage, arrival): a heap of the
        tenants already reached, fed from the sorted heads only when the next head is
        better than anything in it."""
        heads, lists, usage_of = self._heads, self._by_tenant, self._usage
        heap: list[tuple[tuple, str, int]] = []
        next_head = 0
        while True:
            if next_head < len(heads) and (not heap or heads[next_head][0] < heap[0][0]):
                key, tenant = heads[next_head]
                next_head += 1
                heapq.heappush(heap, (key, tenant, 0))
                continue
            if not heap:
                return
            _, tenant, i = heapq.heappop(heap)
            if skip is not None and tenant in skip:
                continue  # dropped from the merge, its next request never pushed
            waiting = lists[tenant]
            yield waiting[i]
            if i + 1 < len(waiting):
                priority, klass, order = waiting[i + 1].queue_key
                heapq.heappush(heap, ((priority, klass, usage_of[tenant], order), tenant, i + 1))

    def check_order(self, tenants: dict[str, TenantAccount]) -> None:
        """The order is the module docstring's, by the usages of now (tests only: it walks
        every waiting request)."""
        lists = self._by_tenant
        for waiting in lists.values():
            assert all(_key(a) < _key(b) for a, b in zip(waiting, waiting[1:])), "a tenant's list is out of order"
        expected = sorted(
            self.all(),
            key=lambda r: (*r.queue_key[:2], tenants[r.tenant].usage() if self.fair_share else 0.0, r.queue_key[2]),
        )
        assert list(self.in_order(tenants)) == expected, "queue order (a tenant's usage moved unseen?)"
        assert sorted(self._head) == sorted(lists) == sorted(self._usage), "heads and lists"
        assert self._heads == sorted(self._head.values()), "heads out of order"
        by_engine = Counter(r.spec.engine_id for r in self.all())
        assert self.num_by_engine == by_engine, f"waiting per engine {self.num_by_engine} != {dict(by_engine)}"

    def all(self) -> Iterator[RequestState]:
        return chain.from_iterable(self._by_tenant.values())  # (C: snapshots count over it)
