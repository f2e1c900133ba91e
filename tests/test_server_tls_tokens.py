"""QA: certificates and tokens files as an operator gets them wrong.

A certificate that is not valid yet (issued ahead, or a host clock behind) is refused by
every client exactly as an expired one is, so the journal says so at start and at each
reload, as it does for an expired one. Bad tokens files are one line that names the key
and never the token. Client commands drop the whitespace a token read from a file
carries, instead of failing in gRPC with "Invalid metadata".
"""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from kvbudget.daemon.config.tls_files import read_pair
from kvbudget.daemon.server.tls import ServedCertificate
from kvbudget.client.errors import CLIError
from kvbudget.client.target import call_metadata, resolve_token

from certificates import make_pair, run_openssl
from daemon_harness import DEFAULT_ARGS, DaemonProcess, wait_until

CA_CONFIG = """[ ca ]
default_ca = qa
[ qa ]
dir = .
database = ./index.txt
new_certs_dir = .
serial = ./serial
default_md = sha256
policy = anything
copy_extensions = copy
unique_subject = no
[ anything ]
commonName = supplied
"""


def _openssl(directory: Path, *args: str) -> None:
    run_openssl(*args, cwd=directory)  # (skips the test where openssl is missing)


def _dated_pair(directory: Path, name: str, start: str, end: str) -> tuple[Path, Path]:
    """(certificate, key) for localhost valid from `start` to `end` (YYYYMMDDHHMMSSZ), signed by
    a throwaway CA (`openssl ca` sets both dates; `req -x509` cannot set notBefore)."""
    ca_dir = directory / f"{name}-ca"
    ca_dir.mkdir()
    (ca_dir / "ca.cnf").write_text(CA_CONFIG)
    (ca_dir / "index.txt").write_text("")
    (ca_dir / "serial").write_text("01\n")
    _openssl(ca_dir, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=kvbt-ca",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    _openssl(ca_dir, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", "req.csr", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost")
    _openssl(ca_dir, "ca", "-batch", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile", "ca.key", "-in", "req.csr",
             "-out", str(cert), "-startdate", start, "-enddate", end, "-notext")
    return cert, key


# ------------------------------------------------------------------ not valid yet

def test_a_certificate_not_valid_yet_is_said_when_read_and_when_served(tmp_path, caplog) -> None:
    cert, key = _dated_pair(tmp_path, "future", "20350101000000Z", "20360101000000Z")
    pair = read_pair(str(cert), str(key))
    assert pair.not_before_unix_s == 2051222400.0  # 2035-01-01 00:00:00 UTC
    assert pair.not_yet_valid(time.time()) and not pair.expired(time.time())
    assert "not valid before 2035-01-01 00:00:00 UTC" in pair.describe()
    with caplog.at_level(logging.WARNING):
        served = ServedCertificate(pair)
    assert any("not valid before 2035-01-01 00:00:00 UTC" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records)
    caplog.clear()
    good_cert, good_key = make_pair(tmp_path, "now")
    good = read_pair(str(good_cert), str(good_key))
    assert not good.not_yet_valid(time.time()) and "not valid before" not in good.describe()
    with caplog.at_level(logging.WARNING):
        served.replace(good)  # a renewal that is valid: nothing to say
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        served.replace(pair)  # a reload to one that is not valid yet
    assert any("not valid before" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_a_daemon_serving_a_certificate_not_valid_yet_says_so_at_start_and_at_reload(tmp_path) -> None:
    future_cert, future_key = _dated_pair(tmp_path, "future", "20350101000000Z", "20360101000000Z")
    cert, key = tmp_path / "served.pem", tmp_path / "served.key"
    cert.write_bytes(future_cert.read_bytes())
    key.write_bytes(future_key.read_bytes())
    config = tmp_path / "kvbudget.toml"
    config.write_text(f"[server]\ntls_cert_file = '{cert}'\ntls_key_file = '{key}'\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def warnings() -> list[str]:
        return [line for line in daemon.stderr().splitlines() if "WARNING" in line and "not valid before" in line]

    with DaemonProcess(tmp_path, "--config", str(config),
                       listen=(f"unix://{tmp_path}/kvbudget.sock", f"localhost:{port}")) as daemon:
        assert len(warnings()) == 1, daemon.stderr()  # at start
        good_cert, good_key = make_pair(tmp_path, "renewed")
        cert.write_bytes(good_cert.read_bytes())
        key.write_bytes(good_key.read_bytes())
        daemon.signal(signal.SIGHUP)
        wait_until(lambda: daemon.stderr().count("reloaded:") == 1)
        assert len(warnings()) == 1  # a renewal that is valid now: nothing more to say
        cert.write_bytes(future_cert.read_bytes())
        key.write_bytes(future_key.read_bytes())
        daemon.signal(signal.SIGHUP)
        wait_until(lambda: daemon.stderr().count("reloaded:") == 2)
        assert len(warnings()) == 2, daemon.stderr()  # a reload onto one issued ahead
        assert "not valid before 2035-01-01 00:00:00 UTC" in daemon.stderr().split("reloaded:")[2]


def test_an_expired_or_current_certificate_is_not_called_not_valid_yet(tmp_path) -> None:
    cert, key = _dated_pair(tmp_path, "old", "20200101000000Z", "20200102000000Z")
    pair = read_pair(str(cert), str(key))
    assert pair.expired(time.time()) and not pair.not_yet_valid(time.time())
    assert pair.not_before_unix_s == 1577836800.0
    assert "not valid before" not in pair.describe()


# ------------------------------------------------------------------ tokens files

def _check_config(tmp_path: Path, tokens_text: str, mode: int = 0o640) -> subprocess.CompletedProcess:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(tokens_text)
    tokens.chmod(mode)
    args = [sys.executable, "-m", "kvbudget", "daemon", *DEFAULT_ARGS, "--db-path", str(tmp_path / "d.db"),
            "--listen", "127.0.0.1:47001", "--tokens-file", str(tokens), "--check-config"]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("text, key, why", [
    ('engine = ["kvbt-secret-dup1"]\nadmin = ["kvbt-secret-dup1"]\n', "admin[0]", "already listed for role 'engine'"),
    ('root = ["kvbt-secret-root"]\n', "root", "unknown role 'root'"),
    ('engine = "kvbt-secret-str"\n', "engine", "must be a list"),
    ('engine = ["kvbt secret sp"]\n', "engine[0]", "without spaces"),
    ('engine = [kvbt-secret-bare]\n', "tokens file", "not valid TOML"),
    ('[certificates]\nroot = ["kvbt-secret-cn"]\n', "certificates.root", "unknown role"),
])
def test_a_bad_tokens_file_is_one_line_naming_the_key_never_the_token(tmp_path, text, key, why) -> None:
    result = _check_config(tmp_path, text)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvbudget daemon: error: tokens_file: "), result.stderr
    assert key in lines[0] and why in lines[0]
    assert "kvbt-secret" not in result.stderr and "kvbt secret" not in result.stderr


def test_an_empty_tokens_file_is_said(tmp_path) -> None:
    result = _check_config(tmp_path, "")
    assert "no token" in result.stdout + result.stderr


def test_a_tokens_file_every_user_may_read_is_said(tmp_path) -> None:
    result = _check_config(tmp_path, 'engine = ["kvbt-secret-wr1"]\n', mode=0o644)
    assert "0644" in result.stdout + result.stderr or "every user" in result.stdout + result.stderr


# ------------------------------------------------------------------ the client's token

def test_a_token_read_from_a_file_loses_its_newline(monkeypatch) -> None:
    """`--token "$(cat t)"` strips a trailing newline but not a CRLF file's \\r; a token from
    an env file may keep trailing blanks. gRPC refuses any of them in a header with
    INTERNAL "Invalid metadata", which names neither the token nor the fix."""
    assert resolve_token("kvbt-token-1234\r") == "kvbt-token-1234"
    assert resolve_token("  kvbt-token-1234\n") == "kvbt-token-1234"
    monkeypatch.setenv("KVBUDGET_TOKEN", "kvbt-token-1234\r\n")
    assert resolve_token(None) == "kvbt-token-1234"
    assert call_metadata(resolve_token(None)) == (("authorization", "Bearer kvbt-token-1234"),)
    monkeypatch.setenv("KVBUDGET_TOKEN", " \n")
    assert resolve_token(None) is None  # (nothing there: no header, as with no token)
    with pytest.raises(CLIError) as info:
        resolve_token("kvbt-token 1234")
    assert "kvbt-token" not in str(info.value) and "--token" in str(info.value)


@pytest.mark.slow
def test_a_token_with_a_carriage_return_still_reaches_the_daemon(tmp_path) -> None:
    """End to end: `kvbudget admin status --token "$(cat crlf-file)"` over TCP."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('observer = ["kvbt-observer-crlf"]\n')
    tokens.chmod(0o640)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    with DaemonProcess(tmp_path, "--tokens-file", str(tokens), listen=(f"unix://{tmp_path}/kvbudget.sock", address)):
        result = subprocess.run([sys.executable, "-m", "kvbudget", "admin", "status", "--target", address,
                                 "--token", "kvbt-observer-crlf\r"], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr


# ------------------------------------------------------------------ what a refused handshake says

def _failed_call(target: str, credentials: grpc.ChannelCredentials) -> grpc.RpcError:
    with grpc.secure_channel(target, credentials) as channel:
        with pytest.raises(grpc.RpcError) as failed:
            channel.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=10)
    return failed.value


def _server(credentials: grpc.ServerCredentials | None) -> tuple[grpc.Server, str]:
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_secure_port("localhost:0", credentials) if credentials else server.add_insecure_port("localhost:0")
    server.start()
    return server, f"localhost:{port}"


def test_tls_to_a_plaintext_port_is_not_blamed_on_the_ca(tmp_path) -> None:
    """A client given --tls-ca for a daemon that serves plaintext TCP (tokens only): the
    line said to check the CA, which was never looked at."""
    from kvbudget.client.target import rpc_error_line

    cert, _ = make_pair(tmp_path, "server")
    server, address = _server(None)
    try:
        line = rpc_error_line(address, _failed_call(address, grpc.ssl_channel_credentials(cert.read_bytes())))
    finally:
        server.stop(0)
    assert line.startswith(f"{address}: UNAVAILABLE: ")
    assert "does not speak TLS on this port" in line and "--tls-ca must be the CA" not in line


def test_a_certificate_for_another_host_is_named_as_such(tmp_path) -> None:
    from certificates import make_ca, make_signed
    from kvbudget.client.target import rpc_error_line

    ca = make_ca(tmp_path, "ca")
    cert, key = make_signed(tmp_path, "server", ca, common_name="not-this-host")
    server, address = _server(grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())]))
    try:
        line = rpc_error_line(address, _failed_call(address, grpc.ssl_channel_credentials(ca[0].read_bytes())))
    finally:
        server.stop(0)
    assert line.startswith(f"{address}: UNAVAILABLE: ")
    assert "does not name the host in --target" in line, line
