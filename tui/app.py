"""The dashboard app: layout, keys, one source worker, a steady render rate.

The worker folds every source event into `self.state` (`fold`); a timer at `render_hz`
draws the latest state if it moved, so a burst of decisions costs folds, not frames.
Nothing a user or the daemon wrote is ever parsed as markup.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from rich.text import Text
from textual import events, on
from textual.app import App, ComposeResult, SystemCommand
from textual.containers import Grid, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from kvbudget.client.tls import NO_TLS, TlsFiles, channel_credentials
from kvbudget.tui import DEFAULT_TARGET, decisions, keys
from kvbudget.tui.app_actions import WindowActions
from kvbudget.tui.replays import ReplayLauncher
from kvbudget.tui.screens import DecisionScreen, HelpScreen
from kvbudget.tui.signals import StopSignals, terminal_alive
from kvbudget.tui.source import Connected, Disconnected, Source, SourceEvent, Update, WatchSource
from kvbudget.tui.state import DashboardState, Limits, Link
from kvbudget.tui.status import status_line
from kvbudget.tui.widgets import PANELS, DecisionsTable, Panel


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


class KVBudgetApp(WindowActions, App[int]):
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
    BINDINGS = keys.BINDINGS
    # The table is rebuilt at most this often: a list scrolling 10 times a second cannot be
    # read anyway, and the rebuild is most of a frame's cost under load.
    TABLE_PERIOD_S = 0.25
    KEYS_HELP = keys.KEYS_HELP

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
        self.token, self.tls = token, tls  # (the whole-log search opens its own channel)
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
        self._signals = StopSignals()  # SIGTERM and SIGHUP end the dashboard as `q` does

    # -- layout ------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static(status_line(self.state), id="status")
        with Grid(id="panels"):
            for widget_id, title, render_state, inputs in PANELS:
                yield Panel(title, render_state, inputs, id=widget_id)
        with Vertical(id="decisions-box") as box:
            box.border_title = "Decisions"
            yield Input(placeholder="filter: words in kind, reason, request, engine, tenant", id="filter")
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
        self._table = self.query_one("#decisions", DecisionsTable)
        self._filter = self.query_one("#filter", Input)
        self._grid = self.query_one("#panels", Grid)
        self._leave_room_for_decisions(self.size.height)
        self._signals.install(self._stop_on_signal)
        self.run_worker(self._consume(), name="watch", exclusive=True, group="source")
        self.set_interval(1.0 / self.render_hz, self.draw)
        self.set_interval(1.0, self._reap_replays)
        self._table.focus()

    async def _consume(self) -> None:
        async for event in self.source.events():
            self.state = fold(self.state, event, self.clock())

    # -- drawing -------------------------------------------------------------------------

    @property
    def drawn_version(self) -> int:  # the state version the panels last drew
        return self._drawn_version

    @property
    def table_fresh(self) -> bool:  # the table's rows were built for the newest state, at its height
        return not self._table_stale and self._table_height == self._table.size.height

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
        status = status_line(state, self.paused, self.filter_text, now)
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
        keep = table.highlighted()
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
        table.show(rows, keep)

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
        shown = self._table.shown.get(row_key or "")
        if shown is not None:
            self.push_screen(DecisionScreen(shown.row))

    async def action_quit(self) -> None:
        self.launcher.stop_all()
        self.exit(0)

    def on_unmount(self) -> None:
        self._signals.restore()
        self.launcher.stop_all()

    # -- signals and the exit status --------------------------------------------------------

    def _stop_on_signal(self, signum: int) -> None:
        self.launcher.stop_all()
        if signum == signal.SIGHUP and not terminal_alive():
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
        for title, help_text, action in keys.COMMANDS:
            yield SystemCommand(title, help_text, getattr(self, f"action_{action}"))


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
