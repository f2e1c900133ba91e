"""The machine-readable details the daemon sends with each refusal, for callers that
branch on what went wrong rather than on its words. The calls still raise grpc's own
errors: `refusal_details(error)` reads the google.rpc.Status in their trailer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from google.rpc import error_details_pb2, status_pb2

if TYPE_CHECKING:
    import grpc

DETAILS_KEY = "grpc-status-details-bin"  # the trailer grpcio-status reads and writes


@dataclass(frozen=True)
class RefusalDetails:
    """What a refusal's google.rpc.Status says (docs/engine-integration.md, "Error details")."""

    reason: str  # stable, e.g. "SESSION_UNKNOWN", "INVALID_FIELD", "DRAINING"
    domain: str  # "kvbudget"
    field: str | None  # the request field it names ("submits[1].request_id"), if any
    metadata: dict[str, str]
    status: status_pb2.Status  # the whole of it, with the detail its code calls for


def refusal_details(error: grpc.RpcError) -> RefusalDetails | None:
    """The details of a daemon's refusal; None when the error carries none (the transport
    failed, a deadline passed, or an older daemon answered)."""
    trailer = getattr(error, "trailing_metadata", None)
    for key, value in (trailer() if callable(trailer) else None) or ():
        if key == DETAILS_KEY:
            status = status_pb2.Status.FromString(value)
            break
    else:
        return None
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            metadata = dict(info.metadata)
            return RefusalDetails(info.reason, info.domain, metadata.get("field"), metadata, status)
    return RefusalDetails("", "", None, {}, status)
