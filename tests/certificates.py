"""TLS certificates for the tests, made by the `openssl` command (the test is skipped
where it is missing): self-signed ones, and a CA with certificates it signs (mutual TLS);
and what `openssl` itself says of them."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc


def run_openssl(*args: str, cwd: Path | None = None) -> str:
    """`openssl ARGS` (in `cwd`), its stdout; the test is skipped where openssl is missing."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: it makes the certificates this test serves")
    return subprocess.run(["openssl", *args], check=True, capture_output=True, text=True, timeout=60,
                          cwd=cwd).stdout


def make_pair(directory: Path, name: str, days: int = 1) -> tuple[Path, Path]:
    """(certificate, key) for localhost, an EC P-256 key (quick to make), valid `days`."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    run_openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(cert), "-days", str(days), "-subj", f"/CN=localhost/O={name}",
             "-addext", "subjectAltName=DNS:localhost")
    return cert, key


def make_ca(directory: Path, name: str, days: int = 1) -> tuple[Path, Path]:
    """(certificate, key) of a CA named `name` that `make_signed` signs with, valid `days`."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    run_openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(cert), "-days", str(days), "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    return cert, key


def make_signed(directory: Path, name: str, ca: tuple[Path, Path], common_name: str = "localhost") -> tuple[Path, Path]:
    """(certificate, key) signed by `ca` (`make_ca`), for `common_name` (also its DNS name),
    good for a server or a client, valid a day."""
    cert, key, request = directory / f"{name}.pem", directory / f"{name}.key", directory / f"{name}.csr"
    run_openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(request), "-subj", f"/CN={common_name}/O={name}")
    extensions = directory / f"{name}.ext"
    extensions.write_text(f"subjectAltName=DNS:{common_name}\nextendedKeyUsage=serverAuth,clientAuth\n")
    run_openssl("x509", "-req", "-in", str(request), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
             "-out", str(cert), "-days", "1", "-extfile", str(extensions))
    return cert, key


def fingerprint(cert: Path) -> str:
    """`openssl x509 -fingerprint -sha256` of the (first) certificate in `cert`."""
    line = run_openssl("x509", "-noout", "-fingerprint", "-sha256", "-in", str(cert)).strip()
    return line.split("=", 1)[1]  # "sha256 Fingerprint=AB:CD:..."


def not_after_unix_s(cert: Path) -> float:
    """`openssl x509 -enddate` of the (first) certificate in `cert`, as unix time."""
    line = run_openssl("x509", "-noout", "-enddate", "-in", str(cert)).strip()
    return float(ssl.cert_time_to_seconds(line.split("=", 1)[1]))  # "notAfter=Dec  2 21:22:40 2026 GMT"


async def new_connection(address: str, trusted: Path, client: tuple[Path, Path] | None = None) -> str:
    """Health Check over a new TLS connection to `address` ("localhost:PORT") that trusts
    only the certificate in `trusted`, presenting `client` (certificate, key) if given:
    "ok", or the status it failed with."""
    credentials = grpc.ssl_channel_credentials(
        root_certificates=trusted.read_bytes(),
        private_key=client[1].read_bytes() if client else None,
        certificate_chain=client[0].read_bytes() if client else None,
    )
    options = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own, never one reused
    async with grpc.aio.secure_channel(address, credentials, options=options) as channel:
        try:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        except grpc.aio.AioRpcError as error:
            return error.code().name
    return "ok"
