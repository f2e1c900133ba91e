"""The TLS files of a client command (--tls-ca, --tls-cert, --tls-key, or their
$KVBUDGET_TLS_* variables) and the channel credentials made of them.

Every file is read and checked before any call, so a mistake is one line naming the flag
(or variable) and the file, where grpc would only say UNAVAILABLE, later.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvbudget.client.errors import CLIError

if TYPE_CHECKING:
    import grpc

TLS_CA_ENV = "KVBUDGET_TLS_CA"
TLS_CERT_ENV = "KVBUDGET_TLS_CERT"
TLS_KEY_ENV = "KVBUDGET_TLS_KEY"


def add_tls_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, default: object = None) -> None:
    """--tls-ca, --tls-cert, --tls-key (`default`: None, or argparse.SUPPRESS for a
    subcommand's copy; `resolve_tls` fills in the environment)."""
    tls_options = (
        ("--tls-ca", f"CA certificate: talk TLS to a TCP target (default ${TLS_CA_ENV}; "
                     "TLS is for TCP only: the TLS variables are ignored for a unix socket)"),
        ("--tls-cert", "client certificate to present, for a daemon that asks for one "
                       f"(mutual TLS; needs --tls-ca and --tls-key) (default ${TLS_CERT_ENV})"),
        ("--tls-key", f"private key of --tls-cert, unencrypted PEM (default ${TLS_KEY_ENV})"),
    )  # fmt: skip
    for flag, help_text in tls_options:
        parser.add_argument(flag, metavar="FILE", default=default, help=help_text)


@dataclass(frozen=True)
class TlsFile:
    """One TLS file a command was given, and where it came from: what an error names."""

    path: str
    source: str  # the flag ("--tls-ca") or the variable ("$KVBUDGET_TLS_CA")


@dataclass(frozen=True)
class TlsFiles:
    """The CA, client certificate and key of one command; any may be missing (checked by
    `channel_credentials`). Empty: plaintext."""

    ca: TlsFile | None = None
    cert: TlsFile | None = None
    key: TlsFile | None = None

    def __bool__(self) -> bool:
        return any((self.ca, self.cert, self.key))

    def as_flags(self) -> list[str]:
        """The flags that give another `kvbudget` command the same files (`kvbudget replay`,
        started by the dashboard). Paths are no secret, so a command line may carry them."""
        flags: list[str] = []
        for flag, file in (("--tls-ca", self.ca), ("--tls-cert", self.cert), ("--tls-key", self.key)):
            if file is not None:
                flags += [flag, file.path]
        return flags


NO_TLS = TlsFiles()


def is_tcp_target(target: str) -> bool:
    """Whether `target` (checked) is a TCP address, the only kind the daemon serves TLS on."""
    return not target.startswith(("unix:", "unix-abstract:"))


def resolve_tls(target: str, ca: str | None, cert: str | None, key: str | None) -> TlsFiles:
    """The TLS files for `target` (checked): each flag if given, else its variable.

    A TLS flag with a unix socket is refused (one line): the socket is plaintext and the
    flag would do nothing, which would hide a wrong --target. The variables are ignored for
    a unix socket: they are for the remote daemon the environment points at.
    """
    given = [(flag, value) for flag, value in (("--tls-ca", ca), ("--tls-cert", cert), ("--tls-key", key)) if value]
    tcp = is_tcp_target(target)
    if given and not tcp:
        flag, value = given[0]
        raise CLIError(f"{flag} {value}: TLS is for TCP targets, and {target} is a unix socket "
                       "(plaintext: its file mode is the guard)")  # fmt: skip

    def pick(flag: str, value: str | None, env: str) -> TlsFile | None:
        if value:
            return TlsFile(value, flag)
        from_env = os.environ.get(env) if tcp else None
        return TlsFile(from_env, f"${env}") if from_env else None

    return TlsFiles(
        ca=pick("--tls-ca", ca, TLS_CA_ENV),
        cert=pick("--tls-cert", cert, TLS_CERT_ENV),
        key=pick("--tls-key", key, TLS_KEY_ENV),
    )


def channel_credentials(tls: TlsFiles) -> grpc.ChannelCredentials | None:
    """TLS credentials from `tls`: trusting its CA, presenting its client certificate if it
    has one; None (plaintext) when it is empty.

    Every file is read and checked here, so a mistake is one CLIError naming the flag (or
    variable) and the file, before any call; grpc would only say UNAVAILABLE, later.
    """
    if not tls:
        return None
    client = _client_pair(tls)
    if tls.ca is None:
        given = " and ".join(f.source for f in (tls.cert, tls.key) if f is not None)
        raise CLIError(f"{given} need --tls-ca (or ${TLS_CA_ENV}) too: the CA that signed the daemon's "
                       "certificate (for a public CA: the system bundle)")  # fmt: skip
    root = _certificates(tls.ca)
    chain = private_key = None
    if client is not None:
        cert, key = client
        chain = _certificates(cert)
        private_key = _private_key(key, cert)
    import grpc

    return grpc.ssl_channel_credentials(root_certificates=root, private_key=private_key, certificate_chain=chain)


def _client_pair(tls: TlsFiles) -> tuple[TlsFile, TlsFile] | None:
    """(certificate, key), or None for no client certificate; one without the other is refused."""
    if tls.cert is not None and tls.key is not None:
        return tls.cert, tls.key
    if tls.cert is not None:
        raise CLIError(f"{tls.cert.source} {tls.cert.path} needs --tls-key (or ${TLS_KEY_ENV}) too: "
                       "the client certificate's private key")  # fmt: skip
    if tls.key is not None:
        raise CLIError(f"{tls.key.source} {tls.key.path} needs --tls-cert (or ${TLS_CERT_ENV}) too: "
                       "the client certificate it is the key of")  # fmt: skip
    return None


_CERTIFICATE_MARKER = b"-----BEGIN CERTIFICATE-----"


def _read(file: TlsFile) -> bytes:
    try:
        with open(file.path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise CLIError(f"{file.source}: cannot read {file.path}: {exc.strerror}") from None


def _certificates(file: TlsFile) -> bytes:
    """The PEM certificate(s) in `file`, parsed once by OpenSSL so that a bad one is named here."""
    import ssl

    pem = _read(file)
    if _CERTIFICATE_MARKER not in pem:
        raise CLIError(f"{file.source} {file.path}: no PEM certificate in it")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=pem.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError):
        raise CLIError(f"{file.source} {file.path}: a certificate in it does not parse") from None
    return pem


def _private_key(key: TlsFile, cert: TlsFile) -> bytes:
    """The key in `key`, checked to be an unencrypted PEM key that matches `cert` (parsed)."""
    import ssl

    pem = _read(key)
    not_a_key = CLIError(f"{key.source} {key.path}: not an unencrypted PEM private key")
    if b"PRIVATE KEY-----" not in pem or b"ENCRYPTED" in pem:
        raise not_a_key
    try:
        # The empty password: an encrypted key fails here instead of prompting on the terminal.
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert.path, key.path, password=lambda: b"")
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise CLIError(f"{key.source} {key.path}: the key does not match the certificate in {cert.path}") from None
        raise not_a_key from None
    except OSError as exc:  # gone since it was read
        raise CLIError(f"{key.source}: cannot read {key.path}: {exc.strerror}") from None
    return pem
