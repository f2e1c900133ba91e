"""The TLS certificate the daemon's TCP listeners present, replaceable while they serve
(`systemctl reload kvbudget` after a renewal), and the journal's warnings about its dates.
Reading and checking the files is `kvbudget.daemon.config.tls_files`.
"""

from __future__ import annotations

import logging
import time

import grpc

from kvbudget.daemon.config.tls_files import CertificatePair, ClientAuthority, utc_text

log = logging.getLogger("kvbudget.daemon")


def _configuration(pair: CertificatePair, client_ca: ClientAuthority | None) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration(
        [(pair.key_pem, pair.cert_pem)], root_certificates=client_ca.pem if client_ca is not None else None
    )


class ServedCertificate:
    """The pair the listeners present now, and the CAs client certificates must chain to
    (mutual TLS; None: clients present none); `replace` makes new connections get others."""

    def __init__(self, pair: CertificatePair, client_ca: ClientAuthority | None = None) -> None:
        self.pair = pair
        self.client_ca = client_ca
        self._configuration = _configuration(pair, client_ca)
        _warn_if_not_yet_valid(pair)

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

        return grpc.dynamic_ssl_server_credentials(
            taken, fetch, require_client_authentication=self.client_ca is not None
        )

    def replace(self, pair: CertificatePair | None = None, client_ca: ClientAuthority | None = None) -> None:
        """Serves `pair` and/or verifies clients against `client_ca` from the next
        handshake on; None keeps what is served. (Client certificates cannot be turned on
        or off here: each listener fixed that when it was made.)"""
        if client_ca is not None and self.client_ca is None:
            raise ValueError("client certificates are not required by these listeners: that takes a restart")
        pair = pair if pair is not None else self.pair
        client_ca = client_ca if client_ca is not None else self.client_ca
        self._configuration = _configuration(pair, client_ca)
        if pair is not self.pair:
            _warn_if_not_yet_valid(pair)
        self.pair, self.client_ca = pair, client_ca


def _warn_if_not_yet_valid(pair: CertificatePair) -> None:
    """Said when a pair starts being served: clients refuse it until its notBefore, and
    "valid until" alone would read as all is well."""
    if pair.not_yet_valid(time.time()):
        log.warning("tls certificate %s is not valid before %s: clients refuse it until then (a certificate "
                    "issued ahead of time, or this host's clock behind)", pair.cert_file, utc_text(pair.not_before_unix_s))


def warn_if_expired(pair: CertificatePair | None, client_ca: ClientAuthority | None = None) -> None:
    """Said at start and at each reload: an expired certificate is still served (as nginx
    does: renewing it is the operator's; refusing to start would end every session)."""
    now = time.time()
    if pair is not None and pair.expired(now):
        log.warning("tls certificate %s has expired: clients refuse it; renew it, then systemctl reload kvbudget",
                    pair.cert_file)
    if client_ca is not None and client_ca.expired(now):
        log.warning("tls client CA %s: a CA certificate in it has expired: the clients it signed are refused; "
                    "renew it, then systemctl reload kvbudget", client_ca.ca_file)
