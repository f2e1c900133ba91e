"""The TLS certificate the daemon's TCP listeners present, checked before use and
replaceable while they serve (`systemctl reload kvbudget` after a renewal).

A daemon runs for weeks; certificates are renewed more often than that (an internal CA's
24 h or 90-day certificates). Restarting to pick up a renewed one would end every
engine's session, so the listeners are built on gRPC's dynamic server credentials:
before each new connection's handshake, gRPC asks a fetcher whether the certificate
changed. A reload reads the files again, checks the pair, and hands it over; connections
already open keep the certificate they were made with, new ones get the new one.

A pair is checked with the `ssl` module before gRPC sees it, because gRPC's own failure
is one line that names neither file ("Failed to bind to address"), at start, and at a
reload would come only at the next client's handshake, as a connection refused. Checked:
the certificate file holds PEM certificates that parse, and the key file an unencrypted
PEM key (gRPC takes no passphrase) that matches the first certificate.
"""

from __future__ import annotations

import hashlib
import re
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

_PEM_CERTIFICATE = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n.+?\r?\n-----END CERTIFICATE-----", re.DOTALL)


class TlsError(ValueError):
    """A certificate or key that cannot be served; `field` names the config key to fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class CertificatePair:
    """A checked certificate chain and its key, as read from the files."""

    cert_file: str
    cert_pem: bytes
    key_pem: bytes
    fingerprint: str  # SHA-256 of the first certificate, as `openssl x509 -fingerprint -sha256` shows it

    def __repr__(self) -> str:  # (the key stays out of logs and tracebacks)
        return f"CertificatePair({self.cert_file!r}, sha256 {self.fingerprint})"


def _no_passphrase() -> bytes:
    # An encrypted key would make OpenSSL ask for its passphrase on the terminal.
    return b""


def read_pair(cert_file: str, key_file: str) -> CertificatePair:
    """Reads and checks a certificate chain and its private key; TlsError names the culprit."""
    cert_pem = _read(cert_file, "tls_cert_file")
    key_pem = _read(key_file, "tls_key_file")
    certificates = _PEM_CERTIFICATE.findall(cert_pem)
    if not certificates:
        raise TlsError("tls_cert_file", f"{cert_file}: no PEM certificate in it (-----BEGIN CERTIFICATE-----)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_verify_locations(cadata=b"\n".join(certificates).decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError) as exc:
        raise TlsError("tls_cert_file", f"{cert_file}: a certificate in it does not parse ({_why(exc)})") from None
    try:
        context.load_cert_chain(cert_file, key_file, password=_no_passphrase)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            message = f"{key_file}: the key does not match the certificate in {cert_file}"
        else:
            message = f"{key_file}: not an unencrypted PEM private key ({_why(exc)})"
        raise TlsError("tls_key_file", message) from None
    der = ssl.PEM_cert_to_DER_cert(certificates[0].decode("ascii"))
    digest = hashlib.sha256(der).hexdigest().upper()
    fingerprint = ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))
    return CertificatePair(cert_file, cert_pem, key_pem, fingerprint)


def _read(path: str, field: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise TlsError(field, f"cannot read {path} ({exc.strerror or exc})") from None


def _why(exc: Exception) -> str:
    return str(getattr(exc, "reason", None) or exc)


def _configuration(pair: CertificatePair) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(pair.key_pem, pair.cert_pem)])


class ServedCertificate:
    """The pair the listeners present now; `replace` makes new connections get another."""

    def __init__(self, pair: CertificatePair) -> None:
        self.pair = pair
        self._configuration = _configuration(pair)

    def credentials(self) -> grpc.ServerCredentials:
        """Credentials for ONE listener: each notes which configuration it last took, so
        two listeners sharing a fetcher would leave the second on the old certificate."""
        taken = self._configuration

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            # gRPC calls this on its own thread before each new connection's handshake;
            # None keeps the certificate that listener has.
            nonlocal taken
            configuration = self._configuration  # (one read: replace() may run meanwhile)
            if configuration is taken:
                return None
            taken = configuration
            return configuration

        return grpc.dynamic_ssl_server_credentials(taken, fetch)

    def replace(self, pair: CertificatePair) -> None:
        self._configuration = _configuration(pair)
        self.pair = pair
