"""The gauges computed at scrape: each /metrics request reads the core's snapshot (and the
GPU probe's and the decision log's figures) then, instead of a ticker setting them every
second whether anyone reads them or not.

The HTTP server answers on its own thread, and the core's state is the event loop's alone
(a snapshot iterates its dicts; read from another thread it could see one mid-change), so
the scrape hands the reading to the loop and waits for it. A loop that does not answer in
time (stopping, or stalled) leaves the last figures served, as a missed tick did."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvbudget.daemon.server.metrics import Metrics

log = logging.getLogger("kvbudget.daemon")

# How long a scrape waits for the event loop: well under Prometheus's default 10 s scrape
# timeout; a loop that busy has the daemon's engines waiting too.
LOOP_WAIT_S = 2.0

Figures = tuple[Any, Any, Any]  # (core snapshot, GPU probe or None, decision log figures or None)


def read_at_scrape(metrics: Metrics, loop: asyncio.AbstractEventLoop, read: Callable[[], Figures]) -> None:
    """Every collect of `metrics`' registry (a scrape, render()) first runs
    `metrics.update(*read())` on `loop`."""

    def update() -> None:
        try:
            metrics.update(*read())
        except Exception:  # the last figures are served; the journal says why (as the ticker did)
            log.exception("metrics: reading the core for a scrape failed")

    def before_collect() -> None:
        if _running_loop() is loop:  # render() on the loop itself: no hop
            update()
            return
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def on_loop() -> None:
            if done.set_running_or_notify_cancel():  # (not when the scrape gave up waiting)
                update()
                done.set_result(None)

        try:
            loop.call_soon_threadsafe(on_loop)
        except RuntimeError:  # the loop closed: the daemon is stopping
            return
        try:
            done.result(timeout=LOOP_WAIT_S)
        except concurrent.futures.TimeoutError:  # the loop too busy to answer
            done.cancel()

    metrics.registry.before_collect = before_collect


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
