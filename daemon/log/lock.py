"""One daemon per decision log: the writing daemon's flock on `<db_path>.daemon.lock`.

Each log numbers its rows from memory, so two daemons on one file would number over each
other; the OS drops the lock when the process dies.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import stat
from pathlib import Path

LOCK_SUFFIX = ".daemon.lock"
LOCK_MODE = 0o600  # only the daemon's user: the file holds nothing but a pid


def lock_path(db_path: str | os.PathLike[str]) -> Path:
    """The file the writing daemon locks: `decisions.db.daemon.lock` beside `decisions.db`."""
    return Path(f"{os.fspath(db_path)}{LOCK_SUFFIX}")


class LogInUse(Exception):
    """Another process holds the log's writer lock (`WriterLock`)."""

    def __init__(self, db_path: str | os.PathLike[str], pid: int | None) -> None:
        self.lock_file = lock_path(db_path)
        self.pid = pid
        holder = f"pid {pid}" if pid else "a process"
        super().__init__(f"{os.fspath(db_path)} is in use by another kvbudget daemon ({holder} holds "
                         f"{self.lock_file}): stop it, or give this daemon a db_path of its own")


def _written_pid(fd: int) -> int | None:
    """The pid the lock's holder wrote into the file, if it did."""
    try:
        first = os.pread(fd, 32, 0).split(b"\n", 1)[0]
        return int(first) if first.strip() else None
    except (OSError, ValueError):
        return None


def _open_lock_file(path: Path) -> int:
    """The lock file opened for writing, never through a symbolic link (one pointing at
    another file had it overwritten with a pid), made LOCK_MODE whatever the umask.
    Raises OSError naming what is in the way."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, LOCK_MODE)
    except FileExistsError:
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            if os.path.islink(path):
                raise OSError(f"{path} is a symbolic link; the writer lock is never one (remove it)") from None
            raise OSError(f"cannot open {path}: {exc.strerror or exc}") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            what = "is not a regular file" if not stat.S_ISREG(st.st_mode) else "has other hard links"
            raise OSError(f"{path} {what}: not a kvbudget writer lock (remove it)")
        return fd
    try:
        os.fchmod(fd, LOCK_MODE)  # (a umask such as 0277 takes bits away: the docs say 0600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_lock_content(fd: int, path: Path) -> None:
    """Refuses a file that is not a lock this daemon left: anything but empty or a pid line
    (a file of someone else's at that name would be cut to a pid)."""
    head = os.pread(fd, 64, 0)
    if head.strip() and not head.split(b"\n", 1)[0].strip().isdigit():
        raise OSError(f"{path} exists and is not a kvbudget writer lock (it holds no pid): "
                      "move it away, or give this daemon another db_path")


class WriterLock:
    """The writing daemon's claim on a decision log: an exclusive flock on `lock_path`,
    held while the file stays open. The holder's pid is written in it, for the message a
    second daemon prints. The file is left in place at release: removing it would let a
    daemon that opened it just before lock a file nobody else sees any more."""

    def __init__(self, db_path: str | os.PathLike[str]) -> None:
        self.db_path = os.fspath(db_path)
        self.path = lock_path(db_path)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise LogInUse at once (no wait); OSError if the file cannot be
        made. The descriptor is not inherited by child processes (PEP 446)."""
        if self._fd is not None:
            raise RuntimeError("WriterLock.acquire() called twice")
        fd = _open_lock_file(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _written_pid(fd)
            os.close(fd)
            raise LogInUse(self.db_path, pid) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            _check_lock_content(fd, self.path)
        except BaseException:
            os.close(fd)
            raise
        try:
            mine = f"{os.getpid()}\n".encode()
            os.pwrite(fd, mine, 0)  # (then cut: a reader meanwhile sees a whole pid, old or new)
            os.ftruncate(fd, len(mine))
        except OSError:
            pass  # the lock holds without it; only the message loses the pid
        self._fd = fd

    def release(self) -> None:
        """Idempotent. (A process that dies without it releases the lock all the same.)"""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclasses.dataclass(frozen=True)
class LockHolder:
    pid: int | None  # None: held, by a process not known


def lock_holder(db_path: str | os.PathLike[str]) -> LockHolder | None:
    """Who holds the log's writer lock, found without taking it (for --check-config, which
    must never hold off a daemon starting meanwhile): the kernel's table of locks,
    /proc/locks. None when nobody does, or where that table cannot be read (not Linux)."""
    path = lock_path(db_path)
    try:
        st = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as table:
            lines = table.read().splitlines()
    except OSError:
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # (not readable by this user: the table's pid will do)
        written = None
    else:
        try:
            written = _written_pid(fd)
        finally:
            os.close(fd)
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:2146450 0 EOF"; a blocked waiter has "->" after "1:"
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        try:
            major, minor, inode = fields[5].split(":")
            pid, same_device = int(fields[4]), (int(major, 16), int(minor, 16)) == (os.major(st.st_dev),
                                                                                  os.minor(st.st_dev))
            if int(inode) != st.st_ino:
                continue
        except ValueError:
            continue
        # (On overlayfs the table shows the layer's device, not the one stat() sees; the pid
        # the holder wrote then tells the file apart from another with that inode number.)
        if same_device or (written is not None and pid == written):
            return LockHolder(pid if pid > 0 else written)  # (0: a process outside this pid namespace)
    return None
