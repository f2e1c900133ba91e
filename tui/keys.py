"""The dashboard's keys: its bindings, what the help window says of them, and the command
palette's entries."""

from __future__ import annotations

from textual.binding import Binding

BINDINGS = [
    Binding("q", "quit", "quit"),
    Binding("question_mark", "help", "keys"),
    # A priority binding: run as the key arrives, before the keys queued behind it are
    # handed to the table (see KVBudgetApp.action_filter).
    Binding("slash", "filter", "filter", priority=True),
    Binding("space", "pause", "pause"),
    Binding("r", "start_replay", "replay"),
    Binding("s", "search_log", "search log"),
    Binding("escape", "clear_filter", "clear filter", show=False),
]
KEYS_HELP = (
    ("q", "quit (stops replays started here)"),
    ("?", "this help"),
    ("/", "filter decisions: words matched in kind, reason, request, engine, tenant"),
    ("escape", "clear the filter"),
    ("s", "search the whole decision log for the filter's words"),
    ("space", "pause / resume the decisions table (the panels keep going)"),
    ("↑ ↓ enter", "select a decision to see its whole record (it stays selected)"),
    ("r", "start a replay of a shipped trace against this daemon (not in playback)"),
    ("ctrl+p", "command palette"),
)
# (title, help, action): the command palette's entries, after Textual's own.
COMMANDS = (
    ("Start a replay", "replay a shipped trace", "start_replay"),
    ("Pause decisions", "pause / resume the table", "pause"),
    ("Filter decisions", "filter the table", "filter"),
    ("Clear filter", "show every decision", "clear_filter"),
    ("Search the whole log", "the filter's words over every logged decision", "search_log"),
    ("Dashboard keys", "what each key does", "help"),
)
