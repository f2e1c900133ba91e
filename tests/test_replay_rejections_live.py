"""A live replay's rejections as they happen (issue 32, points 6 and 4): on the replay's
console and in the dashboard's Replays panel, while the replay still runs, not only in its
final table; and the replay is in the panel from its start (it appeared ~25 s after its
engine: its first report waited for 200 simulated steps).

A real daemon (the harness's: 64 usable blocks of 16 tokens, optimistic) and the real
`kvbudget replay --target` command. The trace: a 1,500-token prompt at 0 s (cdiv(1500, 16)
= 94 blocks > 64: rejected never_fits), a small request at 0.5 s, and one at 600 s that
keeps the replay running (speed 1) while the test looks.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess
from tui_helpers import NoLauncher, screen_text, wait_until

from kvbudget.traces.replay_live import RejectionNotes
from kvbudget.tui.app import KVBudgetApp
from kvbudget.tui.state import Link

pytestmark = pytest.mark.slow


async def test_a_live_replay_says_its_rejections_while_it_runs(tmp_path: Path):
    trace = tmp_path / "rejects.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,1500,10\n0.5,100,10\n600,100,10\n")
    daemon = DaemonProcess(tmp_path)
    await asyncio.to_thread(daemon.start)
    replay = None
    try:
        app = KVBudgetApp(daemon.target, launcher=NoLauncher())
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until(pilot, lambda: app.state.connection.link is Link.CONNECTED, "connected")
            replay = subprocess.Popen(
                [sys.executable, "-m", "kvbudget", "replay", str(trace), "--target", daemon.target, "--speed", "1"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            # The console: the rejection, with why, as it happens.
            line = await asyncio.wait_for(asyncio.to_thread(replay.stderr.readline), timeout=120)
            assert re.fullmatch(r"kvbudget replay: rejected \S+ \(never_fits: its worst case is more than the "
                                r"whole pool\)\n", line), line
            # The panel: the replay from its start, and its rejection.
            await wait_until(pilot, lambda: "rejected 1: never_fits 1" in screen_text(app),
                             "the rejection in the Replays panel", limit=1200)
            text = screen_text(app)
            assert "rejects.csv" in text and "running" in text
            assert replay.poll() is None  # all of it while the replay runs (its last request: at 600 s)
    finally:
        if replay is not None:
            replay.terminate()
            replay.wait(60)
            replay.stderr.close()
        daemon.stop()


class Rejected:
    def __init__(self, request_id: str, reason) -> None:
        self.request_id, self.reason = request_id, reason


def test_the_console_says_the_first_rejections_then_counts_at_most_every_2_s():
    from kvbudget.daemon.core.records import Reason

    lines: list[str] = []
    clock = [100.0]
    notes = RejectionNotes(lines.append, first=2, every_s=2.0, clock=lambda: clock[0])
    notes.add(Rejected("r1", Reason.NEVER_FITS))
    notes.add(Rejected("r2", Reason.QUEUE_FULL))
    notes.add(Rejected("r3", Reason.NEVER_FITS))  # the third: counted, said with the count
    clock[0] += 1.0
    notes.add(Rejected("r4", Reason.NEVER_FITS))  # 1 s later: not said
    clock[0] += 1.0
    notes.add(Rejected("r5", Reason.NEVER_FITS))  # 2 s after the count: said
    notes.add(Rejected("r6", Reason.NEVER_FITS))
    notes.close()  # r6 not said yet: the count in all
    assert lines == [
        "kvbudget replay: rejected r1 (never_fits: its worst case is more than the whole pool)",
        "kvbudget replay: rejected r2 (queue_full: the daemon's waiting queue is full)",
        "kvbudget replay: 3 rejected so far (never_fits 2, queue_full 1)",
        "kvbudget replay: 5 rejected so far (never_fits 4, queue_full 1)",
        "kvbudget replay: 6 rejected in all (never_fits 5, queue_full 1)",
    ]
    notes.close()
    assert len(lines) == 5  # nothing new: nothing said again
