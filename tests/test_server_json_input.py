"""Bad input as a client of its own (grpcurl, buf curl, another language) sends it: each
request is written as the JSON a user would type, parsed the way those tools parse it
(proto3 JSON), and sent to a real daemon. Every refusal must carry the documented status
and name the field, and change neither the pool nor the decision log.
"""

from __future__ import annotations

import sqlite3

import grpc
import pytest
from google.protobuf import json_format

from kvbudget.v1 import engine_pb2, engine_pb2_grpc, observer_pb2, observer_pb2_grpc

from daemon_harness import DaemonProcess

pytestmark = pytest.mark.slow
Code = grpc.StatusCode


class Daemon:
    def __init__(self, process: DaemonProcess) -> None:
        self.process = process
        self.channel = grpc.insecure_channel(process.target)
        self.engine = engine_pb2_grpc.EngineServiceStub(self.channel)
        self.observer = observer_pb2_grpc.ObserverServiceStub(self.channel)

    def state(self) -> tuple:
        s = self.observer.GetSnapshot(observer_pb2.GetSnapshotRequest()).snapshot
        connection = sqlite3.connect(f"file:{self.process.db_path}?mode=ro", uri=True)
        try:
            [(rows,)] = connection.execute("SELECT count(*) FROM decisions").fetchall()
        finally:
            connection.close()
        return (s.num_free_blocks, s.num_held_blocks, s.num_reserved_blocks, s.num_running, s.num_waiting,
                dict(s.decisions_by_kind), sorted(e.engine_id for e in s.engines), rows)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with DaemonProcess(tmp_path_factory.mktemp("qa-json")) as process:
        d = Daemon(process)
        yield d
        d.channel.close()


def _json(message_type, text: str):
    return json_format.Parse(text, message_type())


# (id, call(d) -> the refused call, status, what the message starts with)
CASES = [
    # The status message rides in an HTTP/2 trailer: quoting a 100,000-character value
    # back made the client's header limit turn FAILED_PRECONDITION into RESOURCE_EXHAUSTED.
    (
        "open-huge-fingerprint",
        lambda d: d.engine.OpenSession(_json(
            engine_pb2.OpenSessionRequest, '{"engine_id": "qa-1", "model_fingerprint": "%s"}' % ("f" * 100_000))),
        Code.FAILED_PRECONDITION,
        "model_fingerprint: ",
    ),
]


@pytest.mark.parametrize("call, code, prefix", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_json_input_is_refused_naming_the_field(daemon: Daemon, call, code, prefix) -> None:
    before = daemon.state()
    with pytest.raises(grpc.RpcError) as info:
        call(daemon)
    assert (info.value.code(), info.value.details()[: len(prefix)]) == (code, prefix), info.value.details()[:300]
    assert daemon.state() == before
