"""The daemon's TLS certificate (daemon/server/tls.py): every bad pair named by its file, and a
replaced pair served to new connections by a real grpc.aio server, old ones kept; mutual
TLS: clients without a certificate from the client CA refused at the handshake, the CA
file replaced while serving."""

from __future__ import annotations

import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from kvbudget.daemon.config.tls_files import TlsError, read_client_ca, read_pair
from kvbudget.daemon.server.tls import ServedCertificate

from certificates import fingerprint, make_ca, make_pair, make_signed, new_connection, not_after_unix_s


def test_a_good_pair_reads_with_openssls_fingerprint(tmp_path) -> None:
    cert, key = make_pair(tmp_path, "a")
    pair = read_pair(str(cert), str(key))
    assert (pair.cert_pem, pair.key_pem) == (cert.read_bytes(), key.read_bytes())
    assert pair.fingerprint == fingerprint(cert)
    assert pair.not_after_unix_s == not_after_unix_s(cert)
    assert "PRIVATE" not in repr(pair)  # the key stays out of logs
    assert not pair.expired(pair.not_after_unix_s - 1) and pair.expired(pair.not_after_unix_s)
    until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(not_after_unix_s(cert)))
    assert pair.describe() == f"{cert}: sha256 {fingerprint(cert)}, valid until {until}"


def test_expiry_past_2049_is_read_too(tmp_path) -> None:
    """X.509 writes a time up to 2049 as UTCTime (two-digit year), later as GeneralizedTime."""
    cert, key = make_pair(tmp_path, "long", days=36500)
    pair = read_pair(str(cert), str(key))
    assert time.gmtime(pair.not_after_unix_s).tm_year > 2100
    assert pair.not_after_unix_s == not_after_unix_s(cert)


def test_every_bad_pair_names_the_file_to_fix(tmp_path) -> None:
    cert_a, key_a = make_pair(tmp_path, "a")
    _, key_b = make_pair(tmp_path, "b")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    broken = tmp_path / "broken.pem"  # the markers, but not a certificate inside
    broken.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    cases = [
        (cert_a, key_b, "tls_key_file", f"{key_b}: the key does not match the certificate in {cert_a}"),
        (garbage, key_a, "tls_cert_file", f"{garbage}: no PEM certificate in it"),
        (broken, key_a, "tls_cert_file", f"{broken}: a certificate in it does not parse"),
        (cert_a, cert_a, "tls_key_file", f"{cert_a}: not an unencrypted PEM private key"),
        (tmp_path / "none.pem", key_a, "tls_cert_file", f"cannot read {tmp_path / 'none.pem'}"),
        (cert_a, tmp_path / "none.key", "tls_key_file", f"cannot read {tmp_path / 'none.key'}"),
    ]
    for cert, key, field, message in cases:
        with pytest.raises(TlsError) as caught:
            read_pair(str(cert), str(key))
        assert caught.value.field == field, (cert, key)
        assert str(caught.value).startswith(message), str(caught.value)


async def test_a_replaced_pair_is_served_to_new_connections_on_every_listener(tmp_path) -> None:
    cert_a, key_a = make_pair(tmp_path, "a")
    cert_b, key_b = make_pair(tmp_path, "b")
    served = ServedCertificate(read_pair(str(cert_a), str(key_a)))
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health_aio.HealthServicer(), server)
    ports = [server.add_secure_port("localhost:0", served.credentials()) for _ in range(2)]
    await server.start()
    try:
        assert [await new_connection(f"localhost:{port}", cert_a) for port in ports] == ["ok", "ok"]
        old = grpc.aio.secure_channel(f"localhost:{ports[0]}", grpc.ssl_channel_credentials(cert_a.read_bytes()))
        health = health_pb2_grpc.HealthStub(old)
        await health.Check(health_pb2.HealthCheckRequest(), timeout=10)

        served.replace(read_pair(str(cert_b), str(key_b)))
        # Both listeners present B to new connections (one fetcher each: a shared one would
        # leave the second on A), and nothing trusting only A gets in any more.
        assert [await new_connection(f"localhost:{port}", cert_b) for port in ports] == ["ok", "ok"]
        assert [await new_connection(f"localhost:{port}", cert_a) for port in ports] == ["UNAVAILABLE", "UNAVAILABLE"]
        assert served.pair.fingerprint == fingerprint(cert_b)
        # The connection made before keeps going with the certificate it was made with.
        reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        await old.close()
    finally:
        await server.stop(0)


def test_an_expired_certificate_is_served_but_the_journal_says_so(tmp_path, caplog) -> None:
    """(As nginx does: it is the operator's to renew; refusing to start would end every session.)"""
    import dataclasses
    import logging

    from kvbudget.daemon.server.tls import warn_if_expired

    cert, key = make_pair(tmp_path, "a")
    pair = read_pair(str(cert), str(key))
    with caplog.at_level(logging.WARNING, logger="kvbudget.daemon"):
        warn_if_expired(pair)
        assert caplog.records == []
        warn_if_expired(dataclasses.replace(pair, not_after_unix_s=time.time() - 60))
    assert [r.getMessage() for r in caplog.records] == [
        f"tls certificate {cert} has expired: clients refuse it; renew it, then systemctl reload kvbudget"]


def test_a_client_ca_file_keeps_only_its_certificates_and_counts_them(tmp_path) -> None:
    ca_a, _ = make_ca(tmp_path, "ca-a")
    ca_b, _ = make_ca(tmp_path, "ca-b")
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(b"# two CAs\n" + ca_a.read_bytes() + b"\n" + ca_b.read_bytes())
    client_ca = read_client_ca(str(bundle))
    assert client_ca.num_certificates == 2 and b"# two CAs" not in client_ca.pem
    first = min(not_after_unix_s(ca_a), not_after_unix_s(ca_b))
    assert client_ca.not_after_unix_s == first
    assert client_ca.describe() == f"{bundle}: 2 CA certificates, the first expires {_utc(first)}"
    assert read_client_ca(str(ca_a)).describe() == f"{ca_a}: 1 CA certificate, valid until {_utc(not_after_unix_s(ca_a))}"
    assert not client_ca.expired(first - 1) and client_ca.expired(first)


def _utc(unix_s: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix_s))


def test_every_bad_client_ca_file_is_named(tmp_path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    broken = tmp_path / "broken.pem"
    broken.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    cases = [
        (garbage, f"{garbage}: no PEM certificate in it"),
        (broken, f"{broken}: a certificate in it does not parse"),
        (tmp_path / "none.pem", f"cannot read {tmp_path / 'none.pem'}"),
    ]
    for path, message in cases:
        with pytest.raises(TlsError) as caught:
            read_client_ca(str(path))
        assert caught.value.field == "tls_client_ca_file"
        assert str(caught.value).startswith(message), str(caught.value)


async def test_mutual_tls_lets_in_only_clients_the_ca_signed_and_a_new_ca_takes_over(tmp_path) -> None:
    ca, ca_key = make_ca(tmp_path, "ca")
    other_ca, other_key = make_ca(tmp_path, "other-ca")
    server_pair = make_signed(tmp_path, "server", (ca, ca_key))
    engine = make_signed(tmp_path, "engine", (ca, ca_key), "engine-0")
    stranger = make_signed(tmp_path, "stranger", (other_ca, other_key), "engine-1")
    self_signed = make_pair(tmp_path, "self-signed")
    served = ServedCertificate(read_pair(str(server_pair[0]), str(server_pair[1])), read_client_ca(str(ca)))
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health_aio.HealthServicer(), server)
    address = f"localhost:{server.add_secure_port('localhost:0', served.credentials())}"
    await server.start()
    try:
        assert await new_connection(address, ca, engine) == "ok"
        assert await new_connection(address, ca) == "UNAVAILABLE"  # no certificate
        assert await new_connection(address, ca, stranger) == "UNAVAILABLE"  # another CA's
        assert await new_connection(address, ca, self_signed) == "UNAVAILABLE"

        served.replace(client_ca=read_client_ca(str(other_ca)))  # the server's own pair stays
        assert await new_connection(address, ca, stranger) == "ok"
        assert await new_connection(address, ca, engine) == "UNAVAILABLE"
        assert served.pair.fingerprint == fingerprint(server_pair[0])
    finally:
        await server.stop(0)


def test_client_certificates_cannot_be_turned_on_while_serving(tmp_path) -> None:
    cert, key = make_pair(tmp_path, "a")
    ca, _ = make_ca(tmp_path, "ca")
    served = ServedCertificate(read_pair(str(cert), str(key)))
    with pytest.raises(ValueError, match="takes a restart"):
        served.replace(client_ca=read_client_ca(str(ca)))
    assert served.client_ca is None


def test_an_expired_client_ca_is_said_too(tmp_path, caplog) -> None:
    import dataclasses
    import logging

    from kvbudget.daemon.server.tls import warn_if_expired

    ca, _ = make_ca(tmp_path, "ca")
    client_ca = read_client_ca(str(ca))
    with caplog.at_level(logging.WARNING, logger="kvbudget.daemon"):
        warn_if_expired(None, client_ca)
        assert caplog.records == []
        warn_if_expired(None, dataclasses.replace(client_ca, not_after_unix_s=time.time() - 60))
    assert [r.getMessage() for r in caplog.records] == [
        f"tls client CA {ca}: a CA certificate in it has expired: the clients it signed are refused; "
        "renew it, then systemctl reload kvbudget"]
