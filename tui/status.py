"""The dashboard's top line (link, model, policy, daemon, target) and the key help."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from kvbudget.client.pool_parts import blocks_at_max_model_len
from kvbudget.daemon.wire.convert import policy_name
from kvbudget.tui.state import Connection, DashboardState, Link, daemon_uptime_s
from kvbudget.units import format_duration
from kvbudget.v1 import common_pb2


def status_line(
    state: DashboardState, paused: bool = False, query: str = "", now: float | None = None
) -> Text:
    """The top line: the link's state first (a narrow terminal still shows it), then what
    runs (model, policy), where, and what the app is doing; the whole reason of a
    disconnection last.

    `now` (the monotonic clock the state's times are on) dates the data: how long since
    the last update, and the retry countdown. Without it neither is shown.
    """
    c = state.connection
    stale_s = state.staleness(now) if now is not None else None
    # Under a second it says nothing (a disconnection is news of its own).
    age = f"no update for {stale_s:.0f} s" if stale_s is not None and stale_s >= 1 else ""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(" kvbudget ", style="bold reverse")
    text.append(" ")
    cause = ""
    if c.playback:
        ended = c.link is Link.DISCONNECTED
        text.append("▶ playback" + (", ended" if ended else ""), style="bold cyan")
    elif c.link is Link.CONNECTED:
        if age:
            text.append(f"● connected, {age}", style="bold yellow")
        else:
            text.append("● connected", style="bold green")
    elif c.link is Link.DISCONNECTED:
        cause = essential_cause(c.detail)
        line = "● disconnected" + (f": {cause}" if cause else "") + f", {_retry(c, now)}"
        text.append(line + (f" · {age}" if age else ""), style="bold red")
    else:
        text.append("● connecting…", style="yellow")
    s = state.snapshot
    if s is not None and (c.link is Link.CONNECTED or c.playback):
        # What runs before where: a socket path can be long, the model and policy are not.
        model = s.plan.model if s.HasField("plan") else ""
        if model:
            text.append(f"  {model}", style="bold")
        text.append(f"  {policy_name(s.policy)}")
        identity = daemon_identity(s)
        if identity:
            text.append(f"  {identity}", style="dim")
        unfit = unservable(s)
        if unfit:
            text.append(f"  ⚠ {unfit}", style="bold yellow")
    text.append(f"  {c.target}")
    if paused:
        text.append("  ⏸ PAUSED", style="bold yellow")
    if query:
        text.append(f"  filter: {query}", style="bold cyan")
    if c.link is Link.DISCONNECTED and c.detail and c.detail != cause:
        text.append(f"  ({c.detail})", style="red")
    return text


def unservable(s: common_pb2.Snapshot) -> str:
    """"no request of max_model_len fits": such a pool serves short requests and rejects
    every long one never_fits, which a replay showed only in its final table. The daemon
    warns at start and doctor says it too (the same figure: pool_parts)."""
    if not s.HasField("plan"):
        return ""
    need = blocks_at_max_model_len(s.plan)
    if need <= s.plan.num_blocks:
        return ""
    return f"no request of max_model_len fits ({s.plan.max_model_len_tokens:,} tokens need {need:,} blocks)"


def daemon_identity(s: common_pb2.Snapshot) -> str:
    """"daemon 0.4.0 · up 2h13m": which daemon answers and how long it has run, as htop's
    uptime or `systemctl status`'s "since". "daemon", not "kvbudget": the daemon may run
    another version than this dashboard. Either part is left out when the daemon does not
    say it (an older one)."""
    parts = []
    if s.daemon_version:
        parts.append(f"daemon {s.daemon_version}")
    uptime_s = daemon_uptime_s(s)
    if uptime_s is not None:
        parts.append(f"up {format_duration(uptime_s)}")
    return " · ".join(parts)


def essential_cause(detail: str) -> str:
    """What failed, out of a gRPC status line: "Connection refused" out of "UNAVAILABLE:
    failed to connect to all addresses; last error: FAILED_PRECONDITION: unix:/x.sock:
    connect failed: addr: unix:/x.sock error: Connection refused". The line itself when it
    has no such tail ("UNAVAILABLE: Socket closed")."""
    if "error: " not in detail:
        return detail
    cause = detail.rsplit("error: ", 1)[1].rsplit(": ", 1)[-1].strip()
    return cause or detail


def _retry(c: Connection, now: float | None) -> str:
    """"retrying in 3 s", counting down; "retrying…" once the attempt is under way."""
    remaining = c.retry_in_s if c.retry_at is None or now is None else c.retry_at - now
    return f"retrying in {math.ceil(remaining)} s" if remaining > 0 else "retrying…"


def key_help(bindings: Sequence[tuple[str, str]]) -> RenderableType:
    table = Table(box=None, padding=(0, 2), show_header=False)
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    for key, description in bindings:
        table.add_row(key, description)
    return table
