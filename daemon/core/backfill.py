"""The queue pass: which waiting requests the controller tries, in what order, and when it stops.

EASY backfill: behind a head that does not fit, up to `backfill_depth` requests may be
admitted past it, each only if it is not expected to delay the head's start
(head_start.py); once the head has waited longer than the workload's waits say it
should (aging.py), nothing passes it. Why, and the model: docs/architecture/core.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from copy import copy

from kvbudget.daemon.core.aging import RecentWaits
from kvbudget.daemon.core.fit import FitCheck, Memo
from kvbudget.daemon.core.head_start import HeadStart, blocks_at, expected_run, head_start
from kvbudget.daemon.core.ledger import BlockLedger
from kvbudget.daemon.core.policies import Policy
from kvbudget.daemon.core.predictor import OutputLengthPredictor
from kvbudget.daemon.core.records import Decision, DecisionKind, Reason
from kvbudget.daemon.core.requests import RequestState
from kvbudget.daemon.core.waiting_queue import WaitingQueue

# Hot enum members as module constants (an enum member lookup is slow on 3.11).
TENANT_QUOTA = Reason.TENANT_QUOTA
ADMIT = DecisionKind.ADMIT
_UNBOUNDED = 1 << 40  # max new tokens asked of the predictor: its answer, unclipped


class Backfill:
    """One controller's queue pass, over its queue, books, fit check, predictor and
    running requests (read, never changed here: admitting is the controller's `try_admit`)."""

    def __init__(
        self, queue: WaitingQueue, ledger: BlockLedger, fit: FitCheck, predictor: OutputLengthPredictor,
        running: dict[str, RequestState],
    ) -> None:
        self.queue = queue
        self.ledger = ledger
        self.fit = fit
        self.predictor = predictor
        self.running = running
        self.waits = RecentWaits()  # of requests admitted while others waited: the aging bound
        self.head: RequestState | None = None  # the head of the pass under way, once tried
        self._start: HeadStart | None = None  # its expected start, worked out when first asked
        self._start_key: tuple | None = None  # (head, now, running, spare) it is valid for
        self._occupancy = 0  # at the head's start, of the last request may_pass let through
        self._predicted: dict[str, int | None] = {}  # per tenant, for that start
        # Requests kept behind the head (their order -> the spare blocks then): not asked
        # again until blocks come back or the head changes.
        self._kept: dict[int, int] = {}
        self._kept_head: RequestState | None = None
        # The last pass tried no one: (spare, now, (queue order version, epoch, depth, aging
        # cap), head). Each candidate it walked was skipped for a spare at most a figure it
        # holds, and nothing but a try (which clears this) or a queue change moves those
        # figures or the walk; so with no more spare, the same key and no earlier clock
        # (aging only cuts a walk shorter as time goes on), a pass skips them all again.
        self._idle: tuple[int, float, tuple, RequestState | None] | None = None
        # Blocks a request holds decoding at n tokens, as far ahead as the engine grows (a
        # window group: its window, not the prefill transient the worst case keeps).
        self._ahead = fit.decode_ahead_tokens
        held = fit.held
        self._total = Memo(lambda n: sum(held[n + self._ahead, n - 1]) if n > 0 else 0)

    def candidates(
        self, now: float, quota_held: set[str], backfill_depth: int, max_head_wait_s: float,
    ) -> Iterator[RequestState]:
        """The head, then (unless it has waited past the aging bound) up to backfill_depth more.

        A request its tenant's quota holds back (refused `tenant_quota` when last tried)
        neither counts in the depth nor stops the pass by its age, and its tenant's later
        requests are passed over in this pass (its tenant is added to `quota_held`, which
        the queue leaves out as it goes): a tenant waits for its quota in its own order, and
        backfill and aging are about the pool's blocks, which passing it takes nothing
        from. Else a tenant at its quota held every other tenant back, behind
        backfill_depth of its requests or behind an aged one, while most of the pool was
        free. (The consumer tries each candidate before asking for the next, so the reason
        read after a yield is that try's; a candidate not tried keeps its last one.)"""
        head: RequestState | None = None
        self.head = None
        tried = 0
        for r in self.queue.in_order(self.ledger.tenants, skip=quota_held):
            if head is not None and tried >= backfill_depth:
                return
            yield r
            if r.wait_reason is TENANT_QUOTA:
                quota_held.add(r.spec.tenant)
            elif head is None:
                # (its start is kept when the pass starts over after a backfill: admit)
                head = self._same_head(r, now, self.ledger.spare)
                # Aging guards the head of the queue; behind a request held by its quota,
                # backfill goes on (as it did while that request was young).
                if not quota_held and now - r.queued_at > self.waits.bound(max_head_wait_s):
                    return
            else:
                tried += 1

    def probe(self, queue) -> Backfill:
        """A twin of this pass over `queue` (anything with `in_order`: the queue with one
        request more) for a look that must change nothing here (outlook.py, a router's
        ask): the same books, predictor, waits and running requests, copies of the memos."""
        twin = copy(self)
        twin.queue = queue
        twin._kept, twin._predicted = dict(self._kept), dict(self._predicted)
        if self._ahead != self.fit.decode_ahead_tokens:  # (the twin's may_pass would refill _total)
            held = self.fit.held
            twin._total = Memo(lambda n: sum(held[n + twin._ahead, n - 1]) if n > 0 else 0)
        return twin

    def may_pass(self, r: RequestState, policy: Policy) -> bool:
        """Whether `r`, a candidate of this pass that fits now, may be admitted: it is the
        head, or it is expected to end before the head can start, or what it holds then
        leaves the head what it needs (EASY). The controller asks once the fit test passed,
        so a request refused for its tenant's quota or for blocks keeps that reason. One kept
        back is not asked again until blocks come back or the head changes (_kept)."""
        head = self.head
        if head is None or r is head:
            return True
        spare = self.ledger.spare
        if head is not self._kept_head:
            self._kept.clear()
            self._kept_head = head
        elif self._kept.get(r.order, -1) >= spare:
            return False
        fit = self.fit
        if self._ahead != fit.decode_ahead_tokens:  # the engine was seen growing further ahead
            self._ahead = fit.decode_ahead_tokens
            self._total.clear()
        start = self._start
        if start is None:
            start = self._start = self._head_start(head, policy, spare)
            self._start_key = None
        steps, final = expected_run(r, self._predict(r), fit.F)
        self._occupancy = 0
        if steps <= start.steps:
            return True
        prompt = r.spec.prompt_tokens
        target = r.resume_len if r.resume_len > prompt else prompt
        occupancy = blocks_at(target, -(-target // fit.F), final, start.steps, self._total.__getitem__)
        if occupancy <= start.extra:
            self._occupancy = occupancy
            return True
        self._kept[r.order] = spare
        return False

    def keeps_back(self, r: RequestState, policy: Policy, anything_running: bool) -> bool:
        """Whether queued `r` is kept behind the head whatever its plan: no prefix hit
        could get it refused first (fit.surely_unrefused) and may_pass says no. The
        controller then answers `queue_ahead` without the plan and its prefix lookup;
        the answer and every side effect are the full try's (may_pass reads nothing the
        plan computes)."""
        head = self.head
        if head is None or r is head or policy.gates_on_peak:
            return False  # (may_pass lets the head through; the peak gate comes first)
        return self.fit.surely_unrefused(r, policy, anything_running) and not self.may_pass(r, policy)

    def _head_start(self, head: RequestState, policy: Policy, spare: int) -> HeadStart:
        """When the head is expected to find what it needs (plan's need, and the
        watermark its policy keeps), from the running requests' expected ends."""
        fit = self.fit
        need = fit.plan(head, policy).need
        if policy.uses_watermark:
            need += fit.watermark_blocks
        self._predicted.clear()
        F, total, predict = fit.F, self._total, self._predict
        ends = []
        for r in self.running.values():
            steps, final = expected_run(r, predict(r), F)
            charged = r.charged
            grows = total[final] - charged
            ends.append((steps, charged, grows if grows > 0 else 0))
        return head_start(ends, spare, need)

    def _predict(self, r: RequestState) -> int:
        """The output length `r` is expected to reach: the predictor's (its quantile of
        recent outputs, per tenant), else its own maximum."""
        tenant = r.spec.tenant
        predicted = self._predicted.get(tenant, -1)
        if predicted == -1:
            value = self.predictor.predict(tenant, _UNBOUNDED)
            predicted = self._predicted[tenant] = None if value >= _UNBOUNDED else value
        most = r.max_len - r.spec.prompt_tokens
        return most if predicted is None or predicted > most else predicted

    def admit(
        self, r: RequestState, now: float, try_admit: Callable[[RequestState, float], Decision | None]
    ) -> Decision | None:
        """`try_admit(r, now)`, and the wait of an admitted `r` noted for aging."""
        self._idle = None  # a try may change what a pass skips
        decision = try_admit(r, now)
        if decision is not None and decision.kind is ADMIT:
            self.waits.observe(now - r.queued_at)
            start, head = self._start, self.head
            if start is not None and head is not None and r is not head:
                # Admitted past the head: what it holds at the head's start comes out of
                # the extra (EASY's bookkeeping), so the next pass need not work it out again.
                self._start = HeadStart(start.steps, start.extra - self._occupancy)
                self._start_key = (head, now, len(self.running), self.ledger.spare)
        return decision

    def admit_from_queue(
        self, now: float, epoch: int, backfill_depth: int, max_head_wait_s: float,
        try_admit: Callable[[RequestState, float], Decision | None],
    ) -> list[Decision]:
        """One admission pass: try the candidates in order, and start over after each ADMIT or
        REJECT (the order changed) until a whole pass changes nothing.

        `epoch` is the controller's (bumped when a policy or quota change may change any
        answer); `try_admit` sets a request's `failed_spare` and `failed_epoch` when it
        lacked blocks."""
        decisions: list[Decision] = []
        queue, ledger, fit = self.queue, self.ledger, self.fit
        while queue:
            budget = fit.budget
            if budget is not None and (budget[0] <= 0 or budget[1] <= 0):
                break  # the engine's step can start nothing more: no need to walk the queue
            spare = ledger.spare  # (only an ADMIT changes it, and the pass starts over)
            idle = self._idle
            if idle is not None and spare <= idle[0] and now >= idle[1] and idle[2] == (
                queue.order_version(), epoch, backfill_depth, max_head_wait_s
            ):
                self._same_head(idle[3], now, spare)  # as the walk would leave it
                break  # the walk would skip every candidate again (see _idle)
            decision = self._pass(now, epoch, backfill_depth, max_head_wait_s, try_admit, spare)
            if decision is None:
                break
            decisions.append(decision)
        return decisions

    def _pass(
        self, now: float, epoch: int, backfill_depth: int, max_head_wait_s: float,
        try_admit: Callable[[RequestState, float], Decision | None], spare: int,
    ) -> Decision | None:
        """One walk of `candidates` (inlined: one loop, no generator between), trying each
        candidate not known to fail again; the first ADMIT or REJECT, else None."""
        kept = self._kept
        quota_held: set[str] = set()
        head: RequestState | None = None
        self.head = None
        behind = tried = 0
        self._idle = None
        queue = self.queue
        version = queue.order_version()  # (before in_order re-places tenants: None then)
        # One tenant waiting: its list itself, the walk ending once it is held by its
        # quota (what in_order's `skip` does, without a generator between).
        one = queue.num_tenants == 1
        for r in queue.in_order(self.ledger.tenants, skip=None if one else quota_held):
            if (head is not None and behind >= backfill_depth) or (one and quota_held):
                break
            if r.failed_epoch == epoch and spare <= r.failed_spare:
                # Lacked blocks last time and none came back since: same answer, and
                # a prefix lookup of a long prompt is not free. (A prefix published
                # meanwhile is seen on the next release; an idle pool is always
                # retried, its spare being the whole pool.)
                pass
            elif head is not None and r is not head and head is self._kept_head and kept.get(r.order, -1) >= spare:
                pass  # kept behind this head, and no blocks came back since (may_pass)
            else:
                tried += 1
                decision = self.admit(r, now, try_admit)
                if decision is not None:  # admitted or rejected: the order changed, start over
                    return decision
            if r.wait_reason is TENANT_QUOTA:  # (candidates' bookkeeping, after the try)
                quota_held.add(r.spec.tenant)
            elif head is None:
                head = self._same_head(r, now, spare)
                if not quota_held and now - r.queued_at > self.waits.bound(max_head_wait_s):
                    break
            else:
                behind += 1
        if not tried and version is not None:
            self._idle = (spare, now, (version, epoch, backfill_depth, max_head_wait_s), head)
        return None

    def _same_head(self, head: RequestState | None, now: float, spare: int) -> RequestState | None:
        """`head` is the pass's head (candidates' bookkeeping): its expected start is kept
        only while nothing it depends on moved."""
        self.head = head
        if head is not None and self._start_key != (head, now, len(self.running), spare):
            self._start = None
        return head
