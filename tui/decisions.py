"""The decisions table: its columns, its rows (newest first, filtered) and the detail view."""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime, timezone

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from kvbudget.tui.state import DashboardState, DecisionRow, decision_matches

# (label, width): fixed, so the table does not jitter as rows come and go (and longer cells
# are cut, not allowed to push the columns that matter off an 80-column screen).
DECISION_COLUMNS: tuple[tuple[str, int], ...] = (
    ("seq", 7),
    ("kind", 7),
    ("reason", 14),
    ("request", 18),
    ("engine", 10),
    ("tenant", 9),
    ("blocks/group", 24),
)
KIND_STYLES = {
    "admit": "green",
    "queue": "yellow",
    "reject": "bold red",
    "grow": "cyan",
    "deny": "yellow",
    "preempt": "bold red",
    "reclaim": "blue",
    "release": "dim",
    "expire": "magenta",
    "policy": "bold magenta",
}


def blocks_per_group(row: DecisionRow) -> str:
    """held/reserved per group, "12/16 4/4"; just held where nothing is reserved; a run of
    equal groups once with its count, "48/48×6 12/16"."""
    cells = []
    for index in range(max(len(row.blocks_held), len(row.blocks_reserved))):
        held = row.blocks_held[index] if index < len(row.blocks_held) else 0
        reserved = row.blocks_reserved[index] if index < len(row.blocks_reserved) else 0
        cells.append(f"{held}/{reserved}" if reserved else str(held))
    runs: list[list] = []
    for cell in cells:
        if runs and runs[-1][0] == cell:
            runs[-1][1] += 1
        else:
            runs.append([cell, 1])
    return " ".join(f"{c}×{k}" if k > 1 else c for c, k in runs) or "—"


def decision_cells(row: DecisionRow) -> tuple[Text, ...]:
    return (
        Text(str(row.seq), style="dim"),
        Text(row.kind, style=KIND_STYLES.get(row.kind, "")),
        Text(row.reason),
        Text(row.request_id),
        Text(row.engine_id),
        Text(row.tenant),
        Text(blocks_per_group(row)),
    )


def visible_decisions(state: DashboardState, query: str, limit: int) -> tuple[DecisionRow, ...]:
    """The table's rows: newest first, filtered by the `/` query, at most `limit`."""
    shown: list[DecisionRow] = []
    for message in reversed(state.decisions):
        if not query or decision_matches(message, query):
            shown.append(DecisionRow.from_proto(message))
            if len(shown) >= limit:
                break
    return tuple(shown)


def decision_detail(row: DecisionRow) -> RenderableType:
    """The whole record, one field a line."""
    table = Table(box=None, padding=(0, 2), show_header=False)
    table.add_column(style="dim", no_wrap=True)
    table.add_column()
    for f in fields(row):
        value = getattr(row, f.name)
        if f.name == "new_blocks":
            value = "; ".join(f"group {g}: {list(ids)}" for g, ids in value) or "—"
        elif isinstance(value, tuple):
            value = " ".join(str(v) for v in value) or "—"
        elif f.name == "time_s":
            value = datetime.fromtimestamp(value, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
        elif value == "":
            value = "—"
        table.add_row(f.name, str(value))
    return table
