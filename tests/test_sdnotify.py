"""sd_notify over a real unix datagram socket standing in for systemd."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvbudget.daemon.server import sdnotify


@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    path = tmp_path / "notify.sock"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(path))
    receiver.settimeout(5.0)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    yield receiver
    receiver.close()


def received(receiver: socket.socket) -> str:
    return receiver.recv(4096).decode()


def test_messages_reach_the_socket(notify_socket: socket.socket) -> None:
    assert sdnotify.ready() is True
    assert received(notify_socket) == "READY=1"
    assert sdnotify.ready("serving 20000 blocks") is True
    assert received(notify_socket) == "READY=1\nSTATUS=serving 20000 blocks"
    assert sdnotify.status("draining\n3 calls in flight") is True
    assert received(notify_socket) == "STATUS=draining 3 calls in flight"  # one line: no new assignment
    assert sdnotify.watchdog() is True
    assert received(notify_socket) == "WATCHDOG=1"
    assert sdnotify.stopping() is True
    assert received(notify_socket) == "STOPPING=1"
    assert sdnotify.extend_timeout(2.5) is True
    assert received(notify_socket) == "EXTEND_TIMEOUT_USEC=2500000"
    before_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert sdnotify.reloading() is True
    head, stamp = received(notify_socket).split("\n")
    assert head == "RELOADING=1" and stamp.startswith("MONOTONIC_USEC=")
    assert before_us <= int(stamp.removeprefix("MONOTONIC_USEC=")) <= time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def test_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"kvbudget-test-{os.getpid()}"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind("\0" + name)
    receiver.settimeout(5.0)
    monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    try:
        assert sdnotify.notify("READY=1") is True
        assert received(receiver) == "READY=1"
    finally:
        receiver.close()


def test_no_socket_is_a_no_op(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sdnotify.ready() is False
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens.sock"))
    assert sdnotify.ready() is False  # systemd gone: never an exception
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")
    assert sdnotify.ready() is False


def test_watchdog_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert sdnotify.watchdog_interval_s() is None
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    assert sdnotify.watchdog_interval_s() == 30.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert sdnotify.watchdog_interval_s() == 30.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert sdnotify.watchdog_interval_s() is None  # meant for another process
    monkeypatch.delenv("WATCHDOG_PID")
    monkeypatch.setenv("WATCHDOG_USEC", "soon")
    assert sdnotify.watchdog_interval_s() is None
    monkeypatch.setenv("WATCHDOG_USEC", "0")
    assert sdnotify.watchdog_interval_s() is None
