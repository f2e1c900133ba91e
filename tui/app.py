"""The dashboard app: layout, keys, one source worker, a steady render rate.

Data flow, one way: the worker reads the source and folds every event into `self.state`
(cheap, immutable); a timer at `render_hz` draws the latest state if it moved. So a burst of
thousands of decisions per second costs folds, not frames: the screen is redrawn at most
`render_hz` times a second whatever the rate upstream (the coalescing), and every buffer in
the state is bounded.

Embedding (the demo does): `KVBudgetApp(target, token).run()`, or `run_dashboard(target,
token)`; `tls=` (a `kvbudget.client_tls.TlsFiles`) for a daemon on TCP with TLS; pass `source=`
to feed it anything else that yields `SourceEvent`s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

from rich.console import RenderableType
from rich.markup import escape
from textual import on
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Grid, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from kvbudget.client_tls import NO_TLS, TlsFiles, channel_credentials
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
from kvbudget.tui.state import DashboardState, DecisionRow, Limits, Link

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


def fold(state: DashboardState, event: SourceEvent) -> DashboardState:
    """One source event into the state (the worker's whole job)."""
    if isinstance(event, Update):
        if state.connection.link is not Link.CONNECTED:
            state = state.with_link(Link.CONNECTED)
        return state.with_response(event.response)
    if isinstance(event, Connected):
        return state.with_link(Link.CONNECTED)
    if isinstance(event, Disconnected):
        return state.with_link(Link.DISCONNECTED, event.detail, event.retry_in_s)
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


class KVBudgetApp(App[int]):
    """`kvbudget tui`: the pool, the queue, the layer types and the replays, live.

    12 frames a second by default: a 10 Hz timer on a busy two-core host loses a tick now
    and then (bench/bench_tui.py measured 9.7/s), 12 Hz keeps it above 10 for 2 points of
    CPU.
    """

    CSS_PATH = "app.tcss"
    TITLE = "kvbudget"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (32, "-tall")]
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "keys"),
        Binding("slash", "filter", "filter"),
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
        ("↑ ↓ enter", "select a decision to see its whole record"),
        ("r", "start a replay of a shipped trace against this daemon"),
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
        self.state = DashboardState.initial(target, limits)
        self.paused = False
        self.filter_text = ""
        self.renders = 0  # frames drawn (the bench reads it)
        self._drawn_version = -1
        self._drawn_layout: tuple[bool, bool, str] | None = None
        self._table_key: tuple | None = None
        self._table_drawn_at = 0.0
        self._table_stale = True
        self._table_height = -1  # the table's height when its rows were last built

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
            table = DataTable(id="decisions", cursor_type="row", zebra_stripes=True)
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
        self.run_worker(self._consume(), name="watch", exclusive=True, group="source")
        self.set_interval(1.0 / self.render_hz, self.draw)
        self.set_interval(1.0, self._reap_replays)
        self._table.focus()

    async def _consume(self) -> None:
        async for event in self.source.events():
            self.state = fold(self.state, event)

    # -- drawing -------------------------------------------------------------------------

    @property
    def compact(self) -> bool:
        """The 80x24 variant of the panels: the breakpoint class on the main screen."""
        return self._main.has_class("-short")

    def draw(self) -> None:
        """Draw the latest state if it moved since the last frame (the timer calls this)."""
        state = self.state
        layout = (self.compact, self.paused, self.filter_text)
        if state.version != self._drawn_version or layout != self._drawn_layout:
            self._drawn_version, self._drawn_layout = state.version, layout
            self._status.update(panels.status_line(state, self.paused, self.filter_text))
            compact = self.compact
            for panel in self._panels:
                panel.show(state, compact)
            self._draw_title(state)
            self._table_stale = True
            self.renders += 1
        if not self.paused and self._table.size.height != self._table_height:
            # The table grew or shrank without a terminal resize (the compact layout came
            # or went): the rows that fit changed, though no data did.
            self._table_stale = True
        if self._table_stale:
            self._draw_table(state)

    def _draw_title(self, state: DashboardState) -> None:
        box = self._box
        rate = state.decision_rate()
        title = f"Decisions · {state.decisions_received:,} received"
        if state.decisions_dropped:
            # The daemon sends the newest of each interval; under heavy load it skips some.
            title += f" · {state.decisions_dropped:,} skipped"
        title += f" · {rate:,.0f}/s"
        if self.paused:
            title += " · [b]PAUSED[/b] (space)"
        if self.filter_text:
            title += f" · filter [b]{escape(self.filter_text)}[/b]"
        box.border_title = title

    def _draw_table(self, state: DashboardState) -> None:
        if self.paused and self._table_key is not None:
            self._table_stale = False
            return  # paused: the rows stay as they were when space was pressed
        now = time.monotonic()
        if self._table_key is not None and now - self._table_drawn_at < self.TABLE_PERIOD_S:
            return
        # Live, only the rows that fit are built (rebuilding the table is the costliest part
        # of a frame); paused, every buffered row, to scroll through at leisure.
        if self.paused:
            limit = state.limits.max_decisions
        else:
            limit = min(self.table_rows, max(1, self._table.size.height - 1))
        rows = decisions.visible_decisions(state, self.filter_text, limit)
        key = (rows[0].seq if rows else None, len(rows), self.filter_text, self.paused)
        self._table_stale, self._table_height = False, self._table.size.height
        if key == self._table_key:
            return
        self._table_key, self._table_drawn_at = key, now
        table = self._table
        selected = self._selected_seq(table)
        table.clear()
        for row in rows:
            table.add_row(*decisions.decision_cells(row), key=str(row.seq))
        if selected is not None:
            try:
                table.move_cursor(row=table.get_row_index(selected), animate=False)
            except Exception:  # the selected row scrolled out of the buffer
                pass

    @staticmethod
    def _selected_seq(table: DataTable) -> str | None:
        if table.row_count == 0 or table.cursor_row <= 0:
            return None  # on the newest row: stay on top as new rows arrive
        try:
            return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:
            return None

    def on_resize(self) -> None:
        # Breakpoints may have changed compact mode, and the table's height its rows.
        self._drawn_layout = None
        self._table_key, self._table_stale = None, True

    # -- actions ---------------------------------------------------------------------------

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.KEYS_HELP))

    def action_pause(self) -> None:
        self.paused = not self.paused
        self._table_key = None
        self.draw()

    def action_filter(self) -> None:
        self._filter.add_class("-visible")
        self._filter.focus()

    def action_clear_filter(self) -> None:
        self._filter.value = ""
        self._filter.remove_class("-visible")
        self.filter_text = ""
        self._table_key = None
        self._table.focus()
        self.draw()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value.strip()
        self._table_key = None
        self.draw()

    @on(Input.Submitted, "#filter")
    def _filter_submitted(self, event: Input.Submitted) -> None:
        if not event.value.strip():
            self.action_clear_filter()
            return
        self._table.focus()

    @on(DataTable.RowSelected, "#decisions")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        seq = int(event.row_key.value)
        message = next((m for m in self.state.decisions if m.seq == seq), None)
        if message is not None:
            self.push_screen(DecisionScreen(DecisionRow.from_proto(message)))

    def action_start_replay(self) -> None:
        traces = self.traces if self.traces is not None else shipped_traces()
        self.push_screen(ReplayScreen(traces, self.target), self._replay_chosen)

    def _replay_chosen(self, request: ReplayRequest | None) -> None:
        if request is None:
            return
        try:
            child = self.launcher.start(request)
        except OSError as exc:
            self.notify(f"could not start the replay: {exc}", severity="error")
            return
        self.notify(f"replay of {request.trace.name} started (pid {child.pid})")

    def _reap_replays(self) -> None:
        for ended in self.launcher.reap():
            if ended.returncode == 0:
                self.notify(f"replay of {ended.trace} finished")
            else:
                self.notify(
                    f"replay of {ended.trace} failed ({ended.returncode}): {ended.last_line}",
                    severity="error",
                    timeout=10,
                )

    async def action_quit(self) -> None:
        self.launcher.stop_all()
        self.exit(0)

    def on_unmount(self) -> None:
        self.launcher.stop_all()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Start a replay", "replay a shipped trace", self.action_start_replay)
        yield SystemCommand("Pause decisions", "pause / resume the table", self.action_pause)
        yield SystemCommand("Filter decisions", "filter the table", self.action_filter)
        yield SystemCommand("Clear filter", "show every decision", self.action_clear_filter)
        yield SystemCommand("Dashboard keys", "what each key does", self.action_help)


def run_dashboard(target: str = DEFAULT_TARGET, token: str | None = None, tls: TlsFiles = NO_TLS) -> int:
    """Run the dashboard in this terminal until the user quits; returns the exit status."""
    result = KVBudgetApp(target, token, tls=tls).run()
    return int(result or 0)
