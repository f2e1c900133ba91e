"""The dashboard app driven by keys (Textual's Pilot), fed a recorded Watch stream.

The stream (tests/data/tui_watch_stream.jsonl, see tests/tui_stream.py) goes through a
fake source, so these tests need no daemon; tests/test_tui_e2e.py runs against a real one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from textual.widgets import DataTable
from tui_helpers import screen_text, wait_until
from tui_stream import load_stream

from kvbudget import cli
from kvbudget.tui.app import KVBudgetApp
from kvbudget.tui.replays import ReplayRequest
from kvbudget.tui.screens import DecisionScreen, HelpScreen, ReplayScreen
from kvbudget.tui.source import Connected, Disconnected, RecordedSource, SourceEvent, Update
from kvbudget.tui.state import Link

STREAM = load_stream()
LAST = STREAM[-1].snapshot


class QueueSource:
    """A source the test drives event by event."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[SourceEvent] = asyncio.Queue()

    async def events(self) -> AsyncIterator[SourceEvent]:
        while True:
            yield await self.queue.get()


class FakeLauncher:
    def __init__(self) -> None:
        self.started: list[ReplayRequest] = []
        self.stopped = 0

    def start(self, request: ReplayRequest):
        self.started.append(request)

        class Child:
            pid = 4242

        return Child()

    def stop_all(self) -> None:
        self.stopped += 1

    def reap(self) -> list:
        return []


def recorded_app(**kwargs) -> KVBudgetApp:
    kwargs.setdefault("source", RecordedSource(STREAM))
    kwargs.setdefault("launcher", FakeLauncher())
    return KVBudgetApp("unix:///test/kvbudget.sock", **kwargs)


async def played(pilot) -> None:
    """Until every recorded update is folded in and drawn."""
    app = pilot.app
    await wait_until(pilot, lambda: app.state.snapshot is not None
                     and app.state.snapshot.time_unix_s == LAST.time_unix_s, "stream played")
    await wait_until(pilot, lambda: app._drawn_version == app.state.version, "drawn")
    # The table paints its new rows on the next refresh of the screen.
    await wait_until(pilot, lambda: "req-00200" in screen_text(app), "table painted")
    # ... and its rows are those that fit its final height (a busy machine can settle the
    # layout after the first rows were built).
    await wait_until(pilot, lambda: not app._table_stale and app._table_height == app._table.size.height,
                     "table rows fit its height")


def table_seqs(app) -> list[int]:
    table = app.query_one("#decisions", DataTable)
    return [int(table.get_row_at(i)[0].plain) for i in range(table.row_count)]


async def test_the_table_refills_when_it_grows_with_no_new_data():
    # The table builds only the rows that fit. When it grew without a terminal resize
    # (the panels above it shrank: the compact layout came or went), it kept its old rows
    # until data moved: at the end of a stream, for good (a snapshot test caught it on a
    # busy machine).
    app = recorded_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await played(pilot)
        before = app._table.row_count
        assert before == app._table.size.height - 1  # (200 decisions buffered: height is the bound)
        version = app.state.version
        app.query_one("#panels").display = False  # the table takes their lines
        await wait_until(pilot, lambda: app._table.row_count > before, "table refilled")
        assert app._table.row_count == app._table.size.height - 1
        assert app.state.version == version  # no data moved meanwhile
        assert table_seqs(app)[:3] == [200, 199, 198]


async def test_every_panel_shows_the_stream_at_120x40():
    app = recorded_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await played(pilot)
        text = screen_text(app)
        # Newest decision on top: 40 updates of 5 decisions, seq 200 down.
        assert table_seqs(app)[:3] == [200, 199, 198]
    # The last recorded snapshot: 4,056 of 4,096 blocks held, 40 reserved, 120 cached;
    # 45 running, 19 waiting, 30 preemptions; GPU 100 + 2 GiB with an 80 GiB pool.
    for shown in (
        "● connected", "google/gemma-3-4b-it",
        "held 4,056  reserved 40", "cached 120  free 0 /4,096", "usage 99.0%",
        "running 45  waiting 19", "preempted 30",
        "swa 1024", "full ",
        "102.0 GiB of 141.0 GiB", "memory growing outside the pool",
        "vllm-1", "lapsed", "acme",
        "mooncake_fast25_conversation_trace", "1,950/2,000 10×",
        "Decisions · 200 received", "req-00200",
    ):
        assert shown in text, shown


async def test_every_panel_is_on_screen_at_80x24():
    app = recorded_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await played(pilot)
        text = screen_text(app)
        assert app._main.has_class("-short") and app._main.has_class("-narrow")
    for title in ("Pool", "Queue", "Physical vs logical", "Per layer type",
                  "Engines & tenants", "Replays", "Decisions"):
        assert title in text, title
    for shown in ("held 4,056", "waiting 19", "preempted 30", "⇒ memory growing outside",
                  "swa 1024", "vllm-0", "1,950/2,000", "req-00200"):
        assert shown in text, shown


async def test_slash_filters_the_table_and_escape_clears_it():
    app = recorded_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await played(pilot)
        await pilot.press("slash", *"never_fits", "enter")
        await wait_until(pilot, lambda: app.filter_text == "never_fits", "filter applied")
        await pilot.pause(0.15)
        kinds = {app.query_one("#decisions", DataTable).get_row_at(i)[2].plain
                 for i in range(app.query_one("#decisions", DataTable).row_count)}
        assert kinds == {"never_fits"}
        assert "filter never_fits" in screen_text(app)
        await pilot.press("escape")
        await pilot.pause(0.15)
        assert app.filter_text == ""
        assert table_seqs(app)[:2] == [200, 199]


async def test_space_pauses_the_table_but_not_the_panels():
    source = QueueSource()
    app = recorded_app(source=source)
    async with app.run_test(size=(120, 40)) as pilot:
        await source.queue.put(Connected())
        await source.queue.put(Update(STREAM[0]))  # decisions 1..5
        await wait_until(pilot, lambda: table_seqs(app)[:1] == [5], "first rows")
        await pilot.press("space")
        assert app.paused
        await source.queue.put(Update(STREAM[1]))  # decisions 6..10
        await wait_until(pilot, lambda: app.state.decisions_received == 10, "second update")
        await wait_until(pilot, lambda: app._drawn_version == app.state.version, "drawn")
        await pilot.pause(0.15)
        assert table_seqs(app)[:1] == [5]  # the table held still
        text = screen_text(app)
        assert "PAUSED" in text
        assert "10 received" in text  # the title and panels moved on
        await pilot.press("space")
        await wait_until(pilot, lambda: table_seqs(app)[:1] == [10], "resumed rows")
        assert "PAUSED" not in screen_text(app)


async def test_question_mark_shows_the_keys():
    app = recorded_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await played(pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = screen_text(app)
        assert "pause / resume the decisions table" in text
        assert "command palette" in text
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)


async def test_selecting_a_row_shows_the_whole_record():
    app = recorded_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await played(pilot)
        await pilot.press("space")  # hold the rows still, as a user would
        await pilot.press("down", "enter")  # the second newest: seq 199
        await wait_until(pilot, lambda: isinstance(app.screen, DecisionScreen), "detail")
        assert app.screen.row.seq == 199
        text = screen_text(app)
        # recorded decision 199: kind index 199 % 7 = 3 -> reclaim (window), engine vllm-1
        assert "Decision 199: reclaim (window)" in text
        for field in ("request_id", "req-00199", "num_computed_tokens", "blocks_reserved",
                      "vllm-1", "globex"):
            assert field in text, field
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, DecisionScreen)


async def test_q_quits_and_stops_replays_started_here():
    launcher = FakeLauncher()
    app = recorded_app(launcher=launcher)
    async with app.run_test(size=(120, 40)) as pilot:
        await played(pilot)
        await pilot.press("q")
        await pilot.pause()
    assert app.return_value == 0
    assert launcher.stopped >= 1


async def test_disconnected_shows_retrying_then_resumes():
    source = QueueSource()
    app = recorded_app(source=source)
    async with app.run_test(size=(120, 40)) as pilot:
        await source.queue.put(Connected())
        await source.queue.put(Update(STREAM[0]))
        await source.queue.put(Disconnected("UNAVAILABLE: connection refused", 0.5))
        await wait_until(pilot, lambda: app.state.connection.link is Link.DISCONNECTED, "down")
        await wait_until(pilot, lambda: app._drawn_version == app.state.version, "drawn")
        text = screen_text(app)
        assert "disconnected, retrying in 0.5s (UNAVAILABLE: connection refused)" in text
        assert "held 600" in text  # the last known state stays on screen
        await source.queue.put(Update(STREAM[1]))
        await wait_until(pilot, lambda: app.state.connection.link is Link.CONNECTED, "up")
        await wait_until(pilot, lambda: app._drawn_version == app.state.version, "drawn")
        assert "● connected" in screen_text(app)
        assert app.state.connection.reconnects == 1


async def test_replay_modal_starts_a_replay_of_a_picked_trace(tmp_path: Path):
    traces = [tmp_path / "a_trace.jsonl", tmp_path / "b_trace.csv"]
    for trace in traces:
        trace.write_text("")
    launcher = FakeLauncher()
    app = recorded_app(launcher=launcher, traces=traces)
    async with app.run_test(size=(120, 40)) as pilot:
        await played(pilot)
        await pilot.press("r")
        await wait_until(pilot, lambda: isinstance(app.screen, ReplayScreen), "modal")
        assert "a_trace.jsonl" in screen_text(app)
        await pilot.click("#replay-start")
        await wait_until(pilot, lambda: launcher.started, "replay started")
    # defaults: the first trace, 10x, the daemon's policy, 2000 requests
    assert launcher.started == [ReplayRequest(traces[0], speed=10.0, policy="", limit=2000)]


async def test_many_updates_are_coalesced_into_few_frames():
    # 400 updates as fast as the source can yield them: the screen is drawn at the render
    # rate, not once per update.
    many = [STREAM[i % len(STREAM)] for i in range(400)]
    app = recorded_app(source=RecordedSource(many), render_hz=10.0)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.state.version >= 401, "all folded", limit=2000)
        await wait_until(pilot, lambda: app._drawn_version == app.state.version, "drawn")
        assert app.renders < 400
        assert len(app.state.decisions) == app.state.limits.max_decisions  # bounded


def test_bad_target_is_one_line_and_exit_2(capsys):
    assert cli.main(["tui", "--target", "not a target"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "kvbudget tui: error: --target 'not a target': expected unix:///path/to.sock "
        "or host:port (port 1-65535)\n"
    )


@pytest.mark.parametrize("target", ["unix:///run/kvbudget/kvbudget.sock", "unix:rel.sock",
                                    "localhost:50051", "dns:///host:1", "[::1]:443"])
def test_good_targets_pass_the_check(target):
    from kvbudget.target import check_target

    # the dashboard's check: a socket that is not there yet is fine, it waits for the daemon
    assert check_target(target, require_socket=False) == target


def test_without_a_terminal_the_dashboard_refuses_in_one_line(capsys):
    # pytest's stdin/stdout are not a TTY: drawing there would never end
    assert cli.main(["tui", "--target", "localhost:50051"]) == 2
    assert capsys.readouterr().err.startswith("kvbudget tui: error: kvbudget tui needs a terminal; ")


def test_without_a_terminal_a_real_process_exits_at_once(tmp_path: Path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "kvbudget", "tui", "--target", f"unix://{tmp_path}/k.sock"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("kvbudget tui: error: kvbudget tui needs a terminal; ")
    assert done.stderr.count("\n") == 1


def test_target_comes_from_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("KVBUDGET_TARGET", "unix://relative.sock")
    assert cli.main(["tui"]) == 2
    assert "unix:// needs an absolute path" in capsys.readouterr().err


async def test_command_palette_offers_the_dashboard_actions(tmp_path: Path):
    launcher = FakeLauncher()
    app = recorded_app(launcher=launcher, traces=[tmp_path / "t.jsonl"])
    async with app.run_test(size=(120, 40)) as pilot:
        await played(pilot)
        await pilot.press("ctrl+p")
        await pilot.press(*"Start a replay")
        await pilot.pause(0.3)
        assert "Start a replay" in screen_text(app)
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, ReplayScreen), "replay modal")


def test_bad_recordings_are_one_line(tmp_path: Path, capsys):
    missing = tmp_path / "missing.jsonl"
    assert cli.main(["tui", "--recording", str(missing)]) == 2
    assert capsys.readouterr().err == f"kvbudget tui: error: --recording {missing}: no such file\n"
    junk = tmp_path / "junk.jsonl"
    junk.write_text("not json\n")
    assert cli.main(["tui", "--recording", str(junk)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvbudget tui: error: --recording {junk}: not a Watch recording")
    assert err.count("\n") == 1
