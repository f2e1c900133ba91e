"""TLS files as the config names them: the certificate pair the daemon serves and the CAs client
certificates must chain to, read and checked with `ssl` (gRPC's own failure names neither
file), with their validity dates for the journal and /metrics. No grpc here: `--check-config`
reads them too; serving them is `kvbudget.daemon.server.tls`.
"""

from __future__ import annotations

import calendar
import hashlib
import os
import re
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

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
    not_after_unix_s: float  # when the first certificate expires; 0.0: could not be read
    # From when it is valid: before that every client refuses it as it does an expired one
    # (a certificate issued ahead, or this host's clock behind). 0.0: could not be read.
    not_before_unix_s: float = 0.0

    def __repr__(self) -> str:  # (the key stays out of logs and tracebacks)
        return f"CertificatePair({self.cert_file!r}, sha256 {self.fingerprint})"

    def describe(self) -> str:
        """`PATH: sha256 AB:..., valid until 2026-12-31 23:59:59 UTC`, for the journal (with
        `, not valid before ...` first while that is still to come)."""
        ahead = f", not valid before {utc_text(self.not_before_unix_s)}" if self.not_yet_valid(time.time()) else ""
        until = f", valid until {utc_text(self.not_after_unix_s)}" if self.not_after_unix_s else ""
        return f"{self.cert_file}: sha256 {self.fingerprint}{ahead}{until}"

    def expired(self, now: float) -> bool:
        return 0.0 < self.not_after_unix_s <= now

    def not_yet_valid(self, now: float) -> bool:
        return self.not_before_unix_s > now


def key_file_warnings(key_file: str) -> list[str]:
    """A private key every user of the host may read, said as a tokens file is (at start, on
    reload, in --check-config): it is the daemon's identity; the guide asks for mode 0640."""
    try:
        mode = os.stat(key_file).st_mode
    except OSError:
        return []
    if mode & 0o004:
        return [f"tls_key_file: {key_file} is readable by every user (mode {mode & 0o777:04o}): "
                "make it 0640, owned by root and the daemon's group"]
    return []


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
    digest = hashlib.sha256(ssl.PEM_cert_to_DER_cert(certificates[0].decode("ascii"))).hexdigest().upper()
    fingerprint = ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))
    not_before, not_after = _validity(certificates[0])
    return CertificatePair(cert_file, cert_pem, key_pem, fingerprint, not_after, not_before)


def _validity(certificate_pem: bytes) -> tuple[float, float]:
    """(notBefore, notAfter) of one PEM certificate, as unix time; 0.0 for one that cannot be
    read (OpenSSL parsed it all the same: it is served, its dates unknown)."""
    try:
        return _validity_unix_s(ssl.PEM_cert_to_DER_cert(certificate_pem.decode("ascii")))
    except (IndexError, ValueError):
        return 0.0, 0.0


def _expiry(certificate_pem: bytes) -> float:
    """notAfter of one PEM certificate, as unix time; 0.0 when it cannot be read."""
    return _validity(certificate_pem)[1]


def utc_text(unix_s: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix_s))


@dataclass(frozen=True)
class ClientAuthority:
    """The CA certificates a client's certificate must chain to (mutual TLS), as read."""

    ca_file: str
    pem: bytes  # the file's certificates, and nothing else of it
    num_certificates: int
    # When the first of them expires: from then on the clients it signed are refused
    # (unless another in the file signed them too). 0.0: could not be read.
    not_after_unix_s: float = 0.0

    def describe(self) -> str:
        """`PATH: 2 CA certificates, the first expires 2027-06-30 00:00:00 UTC`, for the journal."""
        plural = "s" if self.num_certificates != 1 else ""
        until = ""
        if self.not_after_unix_s:
            first = "the first expires" if self.num_certificates > 1 else "valid until"
            until = f", {first} {utc_text(self.not_after_unix_s)}"
        return f"{self.ca_file}: {self.num_certificates} CA certificate{plural}{until}"

    def expired(self, now: float) -> bool:
        return 0.0 < self.not_after_unix_s <= now


def read_client_ca(ca_file: str) -> ClientAuthority:
    """Reads and checks the CA certificates client certificates are verified against;
    TlsError names `tls_client_ca_file`. A file with no certificate in it would make gRPC
    refuse every client at its handshake, with no word of why on the daemon's side."""
    field = "tls_client_ca_file"
    certificates = _PEM_CERTIFICATE.findall(_read(ca_file, field))
    if not certificates:
        raise TlsError(field, f"{ca_file}: no PEM certificate in it (-----BEGIN CERTIFICATE-----)")
    pem = b"\n".join(certificates) + b"\n"
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(cadata=pem.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError) as exc:
        raise TlsError(field, f"{ca_file}: a certificate in it does not parse ({_why(exc)})") from None
    known = [expiry for expiry in map(_expiry, certificates) if expiry]
    return ClientAuthority(ca_file, pem, len(certificates), min(known, default=0.0))


def _tlv(der: bytes, pos: int) -> tuple[int, int, int]:
    """The DER element at `pos`: (tag, where its contents start, where they end)."""
    tag, length, start = der[pos], der[pos + 1], pos + 2
    if length & 0x80:  # long form: the next (length & 0x7f) bytes are the length
        size = length & 0x7F
        length, start = int.from_bytes(der[start : start + size], "big"), start + size
    return tag, start, start + length


def _validity_unix_s(der: bytes) -> tuple[float, float]:
    """X.509's validity (notBefore, notAfter): Certificate = SEQUENCE { TBSCertificate =
    SEQUENCE { [0] version (optional), serialNumber, signature, issuer, validity = SEQUENCE {
    notBefore, notAfter }, ... }, ... }. The `ssl` module has no public way to read it
    for a certificate that is not a CA's."""
    _, certificate, _ = _tlv(der, 0)
    _, position, _ = _tlv(der, certificate)  # the TBSCertificate's first element
    tag, _, end = _tlv(der, position)
    if tag == 0xA0:  # the version
        position = end
    for _ in range(3):  # serialNumber, signature, issuer
        position = _tlv(der, position)[2]
    _, validity, _ = _tlv(der, position)
    not_before = _tlv(der, validity)
    return _asn1_time(der, *not_before), _asn1_time(der, *_tlv(der, not_before[2]))


def _asn1_time(der: bytes, tag: int, start: int, end: int) -> float:
    """A UTCTime or GeneralizedTime element's contents, as unix time."""
    text = der[start:end].decode("ascii")
    if tag == 0x17:  # UTCTime, YYMMDDHHMMSSZ: years 1950-2049
        year, rest = int(text[:2]), text[2:]
        year += 1900 if year >= 50 else 2000
    elif tag == 0x18:  # GeneralizedTime, YYYYMMDDHHMMSSZ
        year, rest = int(text[:4]), text[4:]
    else:
        raise ValueError(f"validity time of tag {tag:#x}")
    fields = (int(rest[i : i + 2]) for i in range(0, 10, 2))
    return float(calendar.timegm((year, *fields, 0, 0, 0)))


def _read(path: str, field: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise TlsError(field, f"cannot read {path} ({exc.strerror or exc})") from None


def _why(exc: Exception) -> str:
    return str(getattr(exc, "reason", None) or exc)
