"""Where a client command finds the daemon: the default address, its check, the channel.

Shared by `kvbudget doctor`, `admin`, `replay` (live) and `tui`, so each says the same
thing about the same mistake, at once, before any call.
"""

from __future__ import annotations

import argparse
import os
import re
import stat
import subprocess
import time
from typing import TYPE_CHECKING

from kvbudget.client.tls import add_tls_arguments, is_tcp_target
from kvbudget.client.errors import CLIError

if TYPE_CHECKING:
    import grpc

DEFAULT_TARGET = "unix:///run/kvbudget/kvbudget.sock"
TARGET_ENV = "KVBUDGET_TARGET"
TOKEN_ENV = "KVBUDGET_TOKEN"
SHAPES = "unix:///path/to.sock or host:port"

# host:port, [v6]:port; the host may be empty (":50051", as grpc and the daemon accept).
_HOST_PORT = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]*):(\d{1,5})$")


def unix_socket_path(target: str) -> str | None:
    """The filesystem path of a `unix:` target (None for any other kind); no checks."""
    if not target.startswith("unix:"):
        return None
    path = target.removeprefix("unix:")
    return path[2:] if path.startswith("//") else path


def no_socket(path: str) -> str:
    """What every client command (the dashboard too) says when a unix socket is missing."""
    return f"no daemon socket at {path} (is `kvbudget daemon` running?)"


def check_target(target: str, *, require_socket: bool = True) -> str:
    """The target, stripped, if grpc can make sense of it; CLIError in one line if not.

    `require_socket`: a unix socket path must exist now (a command that makes one call
    fails at once instead of waiting out its deadline). The dashboard passes False: it
    waits, showing "disconnected", for a daemon that is starting.
    """
    target = target.strip()
    if not target:
        raise CLIError(f"--target is empty (expected {SHAPES})")
    path = unix_socket_path(target)
    if path is not None:
        if target.startswith("unix://") and not path.startswith("/"):
            raise CLIError(f"--target {target!r}: unix:// needs an absolute path (unix:///...)")
        if not path:
            raise CLIError(f"--target {target!r}: no socket path after unix:")
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            if require_socket:
                raise CLIError(f"--target {target}: {no_socket(path)}")
            return target
        except OSError as exc:
            raise CLIError(f"--target {target}: cannot look at {path}: {exc.strerror}") from None
        if stat.S_ISDIR(mode):
            raise CLIError(f"--target {target!r}: {path} is a directory, not a socket")
        if not stat.S_ISSOCK(mode):
            raise CLIError(f"--target {target!r}: {path} is not a socket")
        return target
    if target.startswith("unix-abstract:"):
        if not target.removeprefix("unix-abstract:"):
            raise CLIError(f"--target {target!r}: no name after unix-abstract:")
        return target
    address = target
    for scheme in ("dns:///", "ipv4:", "ipv6:"):
        address = address.removeprefix(scheme)
    match = _HOST_PORT.match(address)
    if not match or not 0 < int(match.group(1)) < 65536:
        raise CLIError(f"--target {target!r}: expected {SHAPES} (port 1-65535)")
    return target


def add_target_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    *,
    tls: bool = True,
    token_help: str = "bearer token for a TCP target",
    suppress: bool = False,
) -> None:
    """--target, --token (and --tls-ca, --tls-cert, --tls-key). They default to None;
    `resolve_target`, `resolve_token` and `resolve_tls` fill in the environment, so a
    command can tell a flag from the environment. `suppress`: a subcommand's copy that
    must not overwrite the parent's."""
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument(
        "--target", metavar="ADDR", default=default,
        help=f"daemon address: {SHAPES} (default ${TARGET_ENV} or {DEFAULT_TARGET})",
    )  # fmt: skip
    parser.add_argument("--token", metavar="T", default=default, help=f"{token_help} (default ${TOKEN_ENV})")
    if tls:
        add_tls_arguments(parser, default)


def resolve_target(flag: str | None) -> str:
    """--target if given (an empty one too: `check_target` names it), else $KVBUDGET_TARGET,
    else the packaged unix socket. A malformed $KVBUDGET_TARGET is named as such here, not
    as a --target the user never gave."""
    if flag is not None:
        return flag
    value = os.environ.get(TARGET_ENV)
    if value is None:
        return DEFAULT_TARGET
    try:
        check_target(value, require_socket=False)
    except CLIError as exc:
        raise CLIError(str(exc).replace("--target", f"${TARGET_ENV}", 1)) from None
    return value


def resolve_token(flag: str | None) -> str | None:
    """--token if given, else $KVBUDGET_TOKEN, else none (the unix socket needs none).

    Blanks around it are dropped: a token read from a file keeps its line end (a CRLF
    file's \\r survives `$(cat FILE)`), and gRPC refuses a header holding one with INTERNAL
    "Invalid metadata", which names neither the token nor the fix. A token has no blank
    inside (the daemon's tokens file refuses one): that is one line naming the flag or the
    variable, never the token."""
    source, value = ("--token", flag) if flag else (f"${TOKEN_ENV}", os.environ.get(TOKEN_ENV))
    token = (value or "").strip()
    if any(ch.isspace() or not ch.isprintable() for ch in token):
        raise CLIError(f"{source}: a token has no spaces or control characters inside it (is it the right file?)")
    return token or None


def call_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def channel(target: str, credentials: grpc.ChannelCredentials | None = None) -> grpc.Channel:
    """A blocking channel to `target` (checked by the caller), over TLS with `credentials`
    (`channel_credentials`), plaintext without."""
    import grpc

    if credentials is not None:
        return grpc.secure_channel(target, credentials)
    return grpc.insecure_channel(target)


# What gRPC's details say when a TCP connection was made and then dropped before any call:
# a TLS server whose handshake failed, or a TLS server spoken to in plaintext.
_DROPPED = ("Socket closed", "Tls handshake failed", "Connection reset by peer")
_TLS_HINT = ("(a TLS daemon drops connections whose handshake fails: --tls-ca must be the CA that signed its "
             "certificate, and a daemon with tls_client_ca_file wants --tls-cert/--tls-key signed by that CA)")
# Handshakes that fail for another reason than the CA, by what gRPC's details say (checked
# first: their details also say "Tls handshake failed", which would blame the CA).
_TLS_HINTS = (
    # TLS spoken to a plaintext port: the server's first bytes are no TLS record.
    ("WRONG_VERSION_NUMBER", "(the daemon does not speak TLS on this port: call it without --tls-ca, --tls-cert "
                             "and --tls-key, and without $KVBUDGET_TLS_CA, ..., with a --token)"),
    ("Hostname Verification", "(the daemon's certificate does not name the host in --target: use a name its "
                              "certificate lists, as its subjectAltName)"),
)


def rpc_error_line(target: str, exc: BaseException) -> str:
    """A failed call as one line: `TARGET: STATUS_NAME: details` (details flattened, capped),
    and what to check when a TCP connection was dropped at the handshake (gRPC's own words,
    "Socket closed", name neither TLS nor a certificate)."""
    code = getattr(exc, "code", None)
    details = getattr(exc, "details", None)
    name = code().name if callable(code) and code() is not None else type(exc).__name__
    text = " ".join(((details() if callable(details) else None) or "").split())[:300]
    line = f"{target}: {name}: {text or name}"
    if name == "UNAVAILABLE" and is_tcp_target(target):
        hint = next((hint for words, hint in _TLS_HINTS if words in text), None)
        if hint is None and any(words in text for words in _DROPPED):
            hint = _TLS_HINT
        if hint is not None:
            line += f" {hint}"
    return line


def wait_until_serving(target: str, process: subprocess.Popen | None = None, *, timeout_s: float = 60.0) -> str | None:
    """Polls the standard health service at `target` until it says SERVING.

    None once it does; otherwise why not, in a few words: the daemon `process` exited
    (its code), or `timeout_s` passed. For whoever starts a daemon and must wait for it:
    `kvbudget demo`, the test harness, the benches.
    """
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if process is not None and process.poll() is not None:
                return f"exited with {process.returncode}"
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0).status == health_pb2.HealthCheckResponse.SERVING:
                    return None
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                return f"not SERVING after {timeout_s:g} s"
            time.sleep(0.05)
