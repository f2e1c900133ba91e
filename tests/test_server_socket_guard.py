"""QA: the unix socket as an attacker (or a clumsy operator) would try it.

A stale socket file is removed, but a path that is not a socket (a regular file, a
folder, a symlink to anything) is never deleted; a socket a running daemon serves is
never taken over, also by a daemon that was already starting when the other one bound;
and a socket without a file mode (Linux's abstract namespace) is not trusted as if it
had one.
"""

from __future__ import annotations

import socket
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from kvbudget.v1 import admin_pb2, admin_pb2_grpc, common_pb2

from daemon_harness import DEFAULT_ARGS, DaemonProcess, wait_until

pytestmark = pytest.mark.slow


def _start(workdir: Path, *listen: str, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """A daemon that is expected to refuse to start: its exit status and stderr."""
    args = [sys.executable, "-m", "kvbudget", "daemon", *DEFAULT_ARGS, "--db-path", str(workdir / "d.db"),
            *[item for address in listen for item in ("--listen", address)], *extra]
    return subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=workdir)


def _server_pid(path: Path) -> int:
    """The pid of the process listening on the unix socket at `path` (SO_PEERCRED)."""
    with socket.socket(socket.AF_UNIX) as probe:
        probe.connect(str(path))
        pid, _, _ = struct.unpack("3i", probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid


def test_a_path_that_is_not_a_socket_is_never_deleted(tmp_path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    precious = elsewhere / "precious.txt"
    precious.write_text("keep me")
    stale = elsewhere / "stale.sock"
    with socket.socket(socket.AF_UNIX) as s:  # a socket nobody serves on any more
        s.bind(str(stale))
    cases = {
        "regular file": lambda p: p.write_text("not a socket"),
        "folder": lambda p: p.mkdir(),
        "symlink to a file": lambda p: p.symlink_to(precious),
        "symlink to a stale socket": lambda p: p.symlink_to(stale),
        "dangling symlink": lambda p: p.symlink_to(elsewhere / "nothing-here"),
    }
    for name, make in cases.items():
        workdir = tmp_path / name.replace(" ", "-")
        workdir.mkdir()
        path = workdir / "kvbudget.sock"
        make(path)
        before = path.lstat()
        result = _start(workdir, f"unix://{path}")
        assert result.returncode != 0, name
        lines = result.stderr.strip().splitlines()
        assert len(lines) >= 1 and f"listen: {path} exists and is not a socket" in lines[-1], (name, result.stderr)
        after = path.lstat()  # (raises if it was deleted)
        assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino), name
    assert precious.read_text() == "keep me"
    assert stale.exists()


def test_a_running_daemons_socket_is_kept_and_it_is_not_started_twice(tmp_path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    path = tmp_path / "kvbudget.sock"
    first = DaemonProcess(tmp_path / "a", listen=(f"unix://{path}",))
    first.target = f"unix://{path}"
    with first:
        assert oct(path.stat().st_mode & 0o777) == oct(0o660)
        result = _start(tmp_path / "b", f"unix://{path}")
        assert result.returncode != 0
        assert f"listen: another process is serving on {path}" in result.stderr
        assert _server_pid(path) == first.process.pid


def test_a_daemon_that_was_already_starting_does_not_take_the_socket_of_one_that_bound_meanwhile(tmp_path) -> None:
    """Two daemons (two units, or a restart racing a manual start) on one socket, with a
    db_path each. The one that starts first spends its start-up (the pool, CUDA, the log:
    minutes on a GPU host) between its socket check and its bind; here its decision log is
    held locked for a moment to stand for that. The second binds meanwhile and serves. When
    the first one gets to bind, it must not take the socket over (gRPC unlinks any socket
    at the path it binds), and must not run unreachable."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    path = tmp_path / "kvbudget.sock"
    first = DaemonProcess(tmp_path / "a", listen=(f"unix://{path}",))
    first.target = f"unix://{path}"
    with first:  # once, so that its log exists to be held
        pass
    holder = sqlite3.connect(first.db_path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # the first daemon's start-up waits on it (busy_timeout 5 s)
    with open(tmp_path / "a.log", "w") as journal:
        slow = subprocess.Popen(first.args, stdout=subprocess.DEVNULL, stderr=journal, cwd=tmp_path / "a")
    try:
        wait_until(lambda: "no GPU" in (tmp_path / "a.log").read_text())  # past its socket check
        second = DaemonProcess(tmp_path / "b", listen=(f"unix://{path}",))
        second.target = f"unix://{path}"
        with second:
            assert _server_pid(path) == second.process.pid
            holder.execute("ROLLBACK")
            holder.close()
            wait_until(lambda: slow.poll() is not None or "serving" in (tmp_path / "a.log").read_text())
            assert _server_pid(path) == second.process.pid, "the socket was taken from the daemon serving on it"
            assert slow.wait(30) != 0
            assert "another process is serving" in (tmp_path / "a.log").read_text()
    finally:
        if slow.poll() is None:
            slow.terminate()
            slow.wait(30)


def test_an_abstract_socket_has_no_file_mode_so_its_callers_are_not_trusted(tmp_path) -> None:
    """`unix-abstract:NAME` (deploy/kvbudget.toml lists it) has no file and no mode: any
    process on the host (any user, any container in the network namespace) can connect.
    The unix socket is trusted because its mode is the guard; an abstract one has none, so
    either the daemon refuses to listen there, or its callers need a token like TCP's."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('admin = ["kvbt-admin-token-1"]\n')
    tokens.chmod(0o640)
    name = f"kvbudget-kvbt-{tmp_path.name}"
    result = None
    daemon = DaemonProcess(tmp_path, "--tokens-file", str(tokens), listen=(f"unix://{tmp_path}/kvbudget.sock",
                                                                            f"unix-abstract:{name}"))
    try:
        try:
            daemon.start()
        except RuntimeError as exc:  # refused to start: say so, naming the listen key
            assert "listen" in str(exc) and "abstract" in str(exc)
            return
        with grpc.insecure_channel(f"unix-abstract:{name}") as channel:
            try:
                admin_pb2_grpc.AdminServiceStub(channel).SetPolicy(
                    admin_pb2.SetPolicyRequest(policy=common_pb2.POLICY_NAIVE), timeout=10)
            except grpc.RpcError as error:
                result = error.code()
        assert result == grpc.StatusCode.UNAUTHENTICATED
    finally:
        daemon.stop()
