"""Helpers shared by the dashboard tests: hand-built snapshots and text rendering."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator

from rich.console import Console, RenderableType

from kvbudget.tui.state import DashboardState, Limits
from kvbudget.v1 import common_pb2, observer_pb2

GIB = 2**30


def text_of(renderable: RenderableType, width: int = 36, height: int | None = None) -> str:
    """What a terminal `width` columns wide shows, trailing spaces stripped; with `height`,
    what a box that many lines high shows (Textual renders a panel with its height)."""
    console = Console(
        width=width, color_system=None, record=True, file=io.StringIO(), legacy_windows=False
    )
    if height is not None:
        lines = console.render_lines(renderable, console.options.update(height=height), pad=False)
        return "\n".join("".join(s.text for s in line).rstrip() for line in lines)
    console.print(renderable)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines())


def snapshot(**fields) -> common_pb2.Snapshot:
    """A 100-block pool, 40 held, 10 reserved, 20 evictable; override any field."""
    base = dict(
        time_unix_s=1000.0,
        policy=common_pb2.POLICY_OPTIMISTIC,
        num_blocks=100,
        num_free_blocks=60,
        num_held_blocks=40,
        num_reserved_blocks=10,
        num_evictable_blocks=20,
        num_running=4,
        num_waiting=0,
        num_preemptions=0,
        gpu=common_pb2.GpuState(present=False, note="NVML not available"),
    )
    base.update(fields)
    return common_pb2.Snapshot(**base)


def state_of(*snapshots: common_pb2.Snapshot, limits: Limits | None = None, decisions=()):
    """The state after one Watch update per snapshot (decisions ride on the last one)."""
    state = DashboardState.initial("unix:///test.sock", limits or Limits(sample_period_s=0.0))
    for index, snap in enumerate(snapshots):
        last = index == len(snapshots) - 1
        response = observer_pb2.WatchResponse(snapshot=snap, decisions=decisions if last else ())
        state = state.with_response(response)
    return state


def screen_text(app) -> str:
    """The characters on the app's screen now, as a terminal would show them.

    Done the way `App.export_screenshot` does it, exporting text instead of SVG.
    """
    from rich.console import Console

    width, height = app.size
    console = Console(
        width=width, height=height, file=io.StringIO(), force_terminal=True,
        color_system=None, record=True, legacy_windows=False, safe_box=False,
    )
    update = app.screen._compositor.render_update(
        full=True, screen_stack=app._background_screens
    )
    console.print(update)
    return console.export_text()


def decisions_table(app):
    """The dashboard's decisions table, found as a user's CSS would (Textual's public query)."""
    return app.query_one("#decisions")


async def wait_until(pilot, condition, what: str, limit: int = 400) -> None:
    """Let the app run until `condition()` holds (at most `limit` short pauses)."""
    for _ in range(limit):
        if condition():
            return
        await pilot.pause(0.025)
    raise AssertionError(f"never happened: {what}")


class QueueSource:
    """A dashboard source the test drives event by event."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()

    async def events(self) -> AsyncIterator:
        while True:
            yield await self.queue.get()


def hang_up(pid: int, fd: int, bound_s: float = 60.0) -> int | None:
    """Close the pseudo-terminal `fd` of child `pid` (its terminal goes away: the kernel
    hangs it up) and wait for the child to exit: its wait status, or None if it was still
    running after `bound_s` (a bound on waiting, not a figure asserted; it is killed then)."""
    import os
    import signal
    import time

    os.close(fd)
    end = time.monotonic() + bound_s
    while time.monotonic() < end:
        waited, status = os.waitpid(pid, os.WNOHANG)
        if waited:
            return status
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


class NoLauncher:
    """A dashboard launcher that starts no replays (the dashboard's `r` is not under test)."""

    def stop_all(self) -> None:
        pass

    def reap(self) -> list:
        return []
