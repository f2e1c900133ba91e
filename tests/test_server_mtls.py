"""Mutual TLS on a real daemon (`tls_client_ca_file`): a TCP client without a certificate
the CA signed never gets past the handshake; roles come from the tokens, or from the
certificate's name where the tokens file's [certificates] lists it (with no tokens file,
every client the CA certified is admin); the CA file and the names are read again on
SIGHUP. And TLS with neither tokens nor client certificates is said at start to let
anyone in."""

from __future__ import annotations

import signal
import urllib.request
from pathlib import Path

import grpc
import pytest

from kvbudget.client import EngineClient
from kvbudget.daemon.core.records import RequestSpec
from kvbudget.v1 import admin_pb2, admin_pb2_grpc, common_pb2, observer_pb2, observer_pb2_grpc

from certificates import make_ca, make_signed, new_connection, not_after_unix_s
from daemon_harness import DaemonProcess, await_until, free_port

pytestmark = pytest.mark.slow

OBSERVER_TOKEN = "observer-token-0123"
ADMIN_TOKEN = "admin-token-0123456"



def _channel(address: str, ca: Path, client: tuple[Path, Path]) -> grpc.aio.Channel:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(), private_key=client[1].read_bytes(), certificate_chain=client[0].read_bytes())
    return grpc.aio.secure_channel(address, credentials, options=[("grpc.use_local_subchannel_pool", 1)])


async def _code(call) -> str:
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return error.code().name
    return "ok"


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def _config(path: Path, server: tuple[Path, Path], ca: Path, tokens: Path | None = None) -> Path:
    text = f"[server]\ntls_cert_file = '{server[0]}'\ntls_key_file = '{server[1]}'\ntls_client_ca_file = '{ca}'\n"
    if tokens is not None:
        text += f"tokens_file = '{tokens}'\n"
    path.write_text(text)
    return path


async def test_with_tokens_a_client_needs_a_certificate_and_a_token_and_a_new_ca_takes_over(tmp_path) -> None:
    ca = make_ca(tmp_path, "ca")
    next_ca = make_ca(tmp_path, "next-ca", days=30)
    server = make_signed(tmp_path, "server", ca)
    dashboard = make_signed(tmp_path, "dashboard", ca, "dashboard-0")
    renewed_dashboard = make_signed(tmp_path, "renewed-dashboard", next_ca, "dashboard-0")
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'observer = ["{OBSERVER_TOKEN}"]\nadmin = ["{ADMIN_TOKEN}"]\n')
    ca_file = tmp_path / "client-ca.pem"
    ca_file.write_bytes(ca[0].read_bytes())
    config = _config(tmp_path / "kvbudget.toml", server, ca_file, tokens)
    address = f"localhost:{free_port()}"
    metrics_port = free_port()

    def client_ca_expiry() -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        return float(next(line for line in text.splitlines()
                          if line.startswith("kvbudget_tls_client_ca_expiry_timestamp_seconds ")).split()[1])

    with DaemonProcess(tmp_path, "--config", str(config), "--metrics-address", f"127.0.0.1:{metrics_port}",
                       listen=(f"unix://{tmp_path}/kvbudget.sock", address)) as daemon:
        assert client_ca_expiry() == not_after_unix_s(ca[0])
        assert f"tls client certificates required, signed by {ca_file}: 1 CA certificate, valid until " in daemon.stderr()
        assert "has the admin role" not in daemon.stderr()
        assert await new_connection(address, ca[0]) == "UNAVAILABLE"  # no certificate: no handshake
        async with _channel(address, ca[0], dashboard) as channel:
            observer = observer_pb2_grpc.ObserverServiceStub(channel)
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            snapshot = observer_pb2.GetSnapshotRequest()
            # The certificate lets the client connect; what it may do is still its token's.
            assert await _code(observer.GetSnapshot(snapshot, timeout=10)) == "UNAUTHENTICATED"
            assert await _code(observer.GetSnapshot(snapshot, metadata=_bearer(OBSERVER_TOKEN), timeout=10)) == "ok"
            guaranteed = admin_pb2.SetPolicyRequest(policy=common_pb2.POLICY_GUARANTEED)
            assert await _code(admin.SetPolicy(guaranteed, metadata=_bearer(OBSERVER_TOKEN), timeout=10)) == (
                "PERMISSION_DENIED")
            assert await _code(admin.SetPolicy(guaranteed, metadata=_bearer(ADMIN_TOKEN), timeout=10)) == "ok"

        ca_file.write_bytes(next_ca[0].read_bytes())  # the clients' CA replaced in place
        daemon.signal(signal.SIGHUP)

        async def reloaded() -> bool:
            return "reloaded:" in daemon.stderr()

        await await_until(reloaded)
        said = daemon.stderr().split("INFO: reloaded: ")[1].splitlines()[0].split("; ")
        assert any(item.startswith(f"tls client CA {ca_file}: 1 CA certificate, valid until ") for item in said), said
        assert client_ca_expiry() == not_after_unix_s(next_ca[0]) > not_after_unix_s(ca[0])
        assert await new_connection(address, ca[0], renewed_dashboard) == "ok"
        assert await new_connection(address, ca[0], dashboard) == "UNAVAILABLE"  # the old CA's


async def test_without_tokens_every_client_the_ca_signed_is_admin(tmp_path) -> None:
    ca = make_ca(tmp_path, "ca")
    other_ca = make_ca(tmp_path, "other-ca")
    server = make_signed(tmp_path, "server", ca)
    oncall = make_signed(tmp_path, "oncall", ca, "oncall")
    stranger = make_signed(tmp_path, "stranger", other_ca, "oncall")  # the same name, another CA
    config = _config(tmp_path / "kvbudget.toml", server, ca[0])
    address = f"localhost:{free_port()}"
    with DaemonProcess(tmp_path, "--config", str(config), listen=(f"unix://{tmp_path}/kvbudget.sock", address)) as daemon:
        assert "has the admin role" not in daemon.stderr()  # the CA is the guard
        async with _channel(address, ca[0], oncall) as channel:
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            request = admin_pb2.SetPolicyRequest(policy=common_pb2.POLICY_GUARANTEED)
            assert await _code(admin.SetPolicy(request, timeout=10)) == "ok"
        async with _channel(address, ca[0], stranger) as channel:
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            request = admin_pb2.SetPolicyRequest(policy=common_pb2.POLICY_OPTIMISTIC)
            assert await _code(admin.SetPolicy(request, timeout=10)) == "UNAVAILABLE"
        rows = daemon.decision_rows("kind = 'policy'")
        assert [row["policy"] for row in rows] == ["guaranteed"]  # the stranger changed nothing


def test_tls_without_tokens_or_client_certificates_is_said_to_let_anyone_in(tmp_path) -> None:
    ca = make_ca(tmp_path, "ca")
    server = make_signed(tmp_path, "server", ca)
    address = f"127.0.0.1:{free_port()}"
    with DaemonProcess(tmp_path, "--tls-cert-file", str(server[0]), "--tls-key-file", str(server[1]),
                       listen=(f"unix://{tmp_path}/kvbudget.sock", address)) as daemon:
        assert (f"WARNING: listen {address}: TLS without tokens_file or tls_client_ca_file: every client "
                "that reaches it has the admin role") in daemon.stderr()


async def test_the_tokens_file_gives_roles_to_certificate_names_and_a_reload_changes_them(tmp_path) -> None:
    """No token at all in the file: a certificate it does not name gets nothing (a tokens
    file that lists no token is no reason to trust every caller)."""
    ca = make_ca(tmp_path, "ca")
    server = make_signed(tmp_path, "server", ca)
    vllm = make_signed(tmp_path, "vllm", ca, "vllm-0")
    grafana = make_signed(tmp_path, "grafana", ca, "grafana")
    stranger = make_signed(tmp_path, "stranger", ca, "stranger")
    tokens = tmp_path / "tokens.toml"
    tokens.write_text('[certificates]\nengine = ["vllm-0"]\nobserver = ["grafana"]\n')
    config = _config(tmp_path / "kvbudget.toml", server, ca[0], tokens)
    address = f"localhost:{free_port()}"
    with DaemonProcess(tmp_path, "--config", str(config), listen=(f"unix://{tmp_path}/kvbudget.sock", address)) as daemon:
        credentials = grpc.ssl_channel_credentials(ca[0].read_bytes(), vllm[1].read_bytes(), vllm[0].read_bytes())
        engine = EngineClient(address, "vllm-0", credentials=credentials, heartbeat=False)
        await engine.open()  # the engine role, and no token
        decisions = await engine.step(submits=[RequestSpec("r1", prompt_tokens=16, max_new_tokens=16)])
        assert [d.kind.value for d in decisions] == ["admit"]
        await engine.close()
        snapshot = observer_pb2.GetSnapshotRequest()
        async with _channel(address, ca[0], grafana) as channel:
            assert await _code(observer_pb2_grpc.ObserverServiceStub(channel).GetSnapshot(snapshot, timeout=10)) == "ok"
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            request = admin_pb2.SetPolicyRequest(policy=common_pb2.POLICY_GUARANTEED)
            assert await _code(admin.SetPolicy(request, timeout=10)) == "PERMISSION_DENIED"
        async with _channel(address, ca[0], stranger) as channel:
            observer = observer_pb2_grpc.ObserverServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await observer.GetSnapshot(snapshot, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "this one names stranger" in refused.value.details()

            tokens.write_text('[certificates]\nengine = ["vllm-0"]\nobserver = ["grafana", "stranger"]\n')
            daemon.signal(signal.SIGHUP)

            async def reloaded() -> bool:
                return "reloaded:" in daemon.stderr()

            await await_until(reloaded)
            assert f"tokens from {tokens}: 0, certificate names: 3" in daemon.stderr()
            assert await _code(observer.GetSnapshot(snapshot, timeout=10)) == "ok"  # the same connection
