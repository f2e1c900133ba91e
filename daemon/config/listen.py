"""Where the daemon listens and who may connect: listen addresses parsed, and the [server]
section's checks (addresses, TCP's protection by tokens or TLS, the TLS and tokens files)."""

from __future__ import annotations

import ipaddress
import os
import re

from kvbudget.daemon.config.settings import LOG_LEVELS, ConfigError, DaemonConfig, Failure
from kvbudget.daemon.config.tls_files import TlsError, read_client_ca, read_pair

MIN_LEASE_TTL_S = 1.0  # the wire says TTLs in whole seconds (OpenSessionResponse.lease_ttl_s)
# A unix socket's path fits in sockaddr_un.sun_path (108 bytes with its NUL). gRPC counts
# what follows "unix:" in the address, so `unix:///p` spends two of them on the slashes
# (its own error, "Path name should not have more than 107 characters", came only at the
# bind, after the pool and the log were set up).
MAX_UNIX_ADDRESS_PATH_BYTES = 107
_HOST_PORT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]*):(?P<port>\d{1,5})$")


def parse_host_port(address: str) -> tuple[str, int] | None:
    """("127.0.0.1", 9400) from "127.0.0.1:9400" (IPv6 in brackets), or None if malformed."""
    match = _HOST_PORT.match(address)
    if not match or int(match["port"]) > 65535:
        return None
    return match["host"].strip("[]"), int(match["port"])


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen_kind(address: str) -> str | None:
    """"unix" (unix: / unix-abstract:), "tcp" (host:port), or None if malformed."""
    if address.startswith("unix-abstract:"):
        return "unix" if len(address) > len("unix-abstract:") else None
    if address.startswith("unix:"):
        path = address.removeprefix("unix://") if address.startswith("unix://") else address[5:]
        return "unix" if path.strip("/") else None
    return "tcp" if parse_host_port(address) else None


def check_server(c: DaemonConfig, fail: Failure) -> None:
    """The [server] section: the lease, the log level, the listen addresses, TLS, tokens."""
    if c.lease_ttl_s < MIN_LEASE_TTL_S:  # (after _positive: a bad type or sign is said there)
        # Engines hear the TTL in whole seconds and heartbeat at a third of it: under a
        # second, the lease would lapse between heartbeats.
        raise fail("lease_ttl_s", f"at least {MIN_LEASE_TTL_S:g} s (engines are told it in whole seconds), "
                   f"got {c.lease_ttl_s:g}")
    if c.log_level not in LOG_LEVELS:
        raise fail("log_level", f"must be one of {', '.join(LOG_LEVELS)}, got {c.log_level!r}")
    if not c.listen:
        raise fail("listen", "needs at least one address (e.g. unix:///run/kvbudget/kvbudget.sock)")
    if len(set(c.listen)) != len(c.listen):
        raise fail("listen", "lists the same address twice")
    for address in c.listen:
        _check_address(address, c, fail)
    _check_tls(c, fail)
    if c.tokens_file:
        _check_tokens_file(c, fail)


def _check_address(address: str, c: DaemonConfig, fail: Failure) -> None:
    if address.startswith("unix-abstract:"):
        # Its callers are trusted as a socket file's are (gRPC names both peers "unix:"),
        # but it has no file mode to keep anyone out: any process on the host could
        # connect, from any user or any container sharing the network namespace.
        raise fail("listen", f"{address!r}: an abstract unix socket has no file permissions, so anyone on "
                   "the host could connect as admin; use a unix:///PATH socket")
    kind = listen_kind(address)
    if kind is None:
        raise fail("listen", f"bad address {address!r} (expected unix:///PATH or HOST:PORT)")
    too_long = unix_address_too_long(address) if kind == "unix" else None
    if too_long is not None:
        raise fail("listen", too_long)
    if kind == "tcp" and not (c.tokens_file or c.tls_cert_file or c.allow_insecure_tcp):
        raise fail("listen", f"TCP address {address!r} needs tokens_file or TLS "
                   "(or allow_insecure_tcp = true on a trusted loopback)")
    if kind == "tcp" and c.allow_insecure_tcp and not (c.tokens_file or c.tls_cert_file):
        host = parse_host_port(address)[0]  # type: ignore[index]
        if not _is_loopback(host):
            raise fail("allow_insecure_tcp", f"only allowed on a loopback address, not {address!r}: "
                       "set tokens_file or TLS to listen there")


def _check_tls(c: DaemonConfig, fail: Failure) -> None:
    if bool(c.tls_cert_file) != bool(c.tls_key_file):
        missing = "tls_key_file" if c.tls_cert_file else "tls_cert_file"
        present = "tls_cert_file" if c.tls_cert_file else "tls_key_file"
        raise fail(missing, f"{present} is set but {missing} is not: TLS needs both")
    if c.tls_cert_file:
        try:
            read_pair(c.tls_cert_file, c.tls_key_file)  # (read again to serve: daemon/server/tls.py)
        except TlsError as exc:
            raise fail(exc.field, str(exc)) from None
    if c.tls_client_ca_file:
        if not c.tls_cert_file:
            raise fail("tls_client_ca_file", "needs tls_cert_file and tls_key_file: client certificates "
                       "are asked for in the TLS handshake")
        try:
            read_client_ca(c.tls_client_ca_file)
        except TlsError as exc:
            raise fail(exc.field, str(exc)) from None


def _check_tokens_file(c: DaemonConfig, fail: Failure) -> None:
    from kvbudget.daemon.config.tokens_file import load_roles  # (here: it reads TOML through loading, which imports this)

    try:
        roles = load_roles(c.tokens_file)
    except ConfigError as exc:
        raise fail("tokens_file", str(exc)) from None
    if roles.certificate_names and not c.tls_client_ca_file:
        raise fail("tokens_file", f"{c.tokens_file}: [certificates] names client certificates, but "
                   "tls_client_ca_file is not set: no client presents one")


def unix_address_too_long(address: str) -> str | None:
    """Why gRPC could not bind the unix socket `address` for the length of its path, or
    None. Checked with the rest of the config, so that a start says it at once, before
    the pool and the log are set up."""
    size = len(os.fsencode(address.removeprefix("unix:")))
    if size <= MAX_UNIX_ADDRESS_PATH_BYTES:
        return None
    return (f"{address}: the socket path is too long: gRPC takes at most {MAX_UNIX_ADDRESS_PATH_BYTES} "
            f"bytes after \"unix:\", this address has {size}; use a shorter path")


