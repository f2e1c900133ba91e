"""A replayer's progress report: EngineService.ReportReplay (an engine-role write), and the
deprecated ObserverService.ReportReplay that still works until it is removed. The policy a
report names reaches the snapshot in both fields, the enum (admission_policy) and the
deprecated name (policy), whichever of the two the replayer set.
"""

from __future__ import annotations

import grpc
import pytest

from daemon_harness import DaemonProcess
from kvbudget.client import ObserverClient, refusal_details
from kvbudget.v1 import common_pb2, engine_pb2, engine_pb2_grpc, observer_pb2, observer_pb2_grpc

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with DaemonProcess(tmp_path_factory.mktemp("replay")) as process:
        yield process


def _replays(channel: grpc.Channel) -> dict[str, common_pb2.ReplayState]:
    snapshot = observer_pb2_grpc.ObserverServiceStub(channel).GetSnapshot(observer_pb2.GetSnapshotRequest()).snapshot
    return {r.replay_id: r for r in snapshot.replays}


def test_each_report_shows_its_policy_in_both_fields(daemon: DaemonProcess) -> None:
    with grpc.insecure_channel(daemon.target) as channel:
        engine = engine_pb2_grpc.EngineServiceStub(channel)
        engine.ReportReplay(engine_pb2.EngineServiceReportReplayRequest(replay=common_pb2.ReplayState(
            replay_id="new", trace="t.jsonl", position=3, total=9, admission_policy=common_pb2.POLICY_GUARANTEED)))
        # an older replayer: the deprecated call and the policy's name
        observer_pb2_grpc.ObserverServiceStub(channel).ReportReplay(observer_pb2.ReportReplayRequest(
            replay=common_pb2.ReplayState(replay_id="old", trace="t.jsonl", position=1, total=9, policy="naive")))
        replays = _replays(channel)
    assert (replays["new"].position, replays["new"].policy, replays["new"].admission_policy) == (
        3, "guaranteed", common_pb2.POLICY_GUARANTEED)
    assert (replays["old"].position, replays["old"].policy, replays["old"].admission_policy) == (
        1, "naive", common_pb2.POLICY_NAIVE)


def test_an_unknown_policy_value_is_refused_naming_the_field(daemon: DaemonProcess) -> None:
    with grpc.insecure_channel(daemon.target) as channel:
        with pytest.raises(grpc.RpcError) as info:
            engine_pb2_grpc.EngineServiceStub(channel).ReportReplay(engine_pb2.EngineServiceReportReplayRequest(
                replay=common_pb2.ReplayState(replay_id="bad", admission_policy=99)))
        assert "bad" not in _replays(channel)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "replay.admission_policy: unknown value 99"
    assert refusal_details(info.value).field == "replay.admission_policy"


class _Recorder(engine_pb2_grpc.EngineServiceServicer, observer_pb2_grpc.ObserverServiceServicer):
    """A stand-in daemon that notes which service each report reached."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def ReportReplay(self, request, context):
        service = "engine" if isinstance(request, engine_pb2.EngineServiceReportReplayRequest) else "observer"
        self.calls.append((service, request.replay.replay_id))
        if service == "engine":
            return engine_pb2.EngineServiceReportReplayResponse()
        return observer_pb2.ReportReplayResponse()


@pytest.mark.parametrize(("services", "reached"), [
    (("engine", "observer"), [("engine", "r1")]),
    (("observer",), [("observer", "r1")]),  # a 0.1 daemon: no EngineService.ReportReplay
])
async def test_the_observer_client_reports_to_the_engine_service_or_else_the_old_call(
        tmp_path, services, reached) -> None:
    recorder = _Recorder()
    server = grpc.aio.server()
    if "engine" in services:
        engine_pb2_grpc.add_EngineServiceServicer_to_server(recorder, server)
    observer_pb2_grpc.add_ObserverServiceServicer_to_server(recorder, server)
    target = f"unix://{tmp_path / 'stand-in.sock'}"
    server.add_insecure_port(target)
    await server.start()
    try:
        async with ObserverClient(target) as observer:
            await observer.report_replay(common_pb2.ReplayState(replay_id="r1", position=2, total=4))
    finally:
        await server.stop(None)
    assert recorder.calls == reached
