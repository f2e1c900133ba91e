"""Machine-readable details on every refusal: a google.rpc.Status in the
`grpc-status-details-bin` trailer, as grpcio-status sends it, beside today's code and message.

Every refusal's message starts with what it is about ("grows[2].num_tokens: ...",
"decision log: ...", "authorization: ..."): the details are read off that and the code, in
one place, so that no refusal site changes and none can be left without them. The reasons
are a contract (docs/engine-integration.md, "Error details"): renaming one breaks clients.
"""

from __future__ import annotations

import re

import grpc
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

DOMAIN = "kvbudget"  # ErrorInfo.domain of every refusal
_FIELD = re.compile(r"[a-z_][a-z0-9_]*(?:\[\d+\])?(?:\.[a-z_][a-z0-9_]*(?:\[\d+\])?)*")
_HEADERS = {"authorization"}  # message leads that name call metadata, not a request field
_C = grpc.StatusCode

# (code, the message's start, reason): the first match wins; then the code's own reason.
_REASONS = (
    (_C.FAILED_PRECONDITION, "session_id: unknown session", "SESSION_UNKNOWN"),
    (_C.FAILED_PRECONDITION, "session_id: its lease lapsed", "SESSION_LEASE_LAPSED"),
    (_C.FAILED_PRECONDITION, "model_fingerprint:", "MODEL_MISMATCH"),
    (_C.FAILED_PRECONDITION, "step_seq:", "STEP_SEQ_BELOW_LAST"),
    (_C.INVALID_ARGUMENT, "step_seq:", "STEP_SEQ_REUSED"),
    (_C.INVALID_ARGUMENT, "request: not a valid", "MALFORMED_REQUEST"),
    (_C.ALREADY_EXISTS, "engine_id:", "SESSION_EXISTS"),
    (_C.RESOURCE_EXHAUSTED, "engine_id:", "SESSION_LIMIT"),
    (_C.RESOURCE_EXHAUSTED, "replay.replay_id:", "REPLAY_LIMIT"),
    (_C.RESOURCE_EXHAUSTED, "watchers:", "WATCHER_LIMIT"),
    (_C.RESOURCE_EXHAUSTED, "this step was applied and logged", "REPLY_TOO_LARGE"),
    (_C.UNAVAILABLE, "daemon is draining", "DRAINING"),
    (_C.UNAVAILABLE, "submits: daemon is draining", "DRAINING"),
    (_C.PERMISSION_DENIED, "engine_id:", "ENGINE_ID_NOT_ALLOWED"),
    (_C.PERMISSION_DENIED, "authorization:", "ROLE_NOT_ALLOWED"),
    (_C.PERMISSION_DENIED, "", "NOT_SESSION_OWNER"),
)
_OF_CODE = {
    _C.INVALID_ARGUMENT: "INVALID_FIELD",
    _C.ALREADY_EXISTS: "REQUEST_ID_DUPLICATE",
    _C.NOT_FOUND: "REQUEST_ID_UNKNOWN",
    _C.UNAUTHENTICATED: "UNAUTHENTICATED",
    _C.INTERNAL: "INTERNAL",
}
_UNWRITTEN = "this step was applied and its decisions wait to be written"


def reason_of(code: grpc.StatusCode, message: str) -> str:
    """The refusal's stable ErrorInfo reason (UPPER_SNAKE_CASE)."""
    if code is _C.UNAVAILABLE and message.startswith("decision log:"):
        return "STEP_UNWRITTEN" if _UNWRITTEN in message else "DECISION_LOG_UNAVAILABLE"
    for rule_code, start, reason in _REASONS:
        if rule_code is code and message.startswith(start):
            return reason
    return _OF_CODE.get(code, code.name)


def field_of(message: str) -> str | None:
    """The request field a message names before its colon ("submits[1].request_id"), if any."""
    lead, colon, _ = message.partition(":")
    if not colon or lead in _HEADERS or not _FIELD.fullmatch(lead):
        return None
    return lead


def status_of(code: grpc.StatusCode, message: str) -> status_pb2.Status:
    """The google.rpc.Status for a refusal: ErrorInfo always, and the detail its code calls
    for (BadRequest, QuotaFailure, PreconditionFailure) when the message names a field."""
    reason, field = reason_of(code, message), field_of(message)
    status = status_pb2.Status(code=getattr(code_pb2, code.name), message=message)
    info = error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN)
    if field is not None:
        info.metadata["field"] = field
    elif message.startswith("authorization:"):
        info.metadata["header"] = "authorization"
    status.details.add().Pack(info)
    description = message.partition(": ")[2] if field is not None else message
    if code is _C.INVALID_ARGUMENT and field is not None:
        status.details.add().Pack(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=field, description=description, reason=reason)]))
    elif code is _C.RESOURCE_EXHAUSTED:
        status.details.add().Pack(error_details_pb2.QuotaFailure(violations=[
            error_details_pb2.QuotaFailure.Violation(subject=field or "daemon", description=description)]))
    elif code is _C.FAILED_PRECONDITION:
        status.details.add().Pack(error_details_pb2.PreconditionFailure(violations=[
            error_details_pb2.PreconditionFailure.Violation(type=reason, subject=field or "", description=description)]))
    return status


async def abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str) -> None:
    """Ends the call with `code` and `message`, the details in the trailer (raises, as
    `context.abort` does)."""
    status = rpc_status.to_status(status_of(code, message))
    await context.abort(status.code, status.details, status.trailing_metadata)
