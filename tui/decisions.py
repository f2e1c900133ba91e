"""The decisions table: its title, its columns, its rows (newest first, filtered) and the
detail view."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime, timezone

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from kvbudget.tui.drawing import middle_ellipsis
from kvbudget.tui.state import DashboardState, DecisionRow, Link, decision_matches, words_match

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
# Where the table has no room for a row (a terminal below the documented size, the panels
# taking every line): what the title says, so that an empty table is not taken for a daemon
# deciding nothing.
TOO_SMALL = "terminal too small for rows (80x24)"


def decisions_title(
    state: DashboardState,
    paused: bool = False,
    query: str = "",
    now: float | None = None,
    room_for_rows: bool = True,
) -> Text:
    """The decisions box's title: decisions received (and skipped), the daemon's decision
    rate while the figures are live, the pause and the filter.

    The rate is the daemon's, over the last snapshots: once those stop coming (the daemon
    gone or hung; `now`, the monotonic clock the state's times are on, says since when)
    it is no rate now, and it is left out, as the panels above are dimmed. The count stays:
    it is what this dashboard received, true whatever happened since.
    """
    # A Text, never markup: the filter is what the user typed ("[/" included).
    title = Text("Decisions")
    if not room_for_rows:
        title.append(f" · {TOO_SMALL}", style="bold")
    title.append(f" · {state.decisions_received:,} received")
    if state.decisions_dropped:
        # The daemon sends the newest of each interval; under heavy load it skips some.
        title.append(f" · {state.decisions_dropped:,} skipped")
    if decision_rate_is_live(state, now):
        title.append(f" · {state.decision_rate():,.0f}/s")
    if paused:
        title.append(" · ")
        title.append("PAUSED", style="bold")
        title.append(" (space)")
    if query:
        title.append(" · filter ")
        title.append(query, style="bold")
        kept = len(state.decisions)
        if state.decisions_received + state.decisions_dropped > kept:
            # The filter reads the table's buffer, not the log: a few seconds of a busy daemon
            # (1 preemption matched while the Queue panel counted 116). Said, with the key
            # that searches the rest (LogSearchScreen).
            title.append(f" (the newest {kept:,} only · s: search the whole log)", style="bold")
    return title


def decision_rate_is_live(state: DashboardState, now: float | None = None) -> bool:
    """Whether the state's decision rate is the daemon's now: not while disconnected, nor
    once the figures are stale (`DashboardState.staleness`). A recording's is its own to
    the end: nothing goes stale in playback."""
    connection = state.connection
    if connection.playback:
        return True
    if connection.link is Link.DISCONNECTED:
        return False
    return now is None or state.staleness(now) is None


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


# Cut in the middle: ids that share a long prefix (one per engine of a replay,
# "4ea3818b-engine-0", "4ea3818b-engine-1") differ at their end.
MIDDLE_CUT_COLUMNS = frozenset({"request", "engine", "tenant"})


def decision_cells(row: DecisionRow) -> tuple[Text, ...]:
    cells = (
        Text(str(row.seq), style="dim"),
        Text(row.kind, style=KIND_STYLES.get(row.kind, "")),
        Text(row.reason),
        Text(row.request_id),
        Text(row.engine_id),
        Text(row.tenant),
        Text(blocks_per_group(row)),
    )
    return tuple(
        middle_ellipsis(cell, width) if label in MIDDLE_CUT_COLUMNS else cell
        for cell, (label, width) in zip(cells, DECISION_COLUMNS)
    )


@dataclass(frozen=True)
class TableRow:
    """One row of the decisions table: the decision and its key.

    The key is the dashboard's own arrival number (`DashboardState.decision_number`), not
    the daemon's `seq`: a daemon restarted on a fresh log numbers from 1 again, so seqs can
    repeat in one table; arrival numbers never do, and they name the same decision on every
    redraw.
    """

    key: int
    row: DecisionRow


def visible_decisions(
    state: DashboardState, query: str, limit: int, keep: TableRow | None = None
) -> tuple[TableRow, ...]:
    """The table's rows: newest first, filtered by the `/` query, at most `limit`.

    `keep`: a row the user selected. It stays in the table while it is buffered (the rows
    go on past `limit` down to it), so that a selection survives new rows arriving. Once it
    has left the buffer it is dropped and the selection clears: kept as the last row, it sat
    pinned at the bottom, out of order, for minutes. Dropped too when the query no longer
    matches it.
    """
    shown: list[TableRow] = []
    buffered = keep is not None and keep.key >= state.decision_number(0)
    stop_at = keep.key if buffered and keep is not None else None  # go on down to it
    for index in range(len(state.decisions) - 1, -1, -1):
        key = state.decision_number(index)
        if len(shown) >= limit and (stop_at is None or key < stop_at):
            break
        message = state.decisions[index]
        if query and not decision_matches(message, query):
            continue
        shown.append(TableRow(key, DecisionRow.from_proto(message)))
    return tuple(shown)


def row_matches(row: DecisionRow, query: str) -> bool:
    """The `/` filter on a row already converted (the fields `decision_matches` reads)."""
    return words_match((row.kind, row.reason, row.request_id, row.engine_id, row.tenant), query)


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
        # Text, not a str: a str cell is Rich markup, and a request id or detail such as
        # "[/x]" would fail to parse (or "[b]" restyle the line).
        table.add_row(f.name, Text(str(value)))
    return table
