"""The standard health service as a probe or `grpcurl` uses it: Check per service, and
List (every service the daemon serves, with its status): NOT_SERVING across the board
once the daemon drains."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from daemon_harness import DaemonProcess
from kvbudget.v1 import admin_pb2, admin_pb2_grpc

pytestmark = pytest.mark.slow

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICES = ("", "kvbudget.v1.EngineService", "kvbudget.v1.ObserverService", "kvbudget.v1.AdminService")


def test_list_gives_every_service_and_follows_a_drain(tmp_path) -> None:
    with DaemonProcess(tmp_path) as daemon, grpc.insecure_channel(daemon.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        listed = health.List(health_pb2.HealthListRequest(), timeout=10).statuses
        assert {name: s.status for name, s in listed.items()} == dict.fromkeys(SERVICES, SERVING)
        for name in SERVICES:  # List says what Check says
            assert health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10).status == SERVING
        admin_pb2_grpc.AdminServiceStub(channel).Drain(admin_pb2.DrainRequest(), timeout=10)
        listed = health.List(health_pb2.HealthListRequest(), timeout=10).statuses
        assert {name: s.status for name, s in listed.items()} == dict.fromkeys(SERVICES, NOT_SERVING)
