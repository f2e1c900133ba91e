"""The adapter's line to the daemon: an EngineClient on a loop thread of its own, called
synchronously from vLLM's scheduler thread.

vLLM's scheduler is synchronous, the client is asyncio: one daemon thread runs the loop
(the session, its heartbeats, the Events stream). `step()` sends its Step on a blocking
channel from vLLM's own thread (no hop to the loop and back: docs/vllm.md, "What it
costs"); a Step that fails there, or the first one of a session, goes through the
client's own path (its resend, its session re-open); one step waits at most 2.5 x
`step_timeout_s` in all. A failed step marks the link down and never blocks the engine again:
a background task re-opens a session, and the scheduler hears `SessionReset` once so it
submits again what vLLM still runs (the daemon forgot them).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import threading

import grpc

from kvbudget.client import EngineClient, SessionLost, step_message
from kvbudget.client.channel import CHANNEL_OPTIONS
from kvbudget.client.ordering import DecisionOrder
from kvbudget.client.target import call_metadata
from kvbudget.daemon.core.records import Decision
from kvbudget.daemon.wire import convert
from kvbudget.v1 import engine_pb2_grpc

log = logging.getLogger("kvbudget.vllm")


class LinkDown(Exception):
    """The daemon did not answer this step (or the link is still re-opening)."""


class SessionReset(Exception):
    """A new session is open: the daemon holds nothing of this engine's; submit again."""


class DaemonLink:
    def __init__(self, target: str, engine_id: str, *, token: str | None = None, credentials=None,
                 step_timeout_s: float = 2.0, replace_existing: bool = True, backoff_s: float = 0.5,
                 blocking_steps: bool = True) -> None:
        self._args = dict(token=token, credentials=credentials, replace_existing=replace_existing,
                          call_timeout_s=step_timeout_s, step_resends=1)
        self.target, self.engine_id = target, engine_id
        self.step_timeout_s = step_timeout_s
        self._backoff_s = backoff_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kvbudget-link", daemon=True)
        self._thread.start()
        self._client: EngineClient | None = None
        self._reconnect: concurrent.futures.Future | None = None
        self._listener: asyncio.Task | None = None
        self._events: collections.deque[Decision] = collections.deque()
        self._reset = False  # a session opened after the engine went on without one: tell it once
        self._told_down = False
        self.plan = None
        self.sessions_opened = 0
        # The blocking line for Steps: one channel for the link's life (gRPC reconnects it).
        self._channel = (grpc.secure_channel(target, credentials, options=CHANNEL_OPTIONS) if credentials
                         else grpc.insecure_channel(target, options=CHANNEL_OPTIONS))
        self._stub = engine_pb2_grpc.EngineServiceStub(self._channel)
        self._metadata = call_metadata(token)
        self._blocking = blocking_steps  # False: every Step through the loop thread (the bench's "before")
        self._step_seq = 0  # the link numbers its steps, whichever path sends them
        self._stepped_session = ""  # the session of the last step answered
        # Step replies and Events decisions, in the daemon's order per request (the client
        # orders the Events ones; the blocking Step's replies do not pass through it).
        self._order = DecisionOrder()
        self._first_seq: int | None = 0  # the new session's first decision (None: not yet seen)

    # ---------------------------------------------------------------- thread side
    def _run(self, coro, timeout: float | None):
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def open(self, timeout_s: float) -> None:
        """Opens the first session, waiting at most `timeout_s`; raises LinkDown if the daemon
        does not answer (the link then keeps trying in the background)."""
        self._reconnect = asyncio.run_coroutine_threadsafe(self._open_until_up(), self._loop)
        try:
            self._reconnect.result(timeout_s)
        except concurrent.futures.TimeoutError:
            self._told_down = True
            raise LinkDown(f"no session with the daemon at {self.target} within {timeout_s:g} s") from None

    @property
    def up(self) -> bool:
        return self._client is not None

    def step(self, submits=(), grows=(), progress=(), finishes=(), aborts=(), *,
             admit_tokens: int | None = None, admit_seqs: int | None = None) -> list[Decision]:
        """One Step; returns this engine's decisions (Events ones first). Raises LinkDown
        when the daemon did not answer, SessionReset once after a new session opened."""
        if self._client is None:
            self._start_reconnect()
            self._told_down = True
            raise LinkDown("re-opening the session")
        if self._reset:
            self._reset = False
            self._forget_old_session()
            raise SessionReset("a new session is open")
        client = self._client
        message = step_message(client.session_id, submits, grows, progress, finishes, aborts, admit_tokens, admit_seqs)
        self._step_seq += 1
        message.step_seq = self._step_seq
        try:
            reply = self._send(client, message)
        except SessionLost as lost:  # the client re-opened it already
            self._order = DecisionOrder()
            self._forget_old_session()
            self._restart_listener(client)
            raise SessionReset(str(lost)) from None
        except Exception as error:  # (grpc errors, timeouts: the daemon counts as unreachable)
            self._drop(client, error)
            self._told_down = True
            raise LinkDown(f"{type(error).__name__}: {error}") from None
        decisions = [convert.decision_from_proto(d) for d in reply.decisions]
        events = self.take_events()
        if self._first_seq is None and decisions:
            self._first_seq = min(d.seq for d in decisions)
        if self._first_seq is None:  # (no request of ours in this session yet: all stale)
            events = []
        elif events and self._first_seq:
            events = [e for e in events if e.seq >= self._first_seq]
        return self._order.fresh(events + decisions)

    def _forget_old_session(self) -> None:
        """A session reset: the Events decisions still to come of the old one (an EXPIRE of
        each request it held, say) would end the same requests submitted again in the new
        one. The daemon logged them all before the new session's first decision: an event
        older than that is dropped (docs/vllm.md, "When the daemon is away")."""
        self._events.clear()
        self._first_seq = None

    def _send(self, client: EngineClient, message):
        """The Step's reply: on the blocking channel while the session is the one the last
        step was answered in; else, or when that call fails, through the client (the same
        numbered step again: the daemon answers a resend with the outcome it kept)."""
        timeout = self.step_timeout_s * 2.5
        if self._blocking and message.session_id == self._stepped_session:
            try:
                return self._stub.Step(message, metadata=self._metadata, timeout=self.step_timeout_s,
                                       wait_for_ready=True)
            except grpc.RpcError:
                timeout = self.step_timeout_s * 1.5
        reply = self._run(client.step_raw(message), timeout)
        self._stepped_session = message.session_id
        return reply

    def take_events(self) -> list[Decision]:
        taken = []
        while self._events:
            taken.append(self._events.popleft())
        return taken

    def close(self) -> None:
        client, self._client = self._client, None
        if self._reconnect is not None:
            self._reconnect.cancel()
        if client is not None:
            with contextlib.suppress(Exception):
                self._run(self._close(client), 5.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)
        self._channel.close()

    # ---------------------------------------------------------------- loop side
    def _drop(self, client: EngineClient, error: BaseException) -> None:
        if self._client is client:
            log.warning("kvbudget daemon at %s unreachable (%s); re-opening in the background", self.target, error)
            self._client = None
            asyncio.run_coroutine_threadsafe(self._close(client), self._loop)
            self._start_reconnect()

    def _start_reconnect(self) -> None:
        if self._reconnect is None or self._reconnect.done():
            self._reconnect = asyncio.run_coroutine_threadsafe(self._open_until_up(), self._loop)

    async def _open_until_up(self) -> None:
        while True:
            client = EngineClient(self.target, self.engine_id, **self._args)
            try:
                self.plan = await client.open()
            except asyncio.CancelledError:
                await self._close(client)
                raise
            except Exception as error:
                log.info("kvbudget daemon at %s: %s; trying again", self.target, error)
                await self._close(client)
                await asyncio.sleep(self._backoff_s)
                continue
            self.sessions_opened += 1
            self._reset = self._told_down or self.sessions_opened > 1
            self._told_down = False
            self._order = DecisionOrder()  # (a new session: its requests' decisions start over)
            self._client = client
            self._restart_listener(client)
            return

    def _restart_listener(self, client: EngineClient) -> None:
        def start() -> None:
            if self._listener is not None:
                self._listener.cancel()
            self._listener = self._loop.create_task(self._listen(client))

        self._loop.call_soon_threadsafe(start)

    async def _listen(self, client: EngineClient) -> None:
        with contextlib.suppress(Exception):
            async for decision in client.events():
                self._events.append(decision)

    @staticmethod
    async def _close(client: EngineClient) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.close(), 5.0)
