"""`kvbudget demo` without a terminal: embedded daemon, short live replay, summary, cleanup."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kvbudget.cli.main import main

pytestmark = pytest.mark.slow


def _demo_dirs() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("kvbudget-demo-*"))


def test_headless_demo_prints_a_summary_and_cleans_up(capsys):
    before = _demo_dirs()
    # stdout is captured (not a TTY), so the demo runs headless.
    code = main(["demo", "--limit", "30", "--num-gpu-blocks", "600", "--memory-mode", "accounting"])
    out, err = capsys.readouterr()
    assert code == 0
    assert "kvbudget demo: daemon (gpt-oss-120b, 600 blocks, optimistic)" in err
    # the summary table: 30 requests, every one finished or rejected
    assert re.search(r"requests\s+│\s+30\b", out)
    finished = int(re.search(r"finished\s+│\s+(\d+)", out).group(1))
    rejected = int(re.search(r"rejected\s+│\s+(\d+)", out).group(1))
    assert finished + rejected == 30 and finished > 0
    assert re.search(r"decisions\s+│\s+[\d,]+", out)  # a live run counts decisions
    # the temporary folder (socket, log) is gone, and with it the daemon
    assert _demo_dirs() == before


def test_headless_demo_as_a_process_exits_zero():
    # CI=true forces headless even where the test runner has a terminal.
    out = subprocess.run(
        [sys.executable, "-m", "kvbudget", "demo", "--limit", "10", "--num-gpu-blocks", "400",
         "--memory-mode", "accounting"],
        capture_output=True, text=True, timeout=300, env={**__import__("os").environ, "CI": "true"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert re.search(r"finished\s+│\s+\d+", out.stdout)


def test_demo_bad_input_is_one_line(capsys):
    assert main(["demo", "--trace", "nope"]) == 2
    err = capsys.readouterr().err
    assert "--trace 'nope'" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # Both passed the checks, started the daemon (seconds), then failed in the replay.
        (["--speed", "inf"], "--speed must be > 0 and finite, got inf"),
        (["--trace", "/"], "--trace '/': not a file and not one of mooncake, azure"),
    ],
)
def test_demo_refuses_before_it_starts_anything(capsys, argv: list[str], message: str) -> None:
    before = _demo_dirs()
    assert main(["demo", *argv]) == 2
    assert capsys.readouterr().err == f"kvbudget demo: error: {message}\n"
    assert _demo_dirs() == before


def test_a_demo_whose_terminal_goes_away_stops_its_daemon_and_cleans_up():
    # `kvbudget demo` on a pseudo-terminal whose other end is closed (a tmux pane killed, an
    # ssh session dropped). The dashboard leaves at once there (no `finally` runs), and the
    # daemon, which takes SIGHUP for a reload, kept running orphaned with its folder.
    import fcntl
    import os
    import pty
    import select
    import struct
    import termios
    import time

    from tui_helpers import hang_up

    pid, fd = pty.fork()
    if pid == 0:
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        env = {k: v for k, v in os.environ.items() if k != "CI"}  # (CI=true means headless)
        env["TERM"] = "xterm-256color"
        os.execve(sys.executable, [sys.executable, "-m", "kvbudget", "demo", "--num-gpu-blocks", "600",
                                   "--memory-mode", "accounting", "--limit", "2000"], env)
    output = bytearray()
    try:
        end = time.monotonic() + 120
        while not re.search(rb"at unix://(\S+)/kvbudget\.sock", output) or b"Decisions" not in output:
            assert time.monotonic() < end, output[-2000:]
            if select.select([fd], [], [], 0.1)[0]:
                output.extend(os.read(fd, 65536))
        workdir = Path(re.search(rb"at unix://(\S+)/kvbudget\.sock", output).group(1).decode())
        daemons = subprocess.run(["pgrep", "-f", "--", f"--db-path {workdir}/decisions.db"],
                                 capture_output=True, text=True).stdout.split()
        assert len(daemons) == 1, daemons
    finally:
        status = hang_up(pid, fd)  # the terminal goes away
    assert status is not None, "the demo outlived its terminal"
    assert not workdir.exists()
    assert subprocess.run(["pgrep", "-f", "--", f"--db-path {workdir}/decisions.db"],
                          capture_output=True, text=True).stdout.split() == []
