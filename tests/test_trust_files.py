"""Files the daemon creates or takes (issue 30, point 2), tried as an attacker or a careless
operator would: a symbolic link at the writer lock's name had the linked file overwritten
with a pid; under umask 022 the log was made 0644; an empty file at db_path silently became
a log; a mistyped socket folder was created; another user's dead socket was removed as
stale; a TLS key every user may read was served without a word. Each is now refused (or
said) in one line, and what was there is left as it was."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_harness import DEFAULT_ARGS, DaemonProcess


def _daemon(db_path: Path, listen: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvbudget", "daemon", *DEFAULT_ARGS, "--db-path", str(db_path), "--listen", listen,
         *extra], capture_output=True, text=True, timeout=60,
    )


def _refused_in_one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def no_umask() -> Iterator[None]:
    """umask 0 for the daemons this test starts (they inherit it): the modes must not come from it."""
    before = os.umask(0)
    try:
        yield
    finally:
        os.umask(before)


# ------------------------------------------------------------------ the writer lock
def test_a_symbolic_link_at_the_locks_name_is_refused_and_its_target_left_alone(tmp_path: Path) -> None:
    victim = tmp_path / "precious.conf"
    victim.write_text("do not overwrite me\n")
    db = tmp_path / "d.db"
    Path(f"{db}.daemon.lock").symlink_to(victim)

    line = _refused_in_one_line(_daemon(db, f"unix://{tmp_path}/k.sock"))

    assert f"{db}.daemon.lock is a symbolic link" in line and "db_path" in line
    assert victim.read_text() == "do not overwrite me\n"
    assert not db.exists()


@pytest.mark.parametrize("name, why", [(".daemon.lock", "the writer lock is never one"),
                                       ("-wal", "SQLite would write through it"),
                                       ("-shm", "SQLite would write through it")])
def test_a_symbolic_link_beside_the_log_is_refused_by_the_check_and_the_start(tmp_path: Path, name: str,
                                                                              why: str) -> None:
    victim = tmp_path / "precious.conf"
    victim.write_text("do not overwrite me\n")
    db = tmp_path / "d.db"
    link = Path(f"{db}{name}")
    link.symlink_to(victim)
    problem = f"db_path: cannot use {db}: {link} is a symbolic link; {why} (remove it)"
    for extra in (("--check-config",), ()):
        line = _refused_in_one_line(_daemon(db, f"unix://{tmp_path}/k.sock", *extra))
        assert line == f"kvbudget daemon: error: {problem}", line
    assert victim.read_text() == "do not overwrite me\n"


def test_a_file_of_someone_elses_at_the_locks_name_is_refused_and_left_alone(tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    lock = Path(f"{db}.daemon.lock")
    lock.write_text("notes, not a pid\n")

    line = _refused_in_one_line(_daemon(db, f"unix://{tmp_path}/k.sock"))

    assert f"{lock} exists and is not a kvbudget writer lock" in line
    assert lock.read_text() == "notes, not a pid\n"


# ------------------------------------------------------------------ modes
def test_the_log_is_0640_and_the_lock_0600_whatever_the_umask(tmp_path: Path, no_umask: None) -> None:
    with DaemonProcess(tmp_path) as daemon:
        assert _mode(daemon.db_path) == 0o640
        assert _mode(Path(f"{daemon.db_path}-wal")) == 0o640  # (SQLite gives them the file's mode)
        assert _mode(Path(f"{daemon.db_path}-shm")) == 0o640
        assert _mode(Path(f"{daemon.db_path}.daemon.lock")) == 0o600
    assert daemon.process is not None and daemon.process.returncode == 0


# ------------------------------------------------------------------ db_path
@pytest.mark.parametrize("kind", ["empty file", "symbolic link"])
def test_a_db_path_that_cannot_be_a_log_is_refused_by_the_check_and_the_start(tmp_path: Path, kind: str) -> None:
    db = tmp_path / "d.db"
    if kind == "empty file":
        db.write_bytes(b"")
        problem = f"db_path: cannot use {db}: {db} exists and is empty, not a KVBudget decision log"
    else:
        real = tmp_path / "elsewhere.db"
        real.write_bytes(b"")
        db.symlink_to(real)
        problem = f"db_path: cannot use {db}: {db} is a symbolic link: give db_path the file itself"
    listen = f"unix://{tmp_path}/k.sock"

    for extra in (("--check-config",), ()):
        line = _refused_in_one_line(_daemon(db, listen, *extra))
        assert line.startswith(f"kvbudget daemon: error: {problem}"), line
    assert db.lstat().st_size == 0 or db.is_symlink()
    assert not Path(f"{db}-wal").exists() and not (tmp_path / "elsewhere.db-wal").exists()


# ------------------------------------------------------------------ sockets
def test_a_socket_folder_that_does_not_exist_is_refused_not_created(tmp_path: Path) -> None:
    path = tmp_path / "mistyped" / "k.sock"
    problem = (f"listen: the folder of the socket {path} does not exist (the daemon makes only /run/kvbudget): "
               "create it, or listen elsewhere")
    for extra in (("--check-config",), ()):
        line = _refused_in_one_line(_daemon(tmp_path / "d.db", f"unix://{path}", *extra))
        assert line == f"kvbudget daemon: error: {problem}"
    assert not path.parent.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the socket to another user")
def test_another_users_dead_socket_is_refused_not_removed(tmp_path: Path) -> None:
    path = tmp_path / "k.sock"
    with socket.socket(socket.AF_UNIX) as other:
        other.bind(str(path))  # bound, never listening: nobody answers, as a dead program's
    os.chown(path, 65534, 65534)
    problem = (f"listen: {path} is a socket of another user's (uid 65534) that nobody serves on: not removed; "
               "remove it, or listen elsewhere")
    for extra in (("--check-config",), ()):
        line = _refused_in_one_line(_daemon(tmp_path / "d.db", f"unix://{path}", *extra))
        assert line == f"kvbudget daemon: error: {problem}"
    assert path.lstat().st_uid == 65534


# ------------------------------------------------------------------ the TLS key
def test_a_tls_key_every_user_may_read_is_warned_of_like_a_tokens_file(tmp_path: Path) -> None:
    from tests.certificates import make_pair

    cert, key = make_pair(tmp_path, "served")
    key.chmod(0o644)
    warning = (f"tls_key_file: {key} is readable by every user (mode 0644): make it 0640, owned by root and "
               "the daemon's group")
    tls = ("--tls-cert-file", str(cert), "--tls-key-file", str(key))
    checked = _daemon(tmp_path / "d.db", "localhost:0", "--check-config", *tls)
    assert checked.returncode == 0, checked.stderr
    assert f"warning: {warning}" in checked.stdout.splitlines()

    daemon = DaemonProcess(tmp_path, *tls, listen=(f"unix://{tmp_path}/kvbudget.sock", "localhost:0"))
    with daemon:
        assert warning in daemon.stderr()

    key.chmod(0o640)
    quiet = _daemon(tmp_path / "d.db", "localhost:0", "--check-config", *tls)
    assert quiet.returncode == 0 and "tls_key_file" not in quiet.stdout
