"""A simulated inference engine: continuous batching with chunked prefill, in virtual time.

It plays what vLLM's scheduler does with a request's KV blocks, against KVBudget's
admission (in-process or over gRPC), without running a model.

Step-time model (one engine step, in seconds):

    step = step_base + prefill_tokens x per_prefill_token + batch_seqs x per_decode_seq

defaults 20 ms, 50 us and 0: a fixed launch/sampling cost plus compute that grows with
prefill tokens; decode tokens are memory-bound and ride along for (almost) free.

Each step, per engine:
1. arrivals up to the clock are submitted (at most `max_num_seqs` requests in flight at
   the daemon; the rest wait in the engine);
2. running requests are scheduled: every decoding request 1 token, then prefills (and
   recomputes) in admission order, in chunks, within `max_num_batched_tokens` and
   `max_num_seqs`;
3. one backend call carries the step's finishes, progress reports, grows (asked
   `grow_ahead_blocks` blocks ahead, so most decode steps ask nothing) and submits; a step
   with nothing to ask makes no call;
4. the decisions are applied: GROW/DENY (a denied request sits this step out), PREEMPT
   (the request loses its blocks and, once re-admitted, recomputes from scratch), ADMIT
   (requests admitted by this call start prefilling in this step if budget is left);
5. the clock advances by the step time; tokens computed and generated are booked.

Decoding requests are advanced lazily: one counts steps, and a request is touched only
when it must grow or finish (a heap of due steps); runs of decode-only steps in which
nobody asks anything are taken in one go. That keeps a 256-sequence batch cheap.

Several engines (`engines=K`) share the backend and are stepped in virtual-time order.
Live, a request's decisions may reach its engine out of order (its own Step reply before
an event another engine's call caused), so they are applied by `seq`, per request.

Determinism: given the same trace, backend and seed, the run is the same (the seed only
spreads requests that share a quantised timestamp when asked to, see `spread_arrivals`).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kvbudget.daemon.budget import cache_hit_tokens
from kvbudget.daemon.records import Decision, DecisionKind, RequestSpec
from kvbudget.daemon.spec import KVCacheLayout
from kvbudget.traces.loaders import TraceRequest, pool_prefix_hashes


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    step_base_s: float = 0.020
    per_prefill_token_s: float = 50e-6
    per_decode_seq_s: float = 0.0
    grow_ahead_blocks: int = 4  # growth asked this many blocks past the step's need
    max_model_len: int = 131072
    max_new_tokens: int | None = None  # None: each request's own output length

    def __post_init__(self) -> None:
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


@dataclass
class StepOps:
    """One engine step's asks, as one `Step` call carries them."""

    submits: list[RequestSpec] = field(default_factory=list)
    grows: list[tuple[str, int]] = field(default_factory=list)  # (request id, total slots)
    progress: list[tuple[str, int]] = field(default_factory=list)  # (request id, computed)
    finishes: list[str] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.submits or self.grows or self.progress or self.finishes or self.aborts)

    def __len__(self) -> int:
        return (
            len(self.submits) + len(self.grows) + len(self.progress) + len(self.finishes) + len(self.aborts)
        )


class Backend(Protocol):
    """Where admission happens, in-process (offline). `AsyncBackend` is the gRPC twin."""

    layout: KVCacheLayout
    num_blocks: int  # usable blocks

    def open_engine(self, engine_id: str) -> None: ...

    def step(self, engine_id: str, ops: StepOps, now: float) -> list[Decision]:
        """Apply the ops (finishes, aborts, progress, grows, submits, in that order) and
        return every decision that caused, for any engine's requests."""
        ...

    def poll(self, engine_id: str, now: float) -> list[Decision]:
        """Decisions that reached this engine outside its own calls."""
        ...

    def idle(self, engine_id: str, now: float) -> list[Decision]:
        """The engine ran nothing and has requests waiting: look at the queue again
        (the daemon does this on its own; the in-process core needs asking)."""
        ...

    def num_free_blocks(self) -> int: ...


class AsyncBackend(Protocol):
    layout: KVCacheLayout
    num_blocks: int

    async def open_engine(self, engine_id: str) -> None: ...

    async def step(self, engine_id: str, ops: StepOps, now: float) -> list[Decision]: ...

    async def poll(self, engine_id: str, now: float) -> list[Decision]:
        """Also where pacing happens: return no earlier than virtual time `now` allows."""
        ...

    async def idle(self, engine_id: str, now: float) -> list[Decision]:
        """Like poll, but wait a little for the daemon to admit something on its own."""
        ...

    def num_free_blocks(self) -> int: ...


# ------------------------------------------------------------------------- requests

PENDING, QUEUED, RUNNING, FINISHED, REJECTED, LOST = range(6)


class SimRequest:
    """One trace request as the engine sees it (mutable; engine-internal)."""

    __slots__ = (
        "request_id", "trace", "engine", "arrival_s", "prompt", "output", "max_new", "cap",
        "state", "granted", "computed", "generated", "admitted_s", "first_token_s",
        "finished_s", "preemptions", "hit_blocks", "query_blocks", "decode_anchor",
        "version", "reject_reason", "hashes", "last_seq",
    )  # fmt: skip

    def __init__(self, request_id: str, trace: TraceRequest, engine: int, arrival_s: float,
                 max_new: int, max_model_len: int) -> None:  # fmt: skip
        self.request_id = request_id
        self.trace = trace
        self.engine = engine
        self.arrival_s = arrival_s
        self.prompt = trace.prompt_tokens
        # Like vLLM, generation stops at max_model_len (a longer prompt is rejected anyway).
        room = max(1, max_model_len - self.prompt)
        self.output = min(trace.output_tokens, room)
        self.max_new = min(max_new, room)
        self.cap = min(self.prompt + self.max_new, max_model_len)  # slots it may ever ask for
        self.state = PENDING
        self.granted = 0  # slots the daemon has granted
        self.computed = 0  # tokens whose KV is written
        self.generated = 0  # output tokens produced (kept across preemptions)
        self.admitted_s: float | None = None
        self.first_token_s: float | None = None
        self.finished_s: float | None = None
        self.preemptions = 0
        self.hit_blocks = 0
        self.query_blocks = 0
        self.decode_anchor = 0  # while decoding lazily: generated = step_index - anchor
        self.version = 0  # bumps invalidate heap entries
        self.reject_reason = ""
        self.hashes: tuple[int, ...] = ()
        self.last_seq = -1  # the newest decision applied to it


def spread_arrivals(requests: Sequence[TraceRequest], seed: int, max_gap_s: float = 3.0) -> list[float]:
    """Arrival seconds, with requests sharing a timestamp spread uniformly over the gap to
    the next distinct timestamp (at most `max_gap_s`; Mooncake quantises into ~3 s buckets).

    Traces with distinct timestamps (Azure) come back unchanged. Sorted, origin kept.
    """
    rng = random.Random(seed)
    times = [r.arrival_s for r in requests]
    out: list[float] = []
    i = 0
    while i < len(times):
        j = i
        while j + 1 < len(times) and times[j + 1] == times[i]:
            j += 1
        if j == i:
            out.append(times[i])
        else:
            gap = min(max_gap_s, times[j + 1] - times[i]) if j + 1 < len(times) else max_gap_s
            offsets = sorted(rng.random() * gap for _ in range(j - i + 1))
            offsets[0] = 0.0  # the bucket's first request keeps the bucket's time
            out.extend(times[i] + o for o in offsets)
        i = j + 1
    return out


# --------------------------------------------------------------------------- engine


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
        self.hash_memo: dict[tuple[int, int], tuple[int, ...]] = {}
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
            if r.admitted_s is None:
                r.admitted_s = now
            self.num_queued -= 1
            self.num_running += 1
            r.granted = d.num_tokens
            r.hit_blocks += d.cached_hit_blocks
            r.query_blocks += len(r.hashes)
            # Tokens the prefix cache spares: the daemon's count when it gives one.
            groups = self.layout.groups
            r.computed = d.num_computed or cache_hit_tokens(groups, [d.cached_hit_blocks] * len(groups), r.prompt)
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
        cfg = self.config
        B = self.block_size
        ahead = cfg.grow_ahead_blocks * B
        ops = StepOps()
        progress = self.pending_progress
        self.pending_progress = {}

        # 1. arrivals
        now = self.clock
        arrivals = self.arrivals
        while arrivals and arrivals[0].arrival_s <= now:
            self.local_waiting.append(arrivals.popleft())
        while self.local_waiting and self.in_flight < cfg.max_num_seqs:
            r = self.local_waiting.popleft()
            r.hashes = pool_prefix_hashes(r.trace, B, self.hash_memo)
            r.state = QUEUED
            self.in_flight += 1
            self.num_queued += 1
            ops.submits.append(
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

        # 2. decoding requests that are due: finish, or grow
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
            ops.grows.append((r.request_id, min(r.cap, need + ahead, need - 1 + cfg.max_num_batched_tokens)))
            progress[r.request_id] = need - 1  # lets window blocks go back
            decode_grows.append((r, need))
        ops.finishes = self.pending_finishes
        self.pending_finishes = []
        ops.progress = list(progress.items())

        # 3. prefills / recomputes / stalled decodes, in admission order
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
                ops.grows.append((r.request_id, min(r.cap, max(need, target))))
            scheduled.append((r, tokens, r.version))
            budget -= tokens
            seqs += 1
        return ops, scheduled, decode_grows

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
        duration = cfg.step_base_s + prefill_tokens * cfg.per_prefill_token_s + seqs * cfg.per_decode_seq_s
        self.clock += duration
        self.step_index += 1
        self.steps += 1
        now = self.clock
        for r, tokens in batch:
            was_prefill = r.computed + 1 < r.prompt + r.generated or r.generated == 0
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


# --------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Sample:
    time_s: float
    free_blocks: int
    running: int
    waiting: int
    kv_usage: float


@dataclass
class SimRun:
    """What a simulation produced, before it is summarised."""

    requests: list[SimRequest]
    samples: list[Sample]
    decisions_by_kind: dict[str, int]
    decisions: int
    calls: int
    steps: int
    end_s: float
    running_area: float  # integral of running over time
    usage_area: float  # integral of kv usage over time
    peak_running: int
    stalled: int  # requests left unfinished because nothing could move


ProgressHook = Callable[[int, int, float], None]  # (done, total, virtual now)


class Simulation:
    """K engines sharing one backend, stepped in virtual-time order."""

    def __init__(
        self,
        trace: Sequence[TraceRequest],
        layout: KVCacheLayout,
        config: EngineConfig,
        *,
        engines: int = 1,
        seed: int = 0,
        id_prefix: str = "",
        sample_interval_s: float = 1.0,
        spread_s: float = 0.0,
        max_idle_rounds: int = 50_000,
        on_progress: ProgressHook | None = None,
        progress_every_steps: int = 200,
    ) -> None:
        if engines < 1:
            raise ValueError(f"engines: must be >= 1, got {engines}")
        self.config = config
        self.layout = layout
        self.engines = [
            SimEngine(f"{id_prefix}engine-{k}", k, config, self.layout) for k in range(engines)
        ]
        arrivals = spread_arrivals(trace, seed, spread_s) if spread_s > 0 else [r.arrival_s for r in trace]
        origin = arrivals[0] if arrivals else 0.0
        default_cap = max((r.output_tokens for r in trace), default=1)
        self.requests: dict[str, SimRequest] = {}
        order = sorted(range(len(trace)), key=lambda i: (arrivals[i], i))
        for position, i in enumerate(order):
            t = trace[i]
            max_new = max(t.output_tokens, config.max_new_tokens or default_cap)
            request = SimRequest(f"{id_prefix}{i}", t, position % engines, arrivals[i] - origin,
                                 max_new, config.max_model_len)  # fmt: skip
            self.requests[request.request_id] = request
            self.engines[request.engine].arrivals.append(request)
        self.sample_interval_s = sample_interval_s
        self.max_idle_rounds = max_idle_rounds
        self.on_progress = on_progress
        self.progress_every_steps = progress_every_steps
        self.decisions_by_kind: dict[str, int] = {}
        self.decisions = 0
        self._seen_seqs: set[int] = set()

    def _apply(self, decisions: list[Decision], now: float) -> None:
        requests = self.requests
        engines = self.engines
        by_kind = self.decisions_by_kind
        seen = self._seen_seqs
        for d in decisions:
            if d.seq in seen:
                continue
            seen.add(d.seq)
            self.decisions += 1
            by_kind[d.kind.value] = by_kind.get(d.kind.value, 0) + 1
            r = requests.get(d.request_id)
            # Live, a request's decisions can arrive out of order (its own Step reply
            # before an event another engine's call caused): an older one is stale.
            if r is not None and d.seq > r.last_seq:
                r.last_seq = d.seq
                engines[r.engine].apply(d, r, now)

    # The loop is a generator of backend calls, so one body serves the in-process
    # backend (plain calls) and the gRPC one (awaited calls).
    def _calls(self, num_free_blocks: Callable[[], int], capacity: int):
        """Yields ("open", engine, None, 0) / ("poll" or "idle", engine, None, now) /
        ("step", engine, ops, now); receives the decisions of each; returns the SimRun."""
        for engine in self.engines:
            yield ("open", engine.engine_id, None, 0.0)
        samples: list[Sample] = []
        capacity = max(1, capacity)
        last_t = 0.0
        running_area = usage_area = 0.0
        peak_running = 0
        next_sample = 0.0
        total = len(self.requests)
        steps = 0
        idle_rounds = 0
        engines = self.engines
        # One engine (the usual offline run): skip the per-step scans over engines.
        only = engines[0] if len(engines) == 1 else None
        while True:
            if only is not None:
                if only.idle:
                    break
                engine = only
                running = only.num_running
            else:
                active = [e for e in engines if not e.idle]
                if not active:
                    break
                engine = min(active, key=lambda e: (e.clock, e.index))
                running = sum(e.num_running for e in engines)
            now = engine.clock
            free = num_free_blocks()
            usage = 1.0 - free / capacity
            if now > last_t:
                running_area += running * (now - last_t)
                usage_area += usage * (now - last_t)
                last_t = now
            if now >= next_sample:
                samples.append(Sample(now, free, running, sum(e.waiting() for e in engines), usage))
                next_sample = now + self.sample_interval_s
            # When no engine ran anything and requests wait at the daemon, ask for the
            # queue to be looked at again ("idle"); otherwise only collect events.
            kind = "poll"
            if engine.stalled and engine.num_queued and all(e.stalled or e.idle for e in engines):
                kind = "idle"
            self._apply((yield (kind, engine.engine_id, None, now)), now)

            ops, scheduled, decode_grows = engine.build_step()
            if ops:
                engine.calls += 1
                self._apply((yield ("step", engine.engine_id, ops, now)), now)
            duration = engine.run_step(scheduled, decode_grows)
            engine.stalled = duration == 0.0
            if duration:
                horizon = math.inf if only is not None else min(
                    (e.clock for e in engines if e is not engine and not e.idle), default=math.inf
                )
                engine.skip_quiet_steps(horizon)
            running = only.num_running if only is not None else sum(e.num_running for e in engines)
            if running > peak_running:
                peak_running = running
            if duration == 0.0:
                # Nothing ran: sleep until the next arrival, or a step's worth while others work.
                if engine.in_flight == 0 and not engine.local_waiting:
                    if engine.arrivals:
                        engine.clock = max(engine.clock, engine.arrivals[0].arrival_s)
                else:
                    idle_rounds += 1
                    engine.clock += self.config.step_base_s or 0.001
                if idle_rounds > self.max_idle_rounds:
                    break  # nothing has run for that long: report what is stuck
            else:
                idle_rounds = 0
            steps += 1
            if self.on_progress is not None and steps % self.progress_every_steps == 0:
                self.on_progress(self._done(), total, now)
        # Release the requests that finished in the very last steps.
        for engine in engines:
            ops = StepOps(finishes=engine.pending_finishes)
            engine.pending_finishes = []
            if ops:
                engine.calls += 1
                self._apply((yield ("step", engine.engine_id, ops, engine.clock)), engine.clock)
        end = max((e.clock for e in engines), default=0.0)
        free = num_free_blocks()
        running = sum(e.num_running for e in engines)
        if end > last_t:
            running_area += running * (end - last_t)
            usage_area += (1.0 - free / capacity) * (end - last_t)
        samples.append(Sample(end, free, running, sum(e.waiting() for e in engines), 1.0 - free / capacity))
        if self.on_progress is not None:
            self.on_progress(self._done(), total, end)
        return SimRun(
            requests=list(self.requests.values()),
            samples=samples,
            decisions_by_kind=dict(self.decisions_by_kind),
            decisions=self.decisions,
            calls=sum(e.calls for e in engines),
            steps=sum(e.steps for e in engines),
            end_s=end,
            running_area=running_area,
            usage_area=usage_area,
            peak_running=peak_running,
            stalled=sum(1 for r in self.requests.values() if r.state in (PENDING, QUEUED, RUNNING)),
        )

    def _done(self) -> int:
        return sum(1 for r in self.requests.values() if r.state in (FINISHED, REJECTED, LOST))

    def run(self, backend: Backend) -> SimRun:
        """Drive the simulation against an in-process backend."""
        calls = self._calls(backend.num_free_blocks, backend.num_blocks)
        answer: list[Decision] | None = None
        try:
            while True:
                what, engine_id, ops, now = calls.send(answer)  # type: ignore[arg-type]
                if what == "step":
                    answer = backend.step(engine_id, ops, now)
                elif what == "poll":
                    answer = backend.poll(engine_id, now)
                elif what == "idle":
                    answer = backend.idle(engine_id, now)
                else:
                    backend.open_engine(engine_id)
                    answer = None
        except StopIteration as stop:
            return stop.value

    async def run_async(self, backend: AsyncBackend) -> SimRun:
        """Drive the simulation against an awaitable backend (the daemon over gRPC)."""
        calls = self._calls(backend.num_free_blocks, backend.num_blocks)
        answer: list[Decision] | None = None
        try:
            while True:
                what, engine_id, ops, now = calls.send(answer)  # type: ignore[arg-type]
                if what == "step":
                    answer = await backend.step(engine_id, ops, now)
                elif what == "poll":
                    answer = await backend.poll(engine_id, now)
                elif what == "idle":
                    answer = await backend.idle(engine_id, now)
                else:
                    await backend.open_engine(engine_id)
                    answer = None
        except StopIteration as stop:
            return stop.value
