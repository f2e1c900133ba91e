"""Reflection over TCP needs a token (issue 30, point 7): it listed every service to any
caller that reached the port. Health stays open, as load balancers expect; over the unix
socket (whose mode is the guard) both answer everyone."""

from __future__ import annotations

from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.daemon_harness import DaemonProcess
from daemon_harness import free_port

TOKEN = "kvbt-observer-R3fl3x"



def _services(channel: grpc.Channel, metadata: tuple = ()) -> set[str]:
    stream = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=metadata, timeout=10)
    try:
        return {s.name for s in next(iter(stream)).list_services_response.service}
    finally:
        stream.cancel()


def test_reflection_needs_a_token_over_tcp_and_health_does_not(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'observer = ["{TOKEN}"]\n')
    tokens.chmod(0o640)
    tcp = f"127.0.0.1:{free_port()}"
    with DaemonProcess(tmp_path, "--tokens-file", str(tokens), listen=(f"unix://{tmp_path}/kvbudget.sock", tcp)) as d:
        with grpc.insecure_channel(tcp) as over_tcp, grpc.insecure_channel(d.target) as over_unix:
            for wrong in ((), (("authorization", "Bearer kvbt-wrong"),)):
                try:
                    _services(over_tcp, wrong)
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAUTHENTICATED, exc
                    assert "authorization" in exc.details() and "kvbt-wrong" not in exc.details()
                else:
                    raise AssertionError("reflection answered a TCP caller without a valid token")
            assert "kvbudget.v1.EngineService" in _services(over_tcp, (("authorization", f"Bearer {TOKEN}"),))
            assert "kvbudget.v1.EngineService" in _services(over_unix)
            reply = health_pb2_grpc.HealthStub(over_tcp).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
