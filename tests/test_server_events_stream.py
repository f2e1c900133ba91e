"""An Events stream whose client went away (cancelled, connection dropped) must not take
decisions meant for the session's next stream.

The engine's reconnect (EngineClient follows Events across dropped connections) is the
usual way to meet this: the first stream's call ends on the client side, the daemon's
handler is cancelled while it waits for the session's next decision, and a new stream
reads from then on. Every decision after that must reach the new stream.
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from kvbudget.v1 import common_pb2, engine_pb2, engine_pb2_grpc, observer_pb2, observer_pb2_grpc

from daemon_harness import DaemonProcess, wait_until

pytestmark = pytest.mark.slow
WAIT_S = 20.0  # a bound, not a measurement: the call fails (DEADLINE_EXCEEDED) past it


def _step(engine, session_id: str, **ops) -> list[common_pb2.Decision]:
    return list(engine.Step(engine_pb2.StepRequest(session_id=session_id, **ops), timeout=WAIT_S).decisions)


def _lease_end(observer, engine_id: str) -> float:
    """When the engine's lease ends (unix seconds), by the daemon's snapshot: it moves only
    when a call of the session renews the lease, and an Events stream's opening is one."""
    snapshot = observer.GetSnapshot(observer_pb2.GetSnapshotRequest(), timeout=WAIT_S).snapshot
    [state] = [e for e in snapshot.engines if e.engine_id == engine_id]
    return snapshot.time_unix_s + state.lease_remaining_s


def test_a_cancelled_events_stream_leaves_no_reader_behind(tmp_path) -> None:
    with DaemonProcess(tmp_path, "--policy", "guaranteed", lease_ttl_s=600) as daemon:
        channel = grpc.insecure_channel(daemon.target)
        engine = engine_pb2_grpc.EngineServiceStub(channel)
        observer = observer_pb2_grpc.ObserverServiceStub(channel)
        a = engine.OpenSession(engine_pb2.OpenSessionRequest(engine_id="qa-a", lease_ttl_s=600)).session_id
        b = engine.OpenSession(engine_pb2.OpenSessionRequest(engine_id="qa-b", lease_ttl_s=600)).session_id

        # A holds the whole pool (512 + 512 tokens = 64 blocks); B's request waits.
        [admit] = _step(engine, a, submits=[engine_pb2.Submit(request_id="a-1", prompt_tokens=512, max_new_tokens=512)])
        assert admit.kind == common_pb2.DECISION_KIND_ADMIT
        [queued] = _step(engine, b, submits=[engine_pb2.Submit(request_id="b-1", prompt_tokens=16, max_new_tokens=16)])
        assert queued.kind == common_pb2.DECISION_KIND_QUEUE

        # B's first stream hears b-1 admitted once A's request ends: it is reading.
        first = engine.Events(engine_pb2.EventsRequest(session_id=b), timeout=WAIT_S)
        _step(engine, a, finishes=[engine_pb2.Finish(request_id="a-1")])
        heard = next(first).decision
        assert (heard.kind, heard.request_id) == (common_pb2.DECISION_KIND_ADMIT, "b-1")

        # A fills the rest (62 blocks), B's next request waits again.
        [admit] = _step(engine, a, submits=[engine_pb2.Submit(request_id="a-2", prompt_tokens=512, max_new_tokens=480)])
        assert admit.kind == common_pb2.DECISION_KIND_ADMIT
        [queued] = _step(engine, b, submits=[engine_pb2.Submit(request_id="b-2", prompt_tokens=16, max_new_tokens=16)])
        assert queued.kind == common_pb2.DECISION_KIND_QUEUE

        # The first stream's client goes away while the daemon waits for B's next decision.
        first.cancel()
        time.sleep(1.0)  # let the daemon see the cancellation before the next stream opens

        renewed = _lease_end(observer, "qa-b")  # by b-2's step, a second or more ago
        second = engine.Events(engine_pb2.EventsRequest(session_id=b), timeout=WAIT_S)
        got: list = []
        reader = threading.Thread(target=lambda: got.append(_next_or_error(second)))
        reader.start()
        # The second stream is open on the daemon before the decision is made: its opening
        # renewed the lease (the daemon then takes the session's events at once).
        wait_until(lambda: _lease_end(observer, "qa-b") > renewed + 0.25, WAIT_S)
        _step(engine, a, finishes=[engine_pb2.Finish(request_id="a-2")])
        reader.join(WAIT_S + 5)
        second.cancel()
        channel.close()
        assert got, "the second Events stream never answered"
        heard = got[0]
        assert not isinstance(heard, grpc.RpcError), (
            f"b-2's admission never reached the session's Events stream: {heard.code()} {heard.details()}"
        )
        assert (heard.kind, heard.request_id) == (common_pb2.DECISION_KIND_ADMIT, "b-2")


def _next_or_error(stream):
    try:
        return next(stream).decision
    except grpc.RpcError as error:
        return error
