"""`kvbudget tui`: the live dashboard of a running daemon (a pure gRPC client of it).

The target is checked here, before the screen is taken over, so a typo is one line on
stderr; a well-formed target whose daemon is down is not an error: the dashboard shows
"disconnected, retrying" until it comes up (it may be starting, or restarting).
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from kvbudget.errors import CLIError

from kvbudget.tui import DEFAULT_TARGET
_HOST_PORT = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


def check_target(target: str) -> str:
    """The target as given, if grpc can make sense of it; CLIError naming the flag if not."""
    target = target.strip()
    if not target:
        raise CLIError("--target is empty (expected unix:///path/to.sock or host:port)")
    if target.startswith("unix:"):
        path = target.removeprefix("unix:")
        if path.startswith("//"):
            path = path[2:]
            if not path.startswith("/"):
                raise CLIError(f"--target {target!r}: unix:// needs an absolute path (unix:///...)")
        if not path:
            raise CLIError(f"--target {target!r}: no socket path after unix:")
        if Path(path).is_dir():
            raise CLIError(f"--target {target!r}: {path} is a directory, not a socket")
        return target
    if target.startswith("unix-abstract:"):
        if not target.removeprefix("unix-abstract:"):
            raise CLIError(f"--target {target!r}: no name after unix-abstract:")
        return target
    address = target
    for scheme in ("dns:///", "ipv4:", "ipv6:"):
        address = address.removeprefix(scheme)
    match = _HOST_PORT.match(address)
    if not match or not 0 < int(match.group(1)) < 65536:
        raise CLIError(
            f"--target {target!r}: expected unix:///path/to.sock or host:port (port 1-65535)"
        )
    return target


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        default=None,
        help=f"daemon address (default: $KVBUDGET_TARGET or {DEFAULT_TARGET})",
    )
    parser.add_argument(
        "--token",
        default=None,
        help="bearer token, needed over TCP (default: $KVBUDGET_TOKEN)",
    )
    parser.add_argument(
        "--render-hz",
        type=float,
        default=12.0,
        help="screen refreshes per second at most (default: 12)",
    )
    parser.add_argument(
        "--record",
        type=Path,
        default=None,
        metavar="FILE",
        help="also append every Watch update to FILE (JSON lines), to play back later",
    )
    parser.add_argument(
        "--recording",
        type=Path,
        default=None,
        metavar="FILE",
        help="play a recorded Watch stream (JSON lines) instead of connecting",
    )


def run(args: argparse.Namespace) -> int:
    target = check_target(args.target or os.environ.get("KVBUDGET_TARGET") or DEFAULT_TARGET)
    token = args.token or os.environ.get("KVBUDGET_TOKEN") or None
    if not 0 < args.render_hz <= 60:
        raise CLIError(f"--render-hz must be in (0, 60], got {args.render_hz}")
    source = None
    if args.recording is not None:
        if not args.recording.is_file():
            raise CLIError(f"--recording {args.recording}: no such file")
        from kvbudget.tui.source import RecordedSource

        try:
            source = RecordedSource.from_jsonl(args.recording, interval_s=0.1)
        except Exception as exc:  # a file that is not a recording: one line, not a trace
            raise CLIError(f"--recording {args.recording}: not a Watch recording ({exc})")
        target = f"recording {args.recording.name}"  # what the status line shows

    if args.record is not None:
        if args.recording is not None:
            raise CLIError("--record and --recording: record a daemon or play a file, not both")
        if not args.record.parent.is_dir():
            raise CLIError(f"--record {args.record}: no such directory {args.record.parent}")
        from kvbudget.tui.source import RecordingSource, WatchSource

        source = RecordingSource(WatchSource(target, token), args.record)

    from kvbudget.tui.app import KVBudgetApp

    app = KVBudgetApp(target, token, source=source, render_hz=args.render_hz)
    return int(app.run() or 0)
