"""The Rich console the CLI's tables print on (`log`, `replay`, `estimate`).

Rich is imported here, so a command imports this module only when it prints a table.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console


class _CliConsole(Console):
    def on_broken_pipe(self) -> None:
        # As Rich's own: nothing more goes to the closed pipe, not even at exit's flush;
        # then BrokenPipeError, which `kvbudget.cli.main.main` turns into exit 0.
        self.quiet = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise BrokenPipeError


def cli_console(*, markup: bool = False, wide_when_piped: bool = True) -> Console:
    """Markup off unless the caller's own labels use it: what the tables show (request ids,
    trace and model names) is the user's text, and "[/]" in it is not a closing tag. Piped
    with no COLUMNS, 200 columns wide: 80 would fold or cut every cell. A reader that closes
    the pipe early (`kvbudget log | head`) ends the command quietly, exit 0, as the JSON and
    CSV outputs do, where Rich's own handling exits 1 (a failure to `set -o pipefail`)."""
    console = _CliConsole(markup=markup)
    if wide_when_piped and not console.is_terminal and "COLUMNS" not in os.environ:
        console = _CliConsole(markup=markup, width=200)
    return console
