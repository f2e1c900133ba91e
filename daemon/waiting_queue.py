"""The waiting queue: priorities, tenants with quotas and weights, and deadlines.

Order. Within a tenant, requests wait sorted by `(priority, class, arrival)`: lower
priority values first (vLLM's convention); class 0 is a preempted request coming back
(it goes to the front of its priority), class 1 a new one; then arrival order — so with
equal priorities and one tenant the queue is plain FCFS.

Fair share. Across tenants the queue is merged by `(priority, class, charged / weight,
arrival)`: among equally important requests the tenant using least of the pool per unit
of weight goes first (weighted fair sharing of what quotas leave). With `fair_share`
off, tenants are merged by arrival alone.

Which candidates the controller may try (bounded backfill, aging) is the controller's
business; this module only keeps the order and the tenants' accounts.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Iterator
from dataclasses import dataclass

from kvbudget.daemon.requests import RequestState


@dataclass(slots=True)
class TenantAccount:
    name: str
    max_share: float | None = None  # quota: share of the pool (reserved + held)
    weight: float = 1.0
    charged: int = 0  # Σ over its running requests of max(held, base) per group
    held: int = 0
    running: int = 0
    waiting: int = 0

    def quota_blocks(self, capacity: int) -> int | None:
        return None if self.max_share is None else int(self.max_share * capacity)

    def usage(self) -> float:
        return self.charged / self.weight


def _key(request: RequestState) -> tuple[int, int, int]:
    return request.queue_key


def _keyed(waiting: list[RequestState], usage: float) -> Iterator[tuple[tuple, RequestState]]:
    for r in waiting:
        priority, klass, order = r.queue_key
        yield (priority, klass, usage, order), r


class WaitingQueue:
    def __init__(self, fair_share: bool = True) -> None:
        self.fair_share = fair_share
        self._by_tenant: dict[str, list[RequestState]] = {}
        self._deadlines: list[tuple[float, int, RequestState]] = []
        # Public so the controller's hot path reads an attribute, not a Python __len__ call.
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def __contains__(self, request: RequestState) -> bool:
        waiting = self._by_tenant.get(request.tenant)
        if not waiting:
            return False
        i = bisect_left(waiting, request.queue_key, key=_key)
        return i < len(waiting) and waiting[i] is request

    def push(self, request: RequestState, preempted: bool) -> None:
        request.queue_key = (request.spec.priority, 0 if preempted else 1, request.order)
        waiting = self._by_tenant.get(request.tenant)
        if waiting is None:
            waiting = self._by_tenant[request.tenant] = []
        insort(waiting, request, key=_key)
        self.size += 1
        deadline = request.spec.deadline_s
        if deadline is not None and not preempted:
            heapq.heappush(self._deadlines, (deadline, request.order, request))

    def remove(self, request: RequestState) -> None:
        waiting = self._by_tenant[request.tenant]
        i = bisect_left(waiting, request.queue_key, key=_key)
        if i >= len(waiting) or waiting[i] is not request:
            raise KeyError(request.request_id)
        del waiting[i]
        if not waiting:
            del self._by_tenant[request.tenant]
        self.size -= 1

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

    def in_order(self, tenants: dict[str, TenantAccount]) -> Iterator[RequestState]:
        """Waiting requests, best first (see the module docstring)."""
        lists = self._by_tenant
        if len(lists) == 1:
            return iter(next(iter(lists.values())))
        if not self.fair_share:
            return heapq.merge(*lists.values(), key=_key)
        streams = [_keyed(waiting, tenants[tenant].usage()) for tenant, waiting in lists.items()]
        return (r for _, r in heapq.merge(*streams, key=lambda pair: pair[0]))

    def all(self) -> Iterator[RequestState]:
        for waiting in self._by_tenant.values():
            yield from waiting
