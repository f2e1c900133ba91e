"""SIGTERM and SIGHUP end the dashboard as `q` does (replays started here stopped, the
terminal given back); without handlers Python's default kills it at once, leaving its
replays running and the terminal in raw mode."""

from __future__ import annotations

import asyncio
import select
import signal
import sys
from collections.abc import Callable

# SIGTERM from a supervisor or `kill`, SIGHUP when the terminal goes away.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class StopSignals:
    """The app's handlers of `STOP_SIGNALS` on the running loop, and the ones they replaced."""

    def __init__(self) -> None:
        self._previous: dict[int, object] = {}  # signal -> the handler it had before

    def install(self, stop: Callable[[int], None]) -> None:
        """`stop(signum)` runs on the loop when one of `STOP_SIGNALS` arrives."""
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            previous = signal.getsignal(signum)
            try:
                loop.add_signal_handler(signum, stop, signum)
            except (ValueError, RuntimeError, NotImplementedError):
                continue  # not the main thread (an embedder's), or no such signals here
            self._previous[signum] = previous

    def restore(self) -> None:
        loop = asyncio.get_running_loop()
        for signum, previous in self._previous.items():
            loop.remove_signal_handler(signum)
            if previous is not None:  # None: set outside Python, nothing to put back
                signal.signal(signum, previous)  # type: ignore[arg-type]
        self._previous.clear()


def terminal_alive() -> bool:
    """Whether this process's terminal is still there: a hung-up one polls as HUP / ERR (and
    is no longer a tty to isatty, whose tcgetattr fails). Output that is not a terminal
    (a headless test's file) polls writable: alive, nothing to leave in a hurry."""
    try:
        fd = sys.__stdout__.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        events = poller.poll(0)
    except (OSError, ValueError, AttributeError):
        return False
    return not any(event & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, event in events)
