"""The daemon's listening sockets: unix sockets by default (a stale socket file of this
user's removed, a live one or another user's refused, no folder made but the default's,
mode 0660), TCP only when the config allows it (tokens, TLS, or an explicit insecure
opt-in on a loopback)."""

from __future__ import annotations

import logging
import os
import socket
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc

from kvbudget.daemon.config.host import DEFAULT_SOCKET_FOLDER, socket_folder_missing
from kvbudget.daemon.config.listen import listen_kind, parse_host_port
from kvbudget.daemon.config.settings import DaemonConfig
from kvbudget.daemon.server.startup import StartupError
from kvbudget.daemon.server.tls import ServedCertificate

log = logging.getLogger("kvbudget.daemon")


@dataclass(frozen=True)
class Listener:
    address: str  # as configured
    unix_path: str | None  # filesystem socket path, if any


def unix_path(address: str) -> str | None:
    if address.startswith("unix-abstract:"):
        return None
    if address.startswith("unix://"):
        return address[len("unix://") :]
    return address[len("unix:") :]


def _make_the_default_folder(folder: Path, path: str) -> None:
    """The one socket folder the daemon makes, as the docs say (systemd's RuntimeDirectory=
    when run by hand): the default's. Any other is refused: a mistyped one was made."""
    if folder != DEFAULT_SOCKET_FOLDER:
        raise StartupError(f"listen: {socket_folder_missing(path)}")
    try:
        folder.mkdir(mode=0o750)
        os.chmod(folder, 0o750)  # (whatever the umask, as RuntimeDirectoryMode= would)
    except FileExistsError:
        pass
    except OSError as exc:  # (a folder this user may not write in)
        raise StartupError(f"listen: cannot create {folder} for the socket {path}: {exc.strerror or exc}") from None


def prepare_unix_socket(path: str) -> None:
    """Refuse a missing folder (the daemon makes none: a mistyped one was made), anything
    but a socket, a live socket, or a stale one another user left (another program's);
    remove a stale socket of this user's, left by a killed daemon."""
    target = Path(path)
    try:
        st = target.lstat()
    except FileNotFoundError:
        if not target.parent.is_dir():
            _make_the_default_folder(target.parent, path)
        return
    except OSError as exc:  # (a file in the way; as --check-config words it: daemon/config/host.py)
        raise StartupError(f"listen: cannot reach {path}: {exc.strerror or exc}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise StartupError(f"listen: {path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        if st.st_uid != os.geteuid():
            raise StartupError(f"listen: {path} is a socket of another user's (uid {st.st_uid}) that nobody "
                               "serves on: not removed; remove it, or listen elsewhere") from None
        try:
            target.unlink()  # nobody answers: stale, left by a killed daemon
        except OSError as exc:
            raise StartupError(f"listen: cannot remove the stale socket {path}: {exc.strerror or exc}") from None
        log.info("removed stale socket %s", path)
    else:
        raise StartupError(f"listen: another process is serving on {path}")
    finally:
        probe.close()


def prepare_unix_sockets(addresses: Iterable[str]) -> None:
    """Every unix socket path checked at once, to fail fast, before any expensive setup."""
    for address in addresses:
        path = unix_path(address) if listen_kind(address) == "unix" else None
        if path is not None:
            prepare_unix_socket(path)


def bind(server: grpc.aio.Server, address: str, certificate: ServedCertificate | None) -> Listener:
    """One configured address added to the server (TLS on TCP when there is a certificate)."""
    if listen_kind(address) == "unix":
        path = unix_path(address)
        if path is not None:
            # Checked again right before the bind: gRPC unlinks whatever socket is at
            # the path, and start-up (the pool, CUDA, the log) can take minutes since
            # the first check, time enough for another daemon to bind and serve there.
            prepare_unix_socket(path)
        try:
            server.add_insecure_port(address)
        except RuntimeError as exc:
            raise StartupError(f"listen: cannot bind {address}: {exc}") from None
        return Listener(address, path)
    host_port = parse_host_port(address)
    assert host_port is not None  # the config checked it
    try:
        if certificate is not None:
            server.add_secure_port(address, certificate.credentials())
        else:
            server.add_insecure_port(address)
    except RuntimeError as exc:
        raise StartupError(f"listen: cannot bind {address}: {exc}") from None
    return Listener(address, None)


def open_to_group(listeners: Iterable[Listener]) -> None:
    """Mode 0660 on the socket files: only the owner and the group may connect."""
    for listener in listeners:
        if listener.unix_path:
            os.chmod(listener.unix_path, 0o660)


def remove_sockets(listeners: Iterable[Listener]) -> None:
    for listener in listeners:
        if listener.unix_path:
            Path(listener.unix_path).unlink(missing_ok=True)


def warn_if_tcp_is_open_to_all(config: DaemonConfig) -> None:
    """TLS with neither tokens nor client certificates encrypts, but lets anyone who can
    reach the port in as admin. It is allowed (for a network only trusted hosts reach),
    and said at every start, so that it stays a choice and not an oversight."""
    if config.tokens_file or config.tls_client_ca_file or not config.tls_enabled:
        return
    for address in config.listen:
        if listen_kind(address) == "tcp":
            log.warning("listen %s: TLS without tokens_file or tls_client_ca_file: every client that "
                        "reaches it has the admin role", address)
