"""What systemd hears while the daemon serves: WATCHDOG=1 when it asks for it, and a STATUS=
line with the pool's state (both no-ops without NOTIFY_SOCKET)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from kvbudget.daemon.server import sdnotify

if TYPE_CHECKING:
    from kvbudget.daemon.server.service import CoreService


async def notify_loop(core: CoreService, status_every_s: float = 5.0) -> None:
    """WATCHDOG=1 at half the watchdog interval (when systemd asks for it) and a STATUS=
    line with the pool's state every few seconds; runs until cancelled."""
    interval = sdnotify.watchdog_interval_s()
    tick = min(interval / 2, status_every_s) if interval else status_every_s
    last_status = 0.0
    loop = asyncio.get_running_loop()
    while True:
        if interval:
            sdnotify.watchdog()
        if loop.time() - last_status >= status_every_s:
            last_status = loop.time()
            sdnotify.status(pool_status(core))
        await asyncio.sleep(tick)


def pool_status(core: CoreService) -> str:
    """systemd's STATUS= line while serving: the pool's state, and a log that cannot write."""
    s = core.snapshot()
    unwritten = core.log.num_unwritten
    return (
        f"{s.num_running} running, {s.num_waiting} waiting, {s.num_held_blocks}/{s.num_blocks} "
        f"blocks held ({s.usage:.0%}), policy {s.policy}{', draining' if core.draining else ''}"
        + (f", decision log cannot write ({unwritten} decisions wait), steps refused" if unwritten else "")
    )
