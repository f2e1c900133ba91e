"""The small self-sizing renderables the panels are drawn with, and their number formats.

`StackedBar`, `Sparkline` and `NameTable` take the width Rich gives them at render time, so
the panel functions that build them need not know it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text

from kvbudget.client.pressure import POOL_FULL_SHARE

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


Row = tuple[Text | str, ...]


class CountName(Text):
    """The name of a row that stands for others ("+297 more"): a `NameTable` cuts it at its
    end, never in the middle as it may the names of a table (where "+2… more" would lose the
    count it is there to give)."""


@dataclass(frozen=True)
class Section:
    """A run of a `NameTable`'s rows: `count` of them, `what` they are ("engines").

    Cut short (a panel too short for all), a run ends in one line for the rows it leaves
    out: `rest(shown)` where given, a row in the table's columns standing for the run's rows
    from its `shown`th on (their sums, and how many they are), so that the rows on screen
    add up to the whole; else a bare "+N more <what>" line, which sums nothing.
    """

    count: int
    what: str = ""
    rest: Callable[[int], Row] | None = None


@dataclass(frozen=True)
class NameTable:
    """A table whose first column takes what the others leave (Rich's own squeezes them all).

    The other columns are as wide as their widest cell, right-aligned unless `left` names them.
    Names too long are cut at the end, or in the middle with `middle` (ids that share a
    long prefix differ at their end). `sections` splits the rows into runs (see `Section`):
    given a height (a panel's), rows that do not fit are dropped, each run cut short ending
    in one line for the rest; without sections the rows are one run.
    """

    headers: tuple[str, ...] | None
    rows: tuple[Row, ...]
    left: frozenset[int] = frozenset()
    middle: bool = False
    sections: tuple[Section, ...] = ()

    def runs(self) -> tuple[Section, ...]:
        return self.sections or (Section(len(self.rows)),)

    def header_lines(self) -> int:
        return 1 if self.headers else 0

    def lines(self, width: int, shown: Sequence[int] | None = None) -> list[Text]:
        """The table `width` cells wide: its header, then of each run its first `shown` rows
        (all of them without `shown`) and, where a run is cut short, the line for the rest."""
        runs = self.runs()
        counts = [run.count for run in runs] if shown is None else list(shown)
        laid_out: list[Row | Text] = []  # a Row to lay out in the columns, or a line as is
        rests: list[Row] = []
        start = 0
        for run, count in zip(runs, counts):
            laid_out += self.rows[start : start + count]
            if count < run.count:
                if run.rest is not None:
                    rests.append(run.rest(count))
                    laid_out.append(rests[-1])
                else:
                    more = Text(f"+{run.count - count} more {run.what}".rstrip(), style="dim")
                    more.no_wrap, more.overflow = True, "ellipsis"
                    laid_out.append(more)
            start += run.count
        header: list[Row] = []
        if self.headers:
            header.append(tuple(Text(h, style="bold") for h in self.headers))
        if not header and not self.rows:
            return []
        # The widths of every row, shown or not (they hold still as the panel's height moves),
        # and of the rest rows shown (a sum can be wider than any of its rows).
        cells = [
            tuple(c if isinstance(c, Text) else Text(c) for c in row)
            for row in (*header, *self.rows, *rests)
        ]
        columns = len(cells[0])
        widths = [max(row[i].cell_len for row in cells) for i in range(1, columns)]
        name_width = max(1, width - sum(widths) - (columns - 1))
        return [
            line if isinstance(line, Text) else self._line(line, widths, name_width)
            for line in [*header, *laid_out]
        ]

    def _line(self, row: Row, widths: Sequence[int], name_width: int) -> Text:
        name = row[0] if isinstance(row[0], Text) else Text(row[0])
        if self.middle and not isinstance(name, CountName):
            out = middle_ellipsis(name, name_width)
            out.truncate(name_width, pad=True)
        else:
            out = name.copy()
            out.truncate(name_width, overflow="ellipsis", pad=True)
        for index, width_ in enumerate(widths, start=1):
            cell = row[index].copy() if isinstance(row[index], Text) else Text(row[index])
            cell.align("left" if index in self.left else "right", width_)
            out.append(" ")
            out.append_text(cell)
        out.no_wrap = True
        return out

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        # Called, not yielded: Rich renders what a renderable yields without the height.
        yield from Fitted((self,)).__rich_console__(console, options)


@dataclass(frozen=True)
class Fitted:
    """Tables (and fixed lines) one under the other, cut to the height Rich is given.

    Textual renders a panel with its height; where the rows do not fit, `fit_rows` says how
    many of each section to show, and one line stands for the rest of each section cut
    short: every table keeps its header. A plain console print gives no height: every row
    is shown.
    """

    parts: tuple[NameTable | Text, ...]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        tables = [part for part in self.parts if isinstance(part, NameTable)]
        sizes = [run.count for table in tables for run in table.runs()]
        fixed = sum(1 if isinstance(part, Text) else part.header_lines() for part in self.parts)
        room = None if options.height is None else max(0, options.height - fixed)
        shown = iter(sizes if room is None else fit_rows(sizes, room))
        for part in self.parts:
            if isinstance(part, Text):
                yield part
            else:
                yield from part.lines(width, [next(shown) for _ in part.runs()])


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
