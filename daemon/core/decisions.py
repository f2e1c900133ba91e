"""The controller's decisions: numbered, counted, and built from the request's state.

Each decision takes the next `seq`, is counted by kind (rejections and preemptions also by
reason: the snapshot's figures) and carries the pool, queue and running counts at the
moment it is made. The fast constructor (records.new_decision) is called here only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvbudget.daemon.core.pool import BlockPool
from kvbudget.daemon.core.records import Decision, DecisionKind, Reason, new_decision
from kvbudget.daemon.core.requests import RequestState, Status
from kvbudget.daemon.core.waiting_queue import WaitingQueue

if TYPE_CHECKING:
    from kvbudget.daemon.core.fit import Plan

# Hot enum members as module constants: `Status.RUNNING` is a ~70 ns metaclass lookup on
# Python 3.11 and a submit + finish makes a dozen of them.
RUNNING = Status.RUNNING
ADMIT, PREEMPT, REJECT = DecisionKind.ADMIT, DecisionKind.PREEMPT, DecisionKind.REJECT
FITS, PREFIX_HIT = Reason.FITS, Reason.PREFIX_HIT


class DecisionRecorder:
    """Makes every decision of one controller; `pool`, `queue` and `running` are the
    controller's own (read, never changed, here)."""

    def __init__(self, pool: BlockPool, queue: WaitingQueue, running: dict[str, RequestState], policy: str) -> None:
        self.seq = 0  # the last decision's
        self.policy = policy  # the policy in force: named by decisions of requests never admitted
        # Counters keyed by enum member (a member's .value is a slow descriptor lookup).
        self.by_kind: dict[DecisionKind, int] = {}
        self.rejections: dict[Reason, int] = {}
        self.preemptions: dict[Reason, int] = {}
        self.prefix_hit_blocks = 0  # over admissions that looked the prefix up
        self.prefix_query_blocks = 0
        self._pool = pool
        self._queue = queue
        self._running = running

    def about(
        self, kind: DecisionKind, reason: Reason, r: RequestState, now: float, *,
        new_ids: tuple[tuple[int, ...], ...] = (), freed: int = 0, detail: str = "",
    ) -> Decision:
        """`kind` for `r` as it stands: a running request's blocks held and reserved."""
        self.seq += 1
        counts = self.by_kind
        counts[kind] = counts.get(kind, 0) + 1
        spec = r.spec
        if r.status is RUNNING:
            held = r.held
            reserved = tuple(map(max, held, r.base))
            held = tuple(held)
        else:
            reserved = held = ()
        return new_decision(
            self.seq, now, kind, reason, spec.request_id, spec.engine_id, spec.tenant, r.policy or self.policy,
            spec.prompt_tokens, r.max_len - spec.prompt_tokens, r.num_tokens, r.num_computed, reserved, held,
            new_ids, freed, r.hit_blocks if kind is ADMIT else 0, self._pool.num_free_blocks, self._queue.size,
            len(self._running), detail,
        )

    def admitted(self, r: RequestState, plan: Plan, now: float) -> Decision:
        """ADMIT of `r` by `plan` (its reserved and held tuples are the decision's), with the
        request's whole block table per group."""
        hit = plan.hit
        if hit.queried:  # snapshot-only counters: only a prefix lookup moves them
            self.prefix_hit_blocks += hit.num_blocks
            self.prefix_query_blocks += hit.queried
        tables = r.tables
        # One group (most models): half the cost of mapping tuple over a one-item list.
        new_ids = (tuple(tables[0]),) if len(tables) == 1 else tuple(map(tuple, tables))
        self.seq += 1
        counts = self.by_kind
        counts[ADMIT] = counts.get(ADMIT, 0) + 1
        spec = r.spec
        return new_decision(
            self.seq, now, ADMIT, PREFIX_HIT if hit.num_blocks else FITS, spec.request_id, spec.engine_id,
            spec.tenant, r.policy, spec.prompt_tokens, r.max_len - spec.prompt_tokens, r.num_tokens,
            r.num_computed, plan.reserved, plan.held_tuple, new_ids, 0, r.hit_blocks,
            self._pool.num_free_blocks, self._queue.size, len(self._running), "",
        )

    def ended(self, r: RequestState, kind: DecisionKind, reason: Reason, freed: int, now: float) -> Decision:
        """RELEASE or EXPIRE of `r`, gone already: it reserves and holds nothing."""
        self.seq += 1
        counts = self.by_kind
        counts[kind] = counts.get(kind, 0) + 1
        spec = r.spec
        return new_decision(
            self.seq, now, kind, reason, spec.request_id, spec.engine_id, spec.tenant, r.policy or self.policy,
            spec.prompt_tokens, r.max_len - spec.prompt_tokens, r.num_tokens, r.num_computed, (), (), (), freed, 0,
            self._pool.num_free_blocks, self._queue.size, len(self._running), "",
        )

    def rejected(self, r: RequestState, reason: Reason, now: float, detail: str) -> Decision:
        self.rejections[reason] = self.rejections.get(reason, 0) + 1
        return self.about(REJECT, reason, r, now, detail=detail)

    def preempted(self, v: RequestState, reason: Reason, now: float, freed: int, detail: str) -> Decision:
        self.preemptions[reason] = self.preemptions.get(reason, 0) + 1
        return self.about(PREEMPT, reason, v, now, freed=freed, detail=detail)

    def switched(self, previous: str, policy: str, now: float) -> Decision:
        """POLICY: the policy in force is `policy` from now on."""
        self.policy = policy
        self.seq += 1
        self.by_kind[DecisionKind.POLICY] = self.by_kind.get(DecisionKind.POLICY, 0) + 1
        return Decision(
            seq=self.seq, time_s=now, kind=DecisionKind.POLICY, reason=Reason.SWITCH, request_id="", policy=policy,
            detail=f"{previous} -> {policy}", num_free_blocks=self._pool.num_free_blocks,
            num_waiting=self._queue.size, num_running=len(self._running),
        )

    def changed(self, reason: Reason, tenant: str, detail: str, now: float) -> Decision:
        """ADMIN: an operator's change (`detail` says who, before -> after), numbered with the rest."""
        self.seq += 1
        self.by_kind[DecisionKind.ADMIN] = self.by_kind.get(DecisionKind.ADMIN, 0) + 1
        return Decision(
            seq=self.seq, time_s=now, kind=DecisionKind.ADMIN, reason=reason, request_id="", tenant=tenant,
            policy=self.policy, detail=detail, num_free_blocks=self._pool.num_free_blocks,
            num_waiting=self._queue.size, num_running=len(self._running),
        )
