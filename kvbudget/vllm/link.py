"""The adapter's line to the daemon: an EngineClient on a loop thread of its own, called
synchronously from vLLM's scheduler thread.

vLLM's scheduler is synchronous, the client is asyncio: one daemon thread runs the loop
(the session, its heartbeats, the Events stream), and `step()` waits for one Step at most
`step_timeout_s`. A failed step marks the link down and never blocks the engine again:
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

from kvbudget.client import EngineClient, SessionLost
from kvbudget.daemon.core.records import Decision

log = logging.getLogger("kvbudget.vllm")


class LinkDown(Exception):
    """The daemon did not answer this step (or the link is still re-opening)."""


class SessionReset(Exception):
    """A new session is open: the daemon holds nothing of this engine's; submit again."""


class DaemonLink:
    def __init__(self, target: str, engine_id: str, *, token: str | None = None, credentials=None,
                 step_timeout_s: float = 2.0, replace_existing: bool = True, backoff_s: float = 0.5) -> None:
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
            raise SessionReset("a new session is open")
        client = self._client
        coro = client.step(submits, grows, progress, finishes, aborts,
                           admit_tokens=admit_tokens, admit_seqs=admit_seqs)
        try:
            decisions = self._run(coro, self.step_timeout_s * 2.5)
        except SessionLost as lost:  # the client re-opened it already
            self._restart_listener(client)
            raise SessionReset(str(lost)) from None
        except Exception as error:  # (grpc errors, timeouts: the daemon counts as unreachable)
            self._drop(client, error)
            self._told_down = True
            raise LinkDown(f"{type(error).__name__}: {error}") from None
        return self.take_events() + decisions

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
