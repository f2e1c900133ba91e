"""One daemon per decision log (QA): a second daemon on the same db_path refuses to start,
in one line naming the lock file and the pid holding it, and leaves the log alone; a
SIGKILLed daemon leaves the lock free; `--check-config` reports the lock, never takes it,
and refuses a db_path the start could not use."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import sqlite_utils

from kvbudget.daemon.log.lock import LockHolder, LogInUse, WriterLock, lock_holder, lock_path
from tests.daemon_harness import DEFAULT_ARGS, DaemonProcess, wait_until


def _daemon_args(db_path: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "kvbudget", "daemon", *DEFAULT_ARGS, "--db-path", str(db_path), *extra]


def _check_config(db_path: Path | str, *extra: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvbudget", "daemon", *DEFAULT_ARGS, "--check-config", "--db-path", str(db_path),
         *extra], capture_output=True, text=True, timeout=60, cwd=cwd,
    )


# ------------------------------------------------------------------ the lock, in-process
def test_the_lock_is_one_holder_at_a_time_and_names_it(tmp_path: Path) -> None:
    db = tmp_path / "decisions.db"
    assert lock_path(db) == tmp_path / "decisions.db.daemon.lock"  # (not SQLite's -wal, -shm, -journal, .lock)
    first, second = WriterLock(db), WriterLock(db)
    first.acquire()
    try:
        assert lock_path(db).read_text() == f"{os.getpid()}\n"
        try:
            second.acquire()  # another open file: flock refuses it, in this process too
        except LogInUse as exc:
            assert exc.pid == os.getpid()
            assert str(exc) == (f"{db} is in use by another kvbudget daemon (pid {os.getpid()} holds "
                                f"{db}.daemon.lock): stop it, or give this daemon a db_path of its own")
        else:
            raise AssertionError("a second WriterLock was granted")
        assert lock_holder(db) == LockHolder(os.getpid())
    finally:
        first.release()
    assert lock_holder(db) is None  # released: the file stays, nobody holds it
    second.acquire()
    second.release()
    assert not db.exists()  # the lock never creates the database
    assert lock_holder(tmp_path / "other.db") is None  # no lock file at all


# ------------------------------------------------------------------ two daemons, one log
def test_a_second_daemon_on_the_same_log_refuses_in_one_line_and_touches_nothing(tmp_path: Path) -> None:
    with DaemonProcess(tmp_path) as first:
        db = first.db_path
        other_socket = tmp_path / "other.sock"
        second = subprocess.Popen(_daemon_args(db, "--listen", f"unix://{other_socket}"),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            # The old code served on the second socket; now it exits before binding anything.
            wait_until(lambda: second.poll() is not None or other_socket.exists(), timeout=60)
            assert second.poll() is not None, "a second daemon started serving on the same decision log"
            stderr = second.stderr.read() if second.stderr else ""
        finally:
            if second.poll() is None:
                second.kill()
            second.wait()
        assert second.returncode == 2
        # The only line it wrote: the lock is taken before the GPU probe, the pool and the log.
        assert stderr.splitlines() == [
            f"kvbudget daemon: error: db_path: {db} is in use by another kvbudget daemon "
            f"(pid {first.process.pid} holds {db}.daemon.lock): stop it, or give this daemon a db_path of its own"
        ]
        assert not other_socket.exists()
        assert lock_path(db).read_text() == f"{first.process.pid}\n"  # the holder's pid, as it wrote it
        # Readers are never held off by the lock: sqlite3, sqlite-utils, `kvbudget log`.
        assert first.decision_rows() == []
        assert sqlite_utils.Database(sqlite3.connect(f"file:{db}?mode=ro", uri=True))["decisions"].count == 0
        log = subprocess.run([sys.executable, "-m", "kvbudget", "log", "--db", str(db)],
                             capture_output=True, text=True, timeout=60)
        assert log.returncode == 0, log.stderr
        # --check-config beside the running daemon: OK (it is run before a reload), with a note.
        checked = _check_config(db)
        assert checked.returncode == 0, checked.stderr
        assert checked.stdout.splitlines()[1:] == [
            f"note: log {db} is in use by a running daemon (pid {first.process.pid} holds {db}.daemon.lock): "
            "another daemon on this db_path refuses to start while it runs"
        ]
        assert lock_holder(db) == LockHolder(first.process.pid)  # the check left it with its holder
        assert first.process.poll() is None  # still serving
    assert first.process.returncode == 0


def test_a_sigkilled_daemon_leaves_the_lock_free_for_the_next(tmp_path: Path) -> None:
    killed = DaemonProcess(tmp_path).start()
    try:
        killed.signal(signal.SIGKILL)
        assert killed.wait() == -signal.SIGKILL
    finally:
        killed.stop()
    assert lock_path(killed.db_path).read_text() == f"{killed.process.pid}\n"  # left behind, with a dead pid
    checked = _check_config(killed.db_path)
    assert checked.returncode == 0 and len(checked.stdout.splitlines()) == 1, checked.stdout  # no note: free
    with DaemonProcess(tmp_path) as next_one:  # (the stale socket is removed, as before)
        assert lock_path(next_one.db_path).read_text() == f"{next_one.process.pid}\n"
        assert lock_holder(next_one.db_path) == LockHolder(next_one.process.pid)
    assert lock_holder(next_one.db_path) is None  # a clean stop lets go too


# ------------------------------------------------------------------ --check-config and db_path
def test_check_config_refuses_a_db_path_that_cannot_be_made(tmp_path: Path) -> None:
    root = os.geteuid() == 0  # (root may write anywhere access(2) asks about, so /proc is told by its type)
    cases = {
        "/proc/kvbudget/decisions.db": "/proc/kvbudget does not exist and cannot be created: "
        + ("/proc is on a proc file system, where no file can be created" if root
           else f"/proc is not writable by this user (uid {os.geteuid()})"),
        "/proc/decisions.db": "cannot write in /proc: "
        + ("/proc is on a proc file system, where no file can be created" if root
           else f"/proc is not writable by this user (uid {os.geteuid()})"),
    }
    plain_file = tmp_path / "a-file"
    plain_file.write_text("x")
    cases[f"{plain_file}/logs/decisions.db"] = (
        f"{plain_file}/logs does not exist and cannot be created: {plain_file} is not a directory")
    (tmp_path / "db-is-a-folder.db").mkdir()
    cases[str(tmp_path / "db-is-a-folder.db")] = f"{tmp_path / 'db-is-a-folder.db'} is a directory"
    for db_path, problem in cases.items():
        flag = _check_config(db_path)
        assert flag.returncode == 2, (db_path, flag.stdout)
        assert flag.stderr.splitlines() == [f"kvbudget daemon: error: db_path: {problem}"], db_path
    config = tmp_path / "kvbudget.toml"
    config.write_text('[log]\ndb_path = "/proc/kvbudget/decisions.db"\n')
    from_file = subprocess.run(
        [sys.executable, "-m", "kvbudget", "daemon", *DEFAULT_ARGS, "--config", str(config), "--check-config"],
        capture_output=True, text=True, timeout=60,
    )
    assert from_file.returncode == 2
    assert from_file.stderr.splitlines() == [
        f"kvbudget daemon: error: {config}: log.db_path: {cases['/proc/kvbudget/decisions.db']}"]


def test_check_config_creates_nothing_where_the_log_could_be_made(tmp_path: Path) -> None:
    db = tmp_path / "new" / "deeper" / "decisions.db"
    checked = _check_config(db)
    assert checked.returncode == 0, checked.stderr
    assert f", log {db} (kept: " in checked.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no folder, no database, no lock file
    relative = _check_config("decisions.db", cwd=tmp_path)  # (its folder: the working directory)
    assert relative.returncode == 0, relative.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []
