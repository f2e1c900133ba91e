"""What `kvbudget daemon --check-config` asks of the host, beyond the config's values:
could this user create and write the decision log at db_path, would the start take the
file already there, and is a listen socket's path free (daemon/config/checks.py `_check_paths`).

Each answers in the start's own words, found by looking only: nothing is created, changed,
locked or bound (a socket is connected to, as the start does before it binds).
"""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from kvbudget.daemon.config.settings import DEFAULT_LISTEN

# File systems where no regular file can be made, whatever the permission bits say (root
# passes access(2) there): a db_path under /proc passed every check, and the start failed.
_NO_FILES_FS = frozenset({
    "proc", "sysfs", "cgroup", "cgroup2", "devpts", "debugfs", "tracefs", "securityfs", "configfs",
    "bpf", "pstore", "mqueue", "fusectl", "efivarfs", "binfmt_misc", "nsfs", "selinuxfs", "hugetlbfs",
})


def _file_system_type(directory: str) -> str | None:
    """The type of the file system `directory` is on (/proc/self/mountinfo); None where
    that cannot be read (not Linux)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found, longest = None, -1
    for line in lines:
        # "22 27 0:21 / /proc rw,relatime - proc proc rw": the mount point is the 5th field
        # (octal escapes for spaces), the type follows " - ".
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not rest:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[4])
        inside = directory == point or directory.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= longest:  # (the later of two mounts on one point is the one seen)
            found, longest = rest.split()[0], len(point)
    return found


def db_path_problem(db_path: str) -> str | None:
    """Why this user could not create and write the decision log at `db_path` (the file,
    its -wal and -shm, the writer lock beside them), or why the start would refuse a file
    already there (`_log_file_problem`), found without creating anything; None when
    nothing stands in the way as far as can be told. Its directory must exist and be
    writable, or be creatable under a writable one."""
    path = Path(db_path)
    directory = path.parent
    uid = os.geteuid()
    existing = directory
    while True:  # the nearest folder that exists (the root does)
        try:
            mode = existing.stat().st_mode
            break
        except (FileNotFoundError, NotADirectoryError):
            existing = existing.parent
        except OSError as exc:
            return f"cannot reach {existing}: {exc.strerror or exc}"
    if existing != directory:
        where = f"{directory} does not exist and cannot be created"
    else:
        where = f"cannot write in {directory}"
    if not stat.S_ISDIR(mode):
        return f"{where}: {existing} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{where}: {existing} is not writable by this user (uid {uid})"
    try:
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        return f"{where}: {existing} is on a read-only file system"
    kind = _file_system_type(os.path.realpath(existing))
    if kind in _NO_FILES_FS:
        return f"{where}: {existing} is on a {kind} file system, where no file can be created"
    from kvbudget.daemon.log.lock import lock_path

    for name in (db_path, f"{db_path}-wal", f"{db_path}-shm", str(lock_path(db_path))):
        if name != db_path and os.path.islink(name):  # (the start's words: daemon/log/store.py, lock.py)
            what = "the writer lock is never one" if name.endswith(".lock") else "SQLite would write through it"
            return f"cannot use {db_path}: {name} is a symbolic link; {what} (remove it)"
        try:
            mode = os.stat(name).st_mode
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"cannot reach {name}: {exc.strerror or exc}"
        if stat.S_ISDIR(mode):
            return f"{name} is a directory"
        if not os.access(name, os.R_OK | os.W_OK):
            return f"{name} is not writable by this user (uid {uid})"
    return _log_file_problem(db_path)


def _log_file_problem(db_path: str) -> str | None:
    """Why a start would refuse the file already at `db_path` (DecisionLog.start: not an
    SQLite database, or one that is not a KVBudget log, or of a schema this kvbudget cannot
    read), in the start's words; None when there is no file yet, or a running daemon holds
    it (it checked the file when it started). Read as SQLite's `immutable` file: no lock
    taken, no -wal or -shm made (a plain read-only open makes both)."""
    from kvbudget.daemon.log.schema import DecisionLogError, check_meta
    from kvbudget.daemon.log.lock import lock_holder

    path = Path(db_path)
    where = str(path)  # (as DecisionLog names it)
    if path.is_symlink():  # (the start's words: daemon/log/store.py `_make_or_check_file`)
        return f"cannot use {db_path}: {where} is a symbolic link: give db_path the file itself"
    if not path.is_file() or lock_holder(db_path) is not None:
        return None
    if path.stat().st_size == 0:
        return (f"cannot use {db_path}: {where} exists and is empty, not a KVBudget decision log: remove it, "
                "or give db_path a file of its own")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    except sqlite3.Error as exc:
        return f"cannot use {db_path}: {where}: {exc}"
    try:
        if conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            check_meta(conn, where)  # (an empty database is one the start makes the log in)
    except sqlite3.DatabaseError as exc:
        return f"cannot use {db_path}: {where}: {exc}"
    except DecisionLogError as exc:
        return f"cannot use {db_path}: {exc}"
    finally:
        conn.close()
    return None


@dataclass(frozen=True)
class SocketServer:
    """A process that accepted a connection on a unix socket."""

    pid: int | None  # its pid (SO_PEERCRED); None where the OS does not say


def socket_server(path: str) -> SocketServer | None:
    """Who serves on the unix socket at `path`, found by connecting as the start does
    before it binds (daemon/server/listeners.py prepare_unix_socket); None when nobody answers (a
    stale socket, which the start removes)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(5.0)  # (a check never hangs on a server that does not accept)
    try:
        probe.connect(path)
        return SocketServer(_peer_pid(probe))
    except OSError:
        return None
    finally:
        probe.close()


def _peer_pid(connected: socket.socket) -> int | None:
    if not hasattr(socket, "SO_PEERCRED"):  # (Linux only)
        return None
    credentials = connected.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid = struct.unpack("3i", credentials)[0]
    return pid if pid > 0 else None  # (0: a process outside this pid namespace)


def is_log_daemon(server: SocketServer, db_path: str) -> bool:
    """Whether `server` is the running daemon that holds the log at `db_path`: the daemon
    this config is about, when --check-config is run beside it before a reload."""
    from kvbudget.daemon.log.lock import lock_holder

    holder = lock_holder(db_path)
    return server.pid is not None and holder is not None and holder.pid == server.pid


# The one socket folder the start makes when it is missing (as systemd's RuntimeDirectory=
# would): the default listen address's. Any other missing folder is refused.
DEFAULT_SOCKET_FOLDER = Path(DEFAULT_LISTEN[len("unix://"):]).parent


def socket_folder_missing(path: str) -> str:
    return (f"the folder of the socket {path} does not exist (the daemon makes only "
            f"{DEFAULT_SOCKET_FOLDER}): create it, or listen elsewhere")


def unix_socket_problem(path: str, db_path: str) -> str | None:
    """Why a start would refuse to listen on the unix socket `path` as things stand, in the
    start's words (prepare_unix_socket), found by looking: something other than a socket
    there, or another process serving on it. Not the running daemon that holds this
    config's log (`is_log_daemon`): the check is run beside it before a reload, as the log's
    lock is only a note then (kvbudget/cli/cmd_daemon.py prints one for the socket too)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        folder = Path(path).parent
        if not folder.is_dir() and folder != DEFAULT_SOCKET_FOLDER:
            return socket_folder_missing(path)
        return None
    except OSError as exc:
        return f"cannot reach {path}: {exc.strerror or exc}"
    if not stat.S_ISSOCK(st.st_mode):
        return f"{path} exists and is not a socket"
    server = socket_server(path)
    if server is None and st.st_uid != os.geteuid():
        return (f"{path} is a socket of another user's (uid {st.st_uid}) that nobody serves on: not removed; "
                "remove it, or listen elsewhere")
    if server is None or is_log_daemon(server, db_path):
        return None
    return f"another process is serving on {path}"


def unix_socket_paths(listen: tuple[str, ...]) -> list[str]:
    """The file-system paths of the unix sockets among `listen` addresses."""
    from kvbudget.client.target import unix_socket_path  # (None for TCP and unix-abstract: addresses)

    paths = [unix_socket_path(address) for address in listen]
    return [path for path in paths if path is not None]
