"""Errors the CLI turns into one line on stderr and a non-zero exit."""


class CLIError(Exception):
    """A user mistake or an unmet precondition; the message is shown as is."""
