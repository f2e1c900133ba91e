"""The calls the daemon is serving, counted, so that a stop ends once none is left.

grpc's own stop also waits for every connection to close, and a frozen client's never
does: `stop_server` cuts the stop short once no call has been in flight for `settle_s`, and
stops waiting for a grpc stop stuck on a peer that does not read past `GIVE_UP_S`. A call
whose request is still arriving is waited for only `ARRIVING_S` into the stop: a client
frozen mid-request (its HEADERS sent, not its message) never completes it, and held the
stop until grpc's own 20 s goodbye timer, or the whole grace.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Any

import grpc

SETTLE_S = 0.1  # nothing in flight this long, after the server stopped accepting: stop now
ARRIVING_S = 5.0  # into the stop, how long a request not yet arrived whole (no handler yet) is waited for
GIVE_UP_S = 2.0  # past the grace, how long grpc's stop may still take before the daemon goes on
_GRPC_CALL_TASK = "_schedule_rpc_coro"  # grpc.aio's coroutine for one call, start to end


class Stopped(enum.Enum):
    GRACEFUL = "graceful"  # every call done and every connection closed within the grace
    CUT_SHORT = "cut_short"  # no call in flight, connections still open: closed
    ABANDONED = "abandoned"  # grpc's stop did not return (a peer not reading): not waited for


class InFlightCalls:
    """How many calls are between their start and their end."""

    def __init__(self) -> None:
        self.num_handlers = 0  # handlers started and not yet ended (their RPC's end)

    def started(self, context: grpc.aio.ServicerContext) -> None:
        """A handler starts: counted until the RPC ends (whichever way)."""
        self.num_handlers += 1
        context.add_done_callback(self._ended)

    def _ended(self, _context: Any) -> None:
        self.num_handlers -= 1

    def num_in_flight(self) -> int:
        """Calls gRPC has taken and not ended (their requests still arriving included)."""
        grpc_calls = sum(1 for task in asyncio.all_tasks() if _is_grpc_call(task))
        return max(grpc_calls, self.num_handlers)

    async def wait_idle(self, settle_s: float = SETTLE_S, arriving_s: float = ARRIVING_S) -> None:
        """Returns once no call has been in flight for `settle_s` (looked at every quarter
        of it; a call that came and went between two looks had ended anyway); past
        `arriving_s`, only calls whose handler runs count."""
        loop = asyncio.get_running_loop()
        arriving_until = loop.time() + arriving_s
        quiet_since: float | None = None
        while True:
            now = loop.time()
            if self.num_in_flight() if now < arriving_until else self.num_handlers:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= settle_s:
                return
            await asyncio.sleep(settle_s / 4)


def _is_grpc_call(task: asyncio.Task) -> bool:
    code = getattr(task.get_coro(), "cr_code", None)
    return code is not None and code.co_name == _GRPC_CALL_TASK


async def stop_server(
    server: grpc.aio.Server, calls: InFlightCalls, grace_s: float,
    settle_s: float = SETTLE_S, give_up_s: float = GIVE_UP_S, arriving_s: float = ARRIVING_S,
) -> Stopped:
    """`server.stop(grace_s)`, cut short once no call is in flight, and not waited for
    past `grace_s + give_up_s` (see the module docstring)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s + give_up_s
    graceful = asyncio.ensure_future(server.stop(grace_s))
    idle = asyncio.ensure_future(calls.wait_idle(settle_s, arriving_s))
    try:
        done, _ = await asyncio.wait((graceful, idle), timeout=deadline - loop.time(),
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        idle.cancel()
    if graceful.done():
        graceful.result()
        return Stopped.GRACEFUL
    if idle not in done:
        return Stopped.ABANDONED  # calls still in flight past the grace, and grpc stuck on them
    cut = asyncio.ensure_future(server.stop(0))  # cancels only requests that never arrived; closes the connections
    await asyncio.wait((graceful, cut), timeout=max(0.0, deadline - loop.time()),
                       return_when=asyncio.ALL_COMPLETED)
    if not (graceful.done() and cut.done()):
        return Stopped.ABANDONED  # (asyncio.run cancels what is left of them on the way out)
    graceful.result()
    cut.result()
    return Stopped.CUT_SHORT
