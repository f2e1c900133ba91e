"""The commit path: each batch of decisions into the log, then, once committed and in the
order made, to the owning sessions' Events streams, the watchers and the metrics.

A caller awaits the commit before answering an engine (the contract: a decision an engine
has been told about is in the log). One dispatcher task then hands each batch on; a batch
nobody would hear of (an engine's own step with no watcher and no metrics, the usual case)
skips it.
"""

from __future__ import annotations

import asyncio
import logging
import time

from kvbudget.daemon.core.records import Decision
from kvbudget.daemon.log.decision_log import DecisionLog
from kvbudget.daemon.log.schema import DecisionLogError
from kvbudget.daemon.log.unwritten import UnwrittenError
from kvbudget.daemon.server.sessions import Session, SessionTable
from kvbudget.daemon.server.watch import WatchHub

log = logging.getLogger("kvbudget.daemon")
PUBLISH_SLICE = 1_000  # decisions handed on between two yields of the loop


class Dispatcher:
    def __init__(
        self, decision_log: DecisionLog, sessions: SessionTable, watch_hub: WatchHub, metrics: object | None
    ) -> None:
        self.log = decision_log
        self.sessions = sessions
        self.watch_hub = watch_hub
        self.metrics = metrics  # metrics.Metrics
        self._queue: asyncio.Queue[tuple[list[Decision], asyncio.Future, str, float | None] | None] = (
            asyncio.Queue()
        )
        self._task: asyncio.Task | None = None
        self._stopping = asyncio.Event()  # set by stop(): the dispatcher waits no longer for a failed write
        self._resolved_future: asyncio.Future | None = None
        # Sessions expired (lease lapsed, replaced) whose EXPIRE decisions are not yet on
        # their Events stream, with the last seq of those: the dispatcher ends the stream
        # once it is past that seq, so an engine still reading hears its requests expired.
        self._expiring: list[tuple[int, Session]] = []

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="kvbudget-dispatch")

    async def stop(self) -> None:
        """Hands on what is queued (a batch still unwritten is not waited for), then ends."""
        self._stopping.set()
        if self._task is None:
            return
        await self._queue.put(None)
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None
        self._expiring.clear()  # (their streams were ended: end_expired_streams)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def num_queued(self) -> int:
        """Batches waiting for the dispatcher (committed or not)."""
        return self._queue.qsize()

    @property
    def num_expiring(self) -> int:
        """Expired sessions whose streams wait for their EXPIRE decisions."""
        return len(self._expiring)

    # ------------------------------------------------------------------ record
    def record(
        self, decisions: list[Decision], origin_engine: str = "", started: float | None = None,
        others: bool | None = None,
    ) -> asyncio.Future:
        """Registers decisions just made; the returned future resolves once committed.

        Events for `origin_engine` are not streamed: they go back in that caller's reply.
        `started` (perf_counter at the call's arrival) feeds the decision-latency histogram.
        `others`: whether any decision is another engine's, if the caller knows (a sliced
        step looks slice by slice: a scan of its 100,000 here took 10-50 ms).
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
        if not self._has_audience(decisions, origin_engine, others):
            return committed  # nobody to stream, publish or count them to: skip the dispatcher
        self._queue.put_nowait((decisions, committed, origin_engine, started))
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

    def _has_audience(self, decisions: list[Decision], origin_engine: str, others: bool | None = None) -> bool:
        """Whether anyone but the caller hears of these: metrics, a watcher, another engine."""
        if not decisions:
            return False
        if self.metrics is not None or self.watch_hub.has_watchers:
            return True
        if others is not None:
            return others
        if len(decisions) == 1:  # a step's own decision, as a rule
            engine_id = decisions[0].engine_id
            return bool(engine_id) and engine_id != origin_engine
        for d in decisions:
            if d.engine_id != origin_engine and d.engine_id:
                return True
        return False

    # ------------------------------------------------------------------ the task
    async def _run(self) -> None:
        """Streams, publishes and counts each batch once committed, in the order made.

        Nothing in one batch may stop it: if this task ended, every watcher and Events
        stream would go silent for the rest of the daemon's life while admission went on.
        """
        while (item := await self._queue.get()) is not None:
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
                    await self._publish_sliced(decisions, origin_engine, started)
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

    async def _publish_sliced(self, decisions: list[Decision], origin_engine: str, started: float | None) -> None:
        """`_publish`, PUBLISH_SLICE decisions at a time with the loop let go between (a big
        step's 100,000 held it ~0.1 s); the batch's latency counted once. The next batch
        waits: each session, watcher and the metrics still hear them in seq order."""
        if len(decisions) <= PUBLISH_SLICE:
            self._publish(decisions, origin_engine, started)
            return
        for start in range(0, len(decisions), PUBLISH_SLICE):
            self._publish(decisions[start:start + PUBLISH_SLICE], origin_engine, started if not start else None)
            await asyncio.sleep(0)

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

    # ------------------------------------------------------------------ expired sessions
    def end_after(self, last_seq: int, session: Session) -> None:
        """Ends `session`'s Events stream once the dispatcher is past `last_seq` (its
        EXPIRE decisions, which the caller records)."""
        self._expiring.append((last_seq, session))

    def end_expired_streams(self) -> None:
        """Ends the expired sessions' streams now (a stop): an open one keeps its call in flight."""
        for _, session in self._expiring:
            if not session.closed:
                session.end_events()

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
