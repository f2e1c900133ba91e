"""The service object: the one owner of the AdmissionController inside the daemon's event loop.

Every mutation runs synchronously on the loop thread (the controller is plain Python with
no awaits), so mutations are serialized without locks. Decisions go to the log and on
(`dispatch.Dispatcher`); Steps are served by `steps.Steps`; a ticker expires lapsed leases
and lets the controller schedule the queue (deadlines) even when no engine calls. The
servicers call the methods here and turn a `Refused` into a status.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvbudget.daemon.core import budget
from kvbudget.daemon.core.admission import AdmissionController, AdmissionError
from kvbudget.daemon.core.records import MAX_TENANT_CHARS, OTHER_TENANTS, RESERVED_TENANT, Decision, Snapshot
from kvbudget.daemon.core.validation import StepRejected, check_request_id
from kvbudget.daemon.log.decision_log import DecisionLog
from kvbudget.daemon.log.schema import DecisionLogError
from kvbudget.daemon.log.unwritten import UnwrittenError
from kvbudget.daemon.server.dispatch import Dispatcher
from kvbudget.daemon.server.metrics_scrape import read_at_scrape
from kvbudget.daemon.server.refusal import Refused, Status, invalid, rejected
from kvbudget.daemon.server.replay_report import check_replay
from kvbudget.daemon.server.sessions import ReplayTable, Session, SessionExists, SessionTable, TooManySessions
from kvbudget.daemon.server.snapshot_view import engine_states
from kvbudget.daemon.server.steps import Steps
from kvbudget.daemon.server.watch import WatchHub
from kvbudget.daemon.wire import convert
from kvbudget.v1 import common_pb2

log = logging.getLogger("kvbudget.daemon")
MAX_LEASE_TTL_S = 3600
MAX_QUOTED = 128  # characters of a caller's unbounded text quoted back in a refusal
MAX_ESTIMATE_TOKENS = 1 << 24


@dataclass(frozen=True)
class CoreOptions:
    tick_s: float = 0.1  # lease expiry and queue scheduling
    gpu_refresh_s: float = 5.0
    snapshot_cache_s: float = 0.02  # watchers at 10 Hz share one snapshot
    replay_stale_s: float = 30.0  # a replay not reported for this long is marked done
    max_ops_per_step: int | None = None  # server.max_ops_per_step; None: the core's cap only


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
        self.options = options
        self.draining = False
        self.replays = ReplayTable(options.replay_stale_s)
        self.dispatcher = Dispatcher(decision_log, sessions, watch_hub, metrics)
        self.steps = Steps(self)
        self._gpu_probe = gpu_probe
        self._gpu = gpu
        self._pool_bytes = pool_bytes
        self._started_unix_s = started_unix_s
        self._daemon_version = daemon_version
        self._ticker_task: asyncio.Task | None = None
        self._snapshot_cache: tuple[float, common_pb2.Snapshot] | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.dispatcher.start()
        self._ticker_task = asyncio.create_task(self._ticker(), name="kvbudget-ticker")
        if self.metrics is not None:  # its gauges read as each scrape asks (metrics_scrape.py)
            read_at_scrape(self.metrics, asyncio.get_running_loop(),  # type: ignore[arg-type]
                           lambda: (self.snapshot(), self._gpu, self.log.figures()))

    async def stop(self) -> None:
        """Ends streams, drains the dispatcher, flushes the log. Idempotent."""
        self.watch_hub.close_all()
        self.end_all_streams()
        ticker, self._ticker_task = self._ticker_task, None
        if ticker is None:
            return
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
        if self.log.num_unwritten:
            await asyncio.to_thread(self.log.write_unwritten)  # a last try: the disk may have room now
        await self.dispatcher.stop()  # (a batch still unwritten then is not waited for: see close())
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
        self.dispatcher.end_expired_streams()

    @property
    def gpu(self) -> object | None:
        return self._gpu

    @property
    def metrics(self) -> object | None:
        return self.dispatcher.metrics

    @metrics.setter
    def metrics(self, metrics: object | None) -> None:
        self.dispatcher.metrics = metrics

    # ------------------------------------------------------------------ the log
    def record(
        self, decisions: list[Decision], origin_engine: str = "", started: float | None = None,
        others: bool | None = None,
    ) -> asyncio.Future:
        """Registers decisions just made; the returned future resolves once committed
        (`Dispatcher.record`)."""
        return self.dispatcher.record(decisions, origin_engine, started, others)

    async def commit(self, decisions: list[Decision]) -> None:
        """Records decisions and returns once they are in the log; Refused if they are not
        (nothing is promised)."""
        try:
            await self.record(decisions)
        except Exception as exc:
            raise Refused(Status.UNAVAILABLE, f"decision log: {exc}") from None

    def check_writable(self, what: str) -> None:
        """A failed write left decisions unwritten: nothing more is decided until they are in
        the file (the log keeps the pool's order). One retry first, so that the first call
        after the disk has room again goes through; else Refused, with nothing applied."""
        decision_log = self.log
        if not decision_log.num_unwritten or decision_log.write_unwritten():
            return
        figures = decision_log.figures()
        raise Refused(
            Status.UNAVAILABLE,
            f"decision log: {figures.write_error}; {figures.num_unwritten} decisions wait to be written first, "
            f"so {what} was not applied: retry once the log can write",
        )

    # ------------------------------------------------------------------ engine sessions
    def live_session(self, session_id: str) -> Session:
        """The live session `session_id` names, its lease renewed; Refused if there is none."""
        if not session_id:
            raise invalid("session_id: required")
        session = self.sessions.get(session_id)
        if session is None:
            raise Refused(
                Status.FAILED_PRECONDITION,
                "session_id: unknown session (expired, closed, or the daemon restarted): open a new one",
            )
        now = self.sessions.clock.now()
        if session.expires_at <= now:
            # Lapsed, and the ticker (every 0.1 s) has not taken it back yet: a call now must
            # not bring it back to life; the ticker expires its requests.
            raise Refused(
                Status.FAILED_PRECONDITION,
                f"session_id: its lease lapsed ({session.lease_ttl_s:g} s without a call): open a new one",
            )
        session.renew(now)
        return session

    async def open_session(
        self, engine_id: str, lease_ttl_s: float, model_fingerprint: str, replace_existing: bool
    ) -> Session:
        if self.draining:
            raise Refused(Status.UNAVAILABLE, "daemon is draining: no new sessions")
        try:
            check_request_id("engine_id", engine_id)
        except StepRejected as problem:
            raise rejected(problem) from None
        if lease_ttl_s > MAX_LEASE_TTL_S:
            raise invalid(f"lease_ttl_s: at most {MAX_LEASE_TTL_S}, got {lease_ttl_s}")
        fingerprint = self.plan.model_fingerprint
        if model_fingerprint and model_fingerprint != fingerprint:
            # Quoted in part: the status message travels in an HTTP/2 trailer, and one past
            # the client's header limit (16 KiB by default) reaches it as RESOURCE_EXHAUSTED.
            given = model_fingerprint
            shown = repr(given) if len(given) <= MAX_QUOTED else f"{given[:MAX_QUOTED]!r}... ({len(given)} characters)"
            raise Refused(
                Status.FAILED_PRECONDITION, f"model_fingerprint: {shown} does not match the daemon's {fingerprint!r}"
            )
        sessions = self.sessions
        existing = sessions.of_engine(engine_id)
        if existing is not None:
            # A lease that lapsed holds the engine id only until the next tick takes it
            # back: meanwhile the engine's own re-open must not read as another process's.
            lapsed = existing.expires_at <= sessions.clock.now()
            if not replace_existing and not lapsed:
                raise Refused(
                    Status.ALREADY_EXISTS,
                    f"engine_id: {engine_id!r} already has a live session (set replace_existing to end it)",
                )
            async with self.steps.gate.between_steps():
                self.check_writable("replacing the session")  # replacing it decides (EXPIRE its requests)
                await self.commit(self.close_engine(existing, expire=True))
        try:
            return sessions.open(engine_id, lease_ttl_s, sessions.clock.now())
        except SessionExists:
            raise Refused(Status.ALREADY_EXISTS, f"engine_id: {engine_id!r} already has a live session") from None
        except TooManySessions:
            raise Refused(Status.RESOURCE_EXHAUSTED, f"engine_id: at most {sessions.max_sessions} sessions") from None

    async def close_session(self, session: Session) -> list[Decision]:
        """Ends a session at its engine's word: its requests are released (aborted)."""
        async with self.steps.gate.between_steps():
            self.check_writable("the close")  # closing decides (RELEASE its requests): not while they wait
            decisions = self.close_engine(session, expire=False)
            await self.commit(decisions)
        return decisions

    def requests_of(self, engine_id: str) -> tuple[list, list]:
        """(running, waiting) request states of one engine."""
        c = self.controller
        running = [r for r in c.running_requests() if r.spec.engine_id == engine_id]
        waiting = [r for r in c.waiting_requests() if r.spec.engine_id == engine_id]
        return running, waiting

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
                self.dispatcher.end_after(max(own), session)
                return decisions
        else:
            decisions = []
            running, waiting = self.requests_of(session.engine_id)
            # Queued first, so releasing the running ones cannot admit them meanwhile.
            for r in [*waiting, *running]:
                decisions += self.controller.abort(r.request_id, now)
        self.sessions.remove(session)
        return decisions

    def report_replay(self, replay: common_pb2.ReplayState) -> None:
        check_replay(replay)
        if not self.replays.report(replay, time.monotonic()):
            raise Refused(Status.RESOURCE_EXHAUSTED, f"replay.replay_id: at most {self.replays.max_replays} replays")

    # ------------------------------------------------------------------ admin ops
    def set_policy(self, policy: str) -> list[Decision]:
        return self.controller.set_policy(policy, time.time())

    def set_tenant_quota(self, tenant: str, max_share: float, weight: float) -> None:
        """A tenant's quota as an admin asks for it: a share of 0 is none, a weight of 0 is 1."""
        if not tenant or len(tenant) > MAX_TENANT_CHARS or not tenant.isprintable():
            raise invalid(f"tenant: required, printable, at most {MAX_TENANT_CHARS} characters")
        if tenant == OTHER_TENANTS:
            raise invalid(f"tenant: {RESERVED_TENANT}")
        if not math.isfinite(max_share) or not 0.0 <= max_share <= 1.0:
            raise invalid(f"max_share: between 0 and 1 (0: no quota), got {max_share}")
        if not math.isfinite(weight) or weight < 0:
            raise invalid(f"weight: must be >= 0 (0: 1.0), got {weight}")
        try:
            self.controller.set_tenant_quota(tenant, max_share or None, weight or 1.0)
        except AdmissionError as exc:
            raise invalid(str(exc)) from None  # ("max_share: ...")

    def drain(self) -> list[Decision]:
        """No new sessions or submits from now on, and nothing more admitted: the waiting
        requests are rejected (`draining`); running ones finish."""
        self.draining = True
        return self.controller.close_admissions(time.time())

    # ------------------------------------------------------------------ views
    @property
    def num_free_blocks(self) -> int:
        return self.controller.pool.num_free_blocks

    @property
    def policy_name(self) -> str:
        return self.controller.policy.name

    def estimate(self, tokens: int) -> tuple[int, int, tuple[int, ...]]:
        """(max concurrency, naive max concurrency, blocks per request per group) of
        requests of `tokens` tokens each, on this pool."""
        if not 1 <= tokens <= MAX_ESTIMATE_TOKENS:
            raise invalid(f"tokens_per_request: between 1 and {MAX_ESTIMATE_TOKENS}, got {tokens}")
        layout, num_blocks = self.controller.layout, self.plan.num_blocks
        batched = self.controller.config.max_num_batched_tokens
        return (
            budget.max_concurrency(num_blocks, layout, tokens, batched),
            budget.naive_max_concurrency(num_blocks, layout, tokens),
            budget.request_worst_case(layout, tokens, batched).per_group,
        )

    def snapshot(self) -> Snapshot:
        return self.controller.snapshot(time.time())

    def snapshot_proto(self, *, fresh: bool = False) -> common_pb2.Snapshot:
        now_mono = time.monotonic()
        cached = self._snapshot_cache
        if not fresh and cached and now_mono - cached[0] < self.options.snapshot_cache_s:
            return cached[1]
        snapshot = self.snapshot()
        msg = convert.snapshot_to_proto(
            snapshot,
            engines=engine_states(self.controller, snapshot, self.sessions, now_mono),
            gpu=convert.gpu_to_proto(self._gpu, self._pool_bytes, own_pid=os.getpid()),
            gpus=convert.gpus_to_proto(self._gpu, self._pool_bytes, own_pid=os.getpid()),
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
        last_gpu = time.monotonic()
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
                await self.tick(now_mono)
                if self._gpu_probe is not None and now_mono - last_gpu >= self.options.gpu_refresh_s:
                    last_gpu = now_mono
                    self._gpu = await asyncio.to_thread(self._gpu_probe)
            except asyncio.CancelledError:
                raise
            except Exception:  # keep the daemon alive; the next tick retries
                log.exception("background tick failed")

    async def tick(self, now_mono: float) -> None:  # (the ticker's; tests call it at the times they choose)
        if self.steps.gate.busy:  # a big step is applied in slices: no lease lapses meanwhile (sliced.py)
            return
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
