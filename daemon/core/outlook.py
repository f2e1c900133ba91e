"""How soon could a request of this shape be admitted here? A router's question.

Answered from the admission core's own formulas (fit.FitCheck's plan and refusal, the
queue's order, backfill's candidates) without changing anything: no request, tenant,
block or decision is made. The daemon's AskAdmission call and the multi-host what-if
(traces/multi_host.py) both call `outlook`. What it assumes: docs/routing.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbudget.daemon.core.admission import AdmissionController, AdmissionError
from kvbudget.daemon.core.backfill import Backfill
from kvbudget.daemon.core.fit import FitCheck
from kvbudget.daemon.core.records import Reason, RequestSpec
from kvbudget.daemon.core.requests import RequestState
from kvbudget.daemon.core.waiting_queue import TenantAccount

# A decode step of a busy engine, when the caller knows no better (a router that measured
# its engines' inter-token latency passes its own).
DEFAULT_STEP_S = 0.02


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
    reason: str  # "fits", or why not now: pool_full, tenant_quota, queue_ahead, never_fits...
    final: bool  # never admitted here as things stand (it would be rejected)
    blocks_needed: tuple[int, ...]  # per group: what admission reserves (max(held, base))
    blocks_needed_total: int  # what the pool must find for it (shared prefix hits left out)
    blocks_free: int
    blocks_spare: int  # free and promised to no running request
    blocks_reclaimable: int  # free blocks still holding cached prefixes (counted in free)
    requests_ahead: int  # waiting requests the queue puts before it
    blocks_ahead: int  # what those need
    wait_steps: int  # decode steps until enough comes back: 0 now, -1 not from what runs
    wait_s: float  # wait_steps x step_s (-1.0: unknown)
    detail: str = ""


class _LedgerView:
    """The ledger as FitCheck reads it, with an account for a tenant it has not met (the
    real `tenant()` would create one: that is a change)."""

    def __init__(self, ledger, tenant: str) -> None:
        self._ledger = ledger
        tenants = ledger.tenants
        self.tenants = tenants if tenant in tenants else {**tenants, tenant: TenantAccount(tenant)}

    def __getattr__(self, name):
        return getattr(self._ledger, name)


class _Line:
    """The waiting queue as the new request would find it: those ahead, then it."""

    def __init__(self, waiting: list[RequestState]) -> None:
        self.waiting = waiting

    def in_order(self, tenants, skip=None):
        return (r for r in self.waiting if skip is None or r.spec.tenant not in skip)


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
    r = RequestState(spec, max_len, 1 << 62, len(controller.layout.groups))
    r.queued_at = now
    view = _LedgerView(controller.ledger, shape.tenant)
    fit = FitCheck(controller.layout, view, controller.predictor, config)  # type: ignore[arg-type]
    fit.decode_ahead_tokens = controller.layout.block_size
    pool = controller.pool
    base = dict(blocks_free=pool.num_free_blocks, blocks_spare=controller.ledger.spare,
                blocks_reclaimable=pool.num_evictable_blocks)  # fmt: skip
    final = _final(controller, fit, r)
    if final is not None:
        return Outlook(False, final[0].value, True, (), 0, **base, requests_ahead=0, blocks_ahead=0,
                       wait_steps=-1, wait_s=-1.0, detail=final[1])  # fmt: skip
    policy = controller.policy
    plan = fit.plan(r, policy)
    refusal = fit.refusal(r, plan, policy, controller.num_running > 0)
    ahead = _ahead(controller, view.tenants, shape)
    quota_held: set[str] = set()
    line = Backfill(_Line([*ahead, r]), view, fit, controller.predictor, {})  # type: ignore[arg-type]
    line.waits = controller.recent_waits  # (read only: candidates() asks it for the aging bound)
    reached = any(c is r for c in line.candidates(now, quota_held, config.backfill_depth, config.max_head_wait_s))
    blocks_ahead = sum(fit.plan(a, policy).need for a in ahead)
    reason, is_final, detail = Reason.FITS, False, ""
    if refusal is not None:
        reason, is_final, detail = refusal.reason, refusal.final, refusal.detail
    elif not reached:
        reason = Reason.TENANT_QUOTA if shape.tenant in quota_held else Reason.QUEUE_AHEAD
    admit_now = reason is Reason.FITS
    if not admit_now and config.max_queue_len and controller.num_waiting >= config.max_queue_len:
        reason, is_final, detail = Reason.QUEUE_FULL, True, f"max_queue_len {config.max_queue_len}"
    steps = 0 if admit_now else -1
    if not admit_now and not is_final:
        steps = _wait_steps(controller, fit, r, plan.need + blocks_ahead, reason, plan.charge)
    return Outlook(
        admit_now, reason.value, is_final, tuple(plan.reserved), plan.need, **base,
        requests_ahead=len(ahead), blocks_ahead=blocks_ahead, wait_steps=steps,
        wait_s=steps * step_s if steps >= 0 else -1.0, detail=detail,
    )


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
