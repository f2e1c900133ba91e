"""`kvbudget demo`: a daemon, a real trace replayed against it, and the dashboard.

Everything lives in a temporary folder (socket, decision log, logs) that is removed on
exit. The daemon serves a preset model on a CPU pool small enough that the trace makes
it queue and preempt; the replay runs as a child process reporting its progress to the
daemon; the dashboard runs in this terminal. Quitting the dashboard stops the replay and
the daemon. With no terminal (stdout not a TTY, or CI=true) the demo runs headless: a
short replay as fast as possible, then the summary.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from kvbudget.client.errors import CLIError

DEFAULT_MODEL = "gpt-oss-120b"  # sliding window (W=128) and full attention layers
DEFAULT_BLOCKS = 1000  # 1,000 x 576 KiB = 563 MiB of CPU memory; Azure at its rate needs more
DEFAULT_SPEED = 20.0
HEADLESS_LIMIT = 200
START_TIMEOUT_S = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = __doc__
    from kvbudget.daemon.config.hf_config import preset_names
    from kvbudget.daemon.core.admission_config import POLICIES

    parser.add_argument("--trace", default="azure", metavar="TRACE",
                        help="a shipped trace, mooncake or azure, or a trace file (azure)")
    parser.add_argument("--model", default=DEFAULT_MODEL, metavar="PRESET",
                        help=f"model preset ({DEFAULT_MODEL}); presets: {', '.join(preset_names())}")
    parser.add_argument("--num-gpu-blocks", type=int, default=DEFAULT_BLOCKS, metavar="N",
                        help=f"pool size in blocks ({DEFAULT_BLOCKS})")  # fmt: skip
    parser.add_argument("--policy", default="optimistic", choices=POLICIES, help="admission policy (optimistic)")
    parser.add_argument("--memory-mode", default="owned", choices=("owned", "accounting"),
                        help="owned: the daemon allocates the CPU pool; accounting: counts only")  # fmt: skip
    parser.add_argument("--speed", type=float, help=f"trace seconds per second ({DEFAULT_SPEED:g}; "
                        "headless: as fast as possible)")  # fmt: skip
    parser.add_argument("--limit", type=int, help=f"requests to replay (all; headless {HEADLESS_LIMIT})")
    parser.add_argument("--headless", action="store_true", help="no dashboard: replay, print the summary")


def _headless(args: argparse.Namespace) -> bool:
    ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    return args.headless or ci or not sys.stdout.isatty()


def run(args: argparse.Namespace) -> int:
    if args.num_gpu_blocks < 2:
        raise CLIError(f"--num-gpu-blocks must be at least 2, got {args.num_gpu_blocks}")
    if args.speed is not None and not 0 < args.speed < float("inf"):  # (as replay's --speed)
        raise CLIError(f"--speed must be > 0 and finite, got {args.speed}")
    if args.limit is not None and args.limit < 1:
        raise CLIError(f"--limit must be >= 1, got {args.limit}")
    from kvbudget.traces.loaders import resolve_trace_path

    if not resolve_trace_path(args.trace).is_file():
        raise CLIError(f"--trace {args.trace!r}: not a file and not one of mooncake, azure")
    workdir = Path(tempfile.mkdtemp(prefix="kvbudget-demo-"))
    started: list[subprocess.Popen] = []

    def clean_up() -> None:
        """Stop the daemon, remove the demo's folder (also called when the terminal is gone)."""
        while started:
            _stop(started.pop())
        shutil.rmtree(workdir, ignore_errors=True)

    try:
        started.append(_start_daemon(args, workdir))
        target = f"unix://{workdir / 'kvbudget.sock'}"
        print(f"kvbudget demo: daemon ({args.model}, {args.num_gpu_blocks} blocks, {args.policy}) "
              f"at {target}", file=sys.stderr)  # fmt: skip
        if _headless(args):
            return _replay_here(args, target)
        return _dashboard(args, target, workdir, clean_up)
    finally:
        clean_up()


def _start_daemon(args: argparse.Namespace, workdir: Path) -> subprocess.Popen:
    argv = [
        sys.executable, "-m", "kvbudget", "daemon",
        "--model", args.model,
        "--num-gpu-blocks", str(args.num_gpu_blocks),
        "--device", "cpu",
        "--memory-mode", args.memory_mode,
        "--policy", args.policy,
        "--listen", f"unix://{workdir / 'kvbudget.sock'}",
        "--db-path", str(workdir / "decisions.db"),
    ]  # fmt: skip
    log = open(workdir / "daemon.log", "w")
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=workdir)
    log.close()
    try:
        _wait_serving(process, f"unix://{workdir / 'kvbudget.sock'}", workdir / "daemon.log")
    except BaseException:
        _stop(process)
        raise
    return process


def _wait_serving(process: subprocess.Popen, target: str, log: Path) -> None:
    from kvbudget.client.target import wait_until_serving

    if wait_until_serving(target, process, timeout_s=START_TIMEOUT_S) is None:
        return
    if process.poll() is not None:
        last = (log.read_text(errors="replace").strip().splitlines() or ["(no output)"])[-1]
        raise CLIError(f"the demo daemon exited ({process.returncode}): {last}")
    raise CLIError(f"the demo daemon did not come up within {START_TIMEOUT_S:g} s")


def _stop(process: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM (the daemon flushes its log and exits), then SIGKILL if it lingers."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _replay_argv(args: argparse.Namespace, target: str, *, headless: bool) -> list[str]:
    argv = [args.trace, "--target", target]
    speed = args.speed if args.speed is not None else (None if headless else DEFAULT_SPEED)
    argv += ["--speed", f"{speed:g}"] if speed else ["--as-fast-as-possible"]
    limit = args.limit if args.limit is not None else (HEADLESS_LIMIT if headless else None)
    if limit:
        argv += ["--limit", str(limit)]
    return argv


def _replay_here(args: argparse.Namespace, target: str) -> int:
    """Headless: the replay in this process; its summary table goes to stdout."""
    from kvbudget.cli import cmd_replay

    parser = argparse.ArgumentParser(prog="kvbudget replay")
    cmd_replay.add_arguments(parser)
    return cmd_replay.run(parser.parse_args(_replay_argv(args, target, headless=True)))


def _dashboard(args: argparse.Namespace, target: str, workdir: Path, clean_up: Callable[[], None]) -> int:
    """The replay as a child process (its output in a file), the dashboard in the foreground.
    If the terminal goes away, the dashboard leaves at once (no `finally` runs): the replay
    and `clean_up` (the daemon, the folder) are stopped first, not left running orphaned."""
    argv = [sys.executable, "-m", "kvbudget", "replay", *_replay_argv(args, target, headless=False)]
    log = open(workdir / "replay.log", "w")
    replay = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=workdir)
    log.close()
    try:
        from kvbudget.tui.app import KVBudgetApp, exit_status

        def on_terminal_lost() -> None:
            _stop(replay, timeout=5.0)
            clean_up()

        app = KVBudgetApp(target, on_terminal_lost=on_terminal_lost)
        return exit_status(app, app.run())  # (non-zero after a crash)
    finally:
        _stop(replay, timeout=5.0)
