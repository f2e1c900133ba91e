"""Screenshots of the dashboard's main screens from the recorded stream (pytest-textual-snapshot).

The SVGs live in tests/__snapshots__/test_tui_snapshots/. After an intended change of the
look, regenerate them with `pytest tests/test_tui_snapshots.py --snapshot-update` and
review the diff. They depend on the Textual version (see pyproject.toml).
"""

from __future__ import annotations

from pathlib import Path

from test_tui_app import played, recorded_app
from tui_helpers import screen_text, wait_until

from kvbudget.tui.screens import ReplayScreen

TRACES = [Path("azure_llm_2023_conv.csv"), Path("mooncake_fast25_conversation_trace.jsonl")]


def test_main_screen_120x40(snap_compare):
    assert snap_compare(recorded_app(), terminal_size=(120, 40), run_before=played)


def test_main_screen_80x24(snap_compare):
    assert snap_compare(recorded_app(), terminal_size=(80, 24), run_before=played)


def test_main_screen_60x20(snap_compare):
    # Below the documented 80x24: the 80x24 panels less engines and replays, and the
    # decisions table with rows (it had none).
    async def rows_shown(pilot):
        app = pilot.app
        await wait_until(pilot, lambda: app.state.decisions_received == 200, "played")
        await wait_until(pilot, lambda: "req-00196" in screen_text(app), "five rows painted")
        await wait_until(pilot, lambda: app.table_fresh, "table rows fit its height")

    assert snap_compare(recorded_app(), terminal_size=(60, 20), run_before=rows_shown)


def test_filtered_and_paused(snap_compare):
    async def filter_then_pause(pilot):
        await played(pilot)
        await pilot.press("slash", *"preempt", "enter", "space")
        await pilot.pause(0.2)

    assert snap_compare(recorded_app(), terminal_size=(120, 40), run_before=filter_then_pause)


def test_decision_detail(snap_compare):
    async def select_newest(pilot):
        await played(pilot)
        await pilot.press("space", "enter")
        await pilot.pause(0.1)

    assert snap_compare(recorded_app(), terminal_size=(120, 40), run_before=select_newest)


def test_key_help(snap_compare):
    async def help_(pilot):
        await played(pilot)
        await pilot.press("question_mark")
        await pilot.pause(0.1)

    assert snap_compare(recorded_app(), terminal_size=(120, 40), run_before=help_)


def test_start_replay_modal(snap_compare):
    async def open_modal(pilot):
        await played(pilot)
        await pilot.press("r")
        await wait_until(pilot, lambda: isinstance(pilot.app.screen, ReplayScreen), "modal")
        await pilot.pause(0.3)

    app = recorded_app(traces=TRACES)
    assert snap_compare(app, terminal_size=(120, 40), run_before=open_modal)


def test_whole_log_search(snap_compare):
    # `s` after `/preempt`: the search window over a log that is the recorded stream's 200
    # decisions (pages of 50, 20 matches a search), as the daemon's QueryDecisions pages it.
    from test_tui_app import STREAM

    from kvbudget.tui.log_search import LogSearch
    from kvbudget.tui.screens import LogSearchScreen

    log = [d for response in reversed(STREAM) for d in reversed(response.decisions)]  # newest first

    async def pages(before_seq: int, limit: int):
        return [d for d in log if not before_seq or d.seq < before_seq][:limit]

    async def search(pilot):
        await played(pilot)
        await pilot.press("slash", *"preempt", "enter")
        pilot.app.push_screen(LogSearchScreen(LogSearch(pages, "preempt", page_size=50, want=20)))
        await wait_until(pilot, lambda: "m: more" in screen_text(pilot.app), "searched")
        await pilot.pause(0.2)

    assert snap_compare(recorded_app(), terminal_size=(120, 40), run_before=search)
