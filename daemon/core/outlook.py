"""How soon could a request of this shape be admitted here? A router's question.

Whether it is admitted now, and why not, is decided by the controller's own queue pass
(admission.py's submit: fit.FitCheck's plan and refusal, the predicted-peak gate, the
queue's order, backfill's candidates and its head protection), run on the candidate
without changing anything: no request, tenant, block, memo or decision is made. How long
it would wait is an estimate. The daemon's AskAdmission call and the multi-host what-if
(traces/multi_host.py) both call `outlook`. What it assumes: docs/routing.md.
"""

from __future__ import annotations

from copy import copy
from dataclasses import dataclass

from kvbudget.daemon.core.admission import AdmissionController, AdmissionError
from kvbudget.daemon.core.backfill import Backfill
from kvbudget.daemon.core.fit import FitCheck
from kvbudget.daemon.core.future_peak import PeakGate
from kvbudget.daemon.core.records import Reason, RequestSpec
from kvbudget.daemon.core.requests import RequestState
from kvbudget.daemon.core.waiting_queue import TenantAccount, WaitingQueue

# A decode step of a busy engine, when the caller knows no better (a router that measured
# its engines' inter-token latency passes its own).
DEFAULT_STEP_S = 0.02
_LAST = 1 << 62  # the candidate's arrival order: after every request that waits


@dataclass(frozen=True)
class Shape:
    """The request a router is about to place."""

    prompt_tokens: int
    max_new_tokens: int | None = None  # None: up to max_model_len
    tenant: str = ""
    priority: int = 0
    prefix_hashes: tuple[int, ...] = ()


@dataclass(frozen=True)
class Outlook:
    admit_now: bool
    reason: str  # what a submit now would get: fits or prefix_hit (admitted), else why not
    final: bool  # never admitted here as things stand (it would be rejected)
    blocks_needed: tuple[int, ...]  # per group: what admission reserves (max(held, base))
    blocks_needed_total: int  # what the pool must find for it (shared prefix hits left out)
    blocks_free: int
    blocks_spare: int  # free and promised to no running request
    blocks_reclaimable: int  # free blocks still holding cached prefixes (counted in free)
    requests_ahead: int  # waiting requests the queue puts before it
    blocks_ahead: int  # what those need
    wait_steps: int  # decode steps until enough comes back (an estimate): 0 now, -1 not from what runs
    wait_s: float  # wait_steps x step_s (-1.0: unknown)
    detail: str = ""


class _LedgerView:
    """The ledger as FitCheck reads it, with an account for a tenant it has not met (the
    real `tenant()` would create one: that is a change; a new account has no quota)."""

    def __init__(self, ledger, tenant: str) -> None:
        self._ledger = ledger
        self.tenants = {**ledger.tenants, tenant: TenantAccount(tenant)}

    def __getattr__(self, name):
        return getattr(self._ledger, name)


class _Line:
    """The waiting queue as a submit of `r` would find it: the queue's own order, `r` in
    the place its key gives it, after every request of its (priority, class, tenant
    usage) or better, being the newest (waiting_queue.py)."""

    def __init__(self, queue: WaitingQueue, r: RequestState) -> None:
        self.queue, self.r = queue, r

    def in_order(self, tenants, skip=None):
        r, fair = self.r, self.queue.fair_share
        waiting = self.queue.in_order(tenants, skip)  # (places every tenant by its usage now)
        mine = (r.spec.priority, 1, tenants[r.tenant].usage() if fair and r.tenant in tenants else 0.0)
        placed = False
        for w in waiting:
            if not placed and mine < (w.spec.priority, w.queue_key[1], tenants[w.tenant].usage() if fair else 0.0):
                placed = True
                if skip is None or r.tenant not in skip:
                    yield r
                if skip is not None and w.tenant in skip:  # held back meanwhile: the queue drops it
                    continue
            yield w
        if not placed and (skip is None or r.tenant not in skip):
            yield r


def outlook(controller: AdmissionController, shape: Shape, now: float, step_s: float = DEFAULT_STEP_S) -> Outlook:
    """What submitting `shape` now would get, and if not admitted, about when it would be.
    Raises AdmissionError naming the field for a bad shape."""
    config = controller.config
    if shape.prompt_tokens < 1:
        raise AdmissionError("prompt_tokens", f"must be at least 1, got {shape.prompt_tokens}")
    if shape.max_new_tokens is not None and shape.max_new_tokens < 0:
        raise AdmissionError("max_new_tokens", f"must not be negative, got {shape.max_new_tokens}")
    if not step_s >= 0:
        raise AdmissionError("step_s", f"must not be negative, got {step_s}")
    limit = config.max_model_len
    max_len = min(shape.prompt_tokens + (limit if shape.max_new_tokens is None else shape.max_new_tokens), limit)
    spec = RequestSpec("", shape.prompt_tokens, shape.max_new_tokens, shape.prefix_hashes, shape.priority, shape.tenant)
    r = RequestState(spec, max_len, _LAST, len(controller.layout.groups))
    r.queued_at = now
    fit, peak, backfill, queue = controller.queue_pass_parts()
    ledger = controller.ledger
    if shape.tenant not in ledger.tenants:
        fit = copy(fit)  # the same checks and memos, reading a ledger that knows the tenant
        fit.ledger = _LedgerView(ledger, shape.tenant)  # type: ignore[assignment]
    pool = controller.pool
    base = dict(blocks_free=pool.num_free_blocks, blocks_spare=ledger.spare,
                blocks_reclaimable=pool.num_evictable_blocks)  # fmt: skip
    final = _final(controller, fit, r)
    if final is not None:
        return Outlook(False, final[0].value, True, (), 0, **base, requests_ahead=0, blocks_ahead=0,
                       wait_steps=-1, wait_s=-1.0, detail=final[1])  # fmt: skip
    reason, is_final, detail = _decide(controller, fit, peak, backfill, queue, r, now)
    policy = controller.policy
    plan = fit.plan(r, policy)
    ahead = _ahead(controller, fit.ledger.tenants, shape)
    blocks_ahead = sum(fit.plan(a, policy).need for a in ahead)
    admit_now = reason is Reason.FITS or reason is Reason.PREFIX_HIT
    steps = 0 if admit_now else -1
    if not admit_now and not is_final:
        steps = _wait_steps(controller, fit, r, plan.need + blocks_ahead, reason, plan.charge)
    return Outlook(
        admit_now, reason.value, is_final, tuple(plan.reserved), plan.need, **base,
        requests_ahead=len(ahead), blocks_ahead=blocks_ahead, wait_steps=steps,
        wait_s=steps * step_s if steps >= 0 else -1.0, detail=detail,
    )


def _decide(
    controller: AdmissionController, fit: FitCheck, peak: PeakGate, backfill: Backfill, queue: WaitingQueue,
    r: RequestState, now: float,
) -> tuple[Reason, bool, str]:
    """(reason, final, detail) of the decision a submit of `r` now gets, as
    AdmissionController.submit makes it (tried at once into an empty queue, else behind
    it: `_try_behind_queue`, then `_wait`'s queue bound)."""
    config = controller.config
    if not queue.size:
        return _try(controller, fit, peak, None, r)
    line = backfill.probe(_Line(queue, r))
    quota_held: set[str] = set()
    for candidate in line.candidates(now, quota_held, config.backfill_depth, config.max_head_wait_s):
        if candidate is r:
            decided = _try(controller, fit, peak, line, r)
            break
    else:
        decided = Reason.QUEUE_AHEAD, False, ""
        if r.tenant in quota_held:  # passed over with its tenant's requests that wait for the quota
            policy = controller.policy
            refusal = fit.refusal(r, fit.plan(r, policy), policy, controller.num_running > 0)
            if refusal is not None and refusal.final:
                decided = refusal.reason, True, refusal.detail
            else:
                decided = Reason.TENANT_QUOTA, False, ""
    reason, final, _ = decided
    limit = config.max_queue_len
    if reason is not Reason.FITS and reason is not Reason.PREFIX_HIT and not final and limit and queue.size >= limit:
        return Reason.QUEUE_FULL, True, f"max_queue_len {limit}"
    return decided


def _try(
    controller: AdmissionController, fit: FitCheck, peak: PeakGate, line: Backfill | None, r: RequestState
) -> tuple[Reason, bool, str]:
    """AdmissionController._try_admit's tests in its order, admitting nothing: the step's
    budget, the fit, the predicted peak, and (behind a queue) the head's protection."""
    budget = fit.budget
    if budget is not None and (budget[0] <= 0 or budget[1] <= 0):
        return Reason.QUEUE_AHEAD, False, ""
    policy = controller.policy
    plan = fit.plan(r, policy)
    refusal = fit.refusal(r, plan, policy, controller.num_running > 0)
    if refusal is not None:
        return refusal.reason, refusal.final, refusal.detail
    if policy.gates_on_peak and not peak.admits_read_only(r, plan, controller.ledger.spare):
        return Reason.BUDGET_FULL, False, ""
    if line is not None and not line.may_pass(r, policy):
        return Reason.QUEUE_AHEAD, False, ""
    return (Reason.PREFIX_HIT if plan.hit.num_blocks else Reason.FITS), False, ""


def _final(controller: AdmissionController, fit: FitCheck, r: RequestState) -> tuple[Reason, str] | None:
    """The submit's own rejections before any fit test, in its order."""
    limit = controller.config.max_model_len
    if r.spec.prompt_tokens > limit:
        return Reason.PROMPT_TOO_LONG, f"max_model_len {limit}"
    worst = fit.worst_total[r.max_len]
    if worst > fit.capacity:
        return Reason.NEVER_FITS, f"worst case {worst} > pool {fit.capacity}"
    if not controller.admitting:
        return Reason.DRAINING, "draining: no admissions"
    return None


def _ahead(controller: AdmissionController, tenants: dict[str, TenantAccount], shape: Shape) -> list[RequestState]:
    """The waiting requests the queue orders before a new request of this tenant and
    priority: (priority, class, tenant usage) at or before its own, a new request being
    class 1 and the last to arrive (waiting_queue.py's order)."""
    fair = controller.config.fair_share

    def usage(tenant: str) -> float:
        return tenants[tenant].usage() if fair and tenant in tenants else 0.0

    mine = (shape.priority, 1, usage(shape.tenant))
    return [w for w in controller.waiting_requests() if (w.spec.priority, w.queue_key[1], usage(w.tenant)) <= mine]


def _wait_steps(
    controller: AdmissionController, fit: FitCheck, r: RequestState, deficit_need: int, reason: Reason, charge: int
) -> int:
    """Decode steps until the running requests that finish first have given back what
    it lacks: each is taken to finish at its expected length (the predictor's, as the
    predictive policy reserves), giving back what it is charged. For a tenant at its
    quota only that tenant's running requests count; -1 if what runs is not enough."""
    ledger = controller.ledger
    lacking = deficit_need - ledger.spare
    if reason is Reason.WATERMARK:
        lacking = max(lacking, 0) + fit.watermark_blocks
    account = ledger.tenants.get(r.tenant)
    quota = account.quota_blocks(fit.capacity) if account is not None else None
    if reason is Reason.TENANT_QUOTA and quota is not None:
        lacking = account.charged + charge - quota
    if lacking <= 0:
        return 1  # the blocks are there: the next queue pass reaches it
    predictor = controller.predictor
    ends = []
    for x in controller.running_requests():
        if reason is Reason.TENANT_QUOTA and x.tenant != r.tenant:
            continue
        prompt = x.spec.prompt_tokens
        expected = x.predicted_output or predictor.predict(x.tenant, x.max_len - prompt)
        ends.append((max(1, min(x.max_len, prompt + expected) - x.num_tokens), x.charged))
    got = 0
    for steps, charged in sorted(ends):
        got += charged
        if got >= lacking:
            return steps
    return -1
