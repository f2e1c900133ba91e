"""Every panel of the dashboard, each a pure function of one `DashboardState`.

A panel returns a Rich renderable and nothing else: no widget, no I/O, no clock. The app
puts each one in a bordered box and calls it again when the state moves; the tests render
them to text at a fixed width and compare. `compact=True` is the 80x24 variant: the same
figures on fewer lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kvbudget.tui.drawing import (
    NameTable,
    StackedBar,
    n,
    pairs,
    plot_row,
    usage_style,
)
from kvbudget.tui.state import DashboardState, Link, policy_name
from kvbudget.tui.verdict import Bound, gib, verdict

REPLAY_STALLED_S = 30.0  # a replay whose position has not moved for this long
WAITING = Text("waiting for the first snapshot…", style="dim")


def pool_panel(state: DashboardState, compact: bool = False) -> RenderableType:
    s = state.snapshot
    if s is None:
        return WAITING
    held, reserved, cached = s.num_held_blocks, s.num_reserved_blocks, s.num_evictable_blocks
    free = max(0, s.num_blocks - held - reserved - cached)
    usage = held / s.num_blocks if s.num_blocks else 0.0
    committed = (held + reserved) / s.num_blocks if s.num_blocks else 0.0
    bar = StackedBar(
        ((held, "█", "red"), (reserved, "▓", "yellow"), (cached, "▒", "blue"), (free, "░", "green")),
        s.num_blocks,
    )
    counts_a = pairs(("held", n(held), "red"), ("reserved", n(reserved), "yellow"))
    counts_b = pairs(("cached", n(cached), "blue"), ("free", n(free), "green"))
    counts_b.append(f" /{n(s.num_blocks)}", style="dim")
    gauge = pairs(
        ("usage", f"{usage:.1%}", usage_style(usage)),
        ("+reserved", f"{committed:.1%}", usage_style(committed)),
    )
    free_plot = plot_row(
        "free",
        tuple(x.free_blocks for x in state.history),
        n(s.num_free_blocks),
        "green",
        s.num_blocks or None,
    )
    usage_plot = plot_row(
        "usage", tuple(x.usage for x in state.history), f"{usage:.0%}", usage_style(usage), 1.0
    )
    if compact:
        return Group(bar, counts_a, counts_b, gauge, free_plot)
    hit = s.prefix_hit_blocks / s.prefix_query_blocks if s.prefix_query_blocks else 0.0
    prefix = pairs(
        ("free+cached", n(s.num_free_blocks), "green"), ("prefix hits", f"{hit:.0%}", "")
    )
    return Group(bar, counts_a, counts_b, gauge, prefix, free_plot, usage_plot)


def _reasons(counts: dict[str, int] | None) -> str:
    if not counts:
        return "none"
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return " · ".join(f"{reason} {n(count)}" for reason, count in ordered)


def queue_panel(state: DashboardState, compact: bool = False) -> RenderableType:
    s = state.snapshot
    if s is None:
        return WAITING
    rate = state.preempt_rate()
    counts = pairs(
        ("running", n(s.num_running), "bold"),
        ("waiting", n(s.num_waiting), "bold yellow" if s.num_waiting else "bold"),
    )
    if s.draining:
        counts.append("  draining", style="bold magenta")
    preempts = pairs(
        ("preempted", n(s.num_preemptions), "bold red" if s.num_preemptions else "bold"),
        ("rate", f"{rate:.1f}/s", "red" if rate else ""),
    )
    rejected = Text.assemble(("rejected ", "dim"), _reasons(dict(s.rejections_by_reason)))
    rejected.no_wrap, rejected.overflow = True, "ellipsis"
    waiting_plot = plot_row(
        "wait", tuple(x.waiting for x in state.history), n(s.num_waiting), "yellow"
    )
    running_plot = plot_row(
        "run", tuple(x.running for x in state.history), n(s.num_running), "cyan"
    )
    if compact:
        return Group(counts, preempts, rejected, waiting_plot, running_plot)
    by_reason = Text.assemble(
        ("preempt ", "dim"), _reasons(dict(s.preemptions_by_reason))
    )
    by_reason.no_wrap, by_reason.overflow = True, "ellipsis"
    policy = pairs(
        ("policy", policy_name(s.policy), "bold"),
        ("decisions", f"{state.decision_rate():,.0f}/s", ""),
    )
    return Group(counts, preempts, by_reason, rejected, policy, waiting_plot, running_plot)


SHORT_LAYER_TYPES = {
    "full_attention": "full",
    "sliding_window": "swa",
    "chunked_local": "chunk",
    "cross_attention": "cross",
}


def layer_label(layer_type: str, description: str) -> str:
    """"sliding_window W=4096" -> "swa 4096": the kind short, its parameters' values kept."""
    kind = layer_type or description.split(" ", 1)[0]
    rest = description.removeprefix(kind).strip() if description.startswith(kind) else ""
    values = " ".join(part.split("=", 1)[-1] for part in rest.split())
    short = SHORT_LAYER_TYPES.get(kind, kind)
    return f"{short} {values}" if values else short


@dataclass(frozen=True)
class LayerRow:
    label: str
    groups: int
    layers: int
    reserved: int
    held: int
    reclaimed: int


def layer_rows(groups) -> tuple[LayerRow, ...]:
    """KV-cache groups of one spec merged into one row, in order of first appearance.

    vLLM cuts a hybrid model into groups of equal size (Gemma 3 27B: six sliding-window
    groups and one full); rows of the same spec say the same thing six times, so they are
    summed and marked "×6".
    """
    merged: dict[str, list[int]] = {}
    for g in groups:
        label = layer_label(g.layer_type, g.description)
        row = merged.setdefault(label, [0, 0, 0, 0, 0])
        for index, value in enumerate(
            (1, g.num_layers, g.blocks_reserved, g.blocks_held, g.blocks_reclaimed)
        ):
            row[index] += value
    return tuple(LayerRow(label, *values) for label, values in merged.items())


def layers_panel(state: DashboardState, compact: bool = False) -> RenderableType:
    """One row per kind of KV-cache group: layers, blocks reserved vs held, reclaimed."""
    s = state.snapshot
    if s is None:
        return WAITING
    if not s.groups:
        return Text("no KV-cache groups reported", style="dim")
    table = NameTable(
        ("type", "layers", "resv", "held", "reclm"),
        tuple(
            (
                f"{row.label} ×{row.groups}" if row.groups > 1 else row.label,
                n(row.layers),
                n(row.reserved),
                n(row.held),
                n(row.reclaimed),
            )
            for row in layer_rows(s.groups)
        ),
    )
    if compact:
        return table
    legend = Text("resv: promised · reclm: left window", style="dim")
    return Group(table, legend)


def physical_panel(state: DashboardState, compact: bool = False) -> RenderableType:
    """GPU memory from NVML beside the pool's logical usage, and the one-line verdict."""
    s = state.snapshot
    if s is None:
        return WAITING
    gpu = s.gpu
    judged = verdict(state)
    usage = s.num_held_blocks / s.num_blocks if s.num_blocks else 0.0
    lines: list[RenderableType] = []
    if gpu.present:
        physical = gpu.used_bytes / gpu.total_bytes if gpu.total_bytes else 0.0
        gpu_line = Text.assemble(
            ("GPU   ", "dim"),
            (f"{gib(gpu.used_bytes)} of {gib(gpu.total_bytes)} ", ""),
            (f"{physical:.0%}", usage_style(physical)),
        )
        if gpu.name and not compact:
            gpu_line.append(f" {gpu.name}", style="dim")
        gpu_line.no_wrap, gpu_line.overflow = True, "ellipsis"
        lines.append(gpu_line)
        lines.append(
            Text.assemble(
                ("pool  ", "dim"),
                (f"{gib(gpu.pool_bytes)}  logical ", ""),
                (f"{usage:.0%}", usage_style(usage)),
                (" held", ""),
            )
        )
        outside = max(0, gpu.used_bytes - gpu.pool_bytes)
        lines.append(Text.assemble(("other ", "dim"), (f"{gib(outside)} outside the pool", "")))
        if not compact:
            trend = tuple(x.gpu_used_bytes for x in state.history)
            lines.append(plot_row("mem", trend, "", "magenta", gpu.total_bytes or None))
    else:
        # The daemon's note often starts with "no GPU" itself: say it once.
        note = gpu.note.removeprefix("no GPU").lstrip(":;, ")
        gpu_line = Text.assemble(("GPU   ", "dim"), ("no GPU", "bold"), (f" ({note})" if note else "", ""))
        gpu_line.no_wrap, gpu_line.overflow = True, "ellipsis"
        lines.append(gpu_line)
        lines.append(
            Text.assemble(
                ("pool  ", "dim"),
                (f"{n(s.num_blocks)} blocks  logical ", ""),
                (f"{usage:.0%}", usage_style(usage)),
                (" held", ""),
            )
        )
    style = {
        Bound.LOG_CANNOT_WRITE: "bold red",
        Bound.OUTSIDE_POOL: "bold red",
        Bound.POOL_BOUND: "bold yellow",
        Bound.BUDGET_BOUND: "bold cyan",
        Bound.NOT_BOUND: "green",
        Bound.UNKNOWN: "dim",
    }[judged.bound]
    line = Text.assemble(("⇒ ", "dim"), (judged.bound.value, style))
    if judged.why and not compact:
        line.append(f": {judged.why}")
    lines.append(line)
    return Group(*lines)


def _lease(remaining_s: float) -> tuple[str, str]:
    if remaining_s <= 0:
        return "lapsed", "bold red"
    return f"live {remaining_s:.0f}s", "green"


def engines_panel(state: DashboardState, compact: bool = False) -> RenderableType:
    """Engine sessions with their lease and blocks held; tenants against their quota."""
    s = state.snapshot
    if s is None:
        return WAITING
    if compact:
        return _engines_compact(s)
    parts: list[RenderableType] = []
    if s.engines:
        rows = []
        for engine in s.engines:
            lease, style = _lease(engine.lease_remaining_s)
            rows.append(
                (
                    engine.engine_id,
                    Text(lease, style=style),
                    n(engine.blocks_held),
                    n(engine.running),
                    n(engine.waiting),
                )
            )
        parts.append(NameTable(("engine", "lease", "held", "run", "wait"), tuple(rows), frozenset({1})))
    else:
        parts.append(Text("no engine sessions", style="dim"))
    if s.tenants:
        rows = []
        for tenant in s.tenants:
            quota, use = _quota(tenant)
            rows.append(
                (
                    tenant.tenant or "(default)",
                    n(tenant.blocks_held),
                    quota,
                    use,
                    n(tenant.running),
                    n(tenant.waiting),
                )
            )
        parts.append(NameTable(("tenant", "held", "quota", "use", "run", "wait"), tuple(rows)))
    return Group(*parts)


def _quota(tenant) -> tuple[str, Text | str]:
    """The quota and the tenant's use of it: (held + reserved) / quota."""
    if not tenant.quota_blocks:
        return "—", "—"
    share = (tenant.blocks_held + tenant.blocks_reserved) / tenant.quota_blocks
    return n(tenant.quota_blocks), Text(f"{share:.0%}", style=usage_style(share))


def _engines_compact(s) -> RenderableType:
    """One line an engine, one a tenant, no headers: the 80x24 variant."""
    rows: list[tuple[Text | str, ...]] = []
    for engine in s.engines:
        lease, style = _lease(engine.lease_remaining_s)
        rows.append((engine.engine_id, Text(lease, style=style), n(engine.blocks_held), "held"))
    for tenant in s.tenants:
        quota, use = _quota(tenant)
        name = Text(tenant.tenant or "(default)", style="italic")
        rows.append((name, f"quota {quota}", n(tenant.blocks_held), use))
    if not rows:
        return Text("no engine sessions", style="dim")
    return NameTable(None, tuple(rows), frozenset({1}))


def replays_panel(state: DashboardState, compact: bool = False) -> RenderableType:
    """Running (and finished) replays: trace, position, speed, policy."""
    s = state.snapshot
    if s is None:
        return WAITING
    hint = Text("r: start a replay", style="dim")
    if not s.replays:
        return Group(Text("no replay running", style="dim"), hint)
    rows: list[RenderableType] = []
    for replay in s.replays:
        done = replay.done or (replay.total > 0 and replay.position >= replay.total)
        fraction = replay.position / replay.total if replay.total else 0.0
        head = Text(no_wrap=True, overflow="ellipsis")
        head.append(replay.trace or replay.replay_id, style="bold")
        progress = Table.grid(padding=(0, 1), expand=True)
        progress.add_column(ratio=1, no_wrap=True)
        progress.add_column(justify="right", no_wrap=True)
        remaining = max(0, replay.total - replay.position)
        bar = StackedBar(((replay.position, "█", "cyan"), (remaining, "░", "dim")), replay.total)
        progress.add_row(bar, f"{n(replay.position)}/{n(replay.total)} {replay.speed:g}×")
        rows += [head, progress]
        still_s = state.replay_still_s(replay.replay_id)
        if done:
            status = ("done", "green")
        elif still_s >= REPLAY_STALLED_S:
            status = (f"stalled {still_s:.0f}s", "bold yellow")
        else:
            status = ("running", "cyan")
        if not compact:
            about = Text.assemble(
                (f"{fraction:.0%} ", "bold"), status, ("  policy ", "dim"), (replay.policy or "—", "")
            )
            rows.append(about)
    if not compact:
        rows.append(hint)
    return Group(*rows)


# -- status line --------------------------------------------------------------------------


def status_line(state: DashboardState, paused: bool = False, query: str = "") -> Text:
    """The top line: where we are connected, how, and what the app is doing."""
    c = state.connection
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(" kvbudget ", style="bold reverse")
    text.append(f" {c.target} ")
    if c.link is Link.CONNECTED:
        text.append("● connected", style="bold green")
    elif c.link is Link.DISCONNECTED:
        text.append(f"● disconnected, retrying in {c.retry_in_s:.1f}s", style="bold red")
        if c.detail:
            text.append(f" ({c.detail})", style="red")
    else:
        text.append("● connecting…", style="yellow")
    s = state.snapshot
    if s is not None and c.link is Link.CONNECTED:
        model = s.plan.model if s.HasField("plan") else ""
        if model:
            text.append(f"  {model}", style="bold")
        text.append(f"  {policy_name(s.policy)}")
    if paused:
        text.append("  ⏸ PAUSED", style="bold yellow")
    if query:
        text.append(f"  filter: {query}", style="bold cyan")
    return text


def key_help(bindings: Sequence[tuple[str, str]]) -> RenderableType:
    table = Table(box=None, padding=(0, 2), show_header=False)
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    for key, description in bindings:
        table.add_row(key, description)
    return table
