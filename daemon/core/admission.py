"""Admission controller: the public face of the pure core (no I/O, no gRPC, no clocks).

Callers pass `now` (seconds, any monotonic origin) to every call, so the same object runs
under the daemon, the offline replayer and the tests, deterministically. Every mutating
call returns the decisions it caused, in order; "does not fit" is a decision, never an
exception (AdmissionError is misuse and names the field). The engine contract, the
invariant every path keeps and the module map: docs/architecture/core.md.
"""

from __future__ import annotations

from collections.abc import Callable

from kvbudget.daemon.core import admission_report, integrity, policies
from kvbudget.daemon.core.admission_controls import AdmissionControls
from kvbudget.daemon.core.admission_config import (  # re-exported: see __all__
    POLICIES, AdmissionConfig, AdmissionError, DuplicateRequest, UnknownRequest,
)
from kvbudget.daemon.core.backfill import Backfill
from kvbudget.daemon.core.budget import blocks_held
from kvbudget.daemon.core.decisions import DecisionRecorder
from kvbudget.daemon.core.fit import FitCheck, extra_for_growth
from kvbudget.daemon.core.future_peak import PeakGate
from kvbudget.daemon.core.ledger import BlockLedger
from kvbudget.daemon.core.pool import BlockPool
from kvbudget.daemon.core.predictor import OutputLengthPredictor
from kvbudget.daemon.core.preemption import preempt_for, resume_length
from kvbudget.daemon.core.records import Decision, DecisionKind, Reason, RequestSpec, Snapshot
from kvbudget.daemon.core.requests import RequestState, Status
from kvbudget.daemon.core.spec import KVCacheLayout
from kvbudget.daemon.core.waiting_queue import WaitingQueue

# The settings and errors live in admission_config.py; importers take them from here.
__all__ = ["POLICIES", "AdmissionConfig", "AdmissionController", "AdmissionError", "DuplicateRequest", "UnknownRequest"]

# Hot enum members as module constants (an enum member lookup costs ~70 ns on 3.11).
RUNNING = Status.RUNNING
RELEASE = DecisionKind.RELEASE
FITS, FINISHED, TENANT_QUOTA = Reason.FITS, Reason.FINISHED, Reason.TENANT_QUOTA


class AdmissionController(AdmissionControls):
    """The requests and their blocks; every change to either is one of its calls (the
    live controls, set_policy to number_from: admission_controls.py)."""

    def __init__(
        self, layout: KVCacheLayout, num_blocks: int, config: AdmissionConfig, *,
        predictor: OutputLengthPredictor | None = None,
    ) -> None:
        config.validate()
        if num_blocks < 1:
            raise AdmissionError("num_blocks", f"must be at least 1, got {num_blocks}")
        self.layout = layout
        self.config = config
        self.ledger = BlockLedger(layout, num_blocks)
        self.pool: BlockPool = self.ledger.pool
        self.policy = policies.chosen(config.policy, config.predictive_admission, config.optimistic_peak)
        self.predictor = predictor or OutputLengthPredictor(quantile=config.predictor_quantile)
        self._num_groups = len(layout.groups)
        self._max_model_len = config.max_model_len  # read on every submit
        self._fit = FitCheck(layout, self.ledger, self.predictor, config)
        self.set_step_budget = self._fit.set_budget  # what an engine step can still start
        self._requests: dict[str, RequestState] = {}  # never rebound: `find` is its get
        # The dict's own get, not a method around it: every op of every step asks it.
        self.find: Callable[[str], RequestState | None] = self._requests.get
        self._running: dict[str, RequestState] = {}
        self._queue = WaitingQueue(fair_share=config.fair_share, usage_changed=self.ledger.usage_changed)
        self._order = 0
        self._dirty = False  # blocks or promises came back since the last queue pass
        self._queue_held = False  # an engine step's frees and grows come first: hold_queue
        self.preempted_while_held = False  # a PREEMPT since hold_queue: the step admits nothing
        # The last engine step left admissions to the next (it preempted, or used up what it
        # could start): until then a pass outside a step (a tick) admits only into an idle pool.
        self.deferred = False
        self._admissions = 0  # admission order (victims: the latest admitted first)
        self.admitting = True  # False once drained: close_admissions
        self._epoch = 0  # bumped when a policy or quota change may change any answer
        self._record = DecisionRecorder(self.pool, self._queue, self._running, self.policy.name)
        self._peak = PeakGate(self.ledger, self._fit, self.predictor, config, self._running, self._record)
        self._backfill = Backfill(self._queue, self.ledger, self._fit, self.predictor, self._running)

    # ================================================================ public API
    def submit(self, request: RequestSpec, now: float, admit: bool = True) -> list[Decision]:
        """ADMIT (with block ids per group), QUEUE or REJECT, then anything it caused.
        `admit=False` (a step that preempted): QUEUE or REJECT only."""
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
        worst = fit.worst_total[max_len]
        if worst > fit.capacity:
            return [self._reject(r, Reason.NEVER_FITS, now, f"worst case {worst} > pool {fit.capacity}")]
        if not self.admitting:
            return [self._reject(r, Reason.DRAINING, now, "draining: no admissions")]
        self._requests[rid] = r
        tenant = request.tenant
        if tenant not in self.ledger.tenants:
            self.ledger.tenant(tenant)
        if not admit:
            r.wait_reason = Reason.POOL_FULL
            return [self._wait(r, now)]
        decision = self._try_admit(r, now) if not self._queue.size else self._try_behind_queue(r, now)
        if decision is None:
            decision = self._wait(r, now)
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
            raise AdmissionError("num_tokens", f"{num_tokens} is past the request's maximum length {r.max_len}")
        if r.status is not RUNNING:
            return [self._record.about(DecisionKind.DENY, Reason.NOT_RUNNING, r, now, detail="waiting")]
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
            return [self._record.about(DecisionKind.DENY, reason, r, now)]
        new_ids = self.ledger.grow(r, num_tokens, new_held)
        decisions.append(self._record.about(DecisionKind.GROW, FITS, r, now, new_ids=new_ids))
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
            raise AdmissionError("num_computed", f"{num_computed} is below the {r.num_computed} already computed")
        if num_computed > r.num_tokens:
            raise AdmissionError("num_computed", f"{num_computed} is past the {r.num_tokens} slots held")
        freed = self.ledger.progress(r, num_computed, r.spec.prefix_hashes, self._fit.prefix_caching)
        if not freed:
            return self.schedule(now, full_pass=False)
        self._dirty = True
        decision = self._record.about(DecisionKind.RECLAIM, Reason.WINDOW, r, now, freed=freed)
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
        if self.deferred and self._running:  # the engines' next step admits (apply_step)
            return decisions
        if decisions or self._dirty or full_pass:
            self._dirty = False
            config = self.config
            decisions += self._backfill.admit_from_queue(
                now, self._epoch, config.backfill_depth, config.max_head_wait_s, self._try_admit
            )
        return decisions

    def hold_queue(self, held: bool = True) -> None:
        """Admit nothing from the queue until `release_queue`: one engine step's finishes,
        aborts, progress and grows all land first, as vLLM schedules its running requests
        before its waiting ones (why: docs/architecture/core.md). `held=False` lifts the hold
        without a pass: the next `schedule` makes it. `preempted_while_held` tells whether
        a PREEMPT came since (vLLM then admits nothing in the step: apply_step)."""
        self._queue_held = held
        if held:
            self.preempted_while_held = False

    def step_budget_spent(self) -> bool:
        """The step can start nothing more (set_step_budget's tokens or sequences are out)."""
        budget = self._fit.budget
        return budget is not None and (budget[0] <= 0 or budget[1] <= 0)

    def release_queue(self, now: float) -> list[Decision]:
        """End `hold_queue`: what the held ops made room for is admitted now."""
        self._queue_held = False
        return self.schedule(now)

    def snapshot(self, now: float) -> Snapshot:
        return admission_report.snapshot(now, self.ledger, self._queue, len(self._running), self._record)

    def check_integrity(self) -> None:
        """Pool, tables, budget formulas, counters and queue all agree (O(pool): tests only)."""
        integrity.check_controller(self.ledger, self._requests, self._running, self._queue)

    # ---------------------------------------------------------------- reading
    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._queue)

    def queue_pass_parts(self) -> tuple[FitCheck, PeakGate, Backfill, WaitingQueue]:
        """The pass's own parts, for a look that changes nothing (outlook.py, a router's ask)."""
        return self._fit, self._peak, self._backfill, self._queue

    def request(self, request_id: str) -> RequestState:
        """The live state of a known request (read-only); `find` gives None for an unknown id."""
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

    def _try_behind_queue(self, r: RequestState, now: float) -> Decision | None:
        """`r` joins a queue that is not empty: tried now only if backfill reaches it and
        it cannot delay the head; else None, waiting (reason `tenant_quota` behind its
        tenant's requests that wait for the quota, unless it can never be admitted: REJECT)."""
        self._queue.enter(r, self.ledger.tenants[r.tenant], False, now)
        quota_held: set[str] = set()
        config = self.config
        backfill = self._backfill
        for candidate in backfill.candidates(now, quota_held, config.backfill_depth, config.max_head_wait_s):
            if candidate is r:
                return backfill.admit(r, now, self._try_admit)
        if r.spec.tenant not in quota_held:
            r.wait_reason = Reason.QUEUE_AHEAD
            return None
        # Passed over with its tenant's other requests: never admitted past them.
        policy = self.policy
        refusal = self._fit.refusal(r, self._fit.plan(r, policy), policy, bool(self._running))
        if refusal is not None and refusal.final:
            return self._reject(r, refusal.reason, now, refusal.detail)
        r.wait_reason = TENANT_QUOTA
        return None

    def _wait(self, r: RequestState, now: float) -> Decision:
        """QUEUE the new request `r` that could not be admitted, or REJECT it: its
        deadline passed already, or the queue is full."""
        limit = self.config.max_queue_len
        deadline = r.spec.deadline_s
        if deadline is not None and deadline < now:
            return self._reject(r, Reason.DEADLINE, now, f"deadline {deadline} already passed")
        if limit and len(self._queue) - r.queued >= limit:
            return self._reject(r, Reason.QUEUE_FULL, now, f"max_queue_len {limit}")
        if not r.queued:
            self._queue.enter(r, self.ledger.tenants[r.tenant], False, now)
        return self._record.about(DecisionKind.QUEUE, r.wait_reason, r, now)

    def _try_admit(self, r: RequestState, now: float) -> Decision | None:
        """ADMIT or REJECT `r` now, or None (with `r.wait_reason`) if it must wait."""
        policy = self.policy
        fit = self._fit
        budget = fit.budget
        if budget is not None and (budget[0] <= 0 or budget[1] <= 0):  # the step can start no more
            r.wait_reason = Reason.QUEUE_AHEAD
            return None
        running = bool(self._running)
        backfill = self._backfill
        if r.queued and backfill.keeps_back(r, policy, running):  # the answer below, without the plan
            r.wait_reason = Reason.QUEUE_AHEAD
            return None
        plan = fit.plan(r, policy)
        refusal = fit.refusal(r, plan, policy, running)
        if refusal is not None:
            if refusal.final:
                return self._reject(r, refusal.reason, now, refusal.detail)
            r.wait_reason = refusal.reason
            if refusal.reason is not TENANT_QUOTA:
                r.failed_spare, r.failed_epoch = self.ledger.spare, self._epoch
            return None
        if policy.gates_on_peak and not self._peak.admits(r, plan, self.ledger.spare):
            r.wait_reason = Reason.BUDGET_FULL  # free now, but wanted by the batch's predicted peak
            r.failed_spare, r.failed_epoch = self.ledger.spare, self._epoch
            return None
        if r.queued and not backfill.may_pass(r, policy):  # it fits, but would delay the head
            r.wait_reason = Reason.QUEUE_AHEAD
            return None
        if r.queued:
            self._queue.leave(r, self.ledger.tenants[r.tenant])
        r.policy = policy.name
        r.ahead_limit = fit.F if policy.bounds_ahead else 0
        if plan.predicted:  # (future-peak admission predicted it already: PeakGate)
            r.predicted_output = plan.predicted
        self.ledger.admit(r, plan.hit, plan.base, plan.num_tokens, plan.held, plan.charge)
        self._running[r.spec.request_id] = r
        self._admissions += 1
        r.admitted = self._admissions
        if budget is not None:
            budget[0] -= plan.num_tokens - plan.hit.num_tokens
            budget[1] -= 1
        return self._record.admitted(r, plan, now)

    def _preempt(
        self, v: RequestState, reason: Reason, now: float, detail: str, resume_len: int = 0
    ) -> Decision:
        v.resume_len = resume_length(v, resume_len)
        self.preempted_while_held = True
        freed = self.ledger.release(v)
        del self._running[v.request_id]
        self._queue.enter(v, self.ledger.tenants[v.tenant], True, now)
        v.wait_reason = Reason.QUEUE_AHEAD  # until it is tried again (it kept the reason of its last wait)
        self._dirty = True
        return self._record.preempted(v, reason, now, freed, f"{detail}; resumes at {v.resume_len} tokens")

    def _end(
        self, r: RequestState, kind: DecisionKind, reason: Reason, now: float, *, schedule: bool = True
    ) -> list[Decision]:
        spec = r.spec
        freed = 0
        if r.status is RUNNING:
            freed = self.ledger.release(r)
            del self._running[spec.request_id]
            self._dirty = True
        elif r.queued:
            self._queue.leave(r, self.ledger.tenants[r.tenant])
        del self._requests[spec.request_id]
        decision = self._record.ended(r, kind, reason, freed, now)
        self.ledger.forget_idle_tenant(spec.tenant)
        if not schedule or not self._queue.size:  # nothing waits: nothing to schedule
            return [decision]
        return [decision, *self.schedule(now)]

    def _reject(self, r: RequestState, reason: Reason, now: float, detail: str) -> Decision:
        if r.queued:
            self._queue.leave(r, self.ledger.tenants[r.tenant])
        if self._requests.get(r.request_id) is r:
            del self._requests[r.request_id]
            self.ledger.forget_idle_tenant(r.tenant)
        return self._record.rejected(r, reason, now, detail)
