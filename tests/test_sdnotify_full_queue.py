"""sd_notify never wedges the daemon on a notify socket whose queue is full.

A unix datagram send blocks while the receiver's queue is full (net.unix.max_dgram_qlen
datagrams; on a systemd host that queue is shared by every service and fills while PID 1
is busy, and a reader that never reads fills it for good). The daemon sends WATCHDOG=1 and
STATUS= from its event loop, so a blocking send there froze every engine's Step.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvbudget.daemon.server import sdnotify
from kvbudget.client.target import wait_until_serving
from tests.daemon_harness import DaemonProcess, wait_until

HANG_BOUND_S = 30.0  # only bounds a hang (the old code never returned); not a timing assert


def fill(path: str) -> None:
    """Sends to `path` until its queue is full (our own probes fill it too)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe:
        probe.connect(path)
        probe.setblocking(False)
        while True:
            try:
                probe.send(b"PROBE=1")
            except BlockingIOError:
                return


def queue_is_full(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe:
        probe.connect(path)
        try:
            probe.send(b"PROBE=1", socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True
    return False


@pytest.fixture
def deaf_socket(tmp_path: Path) -> Iterator[str]:
    """A notify socket nobody reads."""
    path = str(tmp_path / "deaf-notify.sock")
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(path)
    yield path
    receiver.close()


def returns(call) -> tuple[bool, object]:
    """(whether `call` returned within the hang bound, what it returned)."""
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(HANG_BOUND_S)
    return (not thread.is_alive(), result[0] if result else None)


@pytest.mark.parametrize("call", [sdnotify.watchdog, lambda: sdnotify.status("3 running"), sdnotify.ready,
                                  sdnotify.reloading, sdnotify.stopping],
                         ids=["watchdog", "status", "ready", "reloading", "stopping"])
def test_a_full_notify_queue_is_a_false_not_a_hang(deaf_socket: str, monkeypatch: pytest.MonkeyPatch,
                                                   call) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", deaf_socket)
    monkeypatch.setattr(sdnotify, "STATE_SEND_TIMEOUT_S", 0.2, raising=False)
    fill(deaf_socket)
    assert returns(call) == (True, False)


def test_the_daemon_serves_on_while_nobody_reads_its_notify_socket(tmp_path: Path, deaf_socket: str) -> None:
    # A 20 ms watchdog: the loop pings every 10 ms, so the 10-datagram queue is full at once.
    env = {"NOTIFY_SOCKET": deaf_socket, "WATCHDOG_USEC": "20000"}
    daemon = DaemonProcess(tmp_path, env=env)
    try:
        daemon.start()
        wait_until(lambda: queue_is_full(deaf_socket), timeout=HANG_BOUND_S)
        # The pings go on (and are dropped) while the queue stays full; the daemon still answers.
        assert wait_until_serving(daemon.target, daemon.process, timeout_s=HANG_BOUND_S) is None
        daemon.signal(15)
        assert daemon.wait(HANG_BOUND_S) == 0
    finally:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.process.kill()
        daemon.stop()
