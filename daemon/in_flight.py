"""The calls the daemon is serving, counted, so that a stop ends once none is left.

grpc.aio's `server.stop(grace)` returns when every call is done AND every connection has
closed. A client that is frozen (SIGSTOP, a hung host, a debugger) never answers the
server's GOAWAY, so its connection stays open, and SIGTERM waited the whole `drain_timeout_s`
(10 s as shipped) with nothing in flight. The daemon counts each call from the moment its
handler starts to the RPC's end (reply and status handed to the transport:
`context.add_done_callback`), and `stop_server` cuts the stop short (`server.stop(0)`) once
none has been in flight for `settle_s`: the connections it closes then carry no call.

`settle_s` covers calls that grpc took before it stopped accepting but whose handler has not
started yet (they start within an iteration or two of the event loop): a stop never cuts one
of those.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

SETTLE_S = 0.1  # nothing in flight this long, after the server stopped accepting: stop now


class InFlightCalls:
    """How many calls are between their handler's start and their end."""

    def __init__(self) -> None:
        self.num_in_flight = 0
        self._changed: asyncio.Event | None = None  # made by wait_idle, in its loop

    def started(self, context: grpc.aio.ServicerContext) -> None:
        """A handler starts: counted until the RPC ends (whichever way)."""
        self.num_in_flight += 1
        context.add_done_callback(self._ended)

    def _ended(self, _context: Any) -> None:
        self.num_in_flight -= 1
        if self.num_in_flight == 0 and self._changed is not None:
            self._changed.set()

    async def wait_idle(self, settle_s: float = SETTLE_S) -> None:
        """Returns once no call has been in flight for `settle_s` (at once never: a call
        taken but not started yet gets its chance first)."""
        self._changed = changed = asyncio.Event()
        while True:
            changed.clear()
            if self.num_in_flight:
                await changed.wait()  # (set when the count falls to 0)
                continue
            await asyncio.sleep(settle_s)
            if not self.num_in_flight and not changed.is_set():
                return


async def stop_server(server: grpc.aio.Server, calls: InFlightCalls, grace_s: float,
                      settle_s: float = SETTLE_S) -> bool:
    """`server.stop(grace_s)`, cut short once no call is in flight. True when it was cut
    short (a connection was still open with nothing on it: a frozen or slow peer)."""
    graceful = asyncio.ensure_future(server.stop(grace_s))
    idle = asyncio.ensure_future(calls.wait_idle(settle_s))
    try:
        await asyncio.wait((graceful, idle), return_when=asyncio.FIRST_COMPLETED)
    finally:
        idle.cancel()
    cut_short = not graceful.done()
    if cut_short:
        await server.stop(0)  # cancels nothing in flight (none is) and closes the connections
    await graceful
    return cut_short
