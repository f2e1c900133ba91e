"""The small self-sizing renderables the panels are drawn with, and their number formats.

`StackedBar`, `Sparkline` and `NameTable` take the width Rich gives them at render time, so
the panel functions that build them need not know it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text

USAGE_WARN = 0.70
USAGE_CRITICAL = 0.90
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
    """

    headers: tuple[str, ...] | None
    rows: tuple[tuple[Text | str, ...], ...]
    left: frozenset[int] = frozenset()

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = [tuple(Text(h, style="bold") for h in self.headers)] if self.headers else []
        lines += [tuple(c if isinstance(c, Text) else Text(c) for c in r) for r in self.rows]
        if not lines:
            return
        columns = len(lines[0])
        widths = [max(line[i].cell_len for line in lines) for i in range(1, columns)]
        name_width = max(1, options.max_width - sum(widths) - (columns - 1))
        for line in lines:
            out = line[0].copy()
            out.truncate(name_width, overflow="ellipsis", pad=True)
            for index, width in enumerate(widths, start=1):
                cell = line[index].copy()
                cell.align("left" if index in self.left else "right", width)
                out.append(" ")
                out.append_text(cell)
            out.no_wrap = True
            yield out


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
