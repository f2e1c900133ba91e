"""The gRPC services: engine, observer, admin. Thin: check the caller, validate, call the core.

Every refusal is a status with a message that names the field. Nothing here decides
admission; that is the controller's, reached only through `CoreService`.
"""

from __future__ import annotations

import asyncio
import math
import time

import grpc

from kvbudget.daemon.core import budget

from kvbudget.daemon.wire import convert
from kvbudget.daemon.core.admission import AdmissionError
from kvbudget.daemon.server.auth import Authorizer, Role
from kvbudget.daemon.server.service import CoreService, StepFailed
from kvbudget.daemon.log.unwritten import UnwrittenError
from kvbudget.daemon.core.records import MAX_TENANT_CHARS, OTHER_TENANTS, RESERVED_TENANT, DecisionKind
from kvbudget.daemon.server.sessions import KeptStep, SessionExists, TooManySessions, UnansweredStep
from kvbudget.daemon.server.step_validation import StepRejected, check_request_id, validate_step
from kvbudget.daemon.server.watch import TooManyWatchers
from kvbudget.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    engine_pb2,
    engine_pb2_grpc,
    observer_pb2,
    observer_pb2_grpc,
)

INVALID = grpc.StatusCode.INVALID_ARGUMENT
MAX_WATCH_INTERVAL_MS = 60_000
MAX_WATCH_DECISIONS = 10_000
MAX_LEASE_TTL_S = 3600
MAX_ESTIMATE_TOKENS = 1 << 24
MAX_QUERY_LIMIT = 10_000
MAX_MESSAGE_BYTES = 64 << 20  # the server's send and receive limit (and EngineClient's): a Step may batch many ops
MAX_REPLAY_TEXT = 512  # a trace's name (a file name is at most 255 bytes)
MAX_QUOTED = 128  # characters of a caller's unbounded text quoted back in a status message
_ENGINE = Role.ENGINE  # enum member lookups are slow on Python 3.11; Step reads it per call


class EngineServicer(engine_pb2_grpc.EngineServiceServicer):
    def __init__(self, core: CoreService, auth: Authorizer) -> None:
        self.core = core
        self.auth = auth
        self._block_size = core.plan.block_size_tokens  # fixed for the daemon's life
        self._check_callers = not auth.trusts_everyone  # Step skips the await when it would pass
        self._lease_now = core.sessions.clock.now  # (the table's clock for its life; bound once for Step)

    async def _session(self, context, session_id: str):
        if not session_id:
            await context.abort(INVALID, "session_id: required")
        session = self.core.sessions.get(session_id)
        if session is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "session_id: unknown session (expired, closed, or the daemon restarted): open a new one",
            )
        now = self.core.sessions.clock.now()
        if session.expires_at <= now:
            # Lapsed, and the ticker (every 0.1 s) has not taken it back yet: a call now must
            # not bring it back to life; the ticker expires its requests.
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"session_id: its lease lapsed ({session.lease_ttl_s:g} s without a call): open a new one",
            )
        session.renew(now)
        return session

    async def _committed(self, context, committed: asyncio.Future) -> None:
        try:
            await committed
        except Exception as exc:  # the log could not commit: promise nothing
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"decision log: {exc}")

    async def OpenSession(self, request, context):
        await self.auth.require(context, Role.ENGINE)
        if self.core.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "daemon is draining: no new sessions")
        try:
            check_request_id("engine_id", request.engine_id)
        except StepRejected as exc:
            await context.abort(exc.code, str(exc))
        if request.lease_ttl_s > MAX_LEASE_TTL_S:
            await context.abort(INVALID, f"lease_ttl_s: at most {MAX_LEASE_TTL_S}, got {request.lease_ttl_s}")
        fingerprint = self.core.plan.model_fingerprint
        if request.model_fingerprint and request.model_fingerprint != fingerprint:
            # Quoted in part: the status message travels in an HTTP/2 trailer, and one past
            # the client's header limit (16 KiB by default) reaches it as RESOURCE_EXHAUSTED.
            given = request.model_fingerprint
            shown = repr(given) if len(given) <= MAX_QUOTED else f"{given[:MAX_QUOTED]!r}... ({len(given)} characters)"
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"model_fingerprint: {shown} does not match the daemon's {fingerprint!r}",
            )
        sessions = self.core.sessions
        existing = sessions.of_engine(request.engine_id)
        if existing is not None:
            # A lease that lapsed holds the engine id only until the next tick takes it
            # back: meanwhile the engine's own re-open must not read as another process's.
            lapsed = existing.expires_at <= sessions.clock.now()
            if not request.replace_existing and not lapsed:
                await context.abort(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"engine_id: {request.engine_id!r} already has a live session "
                    "(set replace_existing to end it)",
                )
            if self.core.log.num_unwritten:  # replacing it decides (EXPIRE its requests)
                await _refuse_while_unwritten(context, self.core.log, "replacing the session")
            await self._committed(context, self.core.record(self.core.close_engine(existing, expire=True)))
        try:
            session = sessions.open(request.engine_id, request.lease_ttl_s, sessions.clock.now())
        except SessionExists:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"engine_id: {request.engine_id!r} already has a live session")
        except TooManySessions:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"engine_id: at most {sessions.max_sessions} sessions"
            )
        return engine_pb2.OpenSessionResponse(
            session_id=session.session_id,
            plan=self.core.plan,
            lease_ttl_s=math.ceil(session.lease_ttl_s),
        )

    async def Step(self, request, context):
        started = time.perf_counter()
        if self._check_callers:
            await self.auth.require(context, _ENGINE)
        core = self.core
        session = core.sessions.get(request.session_id)
        lease_now = self._lease_now()
        if session is None or session.expires_at <= lease_now:
            session = await self._session(context, request.session_id)  # aborts, naming the field
        session.renew(lease_now)
        if session.unanswered is not None:  # the last step was applied but not logged
            reply = await self._answer_again(context, session, request)
            if reply is not None:
                return reply
        step_seq = request.step_seq
        if step_seq and session.last_step is not None and step_seq <= session.last_step.seq:
            return await self._resent(context, session, request)
        engine_id = session.engine_id
        if core.draining and request.submits:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "submits: daemon is draining, no new requests")
        if core.log.num_unwritten and (
            request.submits or request.grows or request.progress or request.finishes or request.aborts
        ):
            await _refuse_while_unwritten(context, core.log, "this step")
        now = time.time()
        try:
            ops = validate_step(request, engine_id, core.controller.find, self._block_size, now)
        except StepRejected as exc:
            await context.abort(exc.code, str(exc))
        try:
            decisions = core.apply_step(ops, now)
        except StepFailed as failed:
            # The controller refused an op validation let through: what was applied
            # stands, is logged and reaches the engine on its Events stream.
            committed = core.record(failed.decisions)
            if step_seq:
                session.last_step = KeptStep(step_seq, request, committed, error=(INVALID, str(failed)))
            await self._committed(context, asyncio.shield(committed))
            await context.abort(INVALID, str(failed))
        committed = core.record(decisions, engine_id, started)
        # Usually committed inline already; if it was queued behind others, the reply is built
        # while the writer commits (SQLite releases the GIL). It is sent only after.
        # num_free_blocks: the pool as this step left it.
        reply = engine_pb2.StepResponse(num_free_blocks=core.controller.pool.num_free_blocks)
        convert.add_decisions(reply.decisions, decisions, engine_id)
        settled = committed.done() and committed.exception() is None
        if step_seq:
            session.last_step = kept = (
                KeptStep(step_seq, request, None, reply) if settled
                else KeptStep(step_seq, request, committed, reply, decisions=decisions)
            )
        if not settled:
            try:
                # Shielded: a caller gone mid-commit (its deadline) must leave the commit's
                # future to the resend that may follow.
                await asyncio.shield(committed)
            except UnwrittenError as exc:
                # Applied, kept to be written first: the same step sent again gets this reply.
                session.unanswered = UnansweredStep(
                    _step_bytes(request), reply,
                    tuple(d for d in decisions if d.engine_id == engine_id),
                )
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"decision log: {exc}; this step was applied and its decisions wait to be written: "
                    "send the same step again to get them once they are",
                )
            except Exception as exc:  # the log could not commit: promise nothing
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"decision log: {exc}")
        if len(decisions) > 1000 and (size := reply.ByteSize()) > MAX_MESSAGE_BYTES:
            # gRPC would fail the send after the step was applied and logged, and the engine
            # hear nothing of it (its retry: ALREADY_EXISTS). Its decisions go out on the
            # Events stream instead, and the engine is told to send smaller steps.
            mine = [d for d in decisions if d.engine_id == engine_id]
            for decision in mine:
                session.push_event(decision)
            too_large = (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"this step was applied and logged, but its reply ({size} bytes) is past the {MAX_MESSAGE_BYTES} "
                f"byte limit: its {len(mine)} decisions go out on the Events stream instead (the oldest dropped "
                f"past {session.events.maxsize}); send smaller steps",
            )
            if step_seq:
                kept.reply, kept.error = None, too_large
            await context.abort(*too_large)
        return reply

    async def _resent(self, context, session, request):
        """The last numbered step sent again (its reply was lost on the way): the outcome it
        had, once its decisions are in the log; nothing is applied again."""
        kept: KeptStep = session.last_step
        if request.step_seq < kept.seq:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"step_seq: {request.step_seq} is below this session's last step ({kept.seq}): only the last "
                "step can be sent again, and a new step needs a higher number",
            )
        if request != kept.request:
            await context.abort(
                INVALID,
                f"step_seq: {kept.seq} numbers another step, already applied: a new step needs a higher number",
            )
        committed = kept.committed
        if committed is not None:
            if not committed.done():
                try:
                    await asyncio.shield(committed)
                except Exception:
                    pass  # read below
            if committed.cancelled():  # (only the daemon stopping cancels it)
                await context.abort(grpc.StatusCode.UNAVAILABLE, "decision log: the step's commit was cancelled")
            failure = committed.exception()
            if isinstance(failure, UnwrittenError):
                if not self.core.log.write_unwritten():
                    if session.unanswered is None and kept.reply is not None and kept.decisions is not None:
                        # The first call went (its deadline) before its write failed: it set
                        # nothing. As it would have: the same ops, however numbered, get this
                        # reply once written; another step sends the decisions on Events.
                        engine_id = session.engine_id
                        session.unanswered = UnansweredStep(
                            _step_bytes(kept.request), kept.reply,
                            tuple(d for d in kept.decisions if d.engine_id == engine_id),
                        )
                    await context.abort(
                        grpc.StatusCode.UNAVAILABLE,
                        f"decision log: {failure}; this step was applied and its decisions wait to be written: "
                        "send it again later",
                    )
            elif failure is not None:  # the log could not commit: promise nothing
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"decision log: {failure}")
            kept.committed = kept.decisions = None  # in the log: a later resend need not look again
        if kept.error is not None:
            await context.abort(*kept.error)
        return kept.reply

    async def _answer_again(self, context, session, request):
        """The reply of the last step (applied, its decisions kept to be written), if this
        is that step sent again and they are in the log now; None if it is another step,
        to be served as usual. While they still wait: UNAVAILABLE.

        Another step, once they are written, means the engine moved on without the reply:
        its decisions go out on the Events stream instead (an engine that gave up on the
        step learns which of its requests hold blocks, and can finish or abort them)."""
        unanswered = session.unanswered
        decision_log = self.core.log
        if _step_bytes(request) != unanswered.request:
            if decision_log.write_unwritten():
                session.unanswered = None  # this step will be applied
                for decision in unanswered.decisions:
                    session.push_event(decision)
            return None  # (else it is refused with nothing applied: the retry may still come)
        if not decision_log.write_unwritten():
            figures = decision_log.figures()
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"decision log: {figures.write_error}; this step was applied and its decisions wait to be "
                f"written ({figures.num_unwritten} decisions in all): send it again later",
            )
        session.unanswered = None
        return unanswered.reply

    async def Events(self, request, context):
        await self.auth.require(context, Role.ENGINE)
        session = await self._session(context, request.session_id)
        replaced = asyncio.ensure_future(session.take_events().wait())
        get = None
        try:
            while True:
                get = asyncio.ensure_future(session.events.get())
                await asyncio.wait((get, replaced), return_when=asyncio.FIRST_COMPLETED)
                if not get.done():  # a newer Events stream of this session reads from now on
                    get.cancel()  # (a cancelled get takes nothing off the queue)
                    return
                decision = get.result()
                if decision is None:
                    return
                if replaced.done():  # a newer stream took over as this one got it: that one sends it
                    session.events.put_front(decision)
                    return
                try:
                    await context.write(engine_pb2.EventsResponse(decision=convert.decision_to_proto(decision)))
                except BaseException:
                    # The call ended mid-write (the client went away): the next stream sends
                    # it first. It may have reached this client already: an engine that
                    # reconnects may hear a decision twice (its seq tells), never not at all.
                    session.events.put_front(decision)
                    raise
        finally:
            replaced.cancel()
            # The call ended without a decision for it (the client went away: its handler
            # is cancelled mid-wait): a get left pending would take the session's next
            # decision, and the next stream would never see it.
            if get is not None and not get.done():
                get.cancel()

    async def Heartbeat(self, request, context):
        await self.auth.require(context, Role.ENGINE)
        session = await self._session(context, request.session_id)
        return engine_pb2.HeartbeatResponse(lease_ttl_s=math.ceil(session.lease_ttl_s))

    async def CloseSession(self, request, context):
        await self.auth.require(context, Role.ENGINE)
        session = await self._session(context, request.session_id)
        if self.core.log.num_unwritten:  # closing decides (RELEASE its requests): not while they wait
            await _refuse_while_unwritten(context, self.core.log, "the close")
        decisions = self.core.close_engine(session, expire=False)
        await self._committed(context, self.core.record(decisions))
        released = sum(1 for d in decisions if d.engine_id == session.engine_id and d.kind == DecisionKind.RELEASE)
        return engine_pb2.CloseSessionResponse(released_requests=released)


class ObserverServicer(observer_pb2_grpc.ObserverServiceServicer):
    def __init__(self, core: CoreService, auth: Authorizer, *, db_path: str, watch_max_hz: float) -> None:
        self.core = core
        self.auth = auth
        self.db_path = db_path
        self.min_interval_s = 1.0 / watch_max_hz if watch_max_hz > 0 else 0.0

    async def Watch(self, request, context):
        await self.auth.require(context, Role.OBSERVER)
        # Bounded so one watcher cannot ask the daemon to buffer millions of decisions for it.
        if request.interval_ms > MAX_WATCH_INTERVAL_MS:
            await context.abort(INVALID, f"interval_ms: at most {MAX_WATCH_INTERVAL_MS}, got {request.interval_ms}")
        if request.max_decisions > MAX_WATCH_DECISIONS:
            await context.abort(INVALID, f"max_decisions: at most {MAX_WATCH_DECISIONS}, got {request.max_decisions}")
        interval_s = max((request.interval_ms or 100) / 1000.0, self.min_interval_s)
        try:
            watcher = self.core.watch_hub.add(request.max_decisions or 200)
        except TooManyWatchers:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"watchers: at most {self.core.watch_hub.max_watchers} at a time",
            )
        try:
            await context.write(observer_pb2.WatchResponse(snapshot=self.core.snapshot_proto(fresh=True)))
            while not watcher.closed:
                await watcher.sleep(interval_s)
                decisions, dropped = watcher.take()
                update = observer_pb2.WatchResponse(snapshot=self.core.snapshot_proto(), dropped_decisions=dropped)
                self.core.watch_hub.add_to(update.decisions, decisions)
                await context.write(update)
        finally:
            self.core.watch_hub.remove(watcher)

    async def GetSnapshot(self, request, context):
        await self.auth.require(context, Role.OBSERVER)
        return observer_pb2.GetSnapshotResponse(snapshot=self.core.snapshot_proto(fresh=True))

    async def QueryDecisions(self, request, context):
        from kvbudget.daemon.log.query import query_decisions
        from kvbudget.daemon.log.schema import decision_from_row

        await self.auth.require(context, Role.OBSERVER)
        kind = None
        if request.kind != common_pb2.DECISION_KIND_UNSPECIFIED:
            kind = convert.kind_from_proto(request.kind)
            if kind is None:
                await context.abort(INVALID, f"kind: unknown value {request.kind}")
        for name in ("since_unix_s", "until_unix_s"):
            value = getattr(request, name)
            if not math.isfinite(value) or value < 0:
                await context.abort(INVALID, f"{name}: must be a finite time >= 0 (0: unbounded)")
        if request.until_unix_s and request.since_unix_s > request.until_unix_s:
            await context.abort(INVALID, "since_unix_s: after until_unix_s")
        if request.limit > MAX_QUERY_LIMIT:
            await context.abort(INVALID, f"limit: at most {MAX_QUERY_LIMIT}, got {request.limit}")
        rows = await asyncio.to_thread(
            query_decisions,
            self.db_path,
            request_id=request.request_id or None,
            engine_id=request.engine_id or None,
            tenant=request.tenant or None,
            kind=kind.value if kind else None,
            since_s=request.since_unix_s or None,
            until_s=request.until_unix_s or None,
            limit=request.limit or 100,
            before_seq=request.before_seq or None,
        )
        return observer_pb2.QueryDecisionsResponse(
            decisions=[convert.decision_to_proto(decision_from_row(row)) for row in rows]
        )

    async def Estimate(self, request, context):
        await self.auth.require(context, Role.OBSERVER)
        tokens = request.tokens_per_request
        if not 1 <= tokens <= MAX_ESTIMATE_TOKENS:
            await context.abort(INVALID, f"tokens_per_request: between 1 and {MAX_ESTIMATE_TOKENS}, got {tokens}")
        controller = self.core.controller
        layout, num_blocks = controller.layout, self.core.plan.num_blocks
        batched = controller.config.max_num_batched_tokens
        return observer_pb2.EstimateResponse(
            max_concurrency=budget.max_concurrency(num_blocks, layout, tokens, batched),
            naive_max_concurrency=budget.naive_max_concurrency(num_blocks, layout, tokens),
            blocks_per_request=budget.request_worst_case(layout, tokens, batched).per_group,
        )

    async def ReportReplay(self, request, context):
        await self.auth.require(context, Role.ENGINE)
        replay = request.replay
        try:
            check_request_id("replay.replay_id", replay.replay_id)
        except StepRejected as exc:
            await context.abort(exc.code, str(exc))
        if replay.total and replay.position > replay.total:
            await context.abort(INVALID, "replay.position: beyond replay.total")
        # Every snapshot and Watch update carries each replay: a 5 MB trace name broke every
        # observer on gRPC's 4 MB default, and 64 of them the daemon's own 64 MiB limit.
        for field, text, limit in (("replay.trace", replay.trace, MAX_REPLAY_TEXT), ("replay.policy", replay.policy, 64)):
            if len(text) > limit or not text.isprintable():
                await context.abort(INVALID, f"{field}: printable text, at most {limit} characters")
        if not (math.isfinite(replay.speed) and replay.speed >= 0):
            await context.abort(INVALID, f"replay.speed: a finite number >= 0 (0: as fast as possible), got {replay.speed}")
        replays = self.core.replays
        if not replays.report(replay, time.monotonic()):
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"replay.replay_id: at most {replays.max_replays} replays"
            )
        return observer_pb2.ReportReplayResponse()


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, core: CoreService, auth: Authorizer, on_drain=None) -> None:
        self.core = core
        self.auth = auth
        self.on_drain = on_drain

    async def SetPolicy(self, request, context):
        await self.auth.require(context, Role.ADMIN)
        policy = convert.policy_from_proto(request.policy)
        if policy is None:
            await context.abort(INVALID, f"policy: unspecified or unknown value {request.policy}")
        if self.core.log.num_unwritten:
            await _refuse_while_unwritten(context, self.core.log, "the policy")
        previous = self.core.controller.policy.name
        decisions = self.core.set_policy(policy)  # [] when `policy` is in force already
        try:
            await self.core.record(decisions)
        except Exception as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"decision log: {exc}")
        # The operator hears what the switch did to the queue (naive can reject all of it).
        reply = admin_pb2.SetPolicyResponse(previous=convert.policy_to_proto(previous))
        for decision in decisions:
            if decision.kind is DecisionKind.ADMIT:
                reply.num_admitted += 1
            elif decision.kind is DecisionKind.REJECT:
                reply.rejected_by_reason[decision.reason.value] += 1
        return reply

    async def SetTenantQuota(self, request, context):
        await self.auth.require(context, Role.ADMIN)
        if not request.tenant or len(request.tenant) > MAX_TENANT_CHARS or not request.tenant.isprintable():
            await context.abort(INVALID, f"tenant: required, printable, at most {MAX_TENANT_CHARS} characters")
        if request.tenant == OTHER_TENANTS:
            await context.abort(INVALID, f"tenant: {RESERVED_TENANT}")
        if not math.isfinite(request.max_share) or not 0.0 <= request.max_share <= 1.0:
            await context.abort(INVALID, f"max_share: between 0 and 1 (0: no quota), got {request.max_share}")
        if not math.isfinite(request.weight) or request.weight < 0:
            await context.abort(INVALID, f"weight: must be >= 0 (0: 1.0), got {request.weight}")
        try:
            self.core.controller.set_tenant_quota(request.tenant, request.max_share or None, request.weight or 1.0)
        except AdmissionError as exc:
            await context.abort(INVALID, str(exc))  # ("max_share: ...")
        return admin_pb2.SetTenantQuotaResponse()

    async def Drain(self, request, context):
        await self.auth.require(context, Role.ADMIN)
        if self.core.log.num_unwritten:
            await _refuse_while_unwritten(context, self.core.log, "the drain")
        decisions = self.core.drain()
        try:
            await self.core.record(decisions)  # the waiting requests' REJECTs, on their engines' Events
        except Exception as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"decision log: {exc}")
        if self.on_drain is not None:
            await self.on_drain()
        return admin_pb2.DrainResponse(running=self.core.snapshot().num_running)


def _step_bytes(request) -> bytes:
    """A step's ops as bytes, without its number: an engine told "send the same step again"
    may send the same ops under a new step_seq (EngineClient numbers every call)."""
    seq = request.step_seq
    if not seq:
        return request.SerializeToString(deterministic=True)
    request.step_seq = 0
    try:
        return request.SerializeToString(deterministic=True)
    finally:
        request.step_seq = seq


async def _refuse_while_unwritten(context, decision_log, what: str) -> None:
    """A failed write left decisions unwritten: nothing more is decided until they are in
    the file (the log keeps the pool's order). One retry first, so that the first call
    after the disk has room again goes through; else UNAVAILABLE, with nothing applied."""
    if decision_log.write_unwritten():
        return
    figures = decision_log.figures()
    await context.abort(
        grpc.StatusCode.UNAVAILABLE,
        f"decision log: {figures.write_error}; {figures.num_unwritten} decisions wait to be written first, "
        f"so {what} was not applied: retry once the log can write",
    )
