"""Signals while the daemon starts: `systemctl reload` or `systemctl stop` may come before
READY=1, and start-up can take minutes on a GPU host (CUDA, a large pool, a log to upgrade).

The daemon is held inside start-up deterministically: a stand-in for its GPU probe (the
first step of start-up that runs after the process has set everything else up) writes a
marker file, then waits for a release file; the test signals it in between.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from daemon_harness import DEFAULT_ARGS, wait_until

pytestmark = pytest.mark.slow

# `kvbudget daemon` with its start-up held at the GPU probe until `release` exists.
HELD_DAEMON = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from kvbudget.daemon.server.lifecycle import Daemon

    held, release = Path(sys.argv[1]), Path(sys.argv[2])

    def held_probe(self):
        held.touch()
        while not release.exists():
            time.sleep(0.02)
        return None

    Daemon.probe_gpu = held_probe
    from kvbudget.cli.main import main
    sys.exit(main(sys.argv[3:]))
    """
)


class HeldDaemon:
    def __init__(self, workdir: Path, *extra_args: str) -> None:
        self.workdir = workdir
        self.held = workdir / "held"
        self.release = workdir / "release"
        self.socket_path = workdir / "kvbudget.sock"
        self.notify_path = workdir / "notify.sock"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.notify_path))
        self.notify.settimeout(0)
        self.stderr_path = workdir / "daemon.log"
        args = [sys.executable, "-c", HELD_DAEMON, str(self.held), str(self.release),
                "daemon", *DEFAULT_ARGS, "--db-path", str(workdir / "decisions.db"),
                "--listen", f"unix://{self.socket_path}", *extra_args]
        with open(self.stderr_path, "w") as stderr:
            self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=stderr, cwd=workdir,
                                            env=dict(os.environ, NOTIFY_SOCKET=str(self.notify_path)))

    def wait_held(self) -> None:
        wait_until(lambda: self.held.exists() or self.process.poll() is not None, timeout=60)
        assert self.process.poll() is None, self.stderr()

    def let_go(self) -> None:
        self.release.touch()

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def notifications(self) -> list[str]:
        received = []
        while True:
            try:
                received.append(self.notify.recv(4096).decode())
            except BlockingIOError:
                return received

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)
        self.notify.close()


@pytest.fixture
def held_daemon(tmp_path: Path):
    daemon = HeldDaemon(tmp_path)
    try:
        yield daemon
    finally:
        daemon.close()


def test_sighup_during_start_up_is_ignored_not_fatal(held_daemon: HeldDaemon) -> None:
    """A SIGHUP's default action ends the process: before the handler was installed at the
    start of start-up, a `systemctl reload` (or a logrotate `kill -HUP`) during it killed
    the daemon."""
    held_daemon.wait_held()
    held_daemon.process.send_signal(signal.SIGHUP)
    wait_until(lambda: "SIGHUP ignored" in held_daemon.stderr() or held_daemon.process.poll() is not None,
               timeout=30)
    held_daemon.let_go()
    wait_until(lambda: any(m.startswith("READY=1") for m in held_daemon.notifications())
               or held_daemon.process.poll() is not None, timeout=60)
    assert held_daemon.process.poll() is None, held_daemon.stderr()
    assert "reload: not serving yet (or stopping); SIGHUP ignored" in held_daemon.stderr()
    held_daemon.process.send_signal(signal.SIGTERM)
    assert held_daemon.process.wait(60) == 0


def test_sigterm_during_start_up_stops_cleanly_without_ready(held_daemon: HeldDaemon) -> None:
    """`systemctl stop` on a daemon still starting: exit 0 (a stop, not a crash), nothing
    left behind, and never READY=1 (units ordered after it must not start)."""
    held_daemon.wait_held()
    held_daemon.process.send_signal(signal.SIGTERM)
    held_daemon.let_go()
    assert held_daemon.process.wait(60) == 0, held_daemon.stderr()
    notifications = held_daemon.notifications()
    assert not any("READY=1" in m.splitlines() for m in notifications), notifications
    assert "stopped before serving" in held_daemon.stderr()
    assert "Traceback" not in held_daemon.stderr()
    assert not held_daemon.socket_path.exists()


def test_sigint_during_start_up_stops_cleanly(held_daemon: HeldDaemon) -> None:
    held_daemon.wait_held()
    held_daemon.process.send_signal(signal.SIGINT)
    held_daemon.let_go()
    assert held_daemon.process.wait(60) == 0, held_daemon.stderr()
    assert "Traceback" not in held_daemon.stderr()
