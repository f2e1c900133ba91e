"""The dashboard's modal screens: key help, one decision's whole record, start a replay,
the filter over the whole log.

Titles and option labels that carry someone's text (a target path, a request's reason, a
trace file's name) are `Content`/`Text`, never markup: "[/x]" in a path must show as typed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.validation import Integer
from textual.widgets import Button, Input, Label, Select, Static

from kvbudget.tui.decisions import DECISION_COLUMNS, TableRow, decision_detail
from kvbudget.tui.log_search import LogSearch, Progress
from kvbudget.tui.status import key_help
from kvbudget.tui.replays import POLICIES, SPEEDS, ReplayRequest
from kvbudget.tui.state import DecisionRow
from kvbudget.tui.widgets import DecisionsTable


class HelpScreen(ModalScreen[None]):
    """`?`: every key of the dashboard, one a line."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]

    def __init__(self, keys: Sequence[tuple[str, str]]) -> None:
        super().__init__()
        self.keys = tuple(keys)

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box", classes="modal-box") as box:
            box.border_title = "Keys"
            yield Static(key_help(self.keys), id="help-keys")
            yield Label("escape: close", classes="modal-hint")


class DecisionScreen(ModalScreen[None]):
    """A selected row of the decisions table: every field of the record."""

    # Not `enter`: it opened this window, and an `enter` pressed again (a quick double
    # press, a key repeating) must leave it open, not close it behind the user's back.
    BINDINGS = [Binding("escape,q", "dismiss", "close")]

    def __init__(self, row: DecisionRow) -> None:
        super().__init__()
        self.row = row

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="decision-box", classes="modal-box") as box:
            row = self.row
            box.border_title = Content(f"Decision {row.seq}: {row.kind} ({row.reason})")
            yield Static(decision_detail(self.row), id="decision-detail")
            yield Label("escape: close", classes="modal-hint")


class ReplayScreen(ModalScreen[ReplayRequest | None]):
    """Pick a shipped trace, a speed and a policy; dismissed with the request or None."""

    # `q` as in the other dialogs (and as the footer under them offers it): it leaves the
    # dialog, starting nothing. In the requests field, and in the trace list while it is
    # open (type to search), it stays a character: Textual gives a printable key to the
    # focused widget that takes it before any binding of the screen.
    BINDINGS = [Binding("escape,q", "dismiss(None)", "cancel")]

    def __init__(self, traces: Sequence[Path], target: str) -> None:
        super().__init__()
        self.traces = tuple(traces)
        self.target = target

    def compose(self) -> ComposeResult:
        with Vertical(id="replay-box", classes="modal-box") as box:
            box.border_title = Content(f"Start a replay against {self.target}")
            if not self.traces:
                yield Label("No shipped traces found (package kvbudget.traces).")
            yield Label("trace")
            yield Select(
                [(Text(p.name), p) for p in self.traces],
                id="replay-trace",
                allow_blank=not self.traces,
                prompt="no trace",
            )
            with Horizontal(classes="replay-row"):
                with Vertical():
                    yield Label("speed")
                    yield Select(
                        [(f"{s:g}×", s) for s in SPEEDS], value=10.0, allow_blank=False,
                        id="replay-speed",
                    )
                with Vertical():
                    yield Label("policy")
                    yield Select(
                        [("daemon's", "")] + [(p, p) for p in POLICIES],
                        value="",
                        allow_blank=False,
                        id="replay-policy",
                    )
                with Vertical():
                    yield Label(LIMIT_LABEL)
                    # The validator marks a negative count as the field's other bad values
                    # are marked, as it is typed; Start refuses it (see requested_limit).
                    limit = Input(
                        "2000", type="integer", validators=[Integer(minimum=0)], id="replay-limit"
                    )
                    limit.cursor_blink = False  # a steady screen (and steady screenshots)
                    yield limit
            with Horizontal(classes="replay-buttons"):
                yield Button("Start", variant="primary", id="replay-start")
                yield Button("Cancel", id="replay-cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "replay-cancel":
            self.dismiss(None)
            return
        trace = self.query_one("#replay-trace", Select).value
        if not isinstance(trace, Path):
            self.notify("pick a trace first", severity="warning")
            return
        try:
            limit = requested_limit(self.query_one("#replay-limit", Input).value)
        except ValueError as exc:
            self.notify(str(exc), severity="warning", markup=False)  # the text as typed
            return
        self.dismiss(
            ReplayRequest(
                trace=trace,
                speed=float(self.query_one("#replay-speed", Select).value),
                policy=str(self.query_one("#replay-policy", Select).value),
                limit=limit,
            )
        )


LIMIT_LABEL = "requests (0: all)"


def requested_limit(text: str) -> int:
    """The replay dialog's requests field as a `--limit`: 0 (or nothing) for the whole trace.

    A negative number, or no number at all, is refused with a message naming the field:
    "-5" was read as 0, and so started a replay of the whole trace (19,366 requests where 5
    were meant, or none), and a lone "-" (the field lets one be typed) crashed the dashboard.
    """
    try:
        value: int | None = int(text.strip() or "0")
    except ValueError:
        value = None
    if value is None or value < 0:
        raise ValueError(f"{LIMIT_LABEL}: expected a whole number, 0 or more, got {text!r}")
    return value


class LogSearchScreen(ModalScreen[None]):
    """`s`: the `/` filter's words over the whole decision log (`LogSearch`), newest first.

    It shows how far back it has read as it goes; `m` reads on for more matches; `enter`
    opens a match's whole record. Closing it stops the search and closes its channel.
    """

    BINDINGS = [
        Binding("escape,q", "dismiss", "close"),
        Binding("m", "more", "more matches"),
    ]

    def __init__(self, search: LogSearch, close: Callable[[], Awaitable[None]] | None = None) -> None:
        super().__init__()
        self.search = search
        self._close = close
        self.progress = search.progress
        self.failure = ""  # why the search stopped short, if it did

    def compose(self) -> ComposeResult:
        with Vertical(id="search-box", classes="modal-box") as box:
            box.border_title = Content(f"The whole log: {self.search.query}")
            yield Static(Text("searching…"), id="search-progress")
            table = DecisionsTable(self._open_record, id="search-table")
            for label, width in DECISION_COLUMNS:
                table.add_column(label, width=width)
            yield table
            yield Label("enter: the record · escape: close", classes="modal-hint")

    def on_mount(self) -> None:
        self.query_one("#search-table", DecisionsTable).focus()
        self.action_more()

    def action_more(self) -> None:
        if not self.progress.done:
            self.run_worker(self._read_on(), exclusive=True, group="log-search")

    async def _read_on(self) -> None:
        import grpc

        self.failure = ""
        try:
            async for progress in self.search.more():
                self._show(progress)
        except grpc.aio.AioRpcError as exc:
            first = (exc.details() or "").splitlines()[:1]
            self.failure = ": ".join([exc.code().name, *first])
            self._show(self.search.progress)

    def _show(self, progress: Progress) -> None:
        table = self.query_one("#search-table", DecisionsTable)
        new = [TableRow(index, DecisionRow.from_proto(m))
               for index, m in enumerate(progress.matches) if index >= len(table.shown)]
        table.append(new)
        self.progress = progress
        line = progress.summary(self.search.query)
        if self.failure:
            line += f" · stopped: {self.failure}"
        elif not progress.done:
            line += " · m: more, further back"
        self.query_one("#search-progress", Static).update(Text(line))

    def _open_record(self, row_key: str | None) -> None:
        shown = self.query_one("#search-table", DecisionsTable).shown.get(row_key or "")
        if shown is not None:
            self.app.push_screen(DecisionScreen(shown.row))

    async def on_unmount(self) -> None:
        if self._close is not None:
            await self._close()
