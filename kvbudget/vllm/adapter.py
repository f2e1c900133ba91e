"""One vLLM step through the daemon: the ops sent, the decisions enacted, the books checked.

`before()` runs at the top of vLLM's `schedule()`: it sends one Step (arrivals, progress,
finishes, grows for the coming step), preempts in vLLM what the daemon preempted, and
returns a `Gate` that hides from vLLM the waiting requests the daemon has not admitted and
the running ones it denied, so vLLM's own loop admits and grows only as decided.
`after()` restores them and compares the blocks each side holds. The daemon unreachable:
`fail_mode` open (vLLM's own admission) or closed (nothing new starts); once a new session
opens, what vLLM runs is submitted again. Why each step is built this way: docs/vllm.md.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from kvbudget.vllm.books import Books
from kvbudget.vllm.link import DaemonLink, LinkDown, SessionReset
from kvbudget.vllm.metrics import AdapterMetrics
from kvbudget.vllm.plan import coming_tokens, request_tenant, submit_spec, vllm_held
from kvbudget.vllm.settings import AdapterSettings

log = logging.getLogger("kvbudget.vllm")


@dataclass
class Gate:
    """What `before()` took out of vLLM's queues for one `schedule()`; `restore()` puts it back."""

    scheduler: object
    order: list = field(default_factory=list)  # vLLM's waiting queue before the call
    running: list = field(default_factory=list)  # (index, request)
    budget_cut: int = 0  # tokens taken off vLLM's step budget for this call

    def restore(self) -> None:
        """Puts back the running requests at their places and rebuilds the waiting queue in
        its order before the call, less what started, after any request vLLM preempted."""
        s = self.scheduler
        s.max_num_scheduled_tokens += self.budget_cut
        for index, request in self.running:
            s.running.insert(min(index, len(s.running)), request)
        left = list(s.waiting)
        if left:
            s.waiting.remove_requests(left)
        before = {id(r) for r in self.order}
        started = {id(r) for r in s.running}
        back = [r for r in left if id(r) not in before]
        back += [r for r in self.order if id(r) not in started and r.request_id in s.requests]
        for request in back:
            s.waiting.add_request(request)
        self.order, self.running, self.budget_cut = [], [], 0


class Adapter:
    def __init__(self, scheduler, settings: AdapterSettings, link: DaemonLink | None = None) -> None:
        self.s = scheduler
        self.settings = settings
        self.metrics = AdapterMetrics()
        self.books = Books(len(scheduler.kv_cache_config.kv_cache_groups))
        self.block_sizes = (scheduler.block_size, scheduler.hash_block_size)
        self.arrivals: list[str] = []
        self.finishes: list[str] = []
        self.aborts: list[str] = []
        self.requeue: list[str] = []  # aborted in the daemon this step, submitted again the next
        self.down_since: float | None = None
        self.admit_tokens = 0  # what the last step told the daemon vLLM could still start
        self._planned: tuple[list, int] | None = None  # the last step's (running it planned, budget left)
        self.link = link or DaemonLink(settings.target, settings.engine_id, token=settings.token,
                                       credentials=_credentials(settings), step_timeout_s=settings.step_timeout_s,
                                       replace_existing=settings.replace_existing)
        self.plan_checked = False
        try:
            self.link.open(settings.connect_timeout_s)
            self._check_plan()
        except LinkDown as error:
            self._down(error)

    # ------------------------------------------------------------ vLLM's hooks
    def arrived(self, request) -> None:
        self.arrivals.append(request.request_id)

    def ended(self, requests, aborted: bool) -> None:
        for request in requests:
            rid = request.request_id
            if rid in self.books.known:
                (self.finishes if self.books.running(rid) and not aborted else self.aborts).append(rid)
                self.books.forget(rid)

    def outputs(self, engine_core_outputs) -> None:
        for eco in engine_core_outputs.values():
            for out in eco.outputs:
                if out.finish_reason is not None and out.request_id in self.books.known:
                    self.ended([out], aborted=not self.books.running(out.request_id))

    def before(self) -> Gate:
        self._planned = None
        try:
            try:
                decisions = self._step()
            except SessionReset:
                decisions = self._resync()
        except (LinkDown, SessionReset) as error:
            self._down(error)
            return self._fail_gate()
        if self.down_since is not None:
            log.warning("kvbudget daemon at %s answers again: it decides again", self.settings.target)
            self.down_since = None
            if not self.plan_checked:  # (the daemon was not up when vLLM started)
                self._check_plan()
        self.metrics.add("steps")
        verdict = self.books.apply(decisions)
        for rid, reason in verdict.rejected.items():
            self._reject(rid, reason)
        self._preempt_unheld()
        gate = self._gate(verdict.denied)
        # A request preempted or denied this step leaves vLLM more of its token budget than
        # the step told the daemon (admit_tokens): vLLM would give the requests the daemon
        # admitted longer first chunks than the blocks granted. Its budget is cut to match.
        left = self._budget_left()
        if left > self.admit_tokens:
            gate.budget_cut = left - self.admit_tokens
            self.s.max_num_scheduled_tokens -= gate.budget_cut
        return gate

    def after(self, output) -> None:
        running = {id(r) for r in self.s.running}
        ready, requests = self.books.ready, self.s.requests
        for rid in list(ready):
            request = requests.get(rid)
            if request is None or id(request) in running:
                ready.pop(rid, None)
        if self.down_since is None and self.settings.check_accounting:
            self.check_accounting()
        self._take_back_dropped(running)

    def _take_back_dropped(self, running: set[int]) -> None:
        """A request the daemon runs that vLLM itself preempted (its pool disagreed: a drift
        already counted) would wait for an admission that never comes: it is aborted in the
        daemon and submitted again with the next step, so nothing stalls. `running`: the ids
        of the request objects vLLM runs."""
        for rid in [rid for rid in self.books.held if rid not in self.books.ready]:
            request = self.s.requests.get(rid)
            if request is not None and id(request) not in running:
                log.warning("kvbudget: vLLM preempted %r by itself; submitting it to the daemon again", rid)
                self.aborts.append(rid)
                self.books.forget(rid)
                self.requeue.append(rid)

    def check_accounting(self) -> list:
        requests, ids = self.s.requests, [r.request_id for r in self.s.running]
        running = set(ids)
        ids += [rid for rid in self.books.held if rid not in running and rid in requests]
        held = vllm_held(self.s.kv_cache_manager, ids)
        drifts = self.books.drift(held)
        for drift in drifts:
            self.metrics.add("drift")
            log.warning("kvbudget accounting drift: %s", drift.line())
        return drifts

    def close(self) -> None:
        """Tells the daemon the ends it has not heard yet (else closing the session would
        release them as aborted), then closes the session."""
        if (self.finishes or self.aborts) and self.down_since is None:
            try:
                self.books.apply(self.link.step((), (), (), self.finishes, self.aborts))
            except (LinkDown, SessionReset):
                pass
        self.link.close()

    # ------------------------------------------------------------ the step
    def _step(self) -> list:
        s, books = self.s, self.books
        held_running = [r for r in s.running if books.running(r.request_id)]
        progress = []
        for r in held_running:
            rid, computed = r.request_id, min(r.num_computed_tokens, books.slots[r.request_id])
            if computed != books.computed.get(rid, 0):
                progress.append((rid, computed))
        coming, budget_left = coming_tokens(s, held_running)
        grows = self._grows(coming, dict(progress))
        submits = [self._spec(s.requests[rid]) for rid in dict.fromkeys(self.arrivals) if rid in s.requests]
        self.admit_tokens = max(budget_left, 0)
        self._planned = (held_running, budget_left)
        decisions = self.link.step(submits, grows, progress, self.finishes, self.aborts, admit_tokens=self.admit_tokens,
                                   admit_seqs=max(s.max_num_running_reqs - len(s.running), 0))
        for rid, computed in progress:
            books.computed[rid] = computed
        for spec in submits:
            books.submitted(spec.request_id)
        self.arrivals, self.finishes, self.aborts, self.requeue = self.requeue, [], [], []
        return decisions

    def _budget_left(self) -> int:
        """vLLM's token budget left after the requests it runs now. Worked out again only when
        the running list is not the one the step planned with (a preemption, a denial) or
        vLLM caps long prefills (then the waiting queue's length counts too): else the same
        sum over the same requests."""
        s, planned = self.s, self._planned
        if planned is not None and not s.scheduler_config.long_prefill_token_threshold:
            running, left = planned
            if len(running) == len(s.running) and all(a is b for a, b in zip(running, s.running)):
                return left
        return coming_tokens(s, s.running)[1]

    def _grows(self, coming, progress: dict[str, int]) -> list[tuple[str, int]]:
        """Grows for the requests whose coming step needs a block they do not hold, to the end
        of that block, latest admitted first (docs/vllm.md, "One step": why both)."""
        s, books, block = self.s, self.books, self.block_sizes[0]
        grows = []
        for c in reversed(coming):
            rid = c.request_id
            if c.slots <= books.slots[rid]:
                continue
            request = s.requests[rid]
            computed = progress.get(rid, books.computed.get(rid, 0))
            end = min(-(-c.slots // block) * block, _max_len(request, s.max_model_len),
                      computed + s.scheduler_config.max_num_batched_tokens)
            grows.append((rid, max(end, c.slots)))
        return grows

    def _resync(self) -> list:
        """A new session: the daemon holds nothing of ours. What vLLM runs is submitted at
        the length whose KV it holds; what waits goes in with the next step's arrivals."""
        self.metrics.add("resyncs")
        self.books.forget_all()
        self.finishes, self.aborts = [], []
        specs = [self._spec(r, resume=True) for r in self.s.running]
        self.admit_tokens = self.s.max_num_scheduled_tokens  # (nothing waiting is submitted)
        decisions = self.link.step(specs)
        for spec in specs:
            self.books.submitted(spec.request_id)
        self.arrivals = [r.request_id for r in self.s.waiting]
        return decisions

    def _spec(self, request, resume: bool = False):
        tenant = request_tenant(request, self.settings.tenant_field, self.settings.tenant)
        return submit_spec(request, self.settings.engine_id, tenant, self.block_sizes, resume)

    # ------------------------------------------------------------ enacting
    def _reject(self, rid: str, reason: str) -> None:
        self.metrics.add("rejections")
        self.s.kvbudget_reject(rid, f"the KV-cache budget daemon (kvbudget) rejected this request: {reason}")

    def _preempt_unheld(self) -> None:
        """Preempts in vLLM each running request the daemon does not hold (it preempted it,
        or queued it when it was submitted again)."""
        now = time.monotonic()
        for request in [r for r in self.s.running if not self.books.running(r.request_id)]:
            self.s.running.remove(request)
            self.s._preempt_request(request, now)
            self.metrics.add("daemon_preemptions")

    def _gate(self, denied: set[str]) -> Gate:
        s = self.s
        gate = Gate(s, order=list(s.waiting))
        # vLLM sees only what the daemon admitted, in the daemon's order.
        if gate.order:
            s.waiting.remove_requests(gate.order)
        by_id = {r.request_id: r for r in gate.order}
        for rid in self.books.ready:
            if rid in by_id:
                s.waiting.add_request(by_id[rid])
        gate.running = [(i, r) for i, r in enumerate(s.running) if r.request_id in denied]
        for _, request in reversed(gate.running):
            s.running.remove(request)
        return gate

    def _fail_gate(self) -> Gate:
        self.metrics.add("unreachable_steps")
        gate = Gate(self.s)
        if self.settings.fail_mode == "closed":  # nothing new starts without the daemon
            gate.order = list(self.s.waiting)
            if gate.order:
                self.s.waiting.remove_requests(gate.order)
        return gate

    def _down(self, error: BaseException) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
            self.metrics.add("link_failures")
            what = "vLLM admits by itself" if self.settings.fail_mode == "open" else "no new request starts"
            log.warning("kvbudget daemon at %s unreachable (%s): fail_%s, %s until it answers",
                        self.settings.target, error, self.settings.fail_mode, what)

    def _check_plan(self) -> None:
        self.plan_checked = True
        plan, s = self.link.plan, self.s
        ours = (s.kv_cache_config.num_blocks, s.block_size, len(s.kv_cache_config.kv_cache_groups))
        theirs = (plan.num_blocks + 1, plan.block_size_tokens, len(plan.groups))
        if ours != theirs:
            log.warning("kvbudget: vLLM's KV cache (blocks, block size, groups) %s differs from the daemon's "
                        "pool %s (its null block counted): the books cannot agree", ours, theirs)


def _max_len(request, max_model_len: int) -> int:
    return min(request.num_prompt_tokens + request.max_tokens, max_model_len)


def _credentials(settings: AdapterSettings):
    if not settings.tls_ca:
        return None
    from kvbudget.client.tls import TlsFile, TlsFiles, channel_credentials

    def pick(path: str | None, name: str):
        return TlsFile(path, f"$KVBUDGET_{name}") if path else None

    return channel_credentials(TlsFiles(ca=pick(settings.tls_ca, "TLS_CA"), cert=pick(settings.tls_cert, "TLS_CERT"),
                                        key=pick(settings.tls_key, "TLS_KEY")))
