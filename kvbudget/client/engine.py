"""An engine's client of the daemon: its session, one Step per scheduler step, the Events
stream, heartbeats, and the resend of a step whose reply was lost.

No torch, no textual. How sessions are lost and re-opened, and when a step is sent again:
docs/architecture/wire.md and docs/engine-integration.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Callable, Iterable

import grpc

from kvbudget.client.batch import StepBatch
from kvbudget.client.channel import open_channel, task_cancelling
from kvbudget.client.messages import step_message
from kvbudget.client.ordering import DecisionOrder
from kvbudget.client.resubmit import OpenRequests, Resubmitted
from kvbudget.client.session_errors import ClientClosed, SessionLost
from kvbudget.client.target import call_metadata
from kvbudget.daemon.core.records import Decision, RequestSpec
from kvbudget.daemon.wire import convert
from kvbudget.v1 import common_pb2, engine_pb2, engine_pb2_grpc

log = logging.getLogger("kvbudget.client")
__all__ = ["ClientClosed", "EngineClient", "SessionLost", "StepBatch"]
_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}


class EngineClient:
    """One engine's session with the daemon: `open()` (or `async with`), one `step()` per
    scheduler step, `events()` for what is decided later, `close()`."""

    def __init__(
        self,
        target: str,
        engine_id: str,
        token: str | None = None,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        lease_ttl_s: int = 0,
        model_fingerprint: str = "",
        replace_existing: bool = False,
        heartbeat: bool = True,
        call_timeout_s: float = 30.0,
        max_backoff_s: float = 2.0,
        step_resends: int = 2,
        resubmit: bool = False,
        on_resubmit: Callable[[Resubmitted], object] | None = None,
    ) -> None:
        self.target = target
        self.engine_id = engine_id
        self._metadata = call_metadata(token)
        self._channel = open_channel(target, credentials)
        self._stub = engine_pb2_grpc.EngineServiceStub(self._channel)
        self._lease_ttl_s = lease_ttl_s
        self._fingerprint = model_fingerprint
        self._replace = replace_existing
        self._heartbeat_enabled = heartbeat
        self._timeout = call_timeout_s
        self._max_backoff = max_backoff_s
        self._step_resends = step_resends
        self._last_step_seq = 0  # steps are numbered (StepRequest.step_seq) so a resend is safe
        # What step() and events() return is in the daemon's order per request: one older
        # than a decision already returned (an Events one overtaken by a Step reply), or
        # heard twice (sent again first by a stream after a reconnect), is dropped.
        self._order = DecisionOrder()
        # One step at a time, its resends included: the daemon keeps only the last numbered
        # step, so an overlapping step would be refused for its number (a lower one sent
        # second), or make the resend of the one before it "below this session's last step".
        self._step_lock = asyncio.Lock()
        self.session_id = ""
        self.lease_ttl_s = 0
        self.plan: common_pb2.PoolPlan | None = None
        self.sessions_opened = 0
        self._heartbeat_task: asyncio.Task | None = None
        self._closed = False
        self._lost: str | None = None  # a loss the heartbeat found, not yet told to the engine
        self._reopen_lock = asyncio.Lock()
        self._closing = asyncio.Event()  # wakes events() out of its reconnect pause
        self._events_reader: object | None = None  # the newest events() iteration
        # resubmit=True: the client resubmits the engine's open requests to a new session
        # itself, instead of raising SessionLost (off by default: docs/engine-integration.md).
        self._open_requests = OpenRequests() if resubmit else None
        self._on_resubmit = on_resubmit
        self.last_resubmitted: Resubmitted | None = None
        self._lost_session_id = ""

    async def __aenter__(self) -> EngineClient:
        try:
            await self.open()
        except BaseException:
            await self.close()  # `async with` does not call __aexit__ when entering fails
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ session
    async def open(self) -> common_pb2.PoolPlan:
        """Opens the session (waiting for the daemon if it is not up yet); returns the plan."""
        request = engine_pb2.OpenSessionRequest(
            engine_id=self.engine_id,
            model_fingerprint=self._fingerprint,
            lease_ttl_s=self._lease_ttl_s,
            replace_existing=self._replace,
        )
        response = await self._stub.OpenSession(
            request, metadata=self._metadata, timeout=self._timeout, wait_for_ready=True
        )
        self.session_id = response.session_id
        self._order.forget()  # (the old session's requests are gone)
        self.lease_ttl_s = response.lease_ttl_s
        self.plan = response.plan
        self.sessions_opened += 1
        # A re-open after a loss never replaces: if another session holds this engine id now,
        # another process took over, and this one gets ALREADY_EXISTS instead of a tug of war.
        self._replace = False
        if self._heartbeat_enabled and (self._heartbeat_task is None or self._heartbeat_task.done()):
            self._heartbeat_task = asyncio.create_task(self._heartbeat_loop())
        return response.plan

    async def _reopen_once(self, used_session_id: str, error: grpc.aio.AioRpcError) -> None:
        """Re-opens the session unless a concurrent call (step or heartbeat) already did."""
        async with self._reopen_lock:
            if self.session_id != used_session_id:
                return
            log.warning("session of %s lost (%s); opening a new one", self.engine_id, error.details())
            await self.open()
            self._lost_session_id = used_session_id
            # Only once the new one is open: a refused re-open (ALREADY_EXISTS) is what the
            # next step must report, not a SessionLost that says a new session is open.
            self._lost = error.details()  # step() tells the engine, once

    def _session_gone(self, error: grpc.aio.AioRpcError) -> bool:
        return error.code() == grpc.StatusCode.FAILED_PRECONDITION and "session_id" in (error.details() or "")

    async def close(self) -> None:
        """Closes the session (the daemon releases what is left) and the channel."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat_task
        if self.session_id:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self._stub.CloseSession(
                    engine_pb2.CloseSessionRequest(session_id=self.session_id),
                    metadata=self._metadata,
                    timeout=5.0,
                )
        await self._channel.close()

    # ------------------------------------------------------------------ steps
    def batch(self) -> StepBatch:
        return StepBatch(self)

    async def step(
        self,
        submits: Iterable[RequestSpec | engine_pb2.Submit] = (),
        grows: Iterable[tuple[str, int]] = (),
        progress: Iterable[tuple[str, int]] = (),
        finishes: Iterable[str] = (),
        aborts: Iterable[str] = (),
        *,
        admit_tokens: int | None = None,
        admit_seqs: int | None = None,
    ) -> list[Decision]:
        """One scheduler step in one call; returns this engine's decisions, in order, less
        any older than one events() already returned for the same request.
        `admit_tokens` / `admit_seqs`: what the step can still start (None: no bound)."""
        message = step_message(self.session_id, submits, grows, progress, finishes, aborts, admit_tokens, admit_seqs)
        response = await self.step_raw(message)
        decisions = self._order.fresh(convert.decision_from_proto(d) for d in response.decisions)
        if self._open_requests is not None:
            self._open_requests.heard(decisions)
        return decisions

    async def step_raw(self, request: engine_pb2.StepRequest) -> engine_pb2.StepResponse:
        """Sends one Step (numbered unless `request.step_seq` is set). Steps called while
        another is in flight wait for it, and go in the order they were called."""
        async with self._step_lock:
            return await self._step_locked(request)

    async def _step_locked(self, request: engine_pb2.StepRequest) -> engine_pb2.StepResponse:
        if self._closed:  # (else grpc's UsageError "Channel is closed.")
            raise ClientClosed(f"the client of engine {self.engine_id!r} is closed")
        if self._lost is not None:  # the heartbeat re-opened the session meanwhile
            reason, self._lost = self._lost, None
            if self._open_requests is not None:
                return await self._resubmit(request, reason)
            raise SessionLost(reason)
        request.session_id = used = self.session_id
        if not request.step_seq:
            self._last_step_seq += 1
            request.step_seq = self._last_step_seq
        elif request.step_seq > self._last_step_seq:  # the caller numbers its own: go on from there
            self._last_step_seq = request.step_seq
        try:
            try:
                response = await self._send(request, once_after_stop=self._open_requests is not None)
            except grpc.aio.AioRpcError as error:
                if not self._session_gone(error):
                    raise
                await self._reopen_once(used, error)
                self._lost = None
                if self._open_requests is None:
                    raise SessionLost(error.details()) from error
                return await self._resubmit(request, error.details())
        except asyncio.CancelledError:
            # close() closing the channel cancels the call: not a cancellation of the caller.
            if self._closed and not task_cancelling():
                raise ClientClosed(f"the client of engine {self.engine_id!r} was closed during this step") from None
            raise
        if self._open_requests is not None:
            self._open_requests.sent(request)
        return response

    async def _send(self, request: engine_pb2.StepRequest, *, once_after_stop: bool) -> engine_pb2.StepResponse:
        """One Step, sent again while its outcome is unknown (`step_resends`); with
        `once_after_stop`, one that failed CANCELLED or UNAVAILABLE (the daemon stopping:
        CANCELLED, it never saw it) is sent again once the daemon is back: the kept outcome,
        or, to a new daemon, session unknown (and then the resubmission)."""
        resends, after_stop = 0, not once_after_stop
        while True:
            try:
                return await self._stub.Step(request, metadata=self._metadata, timeout=self._timeout,
                                             wait_for_ready=True)
            except grpc.aio.AioRpcError as error:
                if not after_stop and error.code() in _RETRYABLE:
                    after_stop = True
                    await self._await_reconnect()
                    continue
                if resends >= self._step_resends or not self._reply_lost(error):
                    raise
                # Whether the step was applied is unknown. The daemon keeps the outcome of
                # the last numbered step, so sending the very same step again is safe.
                resends += 1
                log.warning("step %d of %s: %s; sending it again (%d of %d)", request.step_seq,
                            self.engine_id, error.code().name, resends, self._step_resends)

    async def _await_reconnect(self) -> None:
        """A pause until the connection to the stopping daemon drops (at most max_backoff_s);
        the resend then waits for the daemon that comes back (wait_for_ready)."""
        if self._channel.get_state() == grpc.ChannelConnectivity.READY:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._channel.wait_for_state_change(grpc.ChannelConnectivity.READY), self._max_backoff
                )

    async def _resubmit(self, failed: engine_pb2.StepRequest, reason: str) -> engine_pb2.StepResponse:
        """The new session gets every open request and the step that found the loss, in
        one step; its reply is that step's. The engine hears it through `on_resubmit`."""
        assert self._open_requests is not None
        message = self._open_requests.resubmission(failed)
        message.session_id = self.session_id
        self._last_step_seq += 1
        message.step_seq = self._last_step_seq
        log.warning("%s resubmits %d requests to session %s", self.engine_id, len(message.submits), self.session_id)
        try:
            response = await self._send(message, once_after_stop=False)
        except grpc.aio.AioRpcError as error:
            # The daemon gone again: the next step resubmits (to a session opened for it).
            if self._session_gone(error):
                await self._reopen_once(message.session_id, error)
            elif error.code() in _RETRYABLE or error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                self._lost = reason
            raise
        self._open_requests.sent(message)
        self.last_resubmitted = Resubmitted(
            reason=reason,
            old_session_id=self._lost_session_id,
            session_id=self.session_id,
            request_ids=tuple(s.request_id for s in message.submits),
            decisions=tuple(convert.decision_from_proto(d) for d in response.decisions),
        )
        if self._on_resubmit is not None:
            self._on_resubmit(self.last_resubmitted)
        return response

    def _reply_lost(self, error: grpc.aio.AioRpcError) -> bool:
        """Whether a failed step was sent and its reply lost: a connection dropped mid-call,
        or the deadline passed on a connection that is up. A deadline with no connection
        (the daemon is down: the call waited for one) sent nothing, and a resend would
        only wait as long again."""
        if not _outcome_unknown(error):
            return False
        if error.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
            return True
        return self._channel.get_state() == grpc.ChannelConnectivity.READY

    # ------------------------------------------------------------------ background
    async def _heartbeat_loop(self) -> None:
        backoff = 0.05
        while not self._closed:
            await asyncio.sleep(max(0.05, self.lease_ttl_s / 3))
            used = self.session_id
            try:
                await self._stub.Heartbeat(
                    engine_pb2.HeartbeatRequest(session_id=used),
                    metadata=self._metadata,
                    timeout=max(1.0, self.lease_ttl_s / 2),
                )
                backoff = 0.05
            except grpc.aio.AioRpcError as error:
                if self._session_gone(error):
                    try:
                        await self._reopen_once(used, error)
                    except grpc.aio.AioRpcError as refused:
                        if refused.code() == grpc.StatusCode.ALREADY_EXISTS:
                            # Another process took the engine id over: nothing left to keep
                            # alive (a re-open every lease / 3, a warning each, for ever).
                            # A step that re-opens the session later starts heartbeats again.
                            log.error("heartbeats of %s stop: %s", self.engine_id, refused.details())
                            return
                else:
                    await asyncio.sleep(backoff)
                    backoff = min(self._max_backoff, backoff * 2)

    async def events(self) -> AsyncIterator[Decision]:
        """Decisions taken later for this engine's requests, across reconnects, until close();
        one older than a decision step() or events() returned for its request is dropped.

        One reader per session, as on the daemon: a newer `events()` iteration of this
        client takes over, and this one ends. close() ends it too (it does not raise)."""
        reader = self._events_reader = object()
        backoff = 0.05
        while not self._closed and self._events_reader is reader:
            call = self._stub.Events(
                engine_pb2.EventsRequest(session_id=self.session_id), metadata=self._metadata, wait_for_ready=True
            )
            try:
                async for message in call:
                    backoff = 0.05
                    for decision in self._order.fresh((convert.decision_from_proto(message.decision),)):
                        if self._open_requests is not None:
                            self._open_requests.heard((decision,))
                        yield decision
            except grpc.aio.AioRpcError as error:
                if self._closed:
                    return
                if not (self._session_gone(error) or error.code() in _RETRYABLE):
                    raise
            except asyncio.CancelledError:
                # close() closing the channel cancels the call: that ends the iteration. A
                # cancellation of the reader's own task goes on.
                if self._closed and not task_cancelling():
                    return
                raise
            finally:
                call.cancel()
            if self._events_reader is not reader:  # taken over: the stream ended for that
                return
            # The stream ended (daemon stopping or restarting): follow it after a pause,
            # unless close() comes first.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), backoff * (1 + random.random()))
            backoff = min(self._max_backoff, backoff * 2)


def _outcome_unknown(error: grpc.aio.AioRpcError) -> bool:
    """Whether a failed Step may have been applied all the same: its reply was lost. The
    daemon's own refusals (draining, its decision log) say what happened; a deadline or a
    connection dropped mid-call does not."""
    code = error.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return True
    return code == grpc.StatusCode.UNAVAILABLE and not (error.details() or "").startswith(
        ("decision log:", "submits: daemon is draining")
    )
