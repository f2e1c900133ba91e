"""The pool, queue, physical, layer and replay panels, each a pure function of one
`DashboardState` (the engines & tenants panel is `engines`, the top line `status`).

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

from kvbudget.client.pool_parts import pool_parts  # shared with `kvbudget admin status`
from kvbudget.daemon.wire.convert import policy_name
from kvbudget.tui.drawing import (
    Blocks,
    NameTable,
    StackedBar,
    n,
    n_short,
    pairs,
    plot_row,
    usage_style,
)
from kvbudget.tui.state import DashboardState
from kvbudget.tui.verdict import Bound, gib, verdict
from kvbudget.v1 import common_pb2

REPLAY_STALLED_S = 30.0  # a replay whose position has not moved for this long
WAITING = Text("waiting for the first snapshot…", style="dim")


def pool_panel(state: DashboardState, compact: bool = False) -> RenderableType:
    s = state.snapshot
    if s is None:
        return WAITING
    held, reserved, cached, free = pool_parts(s)
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
        tuple(x.free_blocks for x in state.history),  # the same "free" as the counts above
        n(free),
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
        # The daemon's free blocks: every one no request holds (reserved, cached and free)
        ("not held", n(s.num_free_blocks), "green"), ("prefix hits", f"{hit:.0%}", "")
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
                n_short(row.reclaimed),  # cumulative: it grows for as long as the daemon runs
            )
            for row in layer_rows(s.groups)
        ),
    )
    if compact:
        return table
    legend = Text("resv: promised · reclm: left window", style="dim")
    return Group(table, legend)


def physical_panel(state: DashboardState, compact: bool = False) -> RenderableType:
    """GPU memory from NVML (each GPU a tensor x pipeline pool spans, one line each) beside
    the pool's logical usage, and the one-line verdict."""
    s = state.snapshot
    if s is None:
        return WAITING
    gpu = s.gpu
    usage = s.num_held_blocks / s.num_blocks if s.num_blocks else 0.0
    lines: list[RenderableType] = []
    # A tensor x pipeline pool: a line for each of its GPUs, the verdict above them (the
    # panel's height is fixed: GPUs that do not fit are cut below it, the verdict never).
    parallel = gpu.present and len(s.gpus) > 1
    if parallel:
        lines.append(verdict_line(state, compact))
        lines.extend(gpu_line(g, compact, f"GPU{gpu_number(g):<3}") for g in s.gpus)
    if gpu.present:
        if not parallel:
            lines.append(gpu_line(gpu, compact, "GPU   "))
        lines.append(
            Text.assemble(
                ("pool  ", "dim"),
                (f"{gib(gpu.pool_bytes)}  logical ", ""),
                (f"{usage:.0%}", usage_style(usage)),
                (" held", ""),
            )
        )
        outside = max(0, gpu.used_bytes - gpu.pool_bytes)  # (the pool's GPU: the first)
        lines.append(Text.assemble(("other ", "dim"), (f"{gib(outside)} outside the pool", "")))
        if not compact:
            trend = tuple(x.gpu_used_bytes for x in state.history)
            lines.append(plot_row("mem", trend, "", "magenta", gpu.total_bytes or None))
    else:
        # The daemon's note often starts with "no GPU" itself: say it once.
        note = gpu.note.removeprefix("no GPU").lstrip(":;, ")
        no_gpu = Text.assemble(("GPU   ", "dim"), ("no GPU", "bold"), (f" ({note})" if note else "", ""))
        no_gpu.no_wrap = False  # wrapped, not cut ("(NVML unavailable (NVM…"): 2 lines spare here
        lines.append(no_gpu)
        lines.append(
            Text.assemble(
                ("pool  ", "dim"),
                (f"{n(s.num_blocks)} blocks  logical ", ""),
                (f"{usage:.0%}", usage_style(usage)),
                (" held", ""),
            )
        )
    if not parallel:
        lines.append(verdict_line(state, compact))
    return Group(*lines)


def verdict_line(state: DashboardState, compact: bool) -> Text:
    """The one-line verdict (its reason too, when not compact)."""
    judged = verdict(state)
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
    return line


def gpu_number(gpu: common_pb2.GpuState) -> str:
    """How the operator knows a GPU: its host index, as nvidia-smi numbers it (NVML's id);
    CUDA's index where NVML's id is a UUID or was not read."""
    return gpu.nvml_device if gpu.nvml_device.isdigit() else str(gpu.index)


def gpu_line(gpu: common_pb2.GpuState, compact: bool, label: str) -> Text:
    """One GPU's memory: used of total, the share used, its name (not when compact)."""
    if not gpu.present:  # one of a pool's GPUs that NVML could not read
        line = Text.assemble((label, "dim"), ("not read", "bold"), (f" ({gpu.note})" if gpu.note else "", ""))
    else:
        physical = gpu.used_bytes / gpu.total_bytes if gpu.total_bytes else 0.0
        line = Text.assemble(
            (label, "dim"),
            (f"{gib(gpu.used_bytes)} of {gib(gpu.total_bytes)} ", ""),
            (f"{physical:.0%}", usage_style(physical)),
        )
        if gpu.name and not compact:
            line.append(f" {gpu.name}", style="dim")
    line.no_wrap, line.overflow = True, "ellipsis"
    return line


def replays_panel(state: DashboardState, compact: bool = False) -> RenderableType:
    """Replays: trace, position, speed, status, policy; newest first, as htop and k9s put
    what runs now on top. Running (or stalled) ones before those that stopped short, before
    the finished: when they do not all fit, a "+N more" line stands for finished ones, never
    for one still running."""
    s = state.snapshot
    if s is None:
        return WAITING
    if state.connection.playback:
        hint = Text("playback: no replay from here", style="dim")
    else:
        hint = Text("r: start a replay", style="dim")
    if not s.replays:
        return Group(Text("no replay running", style="dim"), hint)
    blocks: list[RenderableType] = []
    for replay in replays_in_panel_order(s.replays):
        status = replay_status(state, replay)
        name = Text(replay.trace or replay.replay_id, style="bold")
        if compact:
            # No line of its own for the status at 80x24: beside the name.
            head = Table.grid(padding=(0, 1), expand=True)
            head.add_column(ratio=1, no_wrap=True, overflow="ellipsis")
            head.add_column(justify="right", no_wrap=True)
            head.add_row(name, Text.assemble(Text(*status), _rejected_text(state, replay, compact)))
        else:
            head = name
            head.no_wrap, head.overflow = True, "ellipsis"
        progress = Table.grid(padding=(0, 1), expand=True)
        progress.add_column(ratio=1, no_wrap=True)
        progress.add_column(justify="right", no_wrap=True)
        remaining = max(0, replay.total - replay.position)
        bar = StackedBar(((replay.position, "█", "cyan"), (remaining, "░", "dim")), replay.total)
        progress.add_row(bar, f"{n(replay.position)}/{n(replay.total)} {replay.speed:g}×")
        lines: list[RenderableType] = [head, progress]
        if not compact:
            lines.append(Text.assemble(status, ("  policy ", "dim"), (replay.policy or "—", "")))
            rejected = _rejected_text(state, replay, compact)
            if rejected.plain:
                lines.append(rejected)
        blocks.append(Group(*lines))
    return Blocks(tuple(blocks), "replays", None if compact else hint)


def _rejected_text(state: DashboardState, replay: common_pb2.ReplayState, compact: bool) -> Text:
    """"rejected 750: never_fits 750" as the replay's rejections come ("≥" where the
    dashboard may have missed some: tui/replay_rejects.py); at 80x24 " · 750 rejected"
    beside the status. Nothing where none was seen."""
    seen = next((r for r in state.replay_rejects if r.replay_id == replay.replay_id), None)
    if seen is None or not seen.rejected:
        return Text("")
    count = f"{'≥' if seen.partial else ''}{seen.rejected:,}"
    if compact:
        return Text(f" · {count} rejected", style="bold red")
    return Text.assemble((f"rejected {count}", "bold red"), (f": {seen.reasons_text()}", "red"))


def replays_in_panel_order(replays: Sequence[common_pb2.ReplayState]) -> list[common_pb2.ReplayState]:
    """The daemon lists replays as they first reported, oldest first: reversed, then
    running ones, stopped-short ones and finished ones (a stable sort keeps them newest
    first within each)."""
    return sorted(reversed(replays), key=_standing)


def _standing(replay: common_pb2.ReplayState) -> int:
    """0 running (or stalled), 1 stopped short, 2 finished (as replay_status tells them)."""
    if not replay.done and not _finished(replay):
        return 0
    return 1 if replay.total and not _finished(replay) else 2


def _finished(replay) -> bool:
    return replay.total > 0 and replay.position >= replay.total


def replay_status(state: DashboardState, replay) -> tuple[str, str]:
    """What a replay is doing, and its style: "25% running", "100% done", "20% stalled
    31s", or "stopped at 37%".

    A replayer reports `done` with position = total when it finishes. One that dies (or is
    interrupted) sends no last report; the daemon marks it done after 30 s of silence with
    its last position, short of the total: that one stopped, it did not finish.
    """
    fraction = replay.position / replay.total if replay.total else 0.0
    if _finished(replay):
        return f"{fraction:.0%} done", "green"
    if replay.done:
        return (f"stopped at {fraction:.0%}", "bold red") if replay.total else ("done", "green")
    still_s = state.replay_still_s(replay.replay_id)
    if still_s >= REPLAY_STALLED_S:
        return f"{fraction:.0%} stalled {still_s:.0f}s", "bold yellow"
    return f"{fraction:.0%} running", "cyan"
