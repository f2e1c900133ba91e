"""A clean stop, in its order: NOT_SERVING and STOPPING=1 first (load balancers and systemd
learn it), then the streams end, the server waits up to drain_timeout_s for calls in flight,
the open requests are closed in the log (`closing.py`), and the core drains and flushes."""

from __future__ import annotations

import logging

import grpc

from kvbudget.daemon.server import sdnotify
from kvbudget.daemon.server.closing import close_on_stop, mark_closed
from kvbudget.daemon.server.health import Health
from kvbudget.daemon.server.in_flight import InFlightCalls, Stopped, stop_server
from kvbudget.daemon.server.service import CoreService

log = logging.getLogger("kvbudget.daemon")


async def stop_serving(
    core: CoreService, health: Health, server: grpc.aio.Server, calls: InFlightCalls, *,
    drain_timeout_s: float, db_path: str,
) -> bool:
    """Returns True when grpc's stop was abandoned (a peer that stopped reading)."""
    log.info("stopping: draining in-flight calls and flushing the decision log")
    sdnotify.stopping("stopping: flushing the decision log")
    await health.set_serving(False)
    core.draining = True
    core.watch_hub.close_all()  # long-lived streams end, so in-flight calls can finish
    core.end_all_streams()  # (expired sessions' too, still waiting for their decisions)
    health.end_watches()
    stopped = await stop_server(server, calls, drain_timeout_s)
    if stopped is Stopped.CUT_SHORT:
        log.info("stopped: no call in flight; closed the connections still open")
    elif stopped is Stopped.ABANDONED:
        log.warning(
            "stopping without waiting for gRPC any longer: past drain_timeout_s (%gs), a "
            "connection would not close (a client that stopped reading: frozen or hung); "
            "its calls were cancelled", drain_timeout_s,
        )
    # No call can change the pool from here: every request still open gets its last row.
    closed = await close_on_stop(core)
    await core.stop()
    if closed and not core.log.num_unwritten:
        mark_closed(db_path)
    return stopped is Stopped.ABANDONED
