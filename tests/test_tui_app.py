"""The dashboard app driven by keys (Textual's Pilot), fed a recorded Watch stream.

The stream (tests/data/tui_watch_stream.jsonl, see tests/tui_stream.py) goes through a
fake source, so these tests need no daemon; tests/test_tui_e2e.py runs against a real one.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from textual import events
from textual.widgets import DataTable
from tui_helpers import QueueSource, decisions_table, hang_up, screen_text, wait_until
from tui_stream import load_stream

from kvbudget.cli import main as cli
from kvbudget.tui.app import KVBudgetApp
from kvbudget.tui.replays import ReplayRequest
from kvbudget.tui.screens import DecisionScreen, HelpScreen, ReplayScreen
from kvbudget.tui.source import Connected, Disconnected, RecordedSource, Update
from kvbudget.tui.state import Limits, Link
from kvbudget.v1 import common_pb2, observer_pb2

STREAM = load_stream()
LAST = STREAM[-1].snapshot


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


class Clock:
    """The app's monotonic clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def recorded_app(**kwargs) -> KVBudgetApp:
    kwargs.setdefault("source", RecordedSource(STREAM))
    kwargs.setdefault("launcher", FakeLauncher())
    # A clock that stands still unless a test moves it: the recorded stream ends and
    # holds, and a real clock would mark its figures stale a few seconds later (on a busy
    # machine, in the middle of a screenshot).
    kwargs.setdefault("clock", Clock())
    return KVBudgetApp(kwargs.pop("target", "unix:///test/kvbudget.sock"), **kwargs)


async def played(pilot) -> None:
    """Until every recorded update is folded in and drawn."""
    app = pilot.app
    await wait_until(pilot, lambda: app.state.snapshot is not None
                     and app.state.snapshot.time_unix_s == LAST.time_unix_s, "stream played")
    await wait_until(pilot, lambda: app.drawn_version == app.state.version, "drawn")
    # The table paints its new rows on the next refresh of the screen.
    await wait_until(pilot, lambda: "req-00200" in screen_text(app), "table painted")
    # ... and its rows are those that fit its final height (a busy machine can settle the
    # layout after the first rows were built).
    await wait_until(pilot, lambda: app.table_fresh,
                     "table rows fit its height")


def later(response: observer_pb2.WatchResponse, seqs: int,
          snapshot: common_pb2.Snapshot | None = None) -> observer_pb2.WatchResponse:
    """`response`'s decisions numbered `seqs` on, with the last recorded snapshot (or
    `snapshot`): the same daemon, later."""
    moved = observer_pb2.WatchResponse(snapshot=snapshot or LAST)
    for decision in response.decisions:
        moved.decisions.add().CopyFrom(decision)
        moved.decisions[-1].seq += seqs
    return moved


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
        before = decisions_table(app).row_count
        assert before == decisions_table(app).size.height - 1  # (200 decisions buffered: height is the bound)
        version = app.state.version
        app.query_one("#panels").display = False  # the table takes their lines
        await wait_until(pilot, lambda: decisions_table(app).row_count > before, "table refilled")
        assert decisions_table(app).row_count == decisions_table(app).size.height - 1
        assert app.state.version == version  # no data moved meanwhile
        assert table_seqs(app)[:3] == [200, 199, 198]


async def test_every_panel_shows_the_stream_at_120x40():
    app = recorded_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await played(pilot)
        text = screen_text(app)
        # Newest decision on top: 40 updates of 5 decisions, seq 200 down.
        assert table_seqs(app)[:3] == [200, 199, 198]
    # The last recorded snapshot: 4,056 of 4,096 blocks held, 40 reserved (nothing left:
    # none of its 120 evictable blocks is shown cached, they are promised);
    # 45 running, 19 waiting, 30 preemptions; GPU 100 + 2 GiB with an 80 GiB pool.
    for shown in (
        "● connected", "google/gemma-3-4b-it",
        "held 4,056  reserved 40", "cached 0  free 0 /4,096", "usage 99.0%",
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
        assert app.screen.has_class("-short") and app.screen.has_class("-narrow")  # (no modal open)
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
        await wait_until(pilot, lambda: app.drawn_version == app.state.version, "drawn")
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


# What grpc says when the daemon's socket is there but nothing listens (it was killed -9).
REFUSED = (
    "UNAVAILABLE: failed to connect to all addresses; last error: FAILED_PRECONDITION: "
    "unix:/tmp/k/d.sock: connect failed: addr: unix:/tmp/k/d.sock error: Connection refused"
)


async def shown(pilot, text: str, what: str | None = None) -> str:
    await wait_until(pilot, lambda: text in screen_text(pilot.app), what or text)
    return screen_text(pilot.app)


async def test_disconnected_shows_why_counts_down_and_resumes():
    source, clock = QueueSource(), Clock()
    app = recorded_app(source=source, clock=clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await source.queue.put(Connected())
        await source.queue.put(Update(STREAM[0]))
        await wait_until(pilot, lambda: app.state.decisions_received == 5, "first update")
        clock.now += 3.0
        await source.queue.put(Disconnected(REFUSED, 5.0))
        await wait_until(pilot, lambda: app.state.connection.link is Link.DISCONNECTED, "down")
        # The cause first (grpc's tail), the retry counting down, the age of the figures.
        text = await shown(pilot, "● disconnected: Connection refused, retrying in 5 s · no update for 3 s")
        assert "held 600" in text  # the last known state stays on screen, dimmed
        assert app.query_one("#panels").has_class("-stale")
        clock.now += 2.2
        await shown(pilot, "retrying in 3 s · no update for 5 s")
        clock.now += 3.0
        await shown(pilot, "retrying… · no update for 8 s")
        await source.queue.put(Update(STREAM[1]))
        await wait_until(pilot, lambda: app.state.connection.link is Link.CONNECTED, "up")
        text = await shown(pilot, "● connected  google/gemma-3-4b-it  optimistic  daemon 0.1.0 · up 2h13m  unix://")
        assert "no update" not in text and not app.query_one("#panels").has_class("-stale")
        assert app.state.connection.reconnects == 1


async def test_the_whole_disconnect_reason_shows_on_a_wide_terminal():
    source = QueueSource()
    app = recorded_app(source=source)
    async with app.run_test(size=(300, 40)) as pilot:
        await source.queue.put(Connected())
        await source.queue.put(Update(STREAM[0]))
        await source.queue.put(Disconnected(REFUSED, 5.0))
        text = await shown(pilot, "error: Connection refused)", "the whole reason, not cut at 80")
        assert f"({REFUSED})" in text


async def test_a_daemon_that_hangs_shows_the_age_of_the_figures():
    # kill -STOP: the stream stays open and nothing arrives. After a few update intervals
    # (at least 2 s) the figures are marked as old.
    source, clock = QueueSource(), Clock()
    app = recorded_app(source=source, clock=clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await source.queue.put(Connected())
        await source.queue.put(Update(STREAM[0]))
        await source.queue.put(Update(STREAM[1]))  # 0.5 s apart on the daemon's clock
        await wait_until(pilot, lambda: app.state.decisions_received == 10, "updates")
        await shown(pilot, "● connected  google/gemma-3-4b-it")
        clock.now += 1.9  # not yet: 5 intervals of 0.5 s = 2.5 s
        await pilot.pause(0.2)
        assert "no update" not in screen_text(app) and not app.query_one("#panels").has_class("-stale")
        clock.now += 10.1
        await shown(pilot, "● connected, no update for 12 s")
        assert app.query_one("#panels").has_class("-stale")
        await source.queue.put(Update(STREAM[2]))
        await wait_until(pilot, lambda: not app.query_one("#panels").has_class("-stale"), "live again")


async def test_a_restarted_daemon_numbering_from_1_again_does_not_crash_the_table():
    # QA's repro: the old run's decisions are in the buffer when a new daemon sends seq 1.
    source = QueueSource()
    app = recorded_app(source=source)
    async with app.run_test(size=(120, 40)) as pilot:
        await source.queue.put(Connected())
        await source.queue.put(Update(STREAM[0]))  # seqs 1..5
        await wait_until(pilot, lambda: table_seqs(app)[:1] == [5], "first rows")
        await source.queue.put(Disconnected("UNAVAILABLE: Socket closed", 0.25))
        await source.queue.put(Connected())
        # The new daemon: a later clock, and its first decision is seq 1 again (a policy
        # switch); its counters alone would not tell (they are the old run's here).
        restarted = observer_pb2.WatchResponse(snapshot=STREAM[0].snapshot)
        restarted.snapshot.time_unix_s += 60.0
        restarted.decisions.add().CopyFrom(STREAM[0].decisions[0])
        await source.queue.put(Update(restarted))
        await wait_until(pilot, lambda: app.state.decisions_received == 6, "the new daemon's decision")
        await wait_until(pilot, lambda: table_seqs(app) == [1], "the old run's rows gone")
        await pilot.pause(0.3)
        assert app.return_code is None  # still running: no DuplicateKey
        assert app.state.restarts == 1


async def test_the_top_line_names_the_daemon_and_its_uptime_and_a_new_start_is_a_restart():
    # The recorded daemon started 2 h 13 min before the recording. Then another process
    # answers, up 45 s, busier than the old one (higher counters): only its start time says
    # it is another daemon; the uptime on the line is its own.
    source = QueueSource()
    app = recorded_app(source=source)
    async with app.run_test(size=(120, 40)) as pilot:
        await source.queue.put(Connected())
        await source.queue.put(Update(STREAM[0]))
        await shown(pilot, "optimistic  daemon 0.1.0 · up 2h13m  unix://")
        busier = observer_pb2.WatchResponse(snapshot=STREAM[1].snapshot)
        busier.snapshot.started_unix_s = busier.snapshot.time_unix_s - 45.9
        busier.snapshot.daemon_version = "0.2.0"
        busier.snapshot.num_preemptions += 100
        await source.queue.put(Update(busier))
        await shown(pilot, "optimistic  daemon 0.2.0 · up 45s  unix://")
        assert app.state.restarts == 1 and len(app.state.history) == 1


async def test_filter_and_target_text_are_shown_as_typed_never_as_markup(tmp_path: Path):
    app = recorded_app(target="unix:///tmp/[/x]/d[b].sock", traces=[tmp_path / "[red]t.jsonl"])
    async with app.run_test(size=(120, 40)) as pilot:
        await played(pilot)
        await pilot.press("slash", "[", "/")  # "[/" crashed Textual's markup parser
        text = await shown(pilot, "filter [/ ")
        assert app.return_code is None
        await pilot.press("escape", "slash", *".*[(\\?+{ }$^|", "enter")
        text = await shown(pilot, "filter .*[(\\?+{ }$^| ")
        assert "[/b]" not in text
        await pilot.press("escape")
        await pilot.press("r")
        await wait_until(pilot, lambda: isinstance(app.screen, ReplayScreen), "modal")
        text = await shown(pilot, "Start a replay against unix:///tmp/[/x]/d[b].sock")
        assert "[red]t.jsonl" in text
        assert app.return_code is None


async def test_a_reason_with_brackets_shows_in_the_record_as_sent():
    odd = observer_pb2.WatchResponse(snapshot=LAST)
    decision = odd.decisions.add()
    decision.CopyFrom(STREAM[-1].decisions[-1])
    decision.seq, decision.reason, decision.request_id = 201, "[/x] [b]", "req-[/]"
    source = RecordedSource([*STREAM, odd])
    app = recorded_app(source=source)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.state.decisions_received == 201, "played")
        await wait_until(pilot, lambda: table_seqs(app)[:1] == [201], "drawn")
        await pilot.press("space", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, DecisionScreen), "detail")
        text = await shown(pilot, "Decision 201: preempt ([/x] [b])")
        assert "req-[/]" in text
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
    # rate, not once per update. (The recorded decisions numbered on, 5 an update: seqs
    # that went back would be a daemon restarting, and the buffer would start over.)
    many = [later(STREAM[i % len(STREAM)], i * 5 - STREAM[i % len(STREAM)].decisions[0].seq + 1)
            for i in range(400)]
    app = recorded_app(source=RecordedSource(many), render_hz=10.0)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.state.version >= 401, "all folded", limit=2000)
        await wait_until(pilot, lambda: app.drawn_version == app.state.version, "drawn")
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
    from kvbudget.client.target import check_target

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


def highlighted_seq(app) -> int:
    table = app.query_one("#decisions", DataTable)
    return int(table.get_row_at(table.cursor_row)[0].plain)


async def test_a_paused_table_holds_through_a_resize_and_a_filter():
    source = QueueSource()
    app = recorded_app(source=source)
    async with app.run_test(size=(120, 40)) as pilot:
        await source.queue.put(Connected())
        for response in STREAM[:4]:  # decisions 1..20
            await source.queue.put(Update(response))
        await wait_until(pilot, lambda: table_seqs(app)[:1] == [20], "first rows")
        await pilot.press("space")
        for response in STREAM[4:8]:  # decisions 21..40 arrive while paused
            await source.queue.put(Update(response))
        await wait_until(pilot, lambda: app.state.decisions_received == 40, "more decisions")
        await pilot.resize_terminal(100, 30)
        await pilot.pause(0.4)
        assert table_seqs(app) == list(range(20, 0, -1))  # held, all 20 of them
        await pilot.press("slash", *"vllm-1")  # the odd seqs' engine
        await wait_until(pilot, lambda: app.filter_text == "vllm-1", "filter typed")
        await pilot.pause(0.4)
        assert table_seqs(app) == list(range(19, 0, -2))  # the held rows, filtered
        await pilot.press("escape")
        await pilot.pause(0.4)
        assert table_seqs(app)[:1] == [20]
        await pilot.press("space")
        await wait_until(pilot, lambda: table_seqs(app)[:1] == [40], "live again")


async def test_enter_on_a_paused_row_opens_it_after_it_left_the_buffer():
    source = QueueSource()
    app = recorded_app(source=source, limits=Limits(max_decisions=20, sample_period_s=0.0))
    async with app.run_test(size=(120, 40)) as pilot:
        await source.queue.put(Connected())
        for response in STREAM[:4]:  # decisions 1..20: the buffer is full
            await source.queue.put(Update(response))
        await wait_until(pilot, lambda: table_seqs(app)[:1] == [20], "first rows")
        await pilot.press("space")
        for response in STREAM[4:8]:  # 21..40 push 1..20 out of the buffer
            await source.queue.put(Update(response))
        await wait_until(pilot, lambda: app.state.decisions[0].seq == 21, "buffer moved on")
        decisions_table(app).move_cursor(row=decisions_table(app).row_count - 1)  # the oldest row shown: seq 1
        await pilot.pause()
        assert highlighted_seq(app) == 1
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, DecisionScreen), "detail")
        assert app.screen.row.seq == 1 and app.screen.row.request_id == "req-00001"


async def test_a_row_chosen_in_live_mode_stays_chosen_as_rows_arrive():
    source = QueueSource()
    app = recorded_app(source=source)
    async with app.run_test(size=(120, 40)) as pilot:
        await source.queue.put(Connected())
        for response in STREAM[:2]:  # decisions 1..10
            await source.queue.put(Update(response))
        await wait_until(pilot, lambda: table_seqs(app)[:1] == [10], "first rows")
        await pilot.press("down", "down")
        assert highlighted_seq(app) == 8
        for response in STREAM[2:10]:  # 40 more: seq 8 is far below the rows that fit
            await source.queue.put(Update(response))
        await wait_until(pilot, lambda: table_seqs(app)[:1] == [50], "new rows")
        await pilot.pause(0.4)
        assert highlighted_seq(app) == 8
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, DecisionScreen), "detail")
        assert app.screen.row.seq == 8  # what was highlighted, nothing else
        await pilot.press("escape", "ctrl+home")  # back on top: it follows the newest again
        await source.queue.put(Update(STREAM[10]))
        await wait_until(pilot, lambda: table_seqs(app)[:1] == [55], "newest")
        await wait_until(pilot, lambda: highlighted_seq(app) == 55, "follows the newest")


async def test_playback_says_so_and_r_explains_why_it_does_nothing():
    launcher = FakeLauncher()
    app = recorded_app(launcher=launcher, playback=True)
    async with app.run_test(size=(120, 40)) as pilot:
        await played(pilot)
        text = screen_text(app)
        assert ("▶ playback  google/gemma-3-4b-it  optimistic  daemon 0.1.0 · up 2h13m  "
                "unix:///test/kvbudget.sock") in text
        assert "● connected" not in text
        assert "playback: no replay from here" in text
        told: list[str] = []
        app.notify = lambda message, **kwargs: told.append(message)  # type: ignore[method-assign]
        await pilot.press("r")
        await wait_until(pilot, lambda: told, "told why")
        assert told[0].startswith("playback of a recording: no daemon to replay against")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, ReplayScreen) and launcher.started == []


def test_kvbudget_tui_recording_is_playback(monkeypatch):
    from kvbudget.tui import app as app_module
    from tui_stream import STREAM_PATH

    given: dict = {}

    class FakeApp:  # what the command hands the app is the point here
        def __init__(self, target, token, **kwargs) -> None:
            given.update(kwargs, target=target)

        def run(self) -> int:
            return 0

    monkeypatch.setattr(app_module, "KVBudgetApp", FakeApp)
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    assert cli.main(["tui", "--recording", str(STREAM_PATH)]) == 0
    assert given["playback"] is True and given["target"] == "recording tui_watch_stream.jsonl"


async def test_a_tiny_terminal_shows_the_link_state_before_the_target():
    app = recorded_app(target="unix:///run/kvbudget/a-rather-long-path/kvbudget.sock")
    async with app.run_test(size=(40, 12)) as pilot:
        await wait_until(pilot, lambda: app.state.decisions_received == 200, "played")
        await wait_until(pilot, lambda: app.drawn_version == app.state.version, "drawn")
        await pilot.pause(0.1)
        first = screen_text(app).splitlines()[0]
        assert first.startswith(" kvbudget  ● connected  google/gemma-")


async def test_engines_that_do_not_fit_are_counted():
    crowded = common_pb2.Snapshot()
    crowded.CopyFrom(LAST)
    del crowded.engines[:]
    for i in range(9):
        crowded.engines.add(engine_id=f"4ea3818b-5c1d-4e2f-engine-{i:02d}", lease_remaining_s=9.0)
    app = recorded_app(source=RecordedSource([observer_pb2.WatchResponse(snapshot=crowded)]))
    async with app.run_test(size=(120, 40)) as pilot:
        # 6 lines in the panel: 2 headers, the first engine, "+8 more", the 2 tenants.
        text = await shown(pilot, "+8 more engines")
        assert "4ea3…engine-00" in text and "globex" in text


def test_a_crashed_dashboard_exits_non_zero(monkeypatch, tmp_path: Path):
    from kvbudget.tui import app as app_module

    class Broken:
        async def events(self):
            yield Connected()
            raise RuntimeError("the source broke")

    class CrashingApp(app_module.KVBudgetApp):
        def __init__(self, target, token, **kwargs) -> None:
            kwargs.update(source=Broken(), launcher=FakeLauncher())
            super().__init__(target, token, **kwargs)

        def run(self, **kwargs):
            return super().run(headless=True, size=(80, 24))

    monkeypatch.setattr(app_module, "KVBudgetApp", CrashingApp)
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    # Textual's run() returns None after an unhandled exception: it was exit status 0.
    assert cli.main(["tui", "--target", f"unix://{tmp_path}/k.sock"]) == 1


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
async def test_sigterm_and_sighup_end_the_dashboard_as_q_does(signum):
    before = signal.getsignal(signum)
    launcher = FakeLauncher()
    app = recorded_app(launcher=launcher)
    async with app.run_test(size=(120, 40)) as pilot:
        await played(pilot)
        # Installed (else raising it would end this test process, as it ended the dashboard).
        assert signal.getsignal(signum) not in (signal.SIG_DFL, before)
        signal.raise_signal(signum)
        await pilot.pause(0.2)
    assert app.return_code == 128 + signum
    assert launcher.stopped >= 1  # the replays started here
    assert signal.getsignal(signum) == before  # put back


def test_sigterm_gives_the_terminal_back(tmp_path: Path):
    # A real `kvbudget tui` on a pseudo-terminal: SIGTERM ends it with 143 (not killed by
    # the signal) after it left the alternate screen.
    import fcntl
    import os
    import pty
    import select
    import struct
    import sys
    import termios
    import time

    from tui_stream import STREAM_PATH

    pid, fd = pty.fork()
    if pid == 0:  # the child: a 100x30 terminal, then the dashboard
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        env = dict(os.environ, TERM="xterm-256color")
        os.execve(sys.executable, [sys.executable, "-m", "kvbudget", "tui", "--recording",
                                   str(STREAM_PATH)], env)
    output = bytearray()

    def read_until(condition, limit_s: float) -> None:
        end = time.monotonic() + limit_s
        while not condition() and time.monotonic() < end:
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # the child closed the terminal
                    return
                if not chunk:
                    return
                output.extend(chunk)

    try:
        read_until(lambda: b"playback" in output, 60)
        assert b"playback" in output, output[-2000:]
        shown = len(output)
        os.kill(pid, signal.SIGTERM)
        read_until(lambda: False, 10)  # to the end
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 128 + signal.SIGTERM
    assert b"\x1b[?1049l" in output[shown:]  # the alternate screen left


async def test_keys_typed_right_after_slash_go_to_the_filter():
    # A terminal delivers "/queue" typed fast (or pasted) as keys already queued: the
    # focus must have moved to the filter before the "q" is handled, or "q" quits.
    app = recorded_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await played(pilot)
        for char in "/queue/[/":  # the "/"s after the first are characters of the filter
            key = {"/": "slash", "[": "left_square_bracket"}.get(char, char)
            app.post_message(events.Key(key, char))
        await wait_until(pilot, lambda: app.filter_text == "queue/[/", "filter typed")
        assert app.return_code is None  # still running


def test_a_dashboard_whose_terminal_goes_away_exits(tmp_path: Path):
    # A real `kvbudget tui` on a pseudo-terminal whose other end is closed (an ssh session
    # dropped, a tmux pane killed): the kernel hangs the terminal up and sends SIGHUP.
    # Textual's orderly shutdown writes to the dead terminal and could hang there for good
    # (its output thread gone, its queue full), leaving the dashboard spinning with no
    # terminal; it exits 129 instead, at once.
    import fcntl
    import os
    import pty
    import select
    import struct
    import sys
    import termios
    import time

    from tui_stream import STREAM_PATH

    pid, fd = pty.fork()
    if pid == 0:
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        env = dict(os.environ, TERM="xterm-256color")
        os.execve(sys.executable, [sys.executable, "-m", "kvbudget", "tui", "--recording",
                                   str(STREAM_PATH), "--render-hz", "30"], env)
    output = bytearray()
    try:
        end = time.monotonic() + 60
        while b"playback" not in output and time.monotonic() < end:
            if select.select([fd], [], [], 0.1)[0]:
                output.extend(os.read(fd, 65536))
        assert b"playback" in output, output[-2000:]
    finally:
        status = hang_up(pid, fd, bound_s=30)  # the terminal goes away mid-draw
    assert status is not None, "the dashboard outlived its terminal"
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 128 + signal.SIGHUP


def decisions_title(app) -> str:
    """The Decisions box's title as the screen shows it, without the rule around it."""
    titles = (line.strip().strip("╭╮─ ") for line in screen_text(app).splitlines())
    return next((title for title in titles if title.startswith("Decisions")), "")


async def test_a_terminal_below_80x24_still_shows_a_few_decisions():
    # At 60x20 the six panels took every line but the table's header: not one decision
    # was on screen. Below the documented 80x24 the last row of panels gives way instead.
    app = recorded_app()
    async with app.run_test(size=(60, 20)) as pilot:
        await wait_until(pilot, lambda: app.state.decisions_received == 200, "played")
        await wait_until(pilot, lambda: app.drawn_version == app.state.version, "drawn")
        await wait_until(pilot, lambda: "req-00198" in screen_text(app), "three rows on screen",
                         limit=120)
        text = screen_text(app)
        assert app.compact  # the 80x24 panels, compact
    for shown in ("req-00200", "req-00199", "req-00198",  # newest first
                  "Pool", "Queue", "Physical vs logical", "Per layer type",
                  "held 4,056", "waiting 19", "swa"):
        assert shown in text, shown


async def test_a_terminal_too_short_for_any_decision_says_so():
    # 120x16: the panels and the table's header fill the screen. An empty table would look
    # like a daemon deciding nothing; the title says why there are no rows.
    app = recorded_app()
    async with app.run_test(size=(120, 16)) as pilot:
        await wait_until(pilot, lambda: app.state.decisions_received == 200, "played")
        await wait_until(pilot, lambda: app.drawn_version == app.state.version, "drawn")
        await wait_until(pilot, lambda: "too small" in screen_text(app), "told", limit=120)
        assert "req-00200" not in screen_text(app)
        assert decisions_title(app).startswith(
            "Decisions · terminal too small for rows (80x24) · 200 received · "
        )
        await pilot.resize_terminal(120, 24)  # room again: the rows, and no such word
        await wait_until(pilot, lambda: "req-00200" in screen_text(app), "rows back", limit=120)
        await wait_until(pilot, lambda: "too small" not in decisions_title(app), "not said",
                         limit=120)
        assert decisions_title(app).startswith("Decisions · 200 received · ")


async def test_a_disconnected_dashboard_shows_no_decision_rate():
    # The rate in the Decisions title was the last one known, shown as if live while the
    # daemon was gone. The panels dim and their titles turn; the title drops its rate.
    source, clock = QueueSource(), Clock()
    app = recorded_app(source=source, clock=clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await source.queue.put(Connected())
        await source.queue.put(Update(STREAM[0]))
        await source.queue.put(Update(STREAM[1]))  # two snapshots: a rate
        await wait_until(pilot, lambda: app.state.decisions_received == 10, "updates")
        assert app.state.decision_rate() > 0
        # (Waited for whole: the title before the updates, "0 received · 0/s", has a rate too,
        # and under load the screen may still show it for a moment.)
        expected = f"Decisions · 10 received · {app.state.decision_rate():,.0f}/s"
        await wait_until(pilot, lambda: decisions_title(app) == expected, "the rate in the title")
        clock.now += 3.0
        await source.queue.put(Disconnected(REFUSED, 5.0))
        await shown(pilot, "● disconnected")
        await wait_until(pilot, lambda: "/s" not in decisions_title(app), "rate gone")
        assert decisions_title(app) == "Decisions · 10 received"
        assert app.query_one("#decisions-box").has_class("-stale")  # its title marked as the panels' are
        await source.queue.put(Update(STREAM[2]))  # back: live again, with its rate
        await wait_until(pilot, lambda: "/s" in decisions_title(app), "rate back")
        assert not app.query_one("#decisions-box").has_class("-stale")


async def test_a_daemon_that_hangs_shows_no_decision_rate_either():
    # kill -STOP: connected, nothing arrives; once the figures are marked old, so is the rate.
    source, clock = QueueSource(), Clock()
    app = recorded_app(source=source, clock=clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await source.queue.put(Connected())
        await source.queue.put(Update(STREAM[0]))
        await source.queue.put(Update(STREAM[1]))
        await wait_until(pilot, lambda: app.state.decisions_received == 10, "updates")
        expected = f"Decisions · 10 received · {app.state.decision_rate():,.0f}/s"  # (whole: see above)
        await wait_until(pilot, lambda: decisions_title(app) == expected, "the rate in the title")
        clock.now += 12.0
        await shown(pilot, "● connected, no update for 12 s")
        await wait_until(pilot, lambda: "/s" not in decisions_title(app), "rate gone")
        assert decisions_title(app) == "Decisions · 10 received"


async def test_q_closes_the_replay_dialog_as_it_closes_the_other_dialogs(tmp_path: Path):
    # The footer says "q"; in the key help and a decision's record it closes the dialog,
    # in the replay dialog it did nothing. It cancels there now, starting nothing.
    launcher = FakeLauncher()
    app = recorded_app(launcher=launcher, traces=[tmp_path / "t.jsonl"])
    async with app.run_test(size=(120, 40)) as pilot:
        await played(pilot)
        await pilot.press("r")
        await wait_until(pilot, lambda: isinstance(app.screen, ReplayScreen), "modal")
        await pilot.press("q")
        await wait_until(pilot, lambda: not isinstance(app.screen, ReplayScreen), "closed",
                         limit=120)
        assert app.return_code is None and launcher.started == []  # not quit, nothing run
        # In the requests field "q" is a character as in any text field (not a number:
        # refused there), not a way out.
        await pilot.press("r")
        await wait_until(pilot, lambda: isinstance(app.screen, ReplayScreen), "modal again")
        app.screen.query_one("#replay-limit").focus()
        await pilot.press("q")
        await pilot.pause(0.2)
        assert isinstance(app.screen, ReplayScreen)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, ReplayScreen), "escaped")
    assert launcher.started == []


def keys_handled(app) -> bool:
    """Every key posted so far has gone all the way through: no message waits in the app's
    queue or in any widget's (a key is forwarded to the focused widget, bubbles back up to
    the app, and only there runs its binding)."""
    return app._message_queue.empty() and all(node._message_queue.empty() for node in app._registry)


async def settled(pilot) -> None:
    """Until the keys posted all at once were handled (and stayed so for a moment)."""
    for _ in range(3):
        await wait_until(pilot, lambda: keys_handled(pilot.app), "keys handled")
        await pilot.pause(0.05)


def record_windows(app) -> int:
    return sum(isinstance(screen, DecisionScreen) for screen in app.screen_stack)


async def test_quick_enters_open_one_record_window_at_a_time():
    # A terminal hands over keys typed quickly (or held down) all at once. Each `enter` on the
    # table posted a message that opened a record window once it reached the app, after
    # the keys queued behind it: five quick enters stacked five windows, and twenty quick
    # "enter, escape" left most of them stacked (each escape went to the table, not to a
    # window still to come). `?` and `r` open theirs as their key is handled; so does enter.
    app = recorded_app()
    opened: list[int] = []  # the windows on the stack each time one is pushed
    push_screen = app.push_screen

    def counting_push(screen, *args, **kwargs):
        result = push_screen(screen, *args, **kwargs)
        opened.append(record_windows(app))
        return result

    app.push_screen = counting_push  # type: ignore[method-assign]
    async with app.run_test(size=(120, 40)) as pilot:
        await played(pilot)
        await pilot.press("down")
        for _ in range(5):
            app.post_message(events.Key("enter", "\r"))
        await settled(pilot)
        assert record_windows(app) == 1 and opened == [1]
        assert app.screen.row.seq == 199  # the row under the cursor, the one the user chose
        await pilot.press("escape")
        await wait_until(pilot, lambda: record_windows(app) == 0, "closed by one escape")
        opened.clear()
        for _ in range(20):
            app.post_message(events.Key("enter", "\r"))
            app.post_message(events.Key("escape", "\x1b"))
        await settled(pilot)
        assert record_windows(app) == 0  # every window opened was closed
        assert opened and max(opened) == 1  # and never two at once
        assert app.return_code is None


async def test_a_click_queued_behind_another_opens_no_second_record_window():
    # A double click posts two selections; the second reaches the app once the first one's
    # window is open: it opens nothing more.
    app = recorded_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await played(pilot)
        await pilot.press("space")  # the rows hold still
        key = decisions_table(app).coordinate_to_cell_key(decisions_table(app).cursor_coordinate).row_key
        for _ in range(2):
            decisions_table(app).post_message(DataTable.RowSelected(decisions_table(app), 0, key))
        await settled(pilot)
        assert record_windows(app) == 1 and app.screen.row.seq == 200


async def open_replay_dialog_with_limit(pilot, typed: str) -> None:
    """`r`, Tab to "requests (0: all)" as a user does, its 2000 erased and `typed` typed."""
    app = pilot.app
    await pilot.press("r")
    await wait_until(pilot, lambda: isinstance(app.screen, ReplayScreen), "dialog")
    await pilot.press("tab", "tab", "tab")  # trace, speed, policy, requests
    assert app.focused is app.screen.query_one("#replay-limit")
    await pilot.press("end", *["backspace"] * 4, *typed)
    assert app.focused.value == typed


@pytest.mark.parametrize("typed", ["-5", "-", "+"])
async def test_the_replay_dialog_refuses_a_negative_number_of_requests(tmp_path: Path, typed: str):
    # "-5" was read as 0, "all": a replay of the whole trace (19,366 requests) started.
    # A lone "-" or "+" (the field lets them be typed) crashed the dashboard at Start.
    launcher = FakeLauncher()
    app = recorded_app(launcher=launcher, traces=[tmp_path / "t.jsonl"])
    async with app.run_test(size=(120, 40)) as pilot:
        await played(pilot)
        told: list[str] = []
        app.notify = lambda message, **kwargs: told.append(message)  # type: ignore[method-assign]
        await open_replay_dialog_with_limit(pilot, typed)
        await pilot.click("#replay-start")
        await wait_until(pilot, lambda: told, "told why")
        assert told == [f"requests (0: all): expected a whole number, 0 or more, got {typed!r}"]
        assert isinstance(app.screen, ReplayScreen) and launcher.started == []  # nothing ran
        # Put right, it starts what was asked for.
        await pilot.click("#replay-limit")
        await pilot.press("end", *["backspace"] * len(typed), "5")
        await pilot.click("#replay-start")
        await wait_until(pilot, lambda: launcher.started, "replay started")
        assert launcher.started == [ReplayRequest(tmp_path / "t.jsonl", speed=10.0, policy="", limit=5)]
        assert app.return_code is None


def panel_lines(app, widget_id: str) -> list[str]:
    """The lines of one panel's content (inside its border) as the screen shows them."""
    region = app.query_one(f"#{widget_id}").content_region
    lines = screen_text(app).splitlines()[region.y : region.bottom]
    return [line[region.x : region.right].rstrip() for line in lines]


def many_tenants(count: int, shown: int = 100) -> common_pb2.Snapshot:
    """One engine running `count` requests, each of a tenant of its own, listed as the daemon
    lists them: the `shown - 1` largest and "(other)" summing the rest (num_tenants: all)."""
    tenants = [common_pb2.TenantState(tenant=f"tenant-{i}", blocks_held=1 + i % 3, running=1,
                                      waiting=i % 2) for i in range(count)]
    tenants.sort(key=lambda t: -t.blocks_held)
    kept, rest = tenants[: shown - 1], tenants[shown - 1 :]
    other = common_pb2.TenantState(tenant="(other)", blocks_held=sum(t.blocks_held for t in rest),
                                   running=sum(t.running for t in rest),
                                   waiting=sum(t.waiting for t in rest))
    crowded = common_pb2.Snapshot()
    crowded.CopyFrom(LAST)
    del crowded.engines[:]
    del crowded.tenants[:]
    crowded.engines.add(engine_id="vllm-0", lease_remaining_s=9.0,
                        blocks_held=sum(t.blocks_held for t in tenants), running=count,
                        waiting=sum(t.waiting for t in tenants))
    crowded.tenants.extend([*kept, other])
    crowded.num_tenants = count
    return crowded


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_the_tenant_rows_shown_add_up_to_the_engines(size):
    # 300 tenants, the snapshot listing 99 and "(other)" for 201: the panel showed a few,
    # then "+98 more tenants" with no figures, then "+201 more" with the figures of
    # "(other)" alone, as if 201 tenants held what 299 did. One "+N more" row sums every
    # tenant not shown, and counts them.
    crowded = many_tenants(300)
    app = recorded_app(source=RecordedSource([observer_pb2.WatchResponse(snapshot=crowded)]))
    async with app.run_test(size=size) as pilot:
        await shown(pilot, "more", "the tenants cut")
        lines = panel_lines(app, "engines")
    tenant_lines = [line for line in lines if line.startswith(("tenant-", "+"))]
    more = [line for line in tenant_lines if line.startswith("+")]
    assert len(more) == 1 and tenant_lines[-1] == more[0], lines
    named = len(tenant_lines) - 1
    assert more[0].startswith(f"+{300 - named} more ")
    # Blocks held: a tenant's fifth cell from the end ("held quota use run wait"), an
    # engine's third ("held run wait"); compact, both are second to last ("585 held").
    tenant_held, engine_held = (-2, -2) if size == (80, 24) else (-5, -3)
    held = sum(int(line.split()[tenant_held].replace(",", "")) for line in tenant_lines)
    engine = next(line for line in lines if line.startswith("vllm-0")).split()
    assert held == crowded.engines[0].blocks_held == int(engine[engine_held].replace(",", ""))


@pytest.mark.parametrize("size", [(60, 12), (40, 10)])
async def test_a_terminal_too_short_for_the_panels_still_says_why_no_decision_shows(size):
    # At 60x12 and 40x10 the panels alone overflowed the screen, which scrolled: the
    # decisions box went off its bottom, and with it the title saying that no row fits.
    # The panels are cut at the bottom instead; the title and the table's header stay.
    app = recorded_app()
    async with app.run_test(size=size) as pilot:
        await wait_until(pilot, lambda: app.state.decisions_received == 200, "played")
        await wait_until(pilot, lambda: app.drawn_version == app.state.version, "drawn")
        await wait_until(pilot, lambda: "too small" in screen_text(app), "told", limit=120)
        width, height = size
        assert decisions_title(app).startswith("Decisions · terminal too small")
        assert app.screen.max_scroll_y == 0  # nothing below the screen's bottom
        assert app.query_one("#decisions-box").region.bottom <= height - 1  # above the footer
        text = screen_text(app)
        assert "Pool" in text and "seq" in text and "req-00200" not in text
        await pilot.resize_terminal(width, 20)  # room again: rows, and the panels whole
        await wait_until(pilot, lambda: " 200      preempt" in screen_text(app), "rows back",
                         limit=120)
        await wait_until(pilot, lambda: "too small" not in decisions_title(app), "not said",
                         limit=120)
        assert app.query_one("#panels").region.height == 11  # the 60x20 layout's two rows of panels, 6 + 5


async def test_no_daemon_is_said_as_the_other_commands_say_it(tmp_path: Path):
    # Issue 32: `kvbudget tui` with no daemon showed grpc's "No such file or directory"
    # where `admin`, `doctor` and `replay` say "no daemon socket at ... (is ... running?)".
    # A real WatchSource on a socket path that does not exist: no daemon is needed.
    from kvbudget.client.target import no_socket

    path = tmp_path / "none.sock"
    app = KVBudgetApp(f"unix://{path}", launcher=FakeLauncher())
    async with app.run_test(size=(240, 40)) as pilot:
        await wait_until(pilot, lambda: app.state.connection.link is Link.DISCONNECTED, "down")
        text = await shown(pilot, f"● disconnected: {no_socket(str(path))}, retrying")
        assert "No such file" not in text


async def test_a_filter_says_it_searches_only_the_newest_decisions():
    # Issue 32: `/preempt` showed 1 row, then 0, while the Queue panel counted 116
    # preemptions: the filter reads the table's buffer, and nothing said so. Here the
    # buffer keeps 50 of the stream's 200 decisions.
    app = recorded_app(limits=Limits(max_decisions=50))
    async with app.run_test(size=(200, 40)) as pilot:
        await played(pilot)
        assert "the newest 50 only" not in screen_text(app)  # no filter: nothing to say
        await pilot.press("slash", *"never_fits", "enter")
        await wait_until(pilot, lambda: app.filter_text == "never_fits", "filter applied")
        await shown(pilot, "filter never_fits (the newest 50 only · s: search the whole log)")


async def test_a_selection_clears_once_its_row_left_the_buffer():
    # Issue 32: a selected row stayed pinned at the bottom of the table, out of order, for
    # minutes after it had left the buffer. It follows its row while buffered, then clears.
    source = QueueSource()
    app = recorded_app(source=source, limits=Limits(max_decisions=20, sample_period_s=0.0))
    async with app.run_test(size=(120, 40)) as pilot:
        await source.queue.put(Connected())
        for response in STREAM[:4]:  # decisions 1..20: the buffer is full
            await source.queue.put(Update(response))
        await wait_until(pilot, lambda: table_seqs(app)[:1] == [20], "first rows")
        await pilot.press("down", "down", "down")  # seq 17 selected
        table = app.query_one("#decisions", DataTable)
        await wait_until(pilot, lambda: int(table.get_row_at(table.cursor_row)[0].plain) == 17, "17 selected")
        await source.queue.put(Update(STREAM[4]))  # 21..25: 17 is still buffered, and followed
        await wait_until(pilot, lambda: table_seqs(app)[:1] == [25], "more rows")
        assert int(table.get_row_at(table.cursor_row)[0].plain) == 17
        for response in STREAM[5:8]:  # up to 40: 1..20 leave the buffer
            await source.queue.put(Update(response))
        await wait_until(pilot, lambda: table_seqs(app)[:1] == [40], "newest rows")
        await pilot.pause(0.4)
        assert 17 not in table_seqs(app)
        assert table_seqs(app) == sorted(table_seqs(app), reverse=True)  # in order, nothing pinned
