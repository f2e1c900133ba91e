"""The dashboard's widgets: a box per panel function, which redraws only when what the panel
reads moved, and the decisions table."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.console import RenderableType
from textual.widgets import DataTable, Static

from kvbudget.tui import decisions, panels
from kvbudget.tui.engines import engines_panel
from kvbudget.tui.panels import WAITING
from kvbudget.tui.state import DashboardState

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
    ("engines", "Engines & tenants", engines_panel, _snapshot_fields("engines", "tenants")),
    ("replays", "Replays", panels.replays_panel, _snapshot_fields("replays")),
)


class Panel(Static):
    """A bordered box showing one panel function of the state."""

    def __init__(
        self, title: str, render_state: PanelFn, inputs: InputsFn | None, *, id: str
    ) -> None:
        super().__init__(WAITING, id=id, classes="panel")
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
        # The rows shown now, by row key: `enter` opens what was shown (a paused row may be
        # long gone from the state's buffer).
        self.shown: dict[str, decisions.TableRow] = {}

    def show(self, rows: Sequence[decisions.TableRow], keep: decisions.TableRow | None) -> None:
        """Shows `rows`; `keep`, the selected one, stays selected wherever they pushed it."""
        self.clear()
        for row in rows:
            self.add_row(*decisions.decision_cells(row.row), key=str(row.key))
        self.shown = {str(row.key): row for row in rows}
        if keep is not None and str(keep.key) in self.shown:
            self.move_cursor(row=self.get_row_index(str(keep.key)), animate=False)

    def append(self, rows: Sequence[decisions.TableRow]) -> None:
        """Adds `rows` below those shown (a search's older matches), the cursor where it is."""
        for row in rows:
            self.add_row(*decisions.decision_cells(row.row), key=str(row.key))
            self.shown[str(row.key)] = row

    def highlighted(self) -> decisions.TableRow | None:
        """The row under the cursor, kept across rebuilds; None on the newest row, which
        follows the new rows as they arrive."""
        if self.row_count == 0 or self.cursor_row <= 0:
            return None
        try:
            key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:  # noqa: BLE001 - a cursor past the rows: nothing selected
            return None
        return self.shown.get(key or "")

    def action_select_cursor(self) -> None:
        if self.row_count == 0:
            return
        self.open_record(self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value)
