"""The gRPC services: engine, observer, admin. Thin adapters: check the caller, read the
request, call the service object (`service.CoreService`), and turn its `Refused` into a status.

Nothing here decides admission or holds a rule of the protocol; the streams (Events, Watch)
are here because writing to a stream is the transport's.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time

import grpc

from kvbudget.daemon.core.records import DecisionKind
from kvbudget.daemon.server.admin_changes import by_whom, drain_change, quota_change, tenant_quota, who
from kvbudget.daemon.server.ask_admission import ask_admission
from kvbudget.daemon.server.auth import Authorizer, Role
from kvbudget.daemon.server.error_details import abort
from kvbudget.daemon.server.identity import check_may_open, check_owner
from kvbudget.daemon.server.refusal import Refused, Status
from kvbudget.daemon.server.service import CoreService
from kvbudget.daemon.server.watch import TooManyWatchers
from kvbudget.daemon.wire import convert
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
MAX_QUERY_LIMIT = 10_000
_ENGINE = Role.ENGINE  # enum member lookups are slow on Python 3.11; Step reads it per call
log = logging.getLogger("kvbudget.daemon")
STATUS_CODES = {status: grpc.StatusCode[status.name] for status in Status}


def answers(method):
    """A servicer method whose service's refusal ends the call with its status."""

    @functools.wraps(method)
    async def answered(self, request, context):
        try:
            return await method(self, request, context)
        except Refused as refused:
            await abort(context, STATUS_CODES[refused.status], refused.message)

    return answered


class EngineServicer(engine_pb2_grpc.EngineServiceServicer):
    def __init__(self, core: CoreService, auth: Authorizer) -> None:
        self.core = core
        self.auth = auth
        self._steps = core.steps
        self._check_callers = not auth.trusts_everyone  # Step skips the await when it would pass

    @answers
    async def OpenSession(self, request, context):
        caller = await self.auth.caller(context, Role.ENGINE)
        sessions = self.core.sessions
        check_may_open(caller, request.engine_id, sessions.of_engine(request.engine_id), request.replace_existing,
                       sessions.clock.now())
        session = await self.core.open_session(
            request.engine_id, request.lease_ttl_s, request.model_fingerprint, request.replace_existing
        )
        session.owner = caller.credential  # (no await since it opened: no call has seen it yet)
        return engine_pb2.OpenSessionResponse(
            session_id=session.session_id,
            plan=self.core.plan,
            lease_ttl_s=math.ceil(session.lease_ttl_s),
        )

    async def Step(self, request, context):
        started = time.perf_counter()
        try:
            if self._check_callers:
                check_owner(await self.auth.caller(context, _ENGINE), self.core.sessions.get(request.session_id))
            return await self._steps.step(request, started, wire=True)  # (bytes pass the serializer: malformed.py)
        except Refused as refused:
            await abort(context, STATUS_CODES[refused.status], refused.message)

    @answers
    async def Events(self, request, context):
        caller = await self.auth.caller(context, Role.ENGINE)
        check_owner(caller, self.core.sessions.get(request.session_id))
        session = self.core.live_session(request.session_id)
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

    @answers
    async def Heartbeat(self, request, context):
        caller = await self.auth.caller(context, Role.ENGINE)
        check_owner(caller, self.core.sessions.get(request.session_id))
        session = self.core.live_session(request.session_id)
        return engine_pb2.HeartbeatResponse(lease_ttl_s=math.ceil(session.lease_ttl_s))

    @answers
    async def CloseSession(self, request, context):
        caller = await self.auth.caller(context, Role.ENGINE)
        check_owner(caller, self.core.sessions.get(request.session_id))
        session = self.core.live_session(request.session_id)
        decisions = await self.core.close_session(session)
        released = sum(1 for d in decisions if d.engine_id == session.engine_id and d.kind == DecisionKind.RELEASE)
        return engine_pb2.CloseSessionResponse(released_requests=released)

    @answers
    async def ReportReplay(self, request, context):
        await self.auth.require(context, Role.ENGINE)
        await _report_replay(self.core, context, request.replay)
        return engine_pb2.EngineServiceReportReplayResponse()


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
            await abort(context, INVALID, f"interval_ms: at most {MAX_WATCH_INTERVAL_MS}, got {request.interval_ms}")
        if request.max_decisions > MAX_WATCH_DECISIONS:
            await abort(context, INVALID, f"max_decisions: at most {MAX_WATCH_DECISIONS}, got {request.max_decisions}")
        interval_s = max((request.interval_ms or 100) / 1000.0, self.min_interval_s)
        try:
            watcher = self.core.watch_hub.add(request.max_decisions or 200)
        except TooManyWatchers:
            await abort(
                context, grpc.StatusCode.RESOURCE_EXHAUSTED,
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
                await abort(context, INVALID, f"kind: unknown value {request.kind}")
        for name in ("since_unix_s", "until_unix_s"):
            value = getattr(request, name)
            if not math.isfinite(value) or value < 0:
                await abort(context, INVALID, f"{name}: must be a finite time >= 0 (0: unbounded)")
        if request.until_unix_s and request.since_unix_s > request.until_unix_s:
            await abort(context, INVALID, "since_unix_s: after until_unix_s")
        if request.limit > MAX_QUERY_LIMIT:
            await abort(context, INVALID, f"limit: at most {MAX_QUERY_LIMIT}, got {request.limit}")
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
        # Converted off the event loop too: 2,000 rows took ~70 ms there, a stall of every
        # engine's Step for each page of a dashboard's whole-log search.
        decisions = await asyncio.to_thread(lambda: [convert.decision_to_proto(decision_from_row(r)) for r in rows])
        return observer_pb2.QueryDecisionsResponse(decisions=decisions)

    @answers
    async def Estimate(self, request, context):
        await self.auth.require(context, Role.OBSERVER)
        max_concurrency, naive, per_group = self.core.estimate(request.tokens_per_request)
        return observer_pb2.EstimateResponse(
            max_concurrency=max_concurrency, naive_max_concurrency=naive, blocks_per_request=per_group
        )

    @answers
    async def AskAdmission(self, request, context):
        await self.auth.require(context, Role.OBSERVER)
        return ask_admission(self.core.controller, request, time.time())

    @answers
    async def ReportReplay(self, request, context):  # deprecated: EngineService.ReportReplay
        await self.auth.require(context, Role.ENGINE)
        await _report_replay(self.core, context, request.replay)
        return observer_pb2.ReportReplayResponse()


class AdminServicer(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, core: CoreService, auth: Authorizer, on_drain=None) -> None:
        self.core = core
        self.auth = auth
        self.on_drain = on_drain

    @answers
    async def SetPolicy(self, request, context):
        caller = await self.auth.caller(context, Role.ADMIN)
        role = caller.role
        policy = convert.policy_from_proto(request.policy)
        if policy is None:
            await abort(context, INVALID, f"policy: unspecified or unknown value {request.policy}")
        async with self.core.steps.gate.between_steps():  # (not between a big step's slices)
            self.core.check_writable("the policy")
            previous = self.core.policy_name
            decisions = by_whom(self.core.set_policy(policy), who(caller, context.peer()))  # [] if in force
            await self.core.commit(decisions)
        # The operator hears what the switch did to the queue (naive can reject all of it).
        reply = admin_pb2.SetPolicyResponse(previous=convert.policy_to_proto(previous))
        for decision in decisions:
            if decision.kind is DecisionKind.ADMIT:
                reply.num_admitted += 1
            elif decision.kind is DecisionKind.REJECT:
                reply.rejected_by_reason[decision.reason.value] += 1
        if decisions:  # (the policy in force already: nothing changed, nothing said)
            rejected = sum(reply.rejected_by_reason.values())
            _journal(context, role, f"policy {previous} -> {policy}; waiting requests: "
                     f"{reply.num_admitted} admitted, {rejected} rejected")
        return reply

    @answers
    async def SetTenantQuota(self, request, context):
        caller = await self.auth.caller(context, Role.ADMIN)
        async with self.core.steps.gate.between_steps():
            # (as a policy switch: refused while the log cannot write, so the change never
            # goes unrecorded; its row is written before the call answers)
            self.core.check_writable("the quota")
            before = tenant_quota(self.core, request.tenant)
            self.core.set_tenant_quota(request.tenant, request.max_share, request.weight)
            changes = quota_change(self.core, request.tenant, before, who(caller, context.peer()))
            await self.core.commit(changes)
        after = tenant_quota(self.core, request.tenant)
        _journal(context, caller.role, f"tenant {request.tenant!r} {before} -> {after}")
        return admin_pb2.SetTenantQuotaResponse()

    @answers
    async def Drain(self, request, context):
        caller = await self.auth.caller(context, Role.ADMIN)
        role = caller.role
        async with self.core.steps.gate.between_steps():
            self.core.check_writable("the drain")
            was_draining = self.core.draining
            noted = [] if was_draining else [drain_change(self.core, who(caller, context.peer()))]
            decisions = self.core.drain()
            # (the admin row first, then the waiting requests' REJECTs, on their engines' Events)
            await self.core.commit([*noted, *decisions])
        if self.on_drain is not None:
            await self.on_drain()
        running = self.core.snapshot().num_running
        if not was_draining:
            _journal(context, role, f"draining: {len(decisions)} waiting requests rejected, {running} running")
        return admin_pb2.DrainResponse(running=running)


async def _report_replay(core: CoreService, context, replay: common_pb2.ReplayState) -> None:
    problem = convert.fill_replay_policy(replay)
    if problem is not None:
        await abort(context, INVALID, problem)
    core.report_replay(replay)


def _journal(context, role: Role, change: str) -> None:
    """Every admin change in the daemon's log (the journal): who asked (peer and role),
    what, before -> after. A live change lasts until a restart or reload, so the journal is
    where an operator finds why the daemon runs otherwise than its config file says."""
    log.info("admin change by %s (%s): %s", context.peer() or "unknown peer", role.value, change)

