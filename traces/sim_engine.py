"""One simulated engine: its clock, its batch, one scheduling step at a time.

A step is `build_step` (the asks for one backend call), `apply` (each decision that call
returned), then `run_step` (run the batch, advance the clock); `skip_quiet_steps` takes
runs of decode-only steps in one go. The step-time model and the order of a step:
docs/architecture/traces.md.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

from kvbudget.daemon.core.budget import cache_hit_tokens
from kvbudget.daemon.core.records import Decision, DecisionKind, RequestSpec
from kvbudget.daemon.core.spec import KVCacheLayout
from kvbudget.daemon.core.step import StepOps
from kvbudget.traces.sim_request import FINISHED, LOST, QUEUED, REJECTED, RUNNING, SimRequest


ENGINE_MODEL_NAMES = ("decodes-first", "vllm")


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    step_base_s: float = 0.020
    per_prefill_token_s: float = 50e-6
    per_decode_seq_s: float = 0.0
    grow_ahead_blocks: int = 4  # growth asked this many blocks past the step's need
    max_model_len: int = 131072
    # max_tokens each request asks for; a request whose output is longer asks for its
    # output (it must fit). None: the longest output among the requests simulated (the
    # replay CLI passes the whole trace's instead, so a slice asks what the service did).
    max_new_tokens: int | None = None
    # How a step is built: "decodes-first" (this file's SimEngine), or "vllm" as vLLM 0.33's
    # scheduler under kvbudget.vllm builds it (sim_engine_vllm.py; docs/vllm.md).
    engine_model: str = "decodes-first"

    def __post_init__(self) -> None:
        if self.engine_model not in ENGINE_MODEL_NAMES:
            raise ValueError(f"engine_model: one of {', '.join(ENGINE_MODEL_NAMES)}, got {self.engine_model!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")
        for name in ("step_base_s", "per_prefill_token_s", "per_decode_seq_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if self.step_base_s == 0 and self.per_prefill_token_s == 0:
            raise ValueError("step_base_s: a step must take some time (base or per prefill token)")
        if self.grow_ahead_blocks < 0:
            raise ValueError(f"grow_ahead_blocks: must be >= 0, got {self.grow_ahead_blocks}")


_NO_OPS, _NO_SUBMITS = StepOps(), []  # a step with nothing to ask: never filled (only tested)


class SimEngine:
    """One engine: its requests, its clock, its batch."""

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
        self.local_waiting: deque[SimRequest] = deque()
        self.in_flight = 0  # submitted and not finished/rejected
        self.num_running = 0
        self.num_queued = 0
        self.prefilling: dict[str, SimRequest] = {}  # not in steady decode, admission order
        self.decoding: dict[str, SimRequest] = {}
        self.due: list[tuple[int, int, int, SimRequest]] = []  # (step, version, tiebreak, req)
        self._tiebreak = 0
        self.admitted_now: list[SimRequest] = []  # admitted during the current call
        self.pending_finishes: list[str] = []
        self.pending_progress: dict[str, int] = {}  # request id -> computed tokens
        self.stalled = False  # the last step ran nothing

    # ----------------------------------------------------------------- queries
    @property
    def idle(self) -> bool:
        return not (self.arrivals or self.local_waiting or self.in_flight or self.pending_finishes)

    def waiting(self) -> int:
        return len(self.local_waiting) + self.num_queued

    # ------------------------------------------------------------ lazy decode
    def _generated(self, r: SimRequest) -> int:
        return self.step_index - r.decode_anchor

    def _enter_decode(self, r: SimRequest) -> None:
        r.decode_anchor = self.step_index - r.generated
        r.version += 1
        self.decoding[r.request_id] = r
        # At step n the request holds generated(n) tokens and needs prompt + generated(n)
        # slots; it finishes (sits out) at the step where generated(n) == output.
        finish_step = self.step_index + r.output - r.generated
        grow_step = self.step_index + r.granted - r.prompt - r.generated + 1
        self._tiebreak += 1
        heapq.heappush(self.due, (min(finish_step, grow_step), r.version, self._tiebreak, r))

    def _leave_decode(self, r: SimRequest) -> None:
        """Materialise lazy counters: the request is handled one by one from now on."""
        del self.decoding[r.request_id]
        r.generated = self._generated(r)
        r.computed = r.prompt + r.generated - 1
        r.version += 1
        self.prefilling[r.request_id] = r

    # ------------------------------------------------------------ decisions
    def apply(self, d: Decision, r: SimRequest, now: float) -> None:
        kind = d.kind
        if kind is DecisionKind.ADMIT:
            if r.state == RUNNING:
                # Live, the PREEMPT that came first may still be on its way (another
                # engine's call caused it); this ADMIT says it happened.
                self._preempt(r)
            if r.state != QUEUED:
                # e.g. preempted after it finished but before its finish reached the
                # daemon, then re-admitted: the finish on its way releases it.
                return
            r.state = RUNNING
            self.num_queued -= 1
            self.num_running += 1
            r.granted = d.num_tokens
            # Tokens the prefix cache spares: the daemon's count when it gives one.
            groups = self.layout.groups
            r.computed = d.num_computed or cache_hit_tokens(groups, [d.cached_hit_blocks] * len(groups), r.prompt)
            if r.admitted_s is None:  # hits counted once a request: its own blocks found again are not
                r.admitted_s = now
                r.hit_blocks += d.cached_hit_blocks
                r.query_blocks += len(r.hashes)
                r.first_prefill = r.prompt - r.computed
            r.version += 1
            self.prefilling[r.request_id] = r
            self.admitted_now.append(r)
        elif kind is DecisionKind.GROW:
            if r.state == RUNNING:
                r.granted = max(r.granted, d.num_tokens)
        elif kind is DecisionKind.PREEMPT or (kind is DecisionKind.DENY and d.reason.value == "not_running"):
            # (a growth denied as "not running": the PREEMPT before it is still on its way)
            if r.state == RUNNING:
                self._preempt(r)
        elif kind is DecisionKind.REJECT:
            if r.state != QUEUED:
                return
            self.num_queued -= 1
            r.state = REJECTED
            r.reject_reason = d.reason.value
            self.in_flight -= 1
        elif kind is DecisionKind.EXPIRE:
            if r.state == RUNNING:
                self.num_running -= 1
                self.decoding.pop(r.request_id, None)
                self.prefilling.pop(r.request_id, None)
            elif r.state == QUEUED:
                self.num_queued -= 1
            if r.state in (RUNNING, QUEUED):
                self.in_flight -= 1
            self.pending_progress.pop(r.request_id, None)
            r.state = LOST
            r.version += 1
        # QUEUE, DENY, RECLAIM, RELEASE, POLICY: nothing for the engine to do here.

    def _preempt(self, r: SimRequest) -> None:
        if r.request_id in self.decoding:
            self._leave_decode(r)
        self.prefilling.pop(r.request_id, None)
        self.pending_progress.pop(r.request_id, None)  # stale once the KV is gone
        r.state = QUEUED
        r.preemptions += 1
        r.granted = 0
        r.computed = 0  # recompute from scratch when re-admitted
        r.version += 1
        self.num_running -= 1
        self.num_queued += 1

    # ------------------------------------------------------------- the step
    def build_step(self) -> tuple[StepOps, list[tuple[SimRequest, int, int]], list[tuple[SimRequest, int]]]:
        """Ops for this step, the scheduled (request, tokens, version) and the decode grows
        (request, need)."""
        due = self.due
        if self.in_flight >= self.config.max_num_seqs and not (
            self.pending_progress or self.pending_finishes or self.prefilling or (due and due[0][0] <= self.step_index)
        ):  # decodes only, nothing to ask, no room to submit (arrivals just move in): empty ops
            self._submit_arrivals(_NO_SUBMITS)
            return _NO_OPS, [], []
        ops = StepOps()
        progress = self.pending_progress
        self.pending_progress = {}
        self._submit_arrivals(ops.submits)
        decode_grows = self._due_decodes(ops.grows, progress)
        ops.finishes = self.pending_finishes  # with those the due decodes just finished
        self.pending_finishes = []
        ops.progress = list(progress.items())
        scheduled = self._schedule_prefills(ops.grows)
        # What is left of the step for admissions (vLLM admits while its budget lasts).
        ops.admit_tokens = self.config.max_num_batched_tokens - len(self.decoding) - sum(t for _, t, _ in scheduled)
        ops.admit_seqs = self.config.max_num_seqs - self.num_running
        return ops, scheduled, decode_grows

    def _submit_arrivals(self, submits: list[RequestSpec]) -> None:
        """Arrivals up to the clock wait in the engine; as many as `max_num_seqs` allows
        in flight are submitted."""
        arrivals = self.arrivals
        now = self.clock
        while arrivals and arrivals[0].arrival_s <= now:
            self.local_waiting.append(arrivals.popleft())
        max_num_seqs = self.config.max_num_seqs
        while self.local_waiting and self.in_flight < max_num_seqs:
            r = self.local_waiting.popleft()
            r.state = QUEUED
            self.in_flight += 1
            self.num_queued += 1
            submits.append(
                RequestSpec(
                    request_id=r.request_id,
                    prompt_tokens=r.prompt,
                    max_new_tokens=r.max_new,
                    prefix_hashes=r.hashes,
                    priority=r.trace.priority,
                    tenant=r.trace.tenant,
                    engine_id=self.engine_id,
                    arrival_s=r.arrival_s,
                )
            )

    def _due_decodes(self, grows: list[tuple[str, int]], progress: dict[str, int]) -> list[tuple[SimRequest, int]]:
        """Decoding requests that are due finish, or ask to grow; returns (request, need)
        of each grow."""
        cfg = self.config
        ahead = cfg.grow_ahead_blocks * self.block_size
        n = self.step_index
        due = self.due
        decode_grows: list[tuple[SimRequest, int]] = []
        while due and due[0][0] <= n:
            _, version, _, r = heapq.heappop(due)
            if version != r.version or r.request_id not in self.decoding:
                continue
            generated = n - r.decode_anchor
            if generated >= r.output:
                self._finish(r)
                progress.pop(r.request_id, None)
                continue
            need = r.prompt + generated
            grows.append((r.request_id, min(r.cap, need + ahead, need - 1 + cfg.max_num_batched_tokens)))
            progress[r.request_id] = need - 1  # lets window blocks go back
            decode_grows.append((r, need))
        return decode_grows

    def _schedule_prefills(self, grows: list[tuple[str, int]]) -> list[tuple[SimRequest, int, int]]:
        """Prefills, recomputes and stalled decodes, in admission order, within the step's
        token and sequence budget left by the decodes; asks the growth each needs."""
        cfg = self.config
        ahead = cfg.grow_ahead_blocks * self.block_size
        budget = cfg.max_num_batched_tokens - len(self.decoding)
        seqs = len(self.decoding)
        scheduled: list[tuple[SimRequest, int, int]] = []
        for r in self.prefilling.values():
            if seqs >= cfg.max_num_seqs or budget <= 0:
                break
            remaining = r.prompt + r.generated - r.computed
            tokens = min(remaining, budget) if remaining > 0 else 1
            need = r.computed + tokens
            if need > r.granted:
                # Ahead, but within F of what is computed: the reservation contract.
                target = min(need + ahead, r.prompt + r.generated, r.computed + cfg.max_num_batched_tokens)
                grows.append((r.request_id, min(r.cap, max(need, target))))
            scheduled.append((r, tokens, r.version))
            budget -= tokens
            seqs += 1
        return scheduled

    def _finish(self, r: SimRequest) -> None:
        """Generated everything: release at the next call."""
        if r.request_id in self.decoding:
            del self.decoding[r.request_id]
        self.prefilling.pop(r.request_id, None)
        r.generated = r.output
        r.state = FINISHED
        r.finished_s = self.clock
        r.version += 1
        self.num_running -= 1
        self.in_flight -= 1
        self.pending_finishes.append(r.request_id)

    def run_step(self, scheduled: list[tuple[SimRequest, int, int]], decode_grows: list[tuple[SimRequest, int]]) -> float:
        """After the call's decisions are applied: run the batch, advance the clock."""
        if not (scheduled or decode_grows or self.admitted_now):  # decodes only (build_step's empty ops)
            seqs = len(self.decoding)
            return self._advance(0, seqs) if seqs else 0.0
        cfg = self.config
        # Decoding requests whose growth was refused sit out, one by one from now on.
        for r, need in decode_grows:
            if r.request_id in self.decoding and r.granted < need:
                self._leave_decode(r)
            elif r.request_id in self.decoding:
                self._reschedule_decode(r)
        # Scheduled requests run if still as scheduled (not preempted or re-admitted since:
        # same version) and granted the slots.
        batch = [(r, t) for r, t, version in scheduled
                 if r.version == version and r.state == RUNNING and r.computed + t <= r.granted]  # fmt: skip
        seqs = len(self.decoding) + len(batch)
        budget = cfg.max_num_batched_tokens - len(self.decoding) - sum(t for _, t in batch)
        in_batch = {r.request_id for r, _ in batch}
        for r in self.admitted_now:  # admitted by this call: start now if there is room
            if seqs >= cfg.max_num_seqs or budget <= 0:
                break
            if r.state != RUNNING or r.request_id in in_batch or r.request_id not in self.prefilling:
                continue
            remaining = r.prompt + r.generated - r.computed
            tokens = min(remaining, budget, r.granted - r.computed)
            if tokens <= 0:
                continue
            batch.append((r, tokens))
            in_batch.add(r.request_id)
            budget -= tokens
            seqs += 1
        self.admitted_now = []

        if seqs == 0:
            return 0.0
        # A request whose only missing token is its last generated one is decoding.
        prefill_tokens = sum(t for r, t in batch if r.computed + 1 < r.prompt + r.generated or r.generated == 0)
        duration = self._advance(prefill_tokens, seqs)
        now = self.clock
        for r, tokens in batch:
            was_prefill = r.computed + 1 < r.prompt + r.generated or r.generated == 0
            if was_prefill:
                r.prefilled += tokens
            r.computed += tokens
            if r.computed < r.prompt + r.generated:
                self.pending_progress[r.request_id] = r.computed
                continue
            # The step that completes the prompt (or a recompute) samples the next token.
            r.generated += 1
            if r.first_token_s is None:
                r.first_token_s = now
            if r.generated >= r.output:
                self._finish(r)
            else:
                if was_prefill:
                    self.pending_progress[r.request_id] = r.computed  # prompt blocks: cacheable
                del self.prefilling[r.request_id]
                self._enter_decode(r)
        return duration

    def _advance(self, prefill_tokens: int, seqs: int) -> float:
        """One step of `seqs` sequences (`prefill_tokens` prompt tokens): its duration."""
        cfg = self.config
        duration = cfg.step_base_s + prefill_tokens * cfg.per_prefill_token_s + seqs * cfg.per_decode_seq_s
        self.clock += duration
        self.step_index += 1
        self.steps += 1
        return duration

    def skip_quiet_steps(self, horizon: float) -> None:
        """Run, in one go, the decode-only steps before anything happens.

        When no request prefills, nothing is due and nothing was left to report, the next
        steps are identical: every decoding request gains a token, nobody asks anything.
        They are skipped up to the next due step, the next arrival, and `horizon` (the
        clock of the next other engine, so engines still interleave in time order).
        """
        if self.prefilling or self.pending_progress or self.pending_finishes or self.local_waiting:
            return
        if not self.decoding:
            return
        cfg = self.config
        duration = cfg.step_base_s + len(self.decoding) * cfg.per_decode_seq_s
        skip = (self.due[0][0] - self.step_index) if self.due else 1 << 62
        if self.arrivals:
            # the arrival is submitted by the first step starting at or after it
            skip = min(skip, max(0, math.ceil((self.arrivals[0].arrival_s - self.clock) / duration)))
        if horizon < math.inf:
            skip = min(skip, max(0, math.floor((horizon - self.clock) / duration)))
        if skip > 0:
            self.clock += skip * duration
            self.step_index += skip
            self.steps += skip

    def _reschedule_decode(self, r: SimRequest) -> None:
        """A due decoding request grew: compute its next due step from the new grant."""
        generated = self.step_index - r.decode_anchor
        finish_step = self.step_index + r.output - generated
        grow_step = self.step_index + r.granted - r.prompt - generated + 1
        r.version += 1
        self._tiebreak += 1
        heapq.heappush(self.due, (min(finish_step, grow_step), r.version, self._tiebreak, r))
