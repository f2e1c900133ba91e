"""systemd's sd_notify protocol in a few lines of socket code (no libsystemd dependency).
Without NOTIFY_SOCKET every call is a no-op returning False; a send never blocks the event
loop for long (a full queue: WATCHDOG=1 and STATUS= are dropped, state changes wait briefly)."""

from __future__ import annotations

import os
import socket
import time

# How long a state change (READY=1, ...) may wait for room in the notify socket's queue.
STATE_SEND_TIMEOUT_S = 5.0


def notify(message: str, timeout_s: float = STATE_SEND_TIMEOUT_S) -> bool:
    """Send `message` to NOTIFY_SOCKET, waiting at most `timeout_s` (0: only if it can go
    at once) for room in its queue. True if sent; False without a socket, on error, or when
    the queue stayed full."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address or not (address.startswith("/") or address.startswith("@")):
        return False  # unset, or a transport we don't speak (vsock:)
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(timeout_s)  # (0: non-blocking)
            sock.connect(address)
            sock.sendall(message.encode("utf-8"))
    except OSError:  # (a full queue: BlockingIOError, or TimeoutError once timeout_s passed)
        return False  # systemd gone or socket not writable: nothing a daemon can do about it
    return True


def ready(status_text: str | None = None) -> bool:
    return notify("READY=1" + (f"\nSTATUS={_one_line(status_text)}" if status_text else ""))


def stopping(status_text: str | None = None) -> bool:
    return notify("STOPPING=1" + (f"\nSTATUS={_one_line(status_text)}" if status_text else ""))


def reloading() -> bool:
    """A reload begins (READY=1 says it ended); MONOTONIC_USEC as Type=notify-reload wants."""
    return notify(f"RELOADING=1\nMONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")


def status(text: str) -> bool:
    return notify(f"STATUS={_one_line(text)}", timeout_s=0)  # (the next one comes soon)


def watchdog() -> bool:
    return notify("WATCHDOG=1", timeout_s=0)  # (sent at half the interval: one may be missed)


def extend_timeout(seconds: float) -> bool:
    """Ask systemd for more start/stop time (e.g. while a large pool is allocated)."""
    return notify(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}")


def watchdog_interval_s() -> float | None:
    """WATCHDOG_USEC in seconds when the watchdog is on for this process, else None.

    Ping at half this interval, as sd_watchdog_enabled(3) advises.
    """
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if pid and pid != str(os.getpid()):
        return None  # meant for another process (e.g. our parent)
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 1_000_000 if value > 0 else None


def _one_line(text: str) -> str:
    # A newline would start a new assignment; keep STATUS one line.
    return " ".join(text.splitlines())
