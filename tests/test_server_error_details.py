"""Every refusal carries a google.rpc.Status in the `grpc-status-details-bin` trailer, as
grpcio-status sends it: an ErrorInfo with a stable reason and the domain "kvbudget", and
the detail its code calls for (BadRequest, QuotaFailure, PreconditionFailure) naming the
field. The code and message stay what they were. Read over a real channel by the Python
client's `refusal_details` (test_server_buf.py reads them with `buf curl`, a Go client).

Standing state: one daemon (64 usable blocks of 16 tokens); engine "det-a" holds "a-run".
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2

from daemon_harness import DaemonProcess
from kvbudget.client import EngineClient, refusal_details
from kvbudget.daemon.server.error_details import status_of
from kvbudget.v1 import engine_pb2, engine_pb2_grpc

pytestmark = pytest.mark.slow
Code = grpc.StatusCode
UNKNOWN_SESSION = "session_id: unknown session (expired, closed, or the daemon restarted): open a new one"


class Daemon:
    def __init__(self, process: DaemonProcess) -> None:
        self.process = process
        self.channel = grpc.insecure_channel(process.target)
        self.engine = engine_pb2_grpc.EngineServiceStub(self.channel)
        self.session = self.engine.OpenSession(engine_pb2.OpenSessionRequest(engine_id="det-a")).session_id
        self.engine.Step(engine_pb2.StepRequest(session_id=self.session, submits=[
            engine_pb2.Submit(request_id="a-run", prompt_tokens=20, max_new_tokens=10)]))

    def refused(self, call) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as info:
            call(self)
        return info.value


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with DaemonProcess(tmp_path_factory.mktemp("details")) as process:
        d = Daemon(process)
        yield d
        d.channel.close()


def step(d: Daemon, **ops) -> engine_pb2.StepRequest:
    return engine_pb2.StepRequest(session_id=d.session, **ops)


def _detail(status, kind):
    """The one detail of type `kind` in the status (None if it has none)."""
    found = [kind.FromString(d.value) for d in status.details if d.type_url.endswith("/" + kind.DESCRIPTOR.full_name)]
    assert len(found) <= 1, status
    return found[0] if found else None


# (id, the refused call, code, reason, the field it names)
CASES = [
    ("unknown-session", lambda d: d.engine.Step(engine_pb2.StepRequest(session_id="nope")),
     Code.FAILED_PRECONDITION, "SESSION_UNKNOWN", "session_id"),
    ("wrong-model", lambda d: d.engine.OpenSession(engine_pb2.OpenSessionRequest(engine_id="x", model_fingerprint="gpt-2:0")),
     Code.FAILED_PRECONDITION, "MODEL_MISMATCH", "model_fingerprint"),
    ("session-exists", lambda d: d.engine.OpenSession(engine_pb2.OpenSessionRequest(engine_id="det-a")),
     Code.ALREADY_EXISTS, "SESSION_EXISTS", "engine_id"),
    ("duplicate-request", lambda d: d.engine.Step(step(d, submits=[engine_pb2.Submit(request_id="a-run", prompt_tokens=5)])),
     Code.ALREADY_EXISTS, "REQUEST_ID_DUPLICATE", "submits[0].request_id"),
    ("unknown-request", lambda d: d.engine.Step(step(d, finishes=[engine_pb2.Finish(request_id="zzz")])),
     Code.NOT_FOUND, "REQUEST_ID_UNKNOWN", "finishes[0].request_id"),
    ("bad-field", lambda d: d.engine.Step(step(d, submits=[engine_pb2.Submit(request_id="n", prompt_tokens=0)])),
     Code.INVALID_ARGUMENT, "INVALID_FIELD", "submits[0].prompt_tokens"),
    ("not-the-message", lambda d: d.channel.unary_unary(
        "/kvbudget.v1.EngineService/Step", request_serializer=lambda b: b, response_deserializer=lambda b: b,
    )(b"\x0a\x02\xff\xfe", timeout=10), Code.INVALID_ARGUMENT, "MALFORMED_REQUEST", "request"),
]


@pytest.mark.parametrize("call, code, reason, field", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_refusal_carries_its_reason_and_field(daemon: Daemon, call, code, reason, field) -> None:
    error = daemon.refused(call)
    details = refusal_details(error)
    assert error.code() == code
    assert (details.reason, details.domain, details.field) == (reason, "kvbudget", field)
    # the status in the trailer says what the call's own code and message say
    assert (details.status.code, details.status.message) == (code.value[0], error.details())
    assert error.details().startswith(field + ": ")


def test_an_invalid_field_is_a_bad_request_field_violation(daemon: Daemon) -> None:
    error = daemon.refused(lambda d: d.engine.Step(step(d, submits=[
        engine_pb2.Submit(request_id="ok", prompt_tokens=5), engine_pb2.Submit(request_id="n", prompt_tokens=5, max_new_tokens=0)])))
    [violation] = _detail(refusal_details(error).status, error_details_pb2.BadRequest).field_violations
    assert violation.field == "submits[1].max_new_tokens"
    assert error.details() == f"submits[1].max_new_tokens: {violation.description}"
    assert violation.reason == "INVALID_FIELD"


def test_a_lapsed_session_is_a_precondition_failure(daemon: Daemon) -> None:
    error = daemon.refused(lambda d: d.engine.Heartbeat(engine_pb2.HeartbeatRequest(session_id="nope")))
    [violation] = _detail(refusal_details(error).status, error_details_pb2.PreconditionFailure).violations
    assert (violation.type, violation.subject) == ("SESSION_UNKNOWN", "session_id")
    assert error.details() == UNKNOWN_SESSION


async def test_the_engine_client_surfaces_the_details(daemon: Daemon) -> None:
    async with EngineClient(daemon.process.target, "det-client", heartbeat=False) as engine:
        batch = engine.batch()
        batch.finish("never-submitted")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await batch.flush()
    details = refusal_details(info.value)
    assert (details.reason, details.field) == ("REQUEST_ID_UNKNOWN", "finishes[0].request_id")


async def test_an_error_the_daemon_did_not_send_has_no_details(tmp_path: Path) -> None:
    # No daemon at the address: the transport's UNAVAILABLE, with no trailer from a daemon.
    channel = grpc.aio.insecure_channel(f"unix://{tmp_path / 'nobody.sock'}")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await engine_pb2_grpc.EngineServiceStub(channel).Heartbeat(engine_pb2.HeartbeatRequest(session_id="s"), timeout=10)
    await channel.close()
    assert info.value.code() == Code.UNAVAILABLE
    assert refusal_details(info.value) is None


@pytest.mark.parametrize(("code", "message", "reason", "detail"), [
    # refusals a healthy test daemon does not reach: the reason is read off code and message
    (Code.UNAVAILABLE, "daemon is draining: no new sessions", "DRAINING", None),
    (Code.UNAVAILABLE, "submits: daemon is draining, no new requests", "DRAINING", None),
    (Code.UNAVAILABLE, "decision log: disk full", "DECISION_LOG_UNAVAILABLE", None),
    (Code.UNAVAILABLE, "decision log: disk full; this step was applied and its decisions wait to be written: "
                       "send it again later", "STEP_UNWRITTEN", None),
    (Code.RESOURCE_EXHAUSTED, "engine_id: at most 64 sessions", "SESSION_LIMIT", error_details_pb2.QuotaFailure),
    (Code.RESOURCE_EXHAUSTED, "watchers: at most 8 at a time", "WATCHER_LIMIT", error_details_pb2.QuotaFailure),
    (Code.RESOURCE_EXHAUSTED, "this step was applied and logged, but its reply (70000000 bytes) is past the limit",
     "REPLY_TOO_LARGE", error_details_pb2.QuotaFailure),
    (Code.UNAUTHENTICATED, "authorization: unknown token", "UNAUTHENTICATED", None),
    (Code.PERMISSION_DENIED, "authorization: role 'observer' may not call this (engine role needed)",
     "ROLE_NOT_ALLOWED", None),
    (Code.PERMISSION_DENIED, "session_id: this session was opened with another credential", "NOT_SESSION_OWNER", None),
    (Code.FAILED_PRECONDITION, "step_seq: 3 is below this session's last step (5)", "STEP_SEQ_BELOW_LAST",
     error_details_pb2.PreconditionFailure),
    (Code.FAILED_PRECONDITION, "session_id: its lease lapsed (5 s without a call): open a new one",
     "SESSION_LEASE_LAPSED", error_details_pb2.PreconditionFailure),
    (Code.INVALID_ARGUMENT, "step_seq: 5 numbers another step, already applied", "STEP_SEQ_REUSED",
     error_details_pb2.BadRequest),
    (Code.PERMISSION_DENIED, "engine_id: 'e' is not among the engine ids this credential may open",
     "ENGINE_ID_NOT_ALLOWED", None),
    (Code.RESOURCE_EXHAUSTED, "replay.replay_id: at most 16 replays", "REPLAY_LIMIT", error_details_pb2.QuotaFailure),
    (Code.INTERNAL, "grows[0]: the daemon refused an op it had validated (a bug)", "INTERNAL", None),
])
def test_each_refusal_has_a_stable_reason(code, message, reason, detail) -> None:
    status = status_of(code, message)
    info = _detail(status, error_details_pb2.ErrorInfo)
    assert (status.code, status.message, info.reason, info.domain) == (code.value[0], message, reason, "kvbudget")
    assert [d.type_url.rsplit(".", 1)[1] for d in status.details[1:]] == ([detail.DESCRIPTOR.name] if detail else [])
    if message.startswith("authorization:"):  # a header, not a field of the request
        assert dict(info.metadata) == {"header": "authorization"}


def test_the_status_codes_match_google_rpc() -> None:
    assert [status_of(c, "x: y").code for c in (Code.INVALID_ARGUMENT, Code.NOT_FOUND, Code.UNAVAILABLE)] == [
        code_pb2.INVALID_ARGUMENT, code_pb2.NOT_FOUND, code_pb2.UNAVAILABLE]
