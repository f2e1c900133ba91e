"""The dashboard app: layout, keys, one source worker, a steady render rate.

Data flow, one way: the worker reads the source and folds every event into `self.state`
(cheap, immutable); a timer at `render_hz` draws the latest state if it moved. So a burst of
thousands of decisions per second costs folds, not frames: the screen is redrawn at most
`render_hz` times a second whatever the rate upstream (the coalescing), and every buffer in
the state is bounded.

Embedding (the demo does): `app = KVBudgetApp(target, token)` then `exit_status(app,
app.run())` (non-zero after a crash or a signal), or `run_dashboard(target, token)`; `tls=`
(a `kvbudget.client.tls.TlsFiles`) for a daemon on TCP with TLS; pass `source=` to feed it
anything else that yields `SourceEvent`s (`playback=True` for a recording: no daemon
behind it).

Nothing a user or the daemon wrote (a filter, a target path, a request id) is ever parsed
as Textual or Rich markup: titles are built as `Content` or `Text`, cells as `Text`.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from rich.console import RenderableType
from rich.text import Text
from textual import events, on
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Grid, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from kvbudget.client.tls import NO_TLS, TlsFiles, channel_credentials
from kvbudget.tui import DEFAULT_TARGET, decisions, panels
from kvbudget.tui.replays import ReplayLauncher, ReplayRequest, shipped_traces
from kvbudget.tui.screens import DecisionScreen, HelpScreen, ReplayScreen
from kvbudget.tui.source import (
    Connected,
    Disconnected,
    Source,
    SourceEvent,
    Update,
    WatchSource,
)
from kvbudget.tui.state import DashboardState, Limits, Link

PanelFn = Callable[[DashboardState, bool], RenderableType]
InputsFn = Callable[[DashboardState], object]


def _snapshot_fields(*names: str) -> InputsFn:
    """What a panel reads from the snapshot: unchanged inputs, no redraw (messages compare
    by value; the state never mutates them)."""

    def inputs(state: DashboardState) -> object:
        s = state.snapshot
        return None if s is None else tuple(list(getattr(s, name)) for name in names)

    return inputs


# (widget id, title, panel function, its inputs or None for "redraw on every change"), in
# reading order: the on-call drill, left to right.
PANELS: tuple[tuple[str, str, PanelFn, InputsFn | None], ...] = (
    ("pool", "Pool", panels.pool_panel, None),
    ("queue", "Queue", panels.queue_panel, None),
    ("physical", "Physical vs logical", panels.physical_panel, None),
    ("layers", "Per layer type", panels.layers_panel, _snapshot_fields("groups")),
    ("engines", "Engines & tenants", panels.engines_panel,
     _snapshot_fields("engines", "tenants")),
    ("replays", "Replays", panels.replays_panel, _snapshot_fields("replays")),
)


# Signals that end the dashboard as `q` does (replays started here stopped, the terminal
# given back): SIGTERM from a supervisor or `kill`, SIGHUP when its terminal goes away.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def fold(state: DashboardState, event: SourceEvent, now: float | None = None) -> DashboardState:
    """One source event into the state (the worker's whole job); `now` (monotonic) dates it."""
    if isinstance(event, Update):
        if state.connection.link is not Link.CONNECTED:
            state = state.with_link(Link.CONNECTED)
        return state.with_response(event.response, now)
    if isinstance(event, Connected):
        return state.with_link(Link.CONNECTED)
    if isinstance(event, Disconnected):
        return state.with_link(Link.DISCONNECTED, event.detail, event.retry_in_s, now)
    raise TypeError(f"event: not a SourceEvent: {event!r}")


class Panel(Static):
    """A bordered box showing one panel function of the state."""

    def __init__(
        self, title: str, render_state: PanelFn, inputs: InputsFn | None, *, id: str
    ) -> None:
        super().__init__(panels.WAITING, id=id, classes="panel")
        self.border_title = title
        self.render_state = render_state
        self.inputs = inputs
        self._shown: object = object()  # equal to nothing

    def show(self, state: DashboardState, compact: bool) -> None:
        if self.inputs is not None:
            shown = (compact, self.inputs(state))
            if shown == self._shown:
                return
            self._shown = shown
        self.update(self.render_state(state, compact))


class DecisionsTable(DataTable):
    """The decisions table: `enter` opens the highlighted row's record at once.

    DataTable's own `enter` posts a RowSelected message, which reaches the app only after
    the keys already queued behind that `enter` were handled by the table: five quick
    presses each opened one more record window on top of the last (an `escape` typed in
    between went to the table, not to a window still to come). Run here, as the key is
    handled, the window is on screen before the next key is looked at, as `?` and `r` do
    theirs; the keys after it are the window's.
    """

    def __init__(self, open_record: Callable[[str | None], None], *, id: str) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self.open_record = open_record  # called with the highlighted row's key

    def action_select_cursor(self) -> None:
        if self.row_count == 0:
            return
        self.open_record(self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value)


class KVBudgetApp(App[int]):
    """`kvbudget tui`: the pool, the queue, the layer types and the replays, live.

    12 frames a second by default: a 10 Hz timer on a busy two-core host loses a tick now
    and then (bench/bench_tui.py measured 9.7/s), 12 Hz keeps it above 10 for 2 points of
    CPU.
    """

    CSS_PATH = "app.tcss"
    TITLE = "kvbudget"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]
    # Below 23 lines (under the documented 80x24) the narrow layout's six panels would leave
    # the decisions table fewer than 3 rows (1 status + 16 panels + 2 for the table's border
    # and header + 3 rows + 1 footer), at 60x20 none: "-cramped" is the 80x24 layout less
    # the last row of panels there, so that the table keeps a few (app.tcss).
    VERTICAL_BREAKPOINTS = [(0, "-cramped"), (23, "-short"), (32, "-tall")]
    # Shorter still (60x12, 40x10), the panels alone overflow the screen, which then
    # scrolled: the decisions box went off its bottom, and with it the title that says no
    # row fits. The panels are cut at the bottom instead, leaving the box these lines: its
    # title and the table's header (the title then says why there is no row).
    DECISIONS_LEAST_LINES = 2
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "keys"),
        # A priority binding: run as the key arrives, before the keys queued behind it are
        # handed to the table (see action_filter).
        Binding("slash", "filter", "filter", priority=True),
        Binding("space", "pause", "pause"),
        Binding("r", "start_replay", "replay"),
        Binding("escape", "clear_filter", "clear filter", show=False),
    ]
    # The table is rebuilt at most this often: a list scrolling 10 times a second cannot be
    # read anyway, and the rebuild is most of a frame's cost under load.
    TABLE_PERIOD_S = 0.25
    KEYS_HELP = (
        ("q", "quit (stops replays started here)"),
        ("?", "this help"),
        ("/", "filter decisions: words matched in kind, reason, request, engine, tenant"),
        ("escape", "clear the filter"),
        ("space", "pause / resume the decisions table (the panels keep going)"),
        ("↑ ↓ enter", "select a decision to see its whole record (it stays selected)"),
        ("r", "start a replay of a shipped trace against this daemon (not in playback)"),
        ("ctrl+p", "command palette"),
    )

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        token: str | None = None,
        *,
        tls: TlsFiles = NO_TLS,
        source: Source | None = None,
        render_hz: float = 12.0,
        limits: Limits | None = None,
        table_rows: int = 100,
        launcher: ReplayLauncher | None = None,
        traces: Iterable[Path] | None = None,
        playback: bool = False,
        clock: Callable[[], float] = time.monotonic,
        on_terminal_lost: Callable[[], None] | None = None,
    ) -> None:
        super().__init__()
        if render_hz <= 0:
            raise ValueError(f"render_hz must be > 0, got {render_hz}")
        self.target = target
        # `tls` is read (CLIError on a bad file) only for a source of our own.
        self.source: Source = (
            source if source is not None else WatchSource(target, token, credentials=channel_credentials(tls))
        )
        self.render_hz = render_hz
        self.table_rows = table_rows
        # Replays started from here talk to the daemon as the dashboard does, TLS included.
        self.launcher = launcher if launcher is not None else ReplayLauncher(target, token, tls=tls)
        self.traces = tuple(traces) if traces is not None else None
        self.playback = playback  # a recording: nothing goes stale, no replay to start
        self.clock = clock  # dates updates: how stale the panels are (tests pass their own)
        # Run before the hurried exit when the terminal is gone (no cleanup of the caller's
        # runs then: `kvbudget demo` stops its daemon here, which would outlive it otherwise).
        self.on_terminal_lost = on_terminal_lost
        self.state = DashboardState.initial(target, limits, playback=playback)
        self.paused = False
        # The state as it was when space was pressed: the paused table's rows, whatever
        # arrives, whatever the terminal's size or the filter typed meanwhile.
        self._frozen: DashboardState | None = None
        self.filter_text = ""
        self.renders = 0  # frames drawn (the bench reads it)
        self._drawn_version = -1
        self._drawn_layout: tuple[bool, bool, str] | None = None
        self._status_shown: Text | None = None
        self._title_shown: Text | None = None
        self._table_key: tuple | None = None
        self._table_drawn_at = 0.0
        self._table_stale = True
        self._table_height = -1  # the table's height when its rows were last built
        # The rows the table shows now, by row key: `enter` opens what was shown (a paused
        # row may be long gone from the state's buffer).
        self._shown: dict[str, decisions.TableRow] = {}
        self._signals: dict[int, object] = {}  # signal -> the handler it had before

    # -- layout ------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static(panels.status_line(self.state), id="status")
        with Grid(id="panels"):
            for widget_id, title, render_state, inputs in PANELS:
                yield Panel(title, render_state, inputs, id=widget_id)
        with Vertical(id="decisions-box") as box:
            box.border_title = "Decisions"
            yield Input(
                placeholder="filter: words in kind, reason, request, engine, tenant", id="filter"
            )
            table = DecisionsTable(self._open_record, id="decisions")
            for label, width in decisions.DECISION_COLUMNS:
                table.add_column(label, width=width)
            yield table
        yield Footer()

    def on_mount(self) -> None:
        # Held, not queried per frame: a modal on top must not hide them from the timer.
        self._main = self.screen
        self._status = self.query_one("#status", Static)
        self._panels = [self.query_one(f"#{panel[0]}", Panel) for panel in PANELS]
        self._box = self.query_one("#decisions-box", Vertical)
        self._table = self.query_one("#decisions", DataTable)
        self._filter = self.query_one("#filter", Input)
        self._grid = self.query_one("#panels", Grid)
        self._leave_room_for_decisions(self.size.height)
        self._install_signal_handlers()
        self.run_worker(self._consume(), name="watch", exclusive=True, group="source")
        self.set_interval(1.0 / self.render_hz, self.draw)
        self.set_interval(1.0, self._reap_replays)
        self._table.focus()

    async def _consume(self) -> None:
        async for event in self.source.events():
            self.state = fold(self.state, event, self.clock())

    # -- drawing -------------------------------------------------------------------------

    @property
    def compact(self) -> bool:
        """The 80x24 variant of the panels: the breakpoint class on the main screen (or the
        class of a terminal shorter still)."""
        return self._main.has_class("-short") or self._main.has_class("-cramped")

    def draw(self) -> None:
        """Draw the latest state if it moved since the last frame (the timer calls this)."""
        state = self.state
        now = self.clock()
        # Every frame: the status line counts the age of the data and the retry down even
        # when nothing arrives (that is when it matters). Cheap, and drawn only on change.
        status = panels.status_line(state, self.paused, self.filter_text, now)
        if status != self._status_shown:
            self._status_shown = status
            self._status.update(status)
        stale = state.staleness(now) is not None
        self._grid.set_class(stale, "-stale")
        self._box.set_class(stale, "-stale")
        # The table's title every frame too: its rate is left out once the figures are stale
        # (when nothing arrives), and it says when the table has no room for a row (the
        # table's height moves after a resize, in a later frame than the resize).
        title = decisions.decisions_title(
            state, self.paused, self.filter_text, now,
            room_for_rows=self._table.size.height >= 2,  # its header and one row
        )
        if title != self._title_shown:
            self._title_shown = title
            self._box.border_title = title
        layout = (self.compact, self.paused, self.filter_text)
        if state.version != self._drawn_version or layout != self._drawn_layout:
            self._drawn_version, self._drawn_layout = state.version, layout
            compact = self.compact
            for panel in self._panels:
                panel.show(state, compact)
            if not self.paused:
                self._table_stale = True
            self.renders += 1
        if not self.paused and self._table.size.height != self._table_height:
            # The table grew or shrank without a terminal resize (the compact layout came
            # or went): the rows that fit changed, though no data did.
            self._table_stale = True
        if self._table_stale:
            self._draw_table(state)

    def _draw_table(self, state: DashboardState) -> None:
        now = time.monotonic()
        recent = now - self._table_drawn_at < self.TABLE_PERIOD_S
        if not self.paused and self._table_key is not None and recent:
            return
        table = self._table
        keep = self._highlighted(table)
        if self.paused:
            # Every row buffered when space was pressed, to scroll through at leisure.
            shown_state = self._frozen or state
            limit = shown_state.limits.max_decisions
        else:
            # Live, only the rows that fit (rebuilding the table is the costliest part of a
            # frame), and down to the selected one.
            shown_state = state
            limit = min(self.table_rows, max(1, table.size.height - 1))
        rows = decisions.visible_decisions(shown_state, self.filter_text, limit, keep)
        key = (
            rows[0].key if rows else None, len(rows), self.filter_text, self.paused,
            keep.key if keep else None,
        )
        self._table_stale, self._table_height = False, table.size.height
        if key == self._table_key:
            return
        self._table_key, self._table_drawn_at = key, now
        table.clear()
        for row in rows:
            table.add_row(*decisions.decision_cells(row.row), key=str(row.key))
        self._shown = {str(row.key): row for row in rows}
        if keep is not None and str(keep.key) in self._shown:
            # The selected decision stays selected, wherever the new rows pushed it.
            table.move_cursor(row=table.get_row_index(str(keep.key)), animate=False)

    def _highlighted(self, table: DataTable) -> decisions.TableRow | None:
        """The row under the cursor, kept across rebuilds; None on the newest row, which
        follows the new rows as they arrive."""
        if table.row_count == 0 or table.cursor_row <= 0:
            return None
        try:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:  # noqa: BLE001 - a cursor past the rows: nothing selected
            return None
        return self._shown.get(key or "")

    def on_resize(self, event: events.Resize) -> None:
        # Breakpoints may have changed compact mode, and the table's height its rows (a
        # paused table shows all its frozen rows: its key stays, nothing is rebuilt).
        self._drawn_layout = None
        self._table_stale = True
        self._leave_room_for_decisions(event.size.height)

    def _leave_room_for_decisions(self, height: int) -> None:
        """At most the lines the status line, the footer and the decisions box leave to the
        panels (see DECISIONS_LEAST_LINES); no limit at all where they fit, as at 60x20."""
        grid = getattr(self, "_grid", None)  # None: the first resize comes before on_mount
        if grid is not None:
            status_line, footer = 1, 1
            grid.styles.max_height = max(0, height - status_line - footer - self.DECISIONS_LEAST_LINES)

    # -- actions ---------------------------------------------------------------------------

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.KEYS_HELP))

    def action_pause(self) -> None:
        self.paused = not self.paused
        self._frozen = self.state if self.paused else None
        self._table_key, self._table_stale = None, True
        self.draw()

    def action_filter(self) -> None:
        self._filter.add_class("-visible")
        # Focus now, not `focus()` (which waits its turn behind the keys already queued):
        # "/queue" typed fast or pasted had its "q" go to the table, and quit the app.
        self.screen.set_focus(self._filter)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "filter":
            # "/" opens the filter from the main screen only, and is a character like any
            # other once typing in it ("[/" is a fine filter) or in a modal's input.
            # (`screen.focused`, set at once, not `has_focus`: that follows a Focus event.)
            main = getattr(self, "_main", None)
            return main is not None and self.screen is main and main.focused is not self._filter
        return True

    def action_clear_filter(self) -> None:
        self._filter.value = ""
        self._filter.remove_class("-visible")
        self.filter_text = ""
        self._table_key, self._table_stale = None, True
        self._table.focus()
        self.draw()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value.strip()
        self._table_key, self._table_stale = None, True
        self.draw()

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        if not event.value.strip():
            self.action_clear_filter()
            return
        self._table.focus()

    @on(DataTable.RowSelected, "#decisions")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        # A click on a row (`enter` opens its record without this message).
        self._open_record(event.row_key.value)

    def _open_record(self, row_key: str | None) -> None:
        """The whole record of the row shown under `row_key`, in a window of its own: one at
        a time, never one on top of another window (a second click queued behind the first
        reaches here once the first one's window is open)."""
        if self.screen is not self._main:
            return
        # The row as it was shown, not looked up in the live buffer: a paused row may have
        # left it long ago, and a daemon restarted on a fresh log repeats seqs.
        shown = self._shown.get(row_key or "")
        if shown is not None:
            self.push_screen(DecisionScreen(shown.row))

    def action_start_replay(self) -> None:
        if self.playback:
            self.notify(
                "playback of a recording: no daemon to replay against "
                "(run kvbudget tui --target … to start replays)",
                severity="warning", markup=False,
            )
            return
        traces = self.traces if self.traces is not None else shipped_traces()
        self.push_screen(ReplayScreen(traces, self.target), self._replay_chosen)

    def _replay_chosen(self, request: ReplayRequest | None) -> None:
        if request is None:
            return
        try:
            child = self.launcher.start(request)
        except OSError as exc:
            self.notify(f"could not start the replay: {exc}", severity="error", markup=False)
            return
        self.notify(f"replay of {request.trace.name} started (pid {child.pid})", markup=False)

    def _reap_replays(self) -> None:
        # markup=False: trace names and the child's last line are not ours to parse.
        for ended in self.launcher.reap():
            if ended.returncode == 0:
                self.notify(f"replay of {ended.trace} finished", markup=False)
            else:
                self.notify(
                    f"replay of {ended.trace} failed ({ended.returncode}): {ended.last_line}",
                    severity="error",
                    timeout=10,
                    markup=False,
                )

    async def action_quit(self) -> None:
        self.launcher.stop_all()
        self.exit(0)

    def on_unmount(self) -> None:
        self._restore_signal_handlers()
        self.launcher.stop_all()

    # -- signals and the exit status --------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        """SIGTERM and SIGHUP end the dashboard as `q` does; without this Python's default
        kills it at once, leaving its replays running and the terminal in raw mode."""
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            previous = signal.getsignal(signum)
            try:
                loop.add_signal_handler(signum, self._stop_on_signal, signum)
            except (ValueError, RuntimeError, NotImplementedError):
                continue  # not the main thread (an embedder's), or no such signals here
            self._signals[signum] = previous

    def _restore_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum, previous in self._signals.items():
            loop.remove_signal_handler(signum)
            if previous is not None:  # None: set outside Python, nothing to put back
                signal.signal(signum, previous)  # type: ignore[arg-type]
        self._signals.clear()

    def _stop_on_signal(self, signum: int) -> None:
        self.launcher.stop_all()
        if signum == signal.SIGHUP and not _terminal_alive():
            # The terminal is gone (an ssh session dropped, a tmux pane killed): there is no
            # screen to give back, and Textual's orderly shutdown writes to the dead one and
            # hung there (its output thread gone, its queue full), leaving the dashboard
            # spinning with no terminal for good. Leave at once; a recording is flushed per
            # update, and the replays were stopped above.
            if self.on_terminal_lost is not None:
                try:
                    self.on_terminal_lost()
                finally:
                    os._exit(128 + signum)
            os._exit(128 + signum)
        # 128 + N: what a shell reports for a process that signal N ended.
        self.exit(return_code=128 + signum)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Start a replay", "replay a shipped trace", self.action_start_replay)
        yield SystemCommand("Pause decisions", "pause / resume the table", self.action_pause)
        yield SystemCommand("Filter decisions", "filter the table", self.action_filter)
        yield SystemCommand("Clear filter", "show every decision", self.action_clear_filter)
        yield SystemCommand("Dashboard keys", "what each key does", self.action_help)


def _terminal_alive() -> bool:
    """Whether this process's terminal is still there: a hung-up one polls as HUP / ERR (and
    is no longer a tty to isatty, whose tcgetattr fails). Output that is not a terminal
    (a headless test's file) polls writable: alive, nothing to leave in a hurry."""
    try:
        fd = sys.__stdout__.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        events = poller.poll(0)
    except (OSError, ValueError, AttributeError):
        return False
    return not any(event & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, event in events)


def exit_status(app: App, result: object) -> int:
    """The process's exit status once `app.run()` returned `result`: 0 after `q`, 1 after an
    unhandled exception, 128 + N after signal N. Textual's `run()` returns None after a
    crash, so `int(run() or 0)` would tell a supervisor that all went well; the app's
    `return_code` says what happened (a stand-in app without one: its result)."""
    return int(getattr(app, "return_code", None) or result or 0)


def run_dashboard(target: str = DEFAULT_TARGET, token: str | None = None, tls: TlsFiles = NO_TLS) -> int:
    """Run the dashboard in this terminal until the user quits; returns the exit status."""
    app = KVBudgetApp(target, token, tls=tls)
    return exit_status(app, app.run())
