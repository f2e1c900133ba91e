"""Admission controller: the public face of the pure core (no I/O, no gRPC, no clocks).

Callers pass `now` (seconds, any monotonic origin) to every call, so the same object runs
under the daemon, the offline replayer and the tests, deterministically.

Every mutating call returns the decisions it caused, in the order they happened (`seq`
increases by one per decision across the controller). The caller's own decision comes
first for submit, finish, abort and progress; a grow that had to preempt victims returns
their PREEMPTs before its GROW (each decision's pool counts are the state after it).
"Does not fit" is a decision, never an exception; exceptions are for misuse (unknown or
duplicate ids, bad numbers) and name the field. An ADMIT carries the request's whole block
table per group in `new_block_ids` (cached prefix blocks first, 0 for slots already outside
a sliding window); a GROW carries the ids appended. Progress that frees nothing yields no
decision; a grow for a request that is waiting (preempted earlier in the same engine step)
yields DENY `not_running`.

The invariant everything rests on: `pool.num_free_blocks >= Σ reserved-not-held` over all
running requests, plus one block per extra reference on a shared sliding-window block
(see ledger.py). Admission, growth within a reservation, reclamation and release all keep
it, so a reservation is a promise the pool can always keep. Module map: fit.py decides
whether a request fits, ledger.py moves blocks and keeps the totals, waiting_queue.py
orders the queue, backfill.py picks which waiting requests to try (bounded backfill,
aging, tenants held by their quota), preemption.py picks the victims of a growth that
does not fit, policies.py and predictor.py say what to reserve, admission_report.py
reports (snapshot) and checks (check_integrity), admission_config.py holds the settings
and the misuse errors (all re-exported here).

Contract with the engine (vLLM's chunked prefill): a request's slots run at most F =
`max_num_batched_tokens` tokens ahead of its computed tokens. Admission allocates the
first chunk, `min(prompt, hits + F)` slots; the engine grows chunk by chunk. Growing to
more than F ahead is allowed but is not covered by a guaranteed reservation. Growing past
L (prompt + max new tokens, capped at max_model_len) is misuse: AdmissionError on
`num_tokens`.

Victims and preemption: preemption.py (optimistic and predictive requests only; the worst
first; a preempted request comes back at the length it had reached). Queue: bounded
backfill and aging, backfill.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from kvbudget.daemon.core import admission_report, policies
from kvbudget.daemon.core.admission_config import (  # re-exported: see __all__
    POLICIES, AdmissionConfig, AdmissionError, DuplicateRequest, UnknownRequest,
)
from kvbudget.daemon.core.backfill import admit_from_queue, candidates
from kvbudget.daemon.core.budget import blocks_held
from kvbudget.daemon.core.fit import FitTest, extra_for_growth
from kvbudget.daemon.core.ledger import BlockLedger
from kvbudget.daemon.core.pool import BlockPool
from kvbudget.daemon.core.predictor import OutputLengthPredictor
from kvbudget.daemon.core.preemption import preempt_for, resume_length
from kvbudget.daemon.core.records import (
    Decision,
    DecisionKind,
    Reason,
    RequestSpec,
    Snapshot,
    new_decision,
)
from kvbudget.daemon.core.requests import RequestState, Status
from kvbudget.daemon.core.spec import KVCacheLayout
from kvbudget.daemon.core.waiting_queue import WaitingQueue

# The settings and errors live in admission_config.py; importers take them from here.
__all__ = [
    "POLICIES", "AdmissionConfig", "AdmissionController", "AdmissionError", "DuplicateRequest", "UnknownRequest",
]

# Hot enum members as module constants: `Status.RUNNING` is a ~70 ns metaclass lookup on
# Python 3.11 and a submit + finish makes a dozen of them.
RUNNING = Status.RUNNING
ADMIT, RELEASE = DecisionKind.ADMIT, DecisionKind.RELEASE
FITS, PREFIX_HIT, FINISHED, TENANT_QUOTA = Reason.FITS, Reason.PREFIX_HIT, Reason.FINISHED, Reason.TENANT_QUOTA


class AdmissionController:
    """See the module docstring."""

    def __init__(
        self,
        layout: KVCacheLayout,
        num_blocks: int,
        config: AdmissionConfig,
        *,
        predictor: OutputLengthPredictor | None = None,
    ) -> None:
        config.validate()
        if num_blocks < 1:
            raise AdmissionError("num_blocks", f"must be at least 1, got {num_blocks}")
        self.layout = layout
        self.config = config
        self.ledger = BlockLedger(layout, num_blocks)
        self.pool: BlockPool = self.ledger.pool
        self.policy = policies.POLICIES[config.policy]
        self.predictor = predictor or OutputLengthPredictor(quantile=config.predictor_quantile)
        self._num_groups = len(layout.groups)
        self._max_model_len = config.max_model_len  # read on every submit
        self._fit = FitTest(
            layout,
            self.ledger,
            self.predictor,
            max_model_len=config.max_model_len,
            max_num_batched_tokens=config.max_num_batched_tokens,
            prefix_caching=config.enable_prefix_caching,
            lookahead_tokens=config.lookahead_tokens,
            watermark_blocks=int(config.watermark * self.pool.capacity),
            reject_over_quota=config.reject_over_quota,
        )
        self._requests: dict[str, RequestState] = {}  # never rebound: `find` is its get
        # `find` is the dict's own get, not a method around it: every op of every engine
        # step asks it, and a Python frame per call is a good part of the lookup.
        self.find: Callable[[str], RequestState | None] = self._requests.get
        self._running: dict[str, RequestState] = {}
        self._queue = WaitingQueue(fair_share=config.fair_share, usage_changed=self.ledger.usage_changed)
        self._seq = 0
        self._order = 0
        self._dirty = False  # blocks or promises came back since the last queue pass
        self._queue_held = False  # an engine step's frees and grows come first: hold_queue
        self.admitting = True  # False once drained: close_admissions
        self._epoch = 0  # bumped when a policy or quota change may change any answer
        # Counters keyed by enum member (a member's .value is a slow descriptor lookup).
        self._decisions_by_kind: dict[DecisionKind, int] = {}
        self._rejections: dict[Reason, int] = {}
        self._preemptions: dict[Reason, int] = {}
        self._prefix_hit_blocks = 0
        self._prefix_query_blocks = 0

    # ================================================================ public API
    def submit(self, request: RequestSpec, now: float) -> list[Decision]:
        """ADMIT (with block ids per group), QUEUE or REJECT, then anything it caused."""
        rid = request.request_id
        if not rid:
            raise AdmissionError("request_id", "must not be empty")
        if rid in self._requests:
            raise DuplicateRequest("request_id", f"{rid!r} is already known")
        if request.prompt_tokens < 1:
            raise AdmissionError("prompt_tokens", f"must be at least 1, got {request.prompt_tokens}")
        max_new = request.max_new_tokens
        if max_new is not None and max_new < 0:
            raise AdmissionError("max_new_tokens", f"must not be negative, got {max_new}")
        max_model_len = self._max_model_len
        max_len = request.prompt_tokens + (max_model_len if max_new is None else max_new)
        if max_len > max_model_len:
            max_len = max_model_len
        self._order += 1
        # positional (spec, max_len, order, num_groups): hot path
        r = RequestState(request, max_len, self._order, self._num_groups)
        if request.prompt_tokens > max_model_len:
            return [self._reject(r, Reason.PROMPT_TOO_LONG, now, f"max_model_len {max_model_len}")]
        fit = self._fit
        worst = fit._worst_total.get(max_len) or fit.worst_total(max_len)  # the memo, read in place
        if worst > fit.capacity:
            return [self._reject(r, Reason.NEVER_FITS, now, f"worst case {worst} > pool {fit.capacity}")]
        if not self.admitting:
            return [self._reject(r, Reason.DRAINING, now, "draining: no admissions")]
        self._requests[rid] = r
        tenant = request.tenant
        if tenant not in self.ledger.tenants:
            self.ledger.tenant(tenant)
        if not self._queue.size:
            decision = self._try_admit(r, now)
        else:
            self._enqueue(r, now, preempted=False)
            decision = None
            quota_held: set[str] = set()
            config = self.config
            for candidate in candidates(
                self._queue, self.ledger.tenants, now, quota_held, config.backfill_depth, config.max_head_wait_s
            ):
                if candidate is r:
                    decision = self._try_admit(r, now)
                    break
            else:
                if tenant in quota_held:  # passed over with its tenant's other requests
                    decision = self._wait_for_quota(r, now)
                else:
                    r.wait_reason = Reason.QUEUE_AHEAD
        if decision is None:
            limit = self.config.max_queue_len
            deadline = request.deadline_s
            if deadline is not None and deadline < now:
                decision = self._reject(r, Reason.DEADLINE, now, f"deadline {deadline} already passed")
            elif limit and len(self._queue) - r.queued >= limit:
                decision = self._reject(r, Reason.QUEUE_FULL, now, f"max_queue_len {limit}")
            else:
                if not r.queued:
                    self._enqueue(r, now, preempted=False)
                decision = self._decide(DecisionKind.QUEUE, r.wait_reason, r, now)
        if not self._queue.size:  # nothing waits: nothing to schedule
            return [decision]
        return [decision, *self.schedule(now, full_pass=False)]

    def grow(self, request_id: str, num_tokens: int, now: float) -> list[Decision]:
        """Extend a running request to `num_tokens` slots: GROW with new ids, or DENY, or
        (optimistic / predictive) PREEMPT victims first — possibly the request itself."""
        r = self._get(request_id)
        # Past the maximum length is the engine's error whatever the status: refused before
        # a waiting request's DENY, so a bad grow is not answered as a plain "not yet".
        if num_tokens > r.max_len:
            raise AdmissionError(
                "num_tokens", f"{num_tokens} is past the request's maximum length {r.max_len}"
            )
        if r.status is not RUNNING:
            return [self._decide(DecisionKind.DENY, Reason.NOT_RUNNING, r, now, detail="waiting")]
        if num_tokens < r.num_tokens:
            raise AdmissionError("num_tokens", f"{num_tokens} is below the {r.num_tokens} slots held")
        computed = r.num_computed
        if computed >= r.spec.prompt_tokens and computed >= r.resume_len:  # decoding
            self._fit.observe_decode_growth(num_tokens - computed)
        new_held = [blocks_held(s, num_tokens, computed) for s in self.ledger.specs]
        decisions: list[Decision] = []
        policy = policies.POLICIES[r.policy]
        if extra_for_growth(r, new_held) > self.ledger.spare and policy.preempts:
            decisions = preempt_for(r, num_tokens, new_held, self._running.values(), self.ledger, self._preempt, now)
            if decisions and r.policy == "predictive":
                self.predictor.on_preemption()
            if r.status is not RUNNING:
                return decisions + self.schedule(now)
        if extra_for_growth(r, new_held) > self.ledger.spare:
            reason = Reason.OVER_RESERVATION if r.owed or any(r.base) else Reason.POOL_FULL
            return [self._decide(DecisionKind.DENY, reason, r, now)]
        new_ids = self.ledger.grow(r, num_tokens, new_held)
        decisions.append(self._decide(DecisionKind.GROW, FITS, r, now, new_ids=new_ids))
        if len(decisions) > 1:
            decisions += self.schedule(now)
        return decisions

    def progress(self, request_id: str, num_computed: int, now: float) -> list[Decision]:
        """Tokens computed so far: full prompt blocks enter the prefix cache, blocks out of
        the window go back (RECLAIM), queued requests may be admitted.

        Progress that frees nothing yields no decision (decisions are about blocks)."""
        r = self._get(request_id)
        if r.status is not RUNNING:
            return []  # preempted earlier in this step: nothing of it is left to report
        if num_computed < r.num_computed:
            raise AdmissionError(
                "num_computed", f"{num_computed} is below the {r.num_computed} already computed"
            )
        if num_computed > r.num_tokens:
            raise AdmissionError("num_computed", f"{num_computed} is past the {r.num_tokens} slots held")
        freed = self.ledger.progress(r, num_computed, r.spec.prefix_hashes, self._fit.prefix_caching)
        if not freed:
            return self.schedule(now, full_pass=False)
        self._dirty = True
        decision = self._decide(DecisionKind.RECLAIM, Reason.WINDOW, r, now, freed=freed)
        return [decision, *self.schedule(now)]

    def finish(self, request_id: str, now: float) -> list[Decision]:
        """RELEASE the request's blocks (prefix blocks stay cached), then admit from queue."""
        r = self._requests.get(request_id) or self._get(request_id)  # _get raises; one call less
        if r.status is RUNNING:
            spec = r.spec
            output = r.num_tokens - spec.prompt_tokens
            self.predictor.observe(spec.tenant, output if output > 0 else 0)
        return self._end(r, RELEASE, FINISHED, now)

    def abort(self, request_id: str, now: float) -> list[Decision]:
        """Like finish for a running request; removes a queued one from the queue."""
        return self._end(self._get(request_id), RELEASE, Reason.ABORTED, now)

    def expire_engine(self, engine_id: str, now: float) -> list[Decision]:
        """The engine's lease lapsed: EXPIRE each of its requests, running or queued."""
        mine = [r for r in self._requests.values() if r.spec.engine_id == engine_id]
        decisions: list[Decision] = []
        for r in sorted(mine, key=lambda r: r.order, reverse=True):
            decisions += self._end(r, DecisionKind.EXPIRE, Reason.LEASE_EXPIRED, now, schedule=False)
        return decisions + self.schedule(now)

    def schedule(self, now: float, *, full_pass: bool = True) -> list[Decision]:
        """Reject waiting requests whose deadline passed; admit what fits from the queue.

        `full_pass=False` skips the admission pass unless something came back since the
        last one (nothing else can make a waiting request fit). Nothing while the queue is
        held (release_queue schedules); once admissions are closed, every waiting request
        is rejected instead (a request preempted while draining cannot come back)."""
        if not self._queue.size or self._queue_held:
            return []
        if not self.admitting:
            return [self._reject(r, Reason.DRAINING, now, "draining: no admissions") for r in self.waiting_requests()]
        decisions = [
            self._reject(r, Reason.DEADLINE, now, f"deadline {r.spec.deadline_s}")
            for r in self._queue.expired(now)
        ]
        if decisions or self._dirty or full_pass:
            self._dirty = False
            config = self.config
            decisions += admit_from_queue(
                self._queue, self.ledger, now, self._epoch, config.backfill_depth, config.max_head_wait_s,
                self._try_admit,
            )
        return decisions

    def number_from(self, seq: int) -> None:
        """Number the decisions on from `seq` (a restarted daemon: the log's last), so each
        seq stays unique in the log. Only before the first decision."""
        if self._seq:
            raise AdmissionError("seq", f"decisions are already numbered up to {self._seq}")
        if seq < 0:
            raise AdmissionError("seq", f"must not be negative, got {seq}")
        self._seq = seq

    def hold_queue(self, held: bool = True) -> None:
        """Admit nothing from the queue until `release_queue`: one engine step's finishes,
        aborts, progress and grows all land first, as vLLM schedules its running requests
        before its waiting ones. Else a finish's blocks went to the head of the queue and
        the same step's grows preempted it (the latest arrival) before it computed a
        token: on azure at 20x, one request was admitted and preempted 14 times so.
        (`held=False` lifts the hold without a pass: the next `schedule` makes it.)"""
        self._queue_held = held

    def release_queue(self, now: float) -> list[Decision]:
        """End `hold_queue`: what the held ops made room for is admitted now."""
        self._queue_held = False
        return self.schedule(now)

    def close_admissions(self, now: float) -> list[Decision]:
        """Drain: admit nothing more, ever. Every waiting request is REJECTed `draining`
        now (its engine can send it elsewhere rather than wait for good), and so is any
        later submit or preempted request; running requests keep their promises."""
        self.admitting = False
        return self.schedule(now)

    def set_policy(self, policy: str, now: float) -> list[Decision]:
        """Switch the policy for new admissions; running requests keep their promises.

        The POLICY decision comes first, then what the new policy does to the queue at
        once (a looser one may admit; naive may REJECT what its charge can never fit).
        The policy in force already: no decision at all (a no-op is not a switch)."""
        if policy not in policies.POLICIES:
            raise AdmissionError("policy", f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")
        previous = self.policy.name
        if policy == previous:
            return []
        self.policy = policies.POLICIES[policy]
        self._dirty = True
        self._epoch += 1
        self._seq += 1
        decision = Decision(
            seq=self._seq, time_s=now, kind=DecisionKind.POLICY, reason=Reason.SWITCH,
            request_id="", policy=policy, detail=f"{previous} -> {policy}",
            num_free_blocks=self.pool.num_free_blocks, num_waiting=len(self._queue),
            num_running=len(self._running),
        )
        self._count(DecisionKind.POLICY)
        return [decision, *self.schedule(now)]

    def set_tenant_quota(self, tenant: str, max_share: float | None, weight: float = 1.0) -> None:
        """A tenant's maximum share of the pool (None or 0: no quota) and fair-share weight."""
        if max_share is not None and not 0.0 <= max_share <= 1.0:
            raise AdmissionError("max_share", f"must be in [0, 1] (0: no quota), got {max_share}")
        capacity = self.pool.capacity
        if max_share and int(max_share * capacity) == 0:  # (a quota of 0 blocks refuses everything)
            raise AdmissionError("max_share", f"{max_share:g} of the {capacity} blocks is less than one block")
        if not weight > 0.0:
            raise AdmissionError("weight", f"must be positive, got {weight}")
        account = self.ledger.tenant(tenant)
        account.max_share = max_share or None
        account.weight = weight
        if account.waiting:  # a new weight is a new place in the queue
            self.ledger.usage_changed.add(tenant)
        self._dirty = True
        self._epoch += 1

    def retune(
        self, *, max_queue_len: int, backfill_depth: int, max_head_wait_s: float, watermark: float,
        lookahead_tokens: int, reject_over_quota: bool,
    ) -> None:
        """The queue's bounds and the fit test's margins, live (a config reload). Each is
        read when a request is tried (none is in a memo); what runs or waits stays, even
        past a lower max_queue_len. Raises AdmissionError, changing nothing."""
        config = dataclasses.replace(
            self.config, max_queue_len=max_queue_len, backfill_depth=backfill_depth, max_head_wait_s=max_head_wait_s,
            watermark=watermark, lookahead_tokens=lookahead_tokens, reject_over_quota=reject_over_quota,
        )
        config.validate()
        self.config = config
        self._fit.watermark_blocks = int(watermark * self.pool.capacity)
        self._fit.lookahead_tokens = lookahead_tokens
        self._fit.reject_over_quota = reject_over_quota
        self._dirty = True  # a deeper backfill, a longer head wait or a lower watermark may admit at once
        self._epoch += 1

    def snapshot(self, now: float) -> Snapshot:
        return admission_report.snapshot(
            now, self.policy.name, self.ledger, self._queue, len(self._running),
            preemptions=self._preemptions, rejections=self._rejections, decisions_by_kind=self._decisions_by_kind,
            prefix_hit_blocks=self._prefix_hit_blocks, prefix_query_blocks=self._prefix_query_blocks,
        )

    def check_integrity(self) -> None:
        """Pool, tables, budget formulas, counters and queue all agree (O(pool): tests only)."""
        admission_report.check_integrity(self.ledger, self._requests, self._running, self._queue)

    # ---------------------------------------------------------------- reading
    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._queue)

    def request(self, request_id: str) -> RequestState:
        """The live state of a known request (read-only by convention); `find(request_id)`
        is the same, or None for an unknown id (no exception on the hot path)."""
        return self._get(request_id)

    def running_requests(self) -> list[RequestState]:
        return list(self._running.values())

    def waiting_requests(self) -> list[RequestState]:
        return list(self._queue.in_order(self.ledger.tenants))


    # ================================================================ internals
    def _get(self, request_id: str) -> RequestState:
        r = self._requests.get(request_id)
        if r is None:
            raise UnknownRequest("request_id", f"{request_id!r} is not a known request")
        return r

    def _enqueue(self, r: RequestState, now: float, *, preempted: bool) -> None:
        self._queue.push(r, preempted, self.ledger.tenants[r.tenant].usage())
        r.failed_epoch = -1
        r.queued = True
        r.queued_at = now
        self.ledger.tenants[r.tenant].waiting += 1

    def _dequeue(self, r: RequestState) -> None:
        self._queue.remove(r)
        r.queued = False
        self.ledger.tenants[r.tenant].waiting -= 1

    def _wait_for_quota(self, r: RequestState, now: float) -> Decision | None:
        """REJECT `r` if it can never be admitted (bigger than its tenant's quota, or the
        pool); else None: it waits, reason `tenant_quota`, behind its tenant's requests
        that wait for the quota (never admitted past them, whatever the pool has)."""
        policy = self.policy
        fit = self._fit
        refusal = fit.refusal(r, fit.plan(r, policy), policy, bool(self._running))
        if refusal is not None and refusal.final:
            return self._reject(r, refusal.reason, now, refusal.detail)
        r.wait_reason = TENANT_QUOTA
        return None

    def _try_admit(self, r: RequestState, now: float) -> Decision | None:
        """ADMIT or REJECT `r` now, or None (with `r.wait_reason`) if it must wait."""
        policy = self.policy
        fit = self._fit
        running = self._running
        plan = fit.plan(r, policy)
        refusal = fit.refusal(r, plan, policy, bool(running))
        if refusal is not None:
            if refusal.final:
                return self._reject(r, refusal.reason, now, refusal.detail)
            r.wait_reason = refusal.reason
            if refusal.reason is not TENANT_QUOTA:
                r.failed_spare, r.failed_epoch = self.ledger.spare, self._epoch
            return None
        if r.queued:
            self._dequeue(r)
        r.policy = policy_name = policy.name
        r.predicted_output = plan.predicted
        hit = plan.hit
        self.ledger.admit(r, hit, plan.base, plan.num_tokens, plan.held, plan.charge)
        spec = r.spec
        running[spec.request_id] = r
        if hit.queried:  # snapshot-only counters: only a prefix lookup moves them
            self._prefix_hit_blocks += hit.num_blocks
            self._prefix_query_blocks += hit.queried
        tables = r.tables
        # One group (most models): half the cost of mapping tuple over a one-item list.
        new_ids = (tuple(tables[0]),) if len(tables) == 1 else tuple(map(tuple, tables))
        # self._decide(ADMIT, ...) spelled out: one admission per submit, and the plan
        # already has the reserved and held tuples.
        self._seq += 1
        counts = self._decisions_by_kind
        counts[ADMIT] = counts.get(ADMIT, 0) + 1
        return new_decision(
            self._seq, now, ADMIT, PREFIX_HIT if hit.num_blocks else FITS, spec.request_id,
            spec.engine_id, spec.tenant, policy_name, spec.prompt_tokens, r.max_len - spec.prompt_tokens,
            r.num_tokens, r.num_computed, plan.reserved, plan.held_tuple, new_ids, 0, r.hit_blocks,
            self.pool.num_free_blocks, self._queue.size, len(running), "",
        )

    def _preempt(
        self, v: RequestState, reason: Reason, now: float, detail: str, resume_len: int = 0
    ) -> Decision:
        v.resume_len = resume_length(v, resume_len)
        freed = self.ledger.release(v)
        del self._running[v.request_id]
        self._enqueue(v, now, preempted=True)
        v.wait_reason = Reason.QUEUE_AHEAD  # until it is tried again (it kept the reason of its last wait)
        self._preemptions[reason] = self._preemptions.get(reason, 0) + 1
        self._dirty = True
        detail = f"{detail}; resumes at {v.resume_len} tokens"
        return self._decide(DecisionKind.PREEMPT, reason, v, now, freed=freed, detail=detail)

    def _end(
        self, r: RequestState, kind: DecisionKind, reason: Reason, now: float, *, schedule: bool = True
    ) -> list[Decision]:
        spec = r.spec
        running = self._running
        freed = 0
        if r.status is RUNNING:
            freed = self.ledger.release(r)
            del running[spec.request_id]
            self._dirty = True
        elif r.queued:
            self._dequeue(r)
        del self._requests[spec.request_id]
        # self._decide(kind, reason, r, now, freed=freed) spelled out (every finish): `r`
        # is not running now, so it reserves and holds nothing.
        self._seq += 1
        counts = self._decisions_by_kind
        counts[kind] = counts.get(kind, 0) + 1
        decision = new_decision(
            self._seq, now, kind, reason, spec.request_id, spec.engine_id, spec.tenant,
            r.policy or self.policy.name, spec.prompt_tokens, r.max_len - spec.prompt_tokens,
            r.num_tokens, r.num_computed, (), (), (), freed, 0,
            self.pool.num_free_blocks, self._queue.size, len(running), "",
        )
        self.ledger.forget_idle_tenant(spec.tenant)
        if not schedule or not self._queue.size:  # nothing waits: nothing to schedule
            return [decision]
        return [decision, *self.schedule(now)]

    def _reject(self, r: RequestState, reason: Reason, now: float, detail: str) -> Decision:
        if r.queued:
            self._dequeue(r)
        if self._requests.get(r.request_id) is r:
            del self._requests[r.request_id]
            self.ledger.forget_idle_tenant(r.tenant)
        self._rejections[reason] = self._rejections.get(reason, 0) + 1
        return self._decide(DecisionKind.REJECT, reason, r, now, detail=detail)

    def _count(self, kind: DecisionKind) -> None:
        self._decisions_by_kind[kind] = self._decisions_by_kind.get(kind, 0) + 1

    def _decide(
        self,
        kind: DecisionKind,
        reason: Reason,
        r: RequestState,
        now: float,
        *,
        new_ids: tuple[tuple[int, ...], ...] = (),
        freed: int = 0,
        detail: str = "",
        blocks: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
    ) -> Decision:
        """`blocks`: (reserved, held) per group when the caller has them as tuples already."""
        self._seq += 1
        counts = self._decisions_by_kind
        counts[kind] = counts.get(kind, 0) + 1
        spec = r.spec
        if blocks is not None:
            reserved, held = blocks
        elif r.status is RUNNING:
            held = r.held
            reserved = tuple(map(max, held, r.base))
            held = tuple(held)
        else:
            reserved = held = ()
        return new_decision(
            self._seq,
            now,
            kind,
            reason,
            spec.request_id,
            spec.engine_id,
            spec.tenant,
            r.policy or self.policy.name,
            spec.prompt_tokens,
            r.max_len - spec.prompt_tokens,
            r.num_tokens,
            r.num_computed,
            reserved,
            held,
            new_ids,
            freed,
            r.hit_blocks if kind is ADMIT else 0,
            self.pool.num_free_blocks,
            self._queue.size,
            len(self._running),
            detail,
        )
