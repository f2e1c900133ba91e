"""The dashboard's modal screens: key help, one decision's whole record, start a replay.

Titles and option labels that carry someone's text (a target path, a request's reason, a
trace file's name) are `Content`/`Text`, never markup: "[/x]" in a path must show as typed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static

from kvbudget.tui.decisions import decision_detail
from kvbudget.tui.panels import key_help
from kvbudget.tui.replays import POLICIES, SPEEDS, ReplayRequest
from kvbudget.tui.state import DecisionRow


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

    BINDINGS = [Binding("escape,q,enter", "dismiss", "close")]

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
                    yield Label("requests (0: all)")
                    limit = Input("2000", type="integer", id="replay-limit")
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
        limit_text = self.query_one("#replay-limit", Input).value.strip() or "0"
        self.dismiss(
            ReplayRequest(
                trace=trace,
                speed=float(self.query_one("#replay-speed", Select).value),
                policy=str(self.query_one("#replay-policy", Select).value),
                limit=max(0, int(limit_text)),
            )
        )
