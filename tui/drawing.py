"""The small self-sizing renderables the panels are drawn with, and their number formats.

`StackedBar`, `Sparkline` and `NameTable` take the width Rich gives them at render time, so
the panel functions that build them need not know it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text

from kvbudget.pressure import POOL_FULL_SHARE

USAGE_WARN = 0.70
USAGE_CRITICAL = POOL_FULL_SHARE  # red where the pool counts as full (the verdicts' bar)
SPARK_CHARS = "▁▂▃▄▅▆▇█"


def usage_style(usage: float) -> str:
    """Threshold colours of vLLM-style usage gauges: green, then yellow, then red."""
    if usage >= USAGE_CRITICAL:
        return "bold red"
    if usage >= USAGE_WARN:
        return "yellow"
    return "green"


def n(value: int) -> str:
    return f"{value:,}"


def n_short(value: int, limit: int = 100_000) -> str:
    """A count that grows without bound (a cumulative one) in at most 6 cells: as `n` below
    `limit`, else 3 significant figures and a unit, "190k", "1.2M", "45G". In a table whose
    name column takes what the others leave, a counter that keeps growing would otherwise
    eat the names ("swa 1024 ×6" became "swa 1024 …", then "swa 102…")."""
    if value < limit:
        return n(value)
    for unit, suffix in ((10**3, "k"), (10**6, "M"), (10**9, "G"), (10**12, "T")):
        scaled = value / unit
        text = f"{scaled:.1f}" if scaled < 9.95 else f"{scaled:.0f}"
        if float(text) < 1000 or suffix == "T":
            return f"{text}{suffix}"
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class StackedBar:
    """A one-line bar of consecutive segments (count, character, style) out of `total`."""

    segments: tuple[tuple[int, str, str], ...]
    total: int

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        if self.total <= 0:
            yield Segment("·" * width, Style.parse("dim"))
            yield Segment.line()
            return
        # Cumulative rounding: the cells add up to the width exactly, and a non-empty
        # segment keeps at least the cells its share rounds to.
        used, running = 0, 0
        for count, char, style in self.segments:
            running += count
            end = min(width, round(running * width / self.total))
            if end > used:
                yield Segment(char * (end - used), Style.parse(style))
                used = end
        if used < width:
            yield Segment(" " * (width - used))
        yield Segment.line()


@dataclass(frozen=True)
class Sparkline:
    """The newest values that fit the width, scaled from 0 (or `floor`) to their maximum."""

    values: tuple[float, ...]
    style: str = "cyan"
    ceiling: float | None = None  # fixed top of the scale, e.g. 1.0 for a ratio

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Text(spark_text(self.values, options.max_width, self.ceiling), style=self.style)


@dataclass(frozen=True)
class NameTable:
    """A table whose first column takes what the others leave (Rich's own squeezes them all).

    The other columns are as wide as their widest cell, right-aligned unless `left` names them.
    Names too long are cut at the end, or in the middle with `middle` (ids that share a
    long prefix differ at their end). `sections` splits the rows into runs of (count,
    what they are): given a height (a panel's), rows that do not fit are dropped, each run
    cut short ending in one "+N more <what>" line; without sections the rows are one run.
    """

    headers: tuple[str, ...] | None
    rows: tuple[tuple[Text | str, ...], ...]
    left: frozenset[int] = frozenset()
    middle: bool = False
    sections: tuple[tuple[int, str], ...] = ()

    def lines(self, width: int) -> tuple[list[Text], list[tuple[list[Text], str]]]:
        """The header lines and the row lines of each section, `width` cells wide."""
        lines = [tuple(Text(h, style="bold") for h in self.headers)] if self.headers else []
        lines += [tuple(c if isinstance(c, Text) else Text(c) for c in r) for r in self.rows]
        if not lines:
            return [], []
        columns = len(lines[0])
        widths = [max(line[i].cell_len for line in lines) for i in range(1, columns)]
        name_width = max(1, width - sum(widths) - (columns - 1))
        out_lines = []
        for line in lines:
            if self.middle:
                out = middle_ellipsis(line[0], name_width)
                out.truncate(name_width, pad=True)
            else:
                out = line[0].copy()
                out.truncate(name_width, overflow="ellipsis", pad=True)
            for index, width_ in enumerate(widths, start=1):
                cell = line[index].copy()
                cell.align("left" if index in self.left else "right", width_)
                out.append(" ")
                out.append_text(cell)
            out.no_wrap = True
            out_lines.append(out)
        header_count = 1 if self.headers else 0
        header, rows = out_lines[:header_count], out_lines[header_count:]
        sections, start = [], 0
        for count, what in self.sections or ((len(rows), ""),):
            sections.append((rows[start : start + count], what))
            start += count
        return header, sections

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        # Called, not yielded: Rich renders what a renderable yields without the height.
        yield from Fitted((self,)).__rich_console__(console, options)


@dataclass(frozen=True)
class Fitted:
    """Tables (and fixed lines) one under the other, cut to the height Rich is given.

    Textual renders a panel with its height; where the rows do not fit, `fit_rows` says how
    many of each section to show, and a "+N more" line counts the rest: every table keeps
    its header. A plain console print gives no height: every row is shown.
    """

    parts: tuple[NameTable | Text, ...]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        laid_out = [
            ([part], []) if isinstance(part, Text) else part.lines(width) for part in self.parts
        ]
        sizes = [len(rows) for _, sections in laid_out for rows, _ in sections]
        fixed = sum(len(header) for header, _ in laid_out)
        room = None if options.height is None else max(0, options.height - fixed)
        shown = iter(sizes if room is None else fit_rows(sizes, room))
        for header, sections in laid_out:
            yield from header
            for rows, what in sections:
                count = next(shown)
                yield from rows[:count]
                if count < len(rows):
                    more = Text(f"+{len(rows) - count} more {what}".rstrip(), style="dim")
                    more.no_wrap, more.overflow = True, "ellipsis"
                    yield more


@dataclass(frozen=True)
class Blocks:
    """Blocks of lines one under the other (a replay: name, bar, status), then `footer`.

    Given a height (a panel's), as many whole blocks as fit and a "+N more <what>" line
    for the rest; the footer only where a line is left for it. Without a height, all.
    """

    blocks: tuple[RenderableType, ...]
    what: str
    footer: RenderableType | None = None

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        unbounded = options.update(height=None)
        rendered = [console.render_lines(block, unbounded, pad=False) for block in self.blocks]
        footer = [] if self.footer is None else console.render_lines(self.footer, unbounded, pad=False)
        room = options.height
        if room is None or sum(len(lines) for lines in rendered) + len(footer) <= room:
            shown, footer_shown = rendered, footer
        else:
            shown, used = [], 0
            for index, lines in enumerate(rendered):
                # What follows this block: its "+N more" line if any block is left out.
                more = 1 if index < len(rendered) - 1 else 0
                if used + len(lines) + more > room:
                    break
                shown.append(lines)
                used += len(lines)
            left = len(rendered) - len(shown)
            if left:
                used += 1
            footer_shown = footer if used + len(footer) <= room else []
        for lines in shown:
            for line in lines:
                yield from line
                yield Segment.line()
        if len(shown) < len(rendered):
            more = Text(f"+{len(rendered) - len(shown)} more {self.what}", style="dim")
            more.no_wrap, more.overflow = True, "ellipsis"
            yield more
        for line in footer_shown:
            yield from line
            yield Segment.line()


def fit_rows(sizes: Sequence[int], room: int) -> list[int]:
    """How many rows of each section to show in `room` lines, where a section cut short
    takes one line more for its "+N more".

    All of them when they fit. Else every section keeps its first row (and its "+N more"),
    and what room is left goes to the sections in order: the first (engines) fills up
    before the next gets more. Never "+1 more": that line would only stand where the row
    itself fits, so a section of two rows is shown whole or as its first row and "+N more"
    only when even that does not fit.
    """
    if sum(sizes) <= room:
        return list(sizes)
    # The fewest lines each section can take: itself when 2 rows or fewer, else 1 + 1.
    least = [min(size, 2) for size in sizes]
    if sum(least) > room:
        # Not even that: a row where a section has just one, else only its "+N more".
        return [1 if size == 1 else 0 for size in sizes]
    shown = [size if size <= 2 else 1 for size in sizes]
    left = room - sum(least)
    for index, size in enumerate(sizes):
        if size <= 2 or left <= 0:
            continue
        if left >= size - 2:  # whole: its "+N more" line becomes its last row
            shown[index], left = size, left - (size - 2)
        else:
            shown[index], left = 1 + left, 0
    return shown


def middle_ellipsis(text: Text, width: int) -> Text:
    """`text` in `width` cells, cut in the middle ("4ea…engine-07") when longer: a third of
    the room for its start, the rest for its end, where ids sharing a prefix differ."""
    if text.cell_len <= width:
        return text.copy()
    if width <= 1:
        return Text("…"[:width], style=text.style)
    head_room = (width - 1) // 3
    tail_room = width - 1 - head_room
    plain = text.plain
    head = _chars_in(plain, head_room)
    tail = _chars_in(plain[::-1], tail_room)
    out = text[:head]
    out.append("…")
    out.append_text(text[len(plain) - tail :])
    return out


def _chars_in(plain: str, cells: int) -> int:
    """How many leading characters of `plain` fit `cells` cells."""
    used = 0
    for count, char in enumerate(plain):
        used += cell_len(char)
        if used > cells:
            return count
    return len(plain)


def spark_text(values: Sequence[float], width: int, ceiling: float | None = None) -> str:
    shown = list(values)[-width:] if width > 0 else []
    if not shown:
        return ""
    top = ceiling if ceiling is not None else max(shown)
    if top <= 0:
        return SPARK_CHARS[0] * len(shown)
    last = len(SPARK_CHARS) - 1
    return "".join(SPARK_CHARS[max(0, min(last, round(v / top * last)))] for v in shown)


def plot_row(label: str, values: tuple[float, ...], value: str, style: str, ceiling=None) -> Table:
    row = Table.grid(padding=(0, 1), expand=True)
    row.add_column(width=5, no_wrap=True)
    row.add_column(ratio=1, no_wrap=True)
    row.add_column(justify="right", no_wrap=True)
    row.add_row(Text(label, style="dim"), Sparkline(values, style, ceiling), value)
    return row


def pairs(*items: tuple[str, str, str]) -> Text:
    """ "label value" pairs on one line, the value styled."""
    text = Text()
    for index, (label, value, style) in enumerate(items):
        if index:
            text.append("  ")
        text.append(f"{label} ", style="dim")
        text.append(value, style=style)
    return text
