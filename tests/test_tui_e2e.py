"""End to end: a real `kvbudget daemon` process, a short load, the dashboard headless.

The dashboard must show the free-block and preemption counts the daemon itself reports
(GetSnapshot), and must come back by itself when the daemon restarts.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess
from tui_helpers import NoLauncher, screen_text, wait_until

from kvbudget.client import EngineClient, ObserverClient
from kvbudget.daemon.core.records import RequestSpec
from kvbudget.tui.app import KVBudgetApp
from kvbudget.daemon.wire.convert import kind_name
from kvbudget.tui.state import Link

pytestmark = pytest.mark.slow


async def shown(pilot, text: str, what: str) -> None:
    await wait_until(pilot, lambda: text in screen_text(pilot.app), what)


async def test_dashboard_shows_what_the_daemon_reports(tmp_path: Path):
    # The harness's daemon: llama-3.1-8b, 16-token blocks, 64 usable blocks, optimistic.
    daemon = DaemonProcess(tmp_path)
    await asyncio.to_thread(daemon.start)
    try:
        async with EngineClient(daemon.target, "e2e-engine") as engine, \
                ObserverClient(daemon.target) as observer:
            # a and b: 480 tokens = 30 blocks each, 64 - 60 = 4 free. a grows to 560 tokens
            # = 35 blocks: 5 more, only 4 free, so b is preempted (growth) and its 30 come
            # back: 34 free, minus a's 5 = 29.
            await engine.step(submits=[RequestSpec("a", prompt_tokens=480, max_new_tokens=200),
                                       RequestSpec("b", prompt_tokens=480, max_new_tokens=200)])
            await engine.step(grows=[("a", 560)])
            reported = await observer.snapshot()
            assert (reported.num_free_blocks, reported.num_preemptions) == (29, 1)

            app = KVBudgetApp(daemon.target, launcher=NoLauncher())
            async with app.run_test(size=(120, 40)) as pilot:
                await wait_until(pilot, lambda: app.state.snapshot is not None, "first snapshot")
                await shown(pilot, "not held 29", "the daemon's free blocks")
                text = screen_text(app)
                assert "preempted 1" in text
                assert "preempt growth 1" in text
                assert "running 1  waiting 1" in text
                assert "e2e-engine" in text and "live" in text  # the session and its lease
                assert "llama-3.1-8b" in text and "● connected" in text

                # a finishes: its 35 blocks go back and b, waiting since its preemption, is
                # admitted again with its 30: 64 - 30 = 34 free. The dashboard sees the
                # decisions live, as they happen.
                await engine.step(finishes=["a"])
                await wait_until(pilot, lambda: any(d.request_id == "a" and kind_name(d.kind) == "release"
                                                    for d in app.state.decisions), "release of a")
                reported = await observer.snapshot()
                assert reported.num_free_blocks == 34
                await shown(pilot, "not held 34", "free blocks after the release")
                await shown(pilot, "release", "the release in the decisions table")
    finally:
        daemon.stop()


async def test_after_a_short_live_replay_the_dashboard_shows_the_daemons_counts(tmp_path: Path):
    # Issue #6's acceptance: a real daemon, a short replay, the dashboard running headless
    # shows the free-block count and the preempt count the daemon reports. A pool small
    # enough for 40 Mooncake requests (~7k-token prompts) to queue and, optimistic, be preempted.
    daemon = DaemonProcess(tmp_path, "--num-gpu-blocks", "1500", "--max-model-len", "131072")
    await asyncio.to_thread(daemon.start)
    try:
        replay = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "kvbudget", "replay", "mooncake", "--limit", "40", "--as-fast-as-possible",
             "--target", daemon.target, "--json"],
            capture_output=True, text=True, timeout=300,
        )
        assert replay.returncode == 0, replay.stderr
        summary = json.loads(replay.stdout)
        assert summary["finished"] + summary["rejected"] == 40

        async with ObserverClient(daemon.target) as observer:
            reported = await observer.snapshot()
        assert reported.num_preemptions > 0  # the load did what it was sized for
        app = KVBudgetApp(daemon.target, launcher=NoLauncher())
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until(pilot, lambda: app.state.snapshot is not None, "first snapshot")
            # the dashboard groups thousands: 1,499
            await shown(pilot, f"not held {reported.num_free_blocks:,}", "the daemon's free blocks")
            await shown(pilot, f"preempted {reported.num_preemptions:,}", "the daemon's preemptions")
            await shown(pilot, "40/40", "the replay's progress in the Replays panel")
            assert "100% done" in screen_text(app)
    finally:
        daemon.stop()


async def test_dashboard_follows_the_daemon_restarting(tmp_path: Path):
    daemon = DaemonProcess(tmp_path)
    await asyncio.to_thread(daemon.start)
    try:
        app = KVBudgetApp(daemon.target, launcher=NoLauncher())
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until(pilot, lambda: app.state.connection.link is Link.CONNECTED, "up")
            await asyncio.to_thread(daemon.stop)
            await wait_until(pilot, lambda: app.state.connection.link is Link.DISCONNECTED,
                             "noticed the daemon went away")
            await shown(pilot, "● disconnected: ", "the disconnection and its cause")
            await shown(pilot, "retrying", "the retry notice")

            daemon = DaemonProcess(tmp_path)  # the same socket path, a new process
            await asyncio.to_thread(daemon.start)
            await wait_until(pilot, lambda: app.state.connection.link is Link.CONNECTED,
                             "reconnected", limit=1200)
            await shown(pilot, "● connected", "connected again")
            assert app.state.connection.reconnects >= 1
            assert "not held 64" in screen_text(app)  # a fresh pool: 64 usable, all free
    finally:
        daemon.stop()


async def test_the_dashboard_says_when_no_request_of_max_model_len_fits(tmp_path: Path):
    # Issue 32: a pool that serves nothing of max_model_len started and ran without a word;
    # a replay's rejections showed it only in its final table. The harness's pool: 64 usable
    # blocks of 16 tokens, max_model_len 2048 = 128 blocks.
    daemon = DaemonProcess(tmp_path)
    await asyncio.to_thread(daemon.start)
    try:
        app = KVBudgetApp(daemon.target, launcher=NoLauncher())
        async with app.run_test(size=(200, 40)) as pilot:
            await wait_until(pilot, lambda: app.state.snapshot is not None, "first snapshot")
            await shown(pilot, "⚠ no request of max_model_len fits (2,048 tokens need 128 blocks)",
                        "the warning on the top line")
    finally:
        daemon.stop()
