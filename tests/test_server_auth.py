"""Over TCP the daemon wants a bearer token, and the token's role limits what it may do."""

from __future__ import annotations


import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvbudget.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    engine_pb2,
    engine_pb2_grpc,
    observer_pb2,
    observer_pb2_grpc,
)

from certificates import make_pair
from daemon_harness import DaemonProcess, free_port

pytestmark = pytest.mark.slow
Code = grpc.StatusCode
TOKENS = {"engine": "engine-token-123", "observer": "observer-token-123", "admin": "admin-token-123"}



@pytest.fixture(scope="module")
def tcp(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("auth")
    tokens = workdir / "tokens.toml"
    tokens.write_text("".join(f'{role} = ["{token}"]\n' for role, token in TOKENS.items()))
    address = f"127.0.0.1:{free_port()}"
    process = DaemonProcess(workdir, "--tokens-file", str(tokens), listen=(f"unix://{workdir}/kvbudget.sock", address))
    with process:
        channel = grpc.insecure_channel(address)
        yield process, channel
        channel.close()


def _md(role: str | None, scheme: str = "Bearer"):
    return () if role is None else (("authorization", f"{scheme} {TOKENS.get(role, role)}"),)


def _rows(process: DaemonProcess) -> int:
    return len(process.decision_rows())


@pytest.mark.parametrize(
    "role, code",
    [(None, Code.UNAUTHENTICATED), ("not-a-token-xyz", Code.UNAUTHENTICATED), ("observer", None),
     ("engine", None), ("admin", None)],
)
def test_reading_needs_any_valid_token(tcp, role, code) -> None:
    process, channel = tcp
    stub = observer_pb2_grpc.ObserverServiceStub(channel)
    if code is None:
        assert stub.GetSnapshot(observer_pb2.GetSnapshotRequest(), metadata=_md(role)).snapshot.num_blocks == 64
    else:
        with pytest.raises(grpc.RpcError) as info:
            stub.GetSnapshot(observer_pb2.GetSnapshotRequest(), metadata=_md(role))
        assert info.value.code() == code
        assert info.value.details().startswith("authorization")


def test_observer_cannot_admit_and_engine_cannot_switch_policy(tcp) -> None:
    process, channel = tcp
    engine = engine_pb2_grpc.EngineServiceStub(channel)
    admin = admin_pb2_grpc.AdminServiceStub(channel)
    rows = _rows(process)
    refused = [
        (lambda: engine.OpenSession(engine_pb2.OpenSessionRequest(engine_id="spy"), metadata=_md("observer"))),
        (lambda: engine.Step(engine_pb2.StepRequest(session_id="x"), metadata=_md("observer"))),
        (lambda: admin.SetPolicy(admin_pb2.SetPolicyRequest(policy=common_pb2.POLICY_NAIVE), metadata=_md("engine"))),
        (lambda: admin.Drain(admin_pb2.DrainRequest(), metadata=_md("engine"))),
        (lambda: admin.SetTenantQuota(admin_pb2.SetTenantQuotaRequest(tenant="t", max_share=0.5), metadata=_md("observer"))),
    ]
    for call in refused:
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == Code.PERMISSION_DENIED
        assert info.value.details().startswith("authorization")
    assert _rows(process) == rows  # nothing was decided

    session = engine.OpenSession(engine_pb2.OpenSessionRequest(engine_id="eng"), metadata=_md("engine", "bearer"))
    reply = engine.Step(
        engine_pb2.StepRequest(session_id=session.session_id,
                               submits=[engine_pb2.Submit(request_id="t1", prompt_tokens=16, max_new_tokens=16)]),
        metadata=_md("engine"),
    )
    assert [d.kind for d in reply.decisions] == [common_pb2.DECISION_KIND_ADMIT]
    previous = admin.SetPolicy(admin_pb2.SetPolicyRequest(policy=common_pb2.POLICY_GUARANTEED), metadata=_md("admin"))
    assert previous.previous == common_pb2.POLICY_OPTIMISTIC
    assert _rows(process) == rows + 2  # the ADMIT and the POLICY switch


def test_health_needs_no_token(tcp) -> None:
    _, channel = tcp
    status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest()).status
    assert status == health_pb2.HealthCheckResponse.SERVING


def test_tls_listener_with_tokens(tmp_path) -> None:
    """TLS on TCP: a client trusting the daemon's certificate connects; tokens still decide."""
    cert, key = make_pair(tmp_path, "daemon")  # (skipped, with its reason, where openssl is missing)
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'observer = ["{TOKENS["observer"]}"]\n')
    address = f"localhost:{free_port()}"
    with DaemonProcess(tmp_path, "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tokens-file",
                       str(tokens), listen=(f"unix://{tmp_path}/kvbudget.sock", address)):
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        with grpc.secure_channel(address, credentials) as channel:
            stub = observer_pb2_grpc.ObserverServiceStub(channel)
            snapshot = stub.GetSnapshot(observer_pb2.GetSnapshotRequest(), metadata=_md("observer")).snapshot
            assert snapshot.num_blocks == 64
            with pytest.raises(grpc.RpcError) as info:
                stub.GetSnapshot(observer_pb2.GetSnapshotRequest())
            assert info.value.code() == Code.UNAUTHENTICATED
