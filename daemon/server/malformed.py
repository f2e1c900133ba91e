"""Requests whose bytes do not parse as their message get INVALID_ARGUMENT, not UNKNOWN.

grpc.aio turns an exception from a request's deserializer into UNKNOWN ("Unexpected
DecodeError: ...") and writes a traceback to the journal, for every such call: a client's
bug, or a port scan, read as the daemon's. Here each method's deserializer returns a
`Malformed` marker instead of raising, and the method answers it with INVALID_ARGUMENT
naming the message type, before the servicer sees it. A reply the servicer gives as bytes
(a big step's, serialized slice by slice) is sent as it is.

`add_checked(add_fn, servicer, server, calls)` registers a servicer as the generated
`add_*Servicer_to_server` would, with every method so wrapped; the wrapper also counts each
call in `calls` (`in_flight`: a stop ends once none is left).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from kvbudget.daemon.server.error_details import abort
from kvbudget.daemon.server.in_flight import InFlightCalls


class Malformed:
    """What a request that did not parse deserializes to."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


class _Capture:
    """Stands in for the server while a generated `add_*_to_server` registers handlers."""

    def __init__(self) -> None:
        self.services: list[tuple[str, Mapping[str, Any]]] = []

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        pass  # (the same handlers come through add_registered_method_handlers)

    def add_registered_method_handlers(self, service: str, handlers: Mapping[str, Any]) -> None:
        self.services.append((service, handlers))


def add_checked(
    add_fn: Callable[[Any, Any], None], servicer: object, server: grpc.aio.Server, calls: InFlightCalls
) -> None:
    capture = _Capture()
    add_fn(servicer, capture)
    for service, handlers in capture.services:
        checked = {method: _checked(handler, calls) for method, handler in handlers.items()}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, checked),))
        server.add_registered_method_handlers(service, checked)


def _checked(handler: Any, calls: InFlightCalls) -> Any:
    deserialize = handler.request_deserializer
    message_type = getattr(getattr(deserialize, "__self__", None), "DESCRIPTOR", None)
    what = message_type.full_name if message_type is not None else "request message"

    def lenient(raw: bytes) -> object:
        try:
            return deserialize(raw)
        except DecodeError as exc:
            return Malformed(str(exc))

    if handler.unary_unary is not None:
        behavior, field = handler.unary_unary, "unary_unary"
    elif handler.unary_stream is not None:
        behavior, field = handler.unary_stream, "unary_stream"
    else:
        return handler  # (no streaming requests in this contract)

    started = calls.started

    async def guarded(request: object, context: grpc.aio.ServicerContext) -> object:
        started(context)
        if request.__class__ is Malformed:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"request: not a valid {what}: {request.why}")
        return await behavior(request, context)

    serialize = handler.response_serializer

    def serialized(reply: object) -> bytes:  # (a reply serialized already, in slices: steps.py)
        return reply if reply.__class__ is bytes else serialize(reply)

    replaced = {"response_serializer": serialized} if serialize is not None else {}
    return handler._replace(request_deserializer=lenient, **replaced, **{field: guarded})
