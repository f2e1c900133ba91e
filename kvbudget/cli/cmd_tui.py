"""`kvbudget tui`: the live dashboard of a running daemon (a pure gRPC client of it).

The target and the TLS files are checked here, before the screen is taken over, so a typo
is one line on stderr; a well-formed target whose daemon is down is not an error: the
dashboard shows "disconnected, retrying" until it comes up (it may be starting, or
restarting). A replay started from the dashboard gets the same target and TLS files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvbudget.client.tls import channel_credentials, resolve_tls
from kvbudget.client.errors import CLIError
from kvbudget.client.target import add_target_arguments, check_target, resolve_target, resolve_token


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser, token_help="bearer token, needed over TCP")
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
    # A daemon that is not up yet is no error: the dashboard waits for it, "disconnected".
    target = check_target(resolve_target(args.target), require_socket=False)
    token = resolve_token(args.token)
    if not 0 < args.render_hz <= 60:
        raise CLIError(f"--render-hz must be in (0, 60], got {args.render_hz}")
    tls = resolve_tls(target, args.tls_ca, args.tls_cert, args.tls_key)
    credentials = channel_credentials(tls)  # the files are read now: a bad one is one line here
    from kvbudget.tui.source import Source, WatchSource

    live = WatchSource(target, token, credentials=credentials)
    source: Source = live
    if args.recording is not None:
        if not args.recording.is_file():
            what = "not a regular file" if args.recording.exists() else "no such file"
            raise CLIError(f"--recording {args.recording}: {what}")
        from kvbudget.tui.source import RecordedSource

        try:
            source = RecordedSource.from_jsonl(args.recording, interval_s=0.1)
        except Exception as exc:  # a file that is not a recording: one line, not a trace
            why = " ".join(str(exc).split())  # (a protobuf parse error spans lines)
            raise CLIError(f"--recording {args.recording}: not a Watch recording ({why})") from None
        target = f"recording {args.recording.name}"  # what the status line shows

    if args.record is not None:
        if args.recording is not None:
            raise CLIError("--record and --recording: record a daemon or play a file, not both")
        if not args.record.parent.is_dir():
            raise CLIError(f"--record {args.record}: no such directory {args.record.parent}")
        _check_appendable(args.record)
        from kvbudget.tui.source import RecordingSource

        source = RecordingSource(live, args.record)

    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        # Textual would draw escape codes into a pipe or file and never end; the headless
        # dashboard for tests is `KVBudgetApp.run_test`, not this command.
        raise CLIError(
            "kvbudget tui needs a terminal; stdin and stdout must be a TTY "
            "(for a one-shot view use `kvbudget admin status`)"
        )

    from kvbudget.tui.app import KVBudgetApp, exit_status

    app = KVBudgetApp(
        target, token, tls=tls, source=source, render_hz=args.render_hz,
        playback=args.recording is not None,
    )
    # Non-zero after a crash or a signal: Textual's run() alone returns None then.
    return exit_status(app, app.run())


def _check_appendable(path: Path) -> None:
    """--record appends JSON lines to a regular file (made if missing): a folder, a device or
    /proc's files failed at the first write, as a traceback out of the running dashboard."""
    if path.exists() and not path.is_file():
        raise CLIError(f"--record {path}: not a regular file")
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise CLIError(f"--record {path}: cannot write: {exc.strerror or exc}") from None

