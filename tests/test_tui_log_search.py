"""The `/` filter over the whole decision log (issue 32, point 3): `s` pages back through
the daemon's QueryDecisions where the table holds only the newest decisions.

Against a real daemon: 30 requests admitted in one step (seqs 1-30), then finished in one
(releases, seqs 31-60), while a dashboard whose table keeps the newest 10 watches. Its
filter `admit` finds none of them in its buffer; the search finds all 30.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from daemon_harness import DaemonProcess
from tui_helpers import NoLauncher, screen_text, wait_until

from kvbudget.client import EngineClient
from kvbudget.daemon.core.records import RequestSpec
from kvbudget.tui.app import KVBudgetApp
from kvbudget.tui.log_search import LogSearch, Progress
from kvbudget.tui.screens import DecisionScreen, LogSearchScreen
from kvbudget.tui.state import Limits, Link
from kvbudget.v1 import common_pb2

pytestmark = pytest.mark.slow


async def shown(pilot, text: str, what: str | None = None) -> str:
    await wait_until(pilot, lambda: text in screen_text(pilot.app), what or text)
    return screen_text(pilot.app)


async def load(target: str) -> None:
    # 30 requests of 16 prompt tokens, one block each of the 64: all admitted, then released.
    async with EngineClient(target, "search-engine") as engine:
        ids = [f"req-{n:02d}" for n in range(1, 31)]
        await engine.step(submits=[RequestSpec(i, prompt_tokens=16, max_new_tokens=4) for i in ids])
        await engine.step(finishes=ids)


async def test_s_searches_the_whole_log_where_the_filter_sees_only_the_newest(tmp_path: Path):
    daemon = DaemonProcess(tmp_path)
    await asyncio.to_thread(daemon.start)
    try:
        app = KVBudgetApp(daemon.target, launcher=NoLauncher(), limits=Limits(max_decisions=10))
        # Pages of 7, and 20 matches a search: the 60 decisions take 9 pages, the second
        # search (`m`) the last one.
        app.SEARCH_PAGE_SIZE, app.SEARCH_MATCHES = 7, 20
        async with app.run_test(size=(140, 44)) as pilot:
            await wait_until(pilot, lambda: app.state.connection.link is Link.CONNECTED, "connected")
            await load(daemon.target)
            await wait_until(pilot, lambda: app.state.decisions_received >= 60, "the 60 decisions streamed")
            await pilot.press("slash", *"admit", "enter")
            await shown(pilot, "filter admit (the newest 10 only · s: search the whole log)")
            assert "req-" not in screen_text(app)  # the buffer holds only releases

            await pilot.press("s")
            await wait_until(pilot, lambda: isinstance(app.screen, LogSearchScreen), "the search window")
            # Newest first, 7 a page: seqs 60-26 hold 5 admits, 25-19, 18-12 and 11-5 seven
            # each: 26 >= 20 after 8 pages (56 read), back to seq 5.
            await shown(pilot, "26 decisions match 'admit' in the newest 56 (back to seq 5) · m: more")
            text = screen_text(app)
            assert "req-30" in text and "release" not in text
            await pilot.press("m")
            await shown(pilot, "30 decisions match 'admit' in the whole log (60 read)")
            assert "m: more" not in screen_text(app)

            await pilot.press("enter")  # the newest match: req-30's admission, seq 30
            await wait_until(pilot, lambda: isinstance(app.screen, DecisionScreen), "the record")
            await shown(pilot, "Decision 30: admit")
            await pilot.press("escape", "escape")
            await wait_until(pilot, lambda: not isinstance(app.screen, (DecisionScreen, LogSearchScreen)),
                             "back to the dashboard")
    finally:
        daemon.stop()


def decision(seq: int, request_id: str) -> common_pb2.Decision:
    return common_pb2.Decision(seq=seq, request_id=request_id, kind=common_pb2.DECISION_KIND_ADMIT)


async def test_a_search_stops_at_seq_1_and_at_a_short_page():
    # A log of seqs 1-4, pages of 2: the page ending at seq 1 is the last, though full
    # (before_seq 1 asks for nothing, and 0 would mean "from the newest" again).
    log = [decision(seq, f"r{seq}") for seq in range(4, 0, -1)]
    asked: list[int] = []

    async def pages(before_seq: int, limit: int):
        asked.append(before_seq)
        older = [d for d in log if before_seq == 0 or d.seq < before_seq]
        return older[:limit]

    search = LogSearch(pages, "r", page_size=2, want=10)
    steps = [progress async for progress in search.more()]
    assert asked == [0, 3]
    assert steps[-1] == Progress(matches=tuple(log), read=4, oldest_seq=1, done=True)


async def test_a_word_found_nowhere_stops_after_max_read_and_goes_on_with_more():
    # Seqs 10-1, none matching "zzz", pages of 2, at most 4 read a search: seqs 10-7, then
    # 6-3 with `more`, then 2-1 and the end.
    log = [decision(seq, f"r{seq}") for seq in range(10, 0, -1)]

    async def pages(before_seq: int, limit: int):
        return [d for d in log if before_seq == 0 or d.seq < before_seq][:limit]

    search = LogSearch(pages, "zzz", page_size=2, want=1, max_read=4)
    ends = []
    for _ in range(3):
        ends.append([progress async for progress in search.more()][-1])
    assert [(p.read, p.oldest_seq, p.done) for p in ends] == [(4, 7, False), (8, 3, False), (10, 1, True)]
    assert ends[0].summary("zzz") == "0 decisions match 'zzz' in the newest 4 (back to seq 7)"
