"""`kvbudget daemon --check-config` refuses what the start would refuse on this host, in the
start's own words, and only looks (QA: it said `config OK` for a db_path holding a text
file or another program's SQLite database, and for a listen path that was a folder, a
regular file, a socket another daemon served, or too long for a unix socket; each then
failed the start). Nothing is created, changed or locked: a read-only look at the
database, a connection to the socket, never a bind."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kvbudget.daemon.config.listen import MAX_UNIX_ADDRESS_PATH_BYTES
from kvbudget.daemon.config.loading import load_config
from kvbudget.daemon.log.decision_log import DecisionLog
from kvbudget.daemon.log.lock import lock_holder

from daemon_harness import DEFAULT_ARGS, DaemonProcess


def _daemon(db_path: Path, listen: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvbudget", "daemon", *DEFAULT_ARGS, "--db-path", str(db_path), "--listen", listen,
         *extra], capture_output=True, text=True, timeout=60,
    )


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under `folder` with its size and modification time."""
    return {str(p.relative_to(folder)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in folder.rglob("*")}


# Each makes what stands in the start's way under a folder and says (db_path, listen address,
# the problem as the start words it).
Obstacle = Callable[[Path], tuple[Path, str, str]]


def _text_file_as_log(folder: Path) -> tuple[Path, str, str]:
    db = folder / "notes.db"
    db.write_text("not a database\n")
    return db, f"unix://{folder}/k.sock", f"db_path: cannot use {db}: {db}: file is not a database"


def _another_programs_database(folder: Path) -> tuple[Path, str, str]:
    db = folder / "other.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE things (name TEXT)")
    conn.close()
    return db, f"unix://{folder}/k.sock", (
        f"db_path: cannot use {db}: {db} is not a KVBudget decision log (no meta table)")


def _folder_at_the_socket_path(folder: Path) -> tuple[Path, str, str]:
    (folder / "k.sock").mkdir()
    return folder / "d.db", f"unix://{folder}/k.sock", f"listen: {folder}/k.sock exists and is not a socket"


def _file_at_the_socket_path(folder: Path) -> tuple[Path, str, str]:
    (folder / "k.sock").write_text("a file")
    return folder / "d.db", f"unix://{folder}/k.sock", f"listen: {folder}/k.sock exists and is not a socket"


def _file_in_the_socket_path(folder: Path) -> tuple[Path, str, str]:
    (folder / "run").write_text("a file where the socket's folder should be")
    return folder / "d.db", f"unix://{folder}/run/k.sock", f"listen: cannot reach {folder}/run/k.sock: Not a directory"


def _socket_path_too_long(folder: Path) -> tuple[Path, str, str]:
    address = f"unix://{folder}/"
    address += "s" * max(1, len("unix:") + MAX_UNIX_ADDRESS_PATH_BYTES + 1 - len(address))  # (108 bytes)
    size = len(address) - len("unix:")
    return folder / "d.db", address, (
        f"listen: {address}: the socket path is too long: gRPC takes at most 107 bytes after \"unix:\", "
        f"this address has {size}; use a shorter path")


@pytest.mark.parametrize(
    "obstacle",
    [_text_file_as_log, _another_programs_database, _folder_at_the_socket_path, _file_at_the_socket_path,
     _file_in_the_socket_path, _socket_path_too_long],
    ids=lambda obstacle: obstacle.__name__.strip("_"),
)
def test_check_config_refuses_what_the_start_refuses_in_its_words(tmp_path: Path, obstacle: Obstacle) -> None:
    db, listen, problem = obstacle(tmp_path)
    before = _files(tmp_path)
    checked = _daemon(db, listen, "--check-config")
    assert (checked.returncode, checked.stdout) == (2, "")
    assert checked.stderr.splitlines() == [f"kvbudget daemon: error: {problem}"]
    assert _files(tmp_path) == before  # looked only: no lock file, no -wal or -shm, no socket
    started = _daemon(db, listen)
    assert started.returncode == 2
    assert started.stderr.splitlines()[-1] == f"kvbudget daemon: error: {problem}", started.stderr


def test_the_start_refuses_a_socket_path_too_long_at_once_in_one_line(tmp_path: Path) -> None:
    """It bound after the pool and the log were set up, and said gRPC's own words first
    ("Path name should not have more than 107 characters") and `stopped` after."""
    db, listen, problem = _socket_path_too_long(tmp_path)
    started = _daemon(db, listen)
    assert (started.returncode, started.stderr) == (2, f"kvbudget daemon: error: {problem}\n")
    assert _files(tmp_path) == {}  # before the log's lock, the log, the socket


def test_a_log_the_start_would_use_passes_and_is_left_as_it_is(tmp_path: Path) -> None:
    log = DecisionLog(tmp_path / "kept.db")  # a log a stopped daemon left
    log.start()
    log.close()
    before = _files(tmp_path)  # (an empty file is refused: tests/test_trust_files.py)
    for name in ("kept.db",):
        config = load_config(None, {"model": "llama-3.1-8b", "num_gpu_blocks": 64, "db_path": str(tmp_path / name),
                                    "listen": f"unix://{tmp_path}/k.sock"}, check_paths=True)
        assert config.db_path == str(tmp_path / name)
    assert _files(tmp_path) == before


@pytest.mark.slow
def test_a_served_socket_is_refused_unless_its_daemon_holds_this_configs_log(tmp_path: Path) -> None:
    """Another process serving on the socket makes the start fail; the running daemon this
    config is about (it holds the log) is the usual case of a check before a reload: OK,
    with a note for the socket as for the log."""
    with DaemonProcess(tmp_path) as running:
        listen = running.target
        other = _daemon(tmp_path / "other.db", listen, "--check-config")
        assert (other.returncode, other.stdout) == (2, "")
        assert other.stderr == f"kvbudget daemon: error: listen: another process is serving on {running.socket_path}\n"
        assert not (tmp_path / "other.db").exists()
        own = _daemon(running.db_path, listen, "--check-config")
        assert own.returncode == 0, own.stderr
        pid = running.process.pid
        assert own.stdout.splitlines()[1:] == [
            f"note: log {running.db_path} is in use by a running daemon (pid {pid} holds "
            f"{running.db_path}.daemon.lock): another daemon on this db_path refuses to start while it runs",
            f"note: listen {running.socket_path} is served by that running daemon (pid {pid}): "
            "another daemon listening there refuses to start while it runs",
        ]
        assert lock_holder(running.db_path).pid == pid and running.process.poll() is None  # left serving
