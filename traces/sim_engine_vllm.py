"""The `vllm` engine model: a simulated engine that steps as vLLM 0.33's scheduler does
under `kvbudget.vllm.Scheduler`, so an offline replay makes the daemon's decisions of a
vLLM run (`kvbudget replay --offline --engine-model vllm`).

Each step, as the adapter builds it (kvbudget/vllm/adapter.py, plan.py): every arrival is
submitted; progress for each running request whose computed tokens moved; the step's token
budget run over the running list in order, prefill chunks and decodes alike, and a grow to
the end of the block for each request whose coming chunk passes its slots, latest admitted
first. Then vLLM's own loop: the running requests the daemon did not deny, in order, then
those it admitted, in its order, within the budget the step told it. No step is skipped
(progress goes every step); the default engine model, and what it does otherwise, is
sim_engine.py's (docs/vllm.md, "Measured": what the two differ in).
"""

from __future__ import annotations

from collections import deque

from kvbudget.daemon.core.budget import cache_hit_tokens
from kvbudget.daemon.core.records import Decision, DecisionKind, RequestSpec
from kvbudget.daemon.core.spec import KVCacheLayout
from kvbudget.daemon.core.step import StepOps
from kvbudget.traces.sim_engine import EngineConfig, SimEngine
from kvbudget.traces.sim_request import FINISHED, LOST, QUEUED, REJECTED, RUNNING, SimRequest

ARRIVAL_SLACK_S = 1e-12  # an arrival at the step's clock, up to float noise, is submitted by it


class VllmEngine:
    """One engine stepping as vLLM + kvbudget.vllm: the same face to `Simulation` as SimEngine."""

    def __init__(self, engine_id: str, index: int, config: EngineConfig, layout: KVCacheLayout) -> None:
        self.engine_id = engine_id
        self.index = index
        self.config = config
        self.layout = layout
        self.block_size = layout.block_size
        self.clock = 0.0
        self.step_index = 0
        self.steps = 0
        self.calls = 0
        self.arrivals: deque[SimRequest] = deque()
        self.local_waiting: deque[SimRequest] = deque()  # stays empty: every arrival is submitted
        self.in_flight = 0  # submitted and not finished/rejected
        self.num_running = 0  # running in the daemon: vLLM's running list and `ready`
        self.num_queued = 0
        self.running: list[SimRequest] = []  # vLLM's running list: the order they started in
        self.ready: dict[str, SimRequest] = {}  # admitted, not yet started: the daemon's order
        self.reported: dict[str, int] = {}  # the computed tokens last sent as progress
        self.denied: set[str] = set()  # growth denied this step: sits the step out
        self.admit_tokens = 0  # what this step told the daemon vLLM can still start
        self.pending_finishes: list[str] = []
        self.stalled = False

    @property
    def idle(self) -> bool:
        return not (self.arrivals or self.in_flight or self.pending_finishes)

    def waiting(self) -> int:
        return self.num_queued

    # ------------------------------------------------------------ decisions
    def apply(self, d: Decision, r: SimRequest, now: float) -> None:
        kind = d.kind
        if kind is DecisionKind.ADMIT:
            if r.state == RUNNING:  # live: the PREEMPT before it is still on its way
                self._preempt(r)
            if r.state != QUEUED:
                return
            r.state = RUNNING
            self.num_queued -= 1
            self.num_running += 1
            r.granted = d.num_tokens
            groups = self.layout.groups
            r.computed = d.num_computed or cache_hit_tokens(groups, [d.cached_hit_blocks] * len(groups), r.prompt)
            if r.admitted_s is None:
                r.admitted_s = now
                r.hit_blocks += d.cached_hit_blocks
                r.query_blocks += len(r.hashes)
                r.first_prefill = r.prompt - r.computed
            self.ready[r.request_id] = r
        elif kind is DecisionKind.GROW:
            if r.state == RUNNING:
                r.granted = max(r.granted, d.num_tokens)
        elif kind is DecisionKind.PREEMPT or (kind is DecisionKind.DENY and d.reason.value == "not_running"):
            if r.state == RUNNING:
                self._preempt(r)
        elif kind is DecisionKind.DENY:
            self.denied.add(r.request_id)
        elif kind is DecisionKind.REJECT:
            if r.state == QUEUED:
                self.num_queued -= 1
                self.in_flight -= 1
                r.state = REJECTED
                r.reject_reason = d.reason.value
        elif kind is DecisionKind.EXPIRE and r.state in (RUNNING, QUEUED):
            if r.state == RUNNING:
                self._drop(r)
                self.num_running -= 1
            else:
                self.num_queued -= 1
            self.in_flight -= 1
            r.state = LOST

    def _drop(self, r: SimRequest) -> None:
        """Out of vLLM's running list (or `ready`), its progress forgotten."""
        if self.ready.pop(r.request_id, None) is None:
            self.running.remove(r)
        self.reported.pop(r.request_id, None)

    def _preempt(self, r: SimRequest) -> None:
        self._drop(r)
        r.state = QUEUED
        r.preemptions += 1
        r.granted = 0
        r.computed = 0  # vLLM recomputes prompt and output so far when it resumes
        self.num_running -= 1
        self.num_queued += 1

    # ------------------------------------------------------------- the step
    def build_step(self) -> tuple[StepOps, list, list]:
        """The adapter's Step for the coming `schedule()` (the two lists: SimEngine's face)."""
        ops = StepOps()
        self._submit_arrivals(ops.submits)
        ops.finishes, self.pending_finishes = self.pending_finishes, []
        reported = self.reported
        for r in self.running:
            computed = min(r.computed, r.granted)
            if computed != reported.get(r.request_id, 0):
                ops.progress.append((r.request_id, computed))
                reported[r.request_id] = computed
        coming, left = self._coming(self.running, self.config.max_num_batched_tokens)
        block = self.block_size
        for r, tokens in reversed(coming):  # latest admitted first
            slots = r.computed + tokens
            if slots > r.granted:
                end = min(-(-slots // block) * block, r.cap, reported.get(r.request_id, 0) + self.config.max_num_batched_tokens)
                ops.grows.append((r.request_id, max(end, slots)))
        self.admit_tokens = ops.admit_tokens = max(left, 0)
        ops.admit_seqs = max(self.config.max_num_seqs - len(self.running), 0)
        self.denied = set()
        return ops, [], []

    def _coming(self, running: list[SimRequest], budget: int) -> tuple[list[tuple[SimRequest, int]], int]:
        """vLLM's running loop: each request's chunk in order while the budget lasts."""
        max_len = self.config.max_model_len
        coming = []
        for r in running:
            if budget <= 0:
                break
            tokens = min(r.prompt + r.generated - r.computed, budget, max_len - r.computed - 1)
            if tokens > 0:
                coming.append((r, tokens))
                budget -= tokens
        return coming, budget

    def _submit_arrivals(self, submits: list[RequestSpec]) -> None:
        arrivals = self.arrivals
        while arrivals and arrivals[0].arrival_s <= self.clock + ARRIVAL_SLACK_S:
            r = arrivals.popleft()
            r.state = QUEUED
            self.in_flight += 1
            self.num_queued += 1
            submits.append(RequestSpec(
                request_id=r.request_id, prompt_tokens=r.prompt, max_new_tokens=r.max_new,
                prefix_hashes=r.hashes, priority=r.trace.priority, tenant=r.trace.tenant,
                engine_id=self.engine_id, arrival_s=r.arrival_s,
            ))  # fmt: skip

    def run_step(self, scheduled: list, decode_grows: list) -> float:
        """vLLM's `schedule()` over what the daemon allowed, then the batch run."""
        batch = self._schedule()
        if not batch:
            return 0.0
        cfg = self.config
        prefill = sum(t for r, t in batch if r.computed + 1 < r.prompt + r.generated or r.generated == 0)
        duration = cfg.step_base_s + prefill * cfg.per_prefill_token_s + len(batch) * cfg.per_decode_seq_s
        self.clock += duration
        self.step_index += 1
        self.steps += 1
        for r, tokens in batch:
            if r.computed + 1 < r.prompt + r.generated or r.generated == 0:
                r.prefilled += tokens
            r.computed += tokens
            if r.computed < r.prompt + r.generated:
                continue  # a prefill chunk: no token yet
            r.generated += 1
            if r.first_token_s is None:
                r.first_token_s = self.clock
            if r.generated >= r.output:
                self._finish(r)
        return duration

    def _schedule(self) -> list[tuple[SimRequest, int]]:
        """The running requests (less the denied), then the admitted ones in the daemon's
        order, within the budget cut to what the step told the daemon (the adapter's gate)."""
        cfg = self.config
        running = [r for r in self.running if r.request_id not in self.denied] if self.denied else self.running
        budget = cfg.max_num_batched_tokens
        _, left = self._coming(running, budget)
        if left > self.admit_tokens:
            budget -= left - self.admit_tokens
        batch = []
        for r, tokens in self._coming(running, budget)[0]:
            tokens = min(tokens, r.granted - r.computed)  # (never past the slots granted)
            if tokens > 0:
                batch.append((r, tokens))
        budget -= sum(t for _, t in batch)
        seqs = len(running)
        for r in list(self.ready.values()):
            if budget <= 0 or seqs >= cfg.max_num_seqs:
                break
            tokens = min(r.prompt + r.generated - r.computed, budget, r.granted - r.computed)
            if tokens <= 0:
                continue
            del self.ready[r.request_id]
            self.running.append(r)
            batch.append((r, tokens))
            budget -= tokens
            seqs += 1
        return batch

    def _finish(self, r: SimRequest) -> None:
        """Generated everything: vLLM frees it; the daemon hears it with the next step."""
        self._drop(r)
        r.state = FINISHED
        r.finished_s = self.clock
        self.num_running -= 1
        self.in_flight -= 1
        self.pending_finishes.append(r.request_id)

    def skip_quiet_steps(self, horizon: float) -> None:
        """None to skip: every step reports each running request's progress."""


ENGINE_MODELS = {"decodes-first": SimEngine, "vllm": VllmEngine}
