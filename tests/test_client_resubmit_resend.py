"""EngineClient(resubmit=True): a step that failed CANCELLED or UNAVAILABLE as the daemon
stopped is sent again once, the same step (same step_seq: the daemon's kept outcome if it
was applied), and folded into the resubmission if the daemon that answers is a new one.
A scripted in-process EngineService stands for the daemon, so each failure comes exactly
where the test puts it."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from kvbudget.client import EngineClient
from kvbudget.daemon.core.records import RequestSpec
from kvbudget.v1 import engine_pb2, engine_pb2_grpc

from tests.daemon_harness import await_until

DRAINING = "submits: daemon is draining, no new requests"
UNKNOWN = "session_id: unknown session (expired, closed, or the daemon restarted): open a new one"


class ScriptedDaemon(engine_pb2_grpc.EngineServiceServicer):
    """Answers each Step with the next scripted failure, then with an empty reply."""

    def __init__(self, failures: list[tuple[grpc.StatusCode, str]]) -> None:
        self.failures = failures
        self.steps: list[tuple[str, int, tuple[str, ...]]] = []
        self.sessions = 0
        self.lease_ttl_s = 10
        self.forgotten: set[str] = set()  # sessions whose heartbeats are told "unknown"

    async def OpenSession(self, request, context):
        self.sessions += 1
        return engine_pb2.OpenSessionResponse(session_id=f"s{self.sessions}", lease_ttl_s=self.lease_ttl_s)

    async def Step(self, request, context):
        self.steps.append((request.session_id, request.step_seq, tuple(s.request_id for s in request.submits)))
        if self.failures:
            await context.abort(*self.failures.pop(0))
        return engine_pb2.StepResponse()

    async def CloseSession(self, request, context):
        return engine_pb2.CloseSessionResponse()

    async def Heartbeat(self, request, context):
        if request.session_id in self.forgotten:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, UNKNOWN)
        return engine_pb2.HeartbeatResponse()


async def serve(tmp_path: Path, daemon: ScriptedDaemon) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    engine_pb2_grpc.add_EngineServiceServicer_to_server(daemon, server)
    target = f"unix://{tmp_path}/fake.sock"
    server.add_insecure_port(target)
    await server.start()
    return server, target


@pytest.mark.parametrize("code", [grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE])
async def test_a_step_failed_by_a_stop_is_sent_again_then_folded_into_the_resubmission(tmp_path, code) -> None:
    daemon = ScriptedDaemon([])
    server, target = await serve(tmp_path, daemon)
    try:
        async with EngineClient(target, "e", heartbeat=False, resubmit=True, max_backoff_s=0.01) as engine:
            await engine.step(submits=[RequestSpec("r0", 16, 16)])
            daemon.failures[:] = [(code, DRAINING), (grpc.StatusCode.FAILED_PRECONDITION, UNKNOWN)]
            await engine.step(submits=[RequestSpec("r1", 16, 16)])
            assert engine.last_resubmitted.request_ids == ("r0", "r1")
    finally:
        await server.stop(None)
    assert daemon.steps == [
        ("s1", 1, ("r0",)),
        ("s1", 2, ("r1",)),  # failed as the daemon stopped
        ("s1", 2, ("r1",)),  # the same step again: the new daemon does not know s1
        ("s2", 3, ("r0", "r1")),  # the new session: r0 resubmitted, r1 folded in
    ]


async def test_it_is_sent_again_once_only(tmp_path) -> None:
    daemon = ScriptedDaemon([])
    server, target = await serve(tmp_path, daemon)
    try:
        async with EngineClient(target, "e", heartbeat=False, resubmit=True, max_backoff_s=0.01,
                                step_resends=0) as engine:
            daemon.failures[:] = [(grpc.StatusCode.UNAVAILABLE, DRAINING)] * 2
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await engine.step(submits=[RequestSpec("r0", 16, 16)])
            assert (info.value.code(), info.value.details()) == (grpc.StatusCode.UNAVAILABLE, DRAINING)
            assert engine.last_resubmitted is None
    finally:
        await server.stop(None)
    assert daemon.steps == [("s1", 1, ("r0",))] * 2


async def test_a_loss_the_heartbeat_found_is_resubmitted_by_the_next_step(tmp_path) -> None:
    daemon = ScriptedDaemon([])
    daemon.lease_ttl_s = 0  # (a heartbeat every 0.05 s)
    server, target = await serve(tmp_path, daemon)
    try:
        async with EngineClient(target, "e", resubmit=True) as engine:
            await engine.step(submits=[RequestSpec("r0", 16, 16)])
            daemon.forgotten.add("s1")

            async def reopened() -> bool:
                return daemon.sessions == 2

            await await_until(reopened)
            await engine.step(submits=[RequestSpec("r1", 16, 16)])
            assert (engine.last_resubmitted.old_session_id, engine.last_resubmitted.session_id) == ("s1", "s2")
    finally:
        await server.stop(None)
    assert daemon.steps == [("s1", 1, ("r0",)), ("s2", 2, ("r0", "r1"))]


async def test_a_resubmission_the_daemon_did_not_answer_is_made_again_by_the_next_step(tmp_path) -> None:
    daemon = ScriptedDaemon([])
    server, target = await serve(tmp_path, daemon)
    try:
        async with EngineClient(target, "e", heartbeat=False, resubmit=True, step_resends=0) as engine:
            await engine.step(submits=[RequestSpec("r0", 16, 16)])
            daemon.failures[:] = [(grpc.StatusCode.FAILED_PRECONDITION, UNKNOWN),
                                  (grpc.StatusCode.UNAVAILABLE, "Socket closed")]
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await engine.step(submits=[RequestSpec("r1", 16, 16)])
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            # r1's step failed: the engine sends r2 now (a StepBatch would send r1 again).
            await engine.step(submits=[RequestSpec("r2", 16, 16)])
            assert engine.last_resubmitted.request_ids == ("r0", "r2")
    finally:
        await server.stop(None)
    assert daemon.steps == [
        ("s1", 1, ("r0",)),
        ("s1", 2, ("r1",)),
        ("s2", 3, ("r0", "r1")),  # not answered
        ("s2", 4, ("r0", "r2")),
    ]
