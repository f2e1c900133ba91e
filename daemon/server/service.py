"""The single owner of the AdmissionController inside the daemon's event loop.

Every mutation runs synchronously on the loop thread (the controller is plain Python with
no awaits), so mutations are serialized without locks. Each batch of decisions then goes:

  1. into the DecisionLog; the caller awaits the commit before answering an engine
     (the contract: a decision an engine has been told about is in the log);
  2. after the commit, in the order the batches were made, by one dispatcher task: to the
     owning sessions' Events streams, to the watchers, to the metrics (a batch nobody
     would hear of, the usual case for an engine's own step with no watcher and no
     metrics, skips it).

A ticker expires sessions whose lease lapsed and lets the controller schedule the queue
(deadlines) even when no engine calls.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from kvbudget.daemon.wire import convert
from kvbudget.daemon.core.admission import AdmissionController, AdmissionError
from kvbudget.daemon.log.decision_log import DecisionLog
from kvbudget.daemon.log.schema import DecisionLogError
from kvbudget.daemon.log.unwritten import UnwrittenError
from kvbudget.daemon.core.pool import NULL_BLOCK
from kvbudget.daemon.core.records import Decision, Snapshot
from kvbudget.daemon.server.sessions import ReplayTable, Session, SessionTable
from kvbudget.daemon.server.step_validation import StepOps
from kvbudget.daemon.server.watch import WatchHub
from kvbudget.v1 import common_pb2

log = logging.getLogger("kvbudget.daemon")
_NOTHING = (0, 0, 0)  # an engine with no request: no blocks held, none running or waiting


@dataclass(frozen=True)
class CoreOptions:
    tick_s: float = 0.1  # lease expiry and queue scheduling
    gpu_refresh_s: float = 5.0
    metrics_refresh_s: float = 1.0
    snapshot_cache_s: float = 0.02  # watchers at 10 Hz share one snapshot
    replay_stale_s: float = 30.0  # a replay not reported for this long is marked done


class StepFailed(Exception):
    """The controller refused an op mid-step (validation should have caught it).

    `decisions` are those the ops before it made: they stand and must still be logged."""

    def __init__(self, error: AdmissionError, field: str, decisions: list[Decision]) -> None:
        super().__init__(f"{field}: {error}")
        self.field = field
        self.decisions = decisions


class CoreService:
    def __init__(
        self,
        controller: AdmissionController,
        decision_log: DecisionLog,
        plan: common_pb2.PoolPlan,
        sessions: SessionTable,
        watch_hub: WatchHub,
        *,
        metrics: object | None = None,  # metrics.Metrics
        gpu_probe: Callable[[], object] | None = None,
        gpu: object | None = None,  # the first probe's result (gpu.GPUProbe)
        options: CoreOptions = CoreOptions(),
        pool_bytes: int = 0,
        started_unix_s: float = 0.0,
        daemon_version: str = "",
    ) -> None:
        """`started_unix_s` (when the daemon process started, wall clock) and
        `daemon_version` go into every snapshot: they tell a watcher which process it
        hears, so a restart shows even when the new daemon's counters are higher."""
        self.controller = controller
        self.log = decision_log
        self.plan = plan
        self.sessions = sessions
        self.watch_hub = watch_hub
        self.metrics = metrics
        self.options = options
        self.draining = False
        self.replays = ReplayTable(options.replay_stale_s)
        self._gpu_probe = gpu_probe
        self._gpu = gpu
        self._pool_bytes = pool_bytes
        self._started_unix_s = started_unix_s
        self._daemon_version = daemon_version
        self._dispatch: asyncio.Queue[tuple[list[Decision], asyncio.Future, str, float | None] | None] = (
            asyncio.Queue()
        )
        self._tasks: list[asyncio.Task] = []
        self._stopping = asyncio.Event()  # set by stop(): the dispatcher waits no longer for a failed write
        self._snapshot_cache: tuple[float, common_pb2.Snapshot] | None = None
        self._resolved_future: asyncio.Future | None = None
        # Sessions expired (lease lapsed, replaced) whose EXPIRE decisions are not yet on
        # their Events stream, with the last seq of those: the dispatcher ends the stream
        # once it is past that seq, so an engine still reading hears its requests expired.
        self._expiring: list[tuple[int, Session]] = []

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._dispatcher(), name="kvbudget-dispatch"),
            asyncio.create_task(self._ticker(), name="kvbudget-ticker"),
        ]

    async def stop(self) -> None:
        """Ends streams, drains the dispatcher, flushes the log. Idempotent."""
        self.watch_hub.close_all()
        self.end_all_streams()
        if not self._tasks:
            return
        ticker = self._tasks[1]
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
        if self.log.num_unwritten:
            await asyncio.to_thread(self.log.write_unwritten)  # a last try: the disk may have room now
        self._stopping.set()  # (a batch still unwritten then is not waited for: see close())
        await self._dispatch.put(None)
        await asyncio.gather(self._tasks[0], return_exceptions=True)
        self._tasks = []
        self._expiring.clear()  # (their streams were ended above)
        try:
            await asyncio.to_thread(self.log.flush)
        except DecisionLogError as exc:  # decisions still unwritten: close() says how many are lost
            log.error("decision log: %s", exc)

    def end_all_streams(self) -> None:
        """Ends every Events stream, the expired sessions' still waiting for their EXPIRE
        decisions included: at shutdown an open stream keeps its call in flight, and the
        server waits for those (drain_timeout_s). An expired session stays listed until the
        dispatcher is past its decisions, so that they go to no other session meanwhile."""
        for session in self.sessions:
            session.end_events()
        for _, session in self._expiring:
            if not session.closed:
                session.end_events()

    @property
    def gpu(self) -> object | None:
        return self._gpu

    # ------------------------------------------------------------------ commit path
    def record(
        self, decisions: list[Decision], origin_engine: str = "", started: float | None = None
    ) -> asyncio.Future:
        """Registers decisions just made; the returned future resolves once committed.

        Events for `origin_engine` are not streamed: they go back in that caller's reply.
        `started` (perf_counter at the call's arrival) feeds the decision-latency histogram.
        """
        # A small batch with nothing queued ahead commits right here (no thread hand-off,
        # no cross-thread wake-up); otherwise it queues for the writer thread.
        committed = self._resolved_future or self._resolved()
        if decisions:
            try:
                if not self.log.commit_inline(decisions):
                    committed = asyncio.wrap_future(self.log.append(decisions))
            except DecisionLogError as error:
                committed = asyncio.get_running_loop().create_future()
                committed.set_exception(error)
        if not self._has_audience(decisions, origin_engine):
            return committed  # nobody to stream, publish or count them to: skip the dispatcher
        self._dispatch.put_nowait((decisions, committed, origin_engine, started))
        # The caller's await must not be able to cancel the dispatcher's future: a caller
        # cancelled mid-commit (an engine that died mid-Step) would otherwise cancel it,
        # and these decisions (committed all the same) would never reach the watchers.
        return committed if committed.done() else asyncio.shield(committed)

    def _resolved(self) -> asyncio.Future:
        """One already-resolved future, shared: awaiting a done future never suspends, and
        cancelling one is a no-op, so every caller may have the same."""
        resolved = self._resolved_future
        if resolved is None:
            resolved = self._resolved_future = asyncio.get_running_loop().create_future()
            resolved.set_result(None)
        return resolved

    def _has_audience(self, decisions: list[Decision], origin_engine: str) -> bool:
        """Whether anyone but the caller hears of these: metrics, a watcher, another engine."""
        if not decisions:
            return False
        if self.metrics is not None or self.watch_hub.has_watchers:
            return True
        if len(decisions) == 1:  # a step's own decision, as a rule
            engine_id = decisions[0].engine_id
            return bool(engine_id) and engine_id != origin_engine
        for d in decisions:
            if d.engine_id != origin_engine and d.engine_id:
                return True
        return False

    async def _dispatcher(self) -> None:
        """Streams, publishes and counts each batch once committed, in the order made.

        Nothing in one batch may stop it: if this task ended, every watcher and Events
        stream would go silent for the rest of the daemon's life while admission went on.
        """
        while (item := await self._dispatch.get()) is not None:
            decisions, committed, origin_engine, started = item
            try:
                if not committed.done():
                    await asyncio.shield(committed)
            except asyncio.CancelledError:
                if not committed.cancelled():
                    raise  # this task itself is being cancelled
            except Exception:
                pass  # read below
            failure = None if committed.cancelled() else committed.exception()
            if isinstance(failure, UnwrittenError) and await self._written_in_time(failure):
                committed = self._resolved()
            if committed.cancelled() or committed.exception() is not None:
                # The caller reports a failure; nothing was promised, nothing is published.
                log.error("decision log commit failed (%s); %d decisions not published",
                          "cancelled" if committed.cancelled() else committed.exception(), len(decisions))
            else:
                try:
                    self._publish(decisions, origin_engine, started)
                except Exception:  # a broken watcher or metric must not stop the others
                    log.exception("publishing decisions failed")
            # Published or not: an expired engine never hears of a decision not in the log,
            # so if its EXPIRE decisions could not be written its stream ends without them.
            self._end_expired_streams(decisions[-1].seq)

    async def _written_in_time(self, failure: UnwrittenError) -> bool:
        """Waits until the decisions of a failed write are written after all (True), or
        the daemon stops first (False). The caller was told "not committed"; they stand in
        the pool and go first in the next write that works, so they are heard of then, in
        order (later batches queue behind this one, and are written no earlier)."""
        written = asyncio.wrap_future(failure.written)
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait((written, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not written.done():
            written.cancel()  # stopping, still unwritten: the log says at close they are lost
            return False
        return not written.cancelled() and written.exception() is None

    def _publish(self, decisions: list[Decision], origin_engine: str, started: float | None) -> None:
        of_engine = self.sessions.of_engine
        expiring = self._expiring
        for d in decisions:
            if d.engine_id and d.engine_id != origin_engine:
                session = self._expired_owner(d) if expiring else None
                if session is None:
                    session = of_engine(d.engine_id)
                if session is not None:
                    session.push_event(d)
        self.watch_hub.publish(decisions)
        if self.metrics is not None:
            latency = time.perf_counter() - started if started is not None else None
            self.metrics.record(decisions, latency)

    def _expired_owner(self, d: Decision) -> Session | None:
        """The expired session a decision was made under, if it is one still being told:
        not the session that replaced it, which never had that request."""
        for last_seq, session in self._expiring:  # (in the order expired: seqs grow)
            if d.seq <= last_seq and d.engine_id == session.engine_id:
                return session
        return None

    def _end_expired_streams(self, upto_seq: int) -> None:
        """Ends the streams of the expired sessions whose decisions go no further than
        `upto_seq` (the dispatcher is past them)."""
        if not self._expiring:
            return
        waiting: list[tuple[int, Session]] = []
        for last_seq, session in self._expiring:
            if last_seq > upto_seq:
                waiting.append((last_seq, session))
            elif not session.closed:
                session.end_events()
        self._expiring = waiting

    # ------------------------------------------------------------------ engine ops
    def requests_of(self, engine_id: str) -> tuple[list, list]:
        """(running, waiting) request states of one engine."""
        c = self.controller
        running = [r for r in c.running_requests() if r.spec.engine_id == engine_id]
        waiting = [r for r in c.waiting_requests() if r.spec.engine_id == engine_id]
        return running, waiting

    def _engine_tally(self, snapshot: Snapshot) -> dict[str, tuple[int, int, int]]:
        """(blocks held, running, waiting) per engine, in one pass over the running requests
        (the pool bounds them) and the snapshot's count of the waiting: a pass per session,
        in queue order, cost 24 ms a snapshot with 20,000 waiting.

        Blocks held are the engine's distinct pool blocks, as for tenants (ledger.py): a
        prefix block its requests share counts once. A block requests of several engines
        share counts once for each of them, so the engines' figures add up to more than the
        pool's held blocks only by the blocks shared across engines."""
        held: Counter[str] = Counter()
        running: Counter[str] = Counter()
        prefix_blocks: dict[str, set[int]] = {}  # per engine: the blocks in its prefix slots
        for r in self.controller.running_requests():
            engine_id = r.spec.engine_id
            held[engine_id] += sum(r.held)
            running[engine_id] += 1
            if r.cached_upto:
                # Only the slots below cached_upto (prefix-cache hits and published prompt
                # blocks) can be in two tables: a block met there before is taken off again.
                upto = r.cached_upto
                ids = [b for table in r.tables for b in table[:upto] if b != NULL_BLOCK]
                seen = prefix_blocks.setdefault(engine_id, set())
                held[engine_id] -= len(seen.intersection(ids))
                seen.update(ids)
        waiting = snapshot.waiting_by_engine
        return {e: (held[e], running[e], waiting.get(e, 0)) for e in running.keys() | waiting.keys()}

    def apply_step(self, ops: StepOps, now: float) -> list[Decision]:
        """Applies a validated step: finishes, aborts, progress, grows, submits.

        Freeing first lets this step's own submits use the blocks. Queued requests are
        tried once the grows are in, before the submits (the queue is held meanwhile:
        controller.hold_queue), so a step never admits a request its own grows preempt,
        and every op meets the requests as the engine last heard of them, but for those
        an earlier op of the same step preempted: the controller answers a grow of a
        waiting request DENY not_running, ignores its progress, and a finish ends it in
        the queue.
        """
        c = self.controller
        decisions: list[Decision] = []
        finishes, aborts, progress, grows, submits = ops
        name, i = "", 0  # the op being applied, named only if it fails
        held = bool(finishes or aborts or progress or grows)
        if held:  # the queue gets what this step's running requests leave (controller.hold_queue)
            c.hold_queue()
        try:
            if finishes:
                name = "finishes"
                finish = c.finish
                for i, request_id in enumerate(finishes):
                    decisions += finish(request_id, now)
            if aborts:
                name = "aborts"
                for i, request_id in enumerate(aborts):
                    decisions += c.abort(request_id, now)
            if progress:
                name = "progress"
                for i, (request_id, num_computed) in enumerate(progress):
                    decisions += c.progress(request_id, num_computed, now)  # waiting: ignored
            if grows:
                name = "grows"
                for i, (request_id, num_tokens) in enumerate(grows):
                    decisions += c.grow(request_id, num_tokens, now)  # waiting: DENY not_running
            if held:
                held = False
                decisions += c.release_queue(now)
            if submits:
                name = "submits"
                submit = c.submit
                for i, spec in enumerate(submits):
                    decisions += submit(spec, now)
        except AdmissionError as exc:
            if held:  # what was applied stands, and so does what it made room for
                decisions += c.release_queue(now)
            raise StepFailed(exc, f"{name}[{i}].{exc.field}", decisions) from exc
        except BaseException:
            c.hold_queue(False)  # (a bug: never leave the queue held; the next tick admits)
            raise
        return decisions

    def close_engine(self, session: Session, *, expire: bool) -> list[Decision]:
        """Ends a session: its requests are expired (lease lapsed, replaced) or aborted.

        The session leaves the table at once (a replacing one opens right after). An expired
        one's Events stream stays open until its EXPIRE decisions, which the caller records,
        are logged and on it: an engine whose lease lapsed but still reads hears of them."""
        now = time.time()
        if expire:
            decisions = self.controller.expire_engine(session.engine_id, now)
            own = [d.seq for d in decisions if d.engine_id == session.engine_id]
            if own:
                self.sessions.remove(session, end_events=False)
                self._expiring.append((max(own), session))  # the dispatcher ends its stream
                return decisions
        else:
            decisions = []
            running, waiting = self.requests_of(session.engine_id)
            # Queued first, so releasing the running ones cannot admit them meanwhile.
            for r in [*waiting, *running]:
                decisions += self.controller.abort(r.request_id, now)
        self.sessions.remove(session)
        return decisions

    # ------------------------------------------------------------------ admin ops
    def set_policy(self, policy: str) -> list[Decision]:
        return self.controller.set_policy(policy, time.time())

    def drain(self) -> list[Decision]:
        """No new sessions or submits from now on, and nothing more admitted: the waiting
        requests are rejected (`draining`); running ones finish."""
        self.draining = True
        return self.controller.close_admissions(time.time())

    # ------------------------------------------------------------------ views
    def snapshot(self) -> Snapshot:
        return self.controller.snapshot(time.time())

    def snapshot_proto(self, *, fresh: bool = False) -> common_pb2.Snapshot:
        now_mono = time.monotonic()
        cached = self._snapshot_cache
        if not fresh and cached and now_mono - cached[0] < self.options.snapshot_cache_s:
            return cached[1]
        snapshot = self.snapshot()
        tally = self._engine_tally(snapshot)
        engines = []
        for session in self.sessions:
            blocks_held, running, waiting = tally.get(session.engine_id, _NOTHING)
            engines.append(
                common_pb2.EngineState(
                    engine_id=session.engine_id,
                    session_id=session.session_id[:8],  # enough to tell apart, not to use
                    lease_remaining_s=session.lease_remaining_s(self.sessions.clock.now(now_mono)),
                    blocks_held=blocks_held,
                    running=running,
                    waiting=waiting,
                )
            )
        msg = convert.snapshot_to_proto(
            snapshot,
            engines=engines,
            gpu=convert.gpu_to_proto(self._gpu, self._pool_bytes, own_pid=os.getpid()),
            replays=self.replays.values(),
            draining=self.draining,
            plan=self.plan,
            decision_log=self.log.figures(),
            started_unix_s=self._started_unix_s,
            daemon_version=self._daemon_version,
        )
        self._snapshot_cache = (now_mono, msg)
        return msg

    # ------------------------------------------------------------------ background
    async def _ticker(self) -> None:
        last_gpu = last_metrics = time.monotonic()
        while True:
            await asyncio.sleep(self.options.tick_s)
            now_mono = time.monotonic()
            not_run_s = self.sessions.clock.tick(now_mono, self.options.tick_s)
            if not_run_s:
                log.warning(
                    "the daemon did not run for about %.1f s (stopped, or its host paused): leases are held "
                    "through it, so no engine is taken for silent for that time",
                    not_run_s + self.sessions.clock.grace_s,
                )
            try:
                await self._tick(now_mono)
                if self._gpu_probe is not None and now_mono - last_gpu >= self.options.gpu_refresh_s:
                    last_gpu = now_mono
                    self._gpu = await asyncio.to_thread(self._gpu_probe)
                if self.metrics is not None and now_mono - last_metrics >= self.options.metrics_refresh_s:
                    last_metrics = now_mono
                    self.metrics.update(self.snapshot(), self._gpu, self.log.figures())
            except asyncio.CancelledError:
                raise
            except Exception:  # keep the daemon alive; the next tick retries
                log.exception("background tick failed")

    async def _tick(self, now_mono: float) -> None:
        if self.log.num_unwritten:
            # The log cannot write: decide nothing unasked until it can (the writer retries
            # each second); expired leases and the queue are seen to on the first tick after.
            return
        for session in self.sessions.expired(self.sessions.clock.now(now_mono)):
            log.warning("lease of engine %r expired; taking its blocks back", session.engine_id)
            self._record_unattended(self.close_engine(session, expire=True))
        for replay_id in self.replays.expire(now_mono):
            log.warning("replay %r stopped reporting; marked done", replay_id)
        made = self.controller.schedule(time.time())
        if made:
            self._record_unattended(made)

    def _record_unattended(self, decisions: list[Decision]) -> None:
        """record() for decisions no caller waits on: a failed commit is logged here."""
        self.record(decisions).add_done_callback(_log_commit_failure)


def _log_commit_failure(committed: asyncio.Future) -> None:
    # (a write that failed but keeps its decisions is in the journal once per spell, by the log)
    if not committed.cancelled() and not isinstance(committed.exception(), (type(None), UnwrittenError)):
        log.error("decision log commit failed: %s", committed.exception())
