"""The driver: K simulated engines sharing one backend, stepped in virtual-time order.

A simulated engine batches like vLLM (chunked prefill, in virtual time, no model): each step
submits arrivals, schedules its batch, asks admission once (a `StepOps`), applies the
decisions, then advances its clock by the step-time model. Same trace, backend and seed:
same run. One generator of backend calls serves the in-process backend (`run`) and the
gRPC one (`run_async`). The whole story: docs/architecture/traces.md.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from kvbudget.daemon.core.records import Decision
from kvbudget.daemon.core.spec import KVCacheLayout
from kvbudget.daemon.core.step import StepOps
from kvbudget.traces.prefix_hashes import pool_prefix_hashes
from kvbudget.traces.trace_request import TraceRequest
from kvbudget.traces.sim_backend import AsyncBackend, Backend
from kvbudget.traces.sim_engine import EngineConfig, SimEngine
from kvbudget.traces.sim_engine_vllm import ENGINE_MODELS
from kvbudget.traces.sim_request import (
    FINISHED,
    LOST,
    PENDING,
    QUEUED,
    REJECTED,
    RUNNING,
    SimRequest,
    spread_arrivals,
)


@dataclass(frozen=True)
class Sample:
    time_s: float
    free_blocks: int
    running: int
    waiting: int
    kv_usage: float
    preemptions: int = 0  # so far in the run


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
    max_new_tokens: int = 0  # the max_tokens requests asked for (or their output, if longer)


class _Meter:
    """A run's time series and time-weighted areas, read before each step."""

    __slots__ = ("capacity", "interval", "samples", "last_t", "next_sample", "running_area",
                 "usage_area", "peak_running", "by_kind")  # fmt: skip

    def __init__(self, capacity: int, interval: float, by_kind: dict[str, int]) -> None:
        self.by_kind = by_kind  # the run's decision counts, read only when a sample is taken
        self.capacity = capacity
        self.interval = interval
        self.samples: list[Sample] = []
        self.last_t = self.next_sample = 0.0
        self.running_area = self.usage_area = 0.0  # integrals of running and kv usage over time
        self.peak_running = 0

    def observe(self, now: float, free: int, running: int, engines: list[SimEngine]) -> None:
        usage = 1.0 - free / self.capacity
        if now > self.last_t:
            self.running_area += running * (now - self.last_t)
            self.usage_area += usage * (now - self.last_t)
            self.last_t = now
        if now >= self.next_sample:
            self.samples.append(self._sample(now, free, running, engines, usage))
            self.next_sample = now + self.interval

    def close(self, end: float, free: int, running: int, engines: list[SimEngine]) -> None:
        """The last stretch, up to `end`, and a last sample there."""
        usage = 1.0 - free / self.capacity
        if end > self.last_t:
            self.running_area += running * (end - self.last_t)
            self.usage_area += usage * (end - self.last_t)
        self.samples.append(self._sample(end, free, running, engines, usage))

    def _sample(self, now: float, free: int, running: int, engines: list[SimEngine], usage: float) -> Sample:
        waiting = sum(e.waiting() for e in engines)
        return Sample(now, free, running, waiting, usage, self.by_kind.get("preempt", 0))


ProgressHook = Callable[[int, int, float], None]  # (done, total, virtual now)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector. A replay makes no reference cycles (reference
    counting frees everything), yet it keeps millions of prompt-hash ints and thousands of
    block tables alive, which every collection would walk again (~0.5 s of a whole
    Mooncake replay)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


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
        engine_model = ENGINE_MODELS[config.engine_model]
        self.engines = [
            engine_model(f"{id_prefix}engine-{k}", k, config, self.layout) for k in range(engines)
        ]
        arrivals = spread_arrivals(trace, seed, spread_s) if spread_s > 0 else [r.arrival_s for r in trace]
        # Time 0 is the earliest arrival, wherever it sits in `trace`: measured from the
        # first row instead, an out-of-order trace would have requests arrive before 0.
        origin = min(arrivals, default=0.0)
        # Each request asks for max_tokens = max(its own output, this): the output must
        # fit, or the engine could not produce what the trace says it did.
        self.max_new_tokens = config.max_new_tokens or max((r.output_tokens for r in trace), default=1)
        self.requests: dict[str, SimRequest] = {}
        order = sorted(range(len(trace)), key=lambda i: (arrivals[i], i))
        # Every prompt's pool-block hashes, up front in one tight loop (one memo: requests
        # of a conversation share most of their blocks). Hashed here rather than at submit,
        # the millions of hash ints lie together in memory instead of among the run's
        # garbage, which makes every later prefix-cache operation on them cheaper.
        hash_memo: dict[tuple[int, int], tuple[int, ...]] = {}
        for position, i in enumerate(order):
            t = trace[i]
            max_new = max(t.output_tokens, self.max_new_tokens)
            request = SimRequest(f"{id_prefix}{i}", t, position % engines, arrivals[i] - origin,
                                 max_new, config.max_model_len)  # fmt: skip
            request.hashes = pool_prefix_hashes(t, layout.block_size, hash_memo)
            self.requests[request.request_id] = request
            self.engines[request.engine].arrivals.append(request)
        self.sample_interval_s = sample_interval_s
        self.max_idle_rounds = max_idle_rounds
        self.on_progress = on_progress
        self.progress_every_steps = progress_every_steps
        self.decisions_by_kind: dict[str, int] = {}
        self.decisions = 0
        self._seen_seqs: set[int] = set()

    def apply(self, decisions: list[Decision], now: float) -> None:
        """Counts each decision not seen before (by seq) and hands it to the engine of its
        request, unless a newer one reached the request first."""
        if not decisions:  # most polls in-process
            return
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
        engines = self.engines
        for engine in engines:
            yield ("open", engine.engine_id, None, 0.0)
        meter = _Meter(max(1, capacity), self.sample_interval_s, self.decisions_by_kind)
        yield from self._steps(num_free_blocks, meter)
        # Release the requests that finished in the very last steps.
        for engine in engines:
            ops = StepOps(finishes=engine.pending_finishes)
            engine.pending_finishes = []
            if ops:
                engine.calls += 1
                self.apply((yield ("step", engine.engine_id, ops, engine.clock)), engine.clock)
        end = max((e.clock for e in engines), default=0.0)
        meter.close(end, num_free_blocks(), sum(e.num_running for e in engines), engines)
        if self.on_progress is not None:
            self.on_progress(self._done(), len(self.requests), end)
        return self._result(meter, end)

    def _steps(self, num_free_blocks: Callable[[], int], meter: _Meter):
        """Steps the engine with the earliest clock until every engine is idle, or nothing
        has run for `max_idle_rounds` (the rest is reported stuck)."""
        engines = self.engines
        # One engine (the usual offline run): skip the per-step scans over engines.
        only = engines[0] if len(engines) == 1 else None
        total = len(self.requests)
        steps = idle_rounds = 0
        while True:
            if only is not None:
                if only.idle:
                    return
                engine = only
                running = only.num_running
            else:
                active = [e for e in engines if not e.idle]
                if not active:
                    return
                engine = min(active, key=lambda e: (e.clock, e.index))
                running = sum(e.num_running for e in engines)
            now = engine.clock
            meter.observe(now, num_free_blocks(), running, engines)
            # When no engine ran anything and requests wait at the daemon, ask for the
            # queue to be looked at again ("idle"); otherwise only collect events.
            kind = "poll"
            if engine.stalled and engine.num_queued and all(e.stalled or e.idle for e in engines):
                kind = "idle"
            self.apply((yield (kind, engine.engine_id, None, now)), now)

            ops, scheduled, decode_grows = engine.build_step()
            if ops:
                engine.calls += 1
                self.apply((yield ("step", engine.engine_id, ops, now)), now)
            duration = engine.run_step(scheduled, decode_grows)
            engine.stalled = duration == 0.0
            running = only.num_running if only is not None else sum(e.num_running for e in engines)
            if running > meter.peak_running:
                meter.peak_running = running
            if duration:
                idle_rounds = 0
                horizon = math.inf if only is not None else min(
                    (e.clock for e in engines if e is not engine and not e.idle), default=math.inf
                )
                engine.skip_quiet_steps(horizon)
            elif self._wait(engine):
                idle_rounds += 1
                if idle_rounds > self.max_idle_rounds:
                    return  # nothing has run for that long: report what is stuck
            steps += 1
            if self.on_progress is not None and steps % self.progress_every_steps == 0:
                self.on_progress(self._done(), total, now)

    def _wait(self, engine: SimEngine) -> bool:
        """Nothing ran: sleep until the next arrival, or a step's worth while others work
        (then True: a round in which nothing could move)."""
        if engine.in_flight == 0 and not engine.local_waiting:
            if engine.arrivals:
                engine.clock = max(engine.clock, engine.arrivals[0].arrival_s)
            return False
        engine.clock += self.config.step_base_s or 0.001
        return True

    def _result(self, meter: _Meter, end: float) -> SimRun:
        requests = self.requests.values()
        return SimRun(
            requests=list(requests),
            samples=meter.samples,
            decisions_by_kind=dict(self.decisions_by_kind),
            decisions=self.decisions,
            calls=sum(e.calls for e in self.engines),
            steps=sum(e.steps for e in self.engines),
            end_s=end,
            running_area=meter.running_area,
            usage_area=meter.usage_area,
            peak_running=meter.peak_running,
            stalled=sum(1 for r in requests if r.state in (PENDING, QUEUED, RUNNING)),
            max_new_tokens=self.max_new_tokens,
        )

    def _done(self) -> int:
        return sum(1 for r in self.requests.values() if r.state in (FINISHED, REJECTED, LOST))

    def run(self, backend: Backend) -> SimRun:
        """Drive the simulation against an in-process backend."""
        calls = self._calls(backend.num_free_blocks, backend.num_blocks)
        answer: list[Decision] | None = None
        with _collector_paused():
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
