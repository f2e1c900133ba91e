"""Server reflection that carries the contract's documentation: the generated *_pb2 modules
have no source comments, so reflection is handed the documented copy of each file from the
bundled descriptor set. A missing or stale set is a warning, never a stop. Over TCP it needs
a role, as the observer's calls do (it listed every service to anyone who reached the
port); health stays open, as load balancers expect."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from importlib import resources
from importlib.resources.abc import Traversable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FileDescriptor
from google.protobuf.message import DecodeError
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from kvbudget.daemon.server.auth import Authorizer, Role

log = logging.getLogger("kvbudget.daemon")

DESCRIPTOR_SET = "descriptor_set.binpb"  # in the kvbudget.v1 package, written by protos/generate.sh


def bundled_descriptor_set() -> Traversable:
    return resources.files("kvbudget.v1") / DESCRIPTOR_SET


class DocumentedFile:
    """A served file descriptor whose `CopyToProto` gives the documented copy of the file.

    The reflection service walks `dependencies` and serializes each file with `CopyToProto`;
    anything else is the served descriptor's own."""

    def __init__(self, served: FileDescriptor, documented: Mapping[str, descriptor_pb2.FileDescriptorProto]) -> None:
        self._served = served
        self._documented = documented

    @property
    def name(self) -> str:
        return self._served.name

    @property
    def dependencies(self) -> list[DocumentedFile]:
        return [DocumentedFile(dependency, self._documented) for dependency in self._served.dependencies]

    def CopyToProto(self, proto: descriptor_pb2.FileDescriptorProto) -> None:  # noqa: N802 (protobuf's name)
        documented = self._documented.get(self._served.name)
        if documented is None:
            self._served.CopyToProto(proto)
        else:
            proto.CopyFrom(documented)

    def __getattr__(self, attribute: str):
        return getattr(self._served, attribute)


class DocumentedPool:
    """A descriptor pool for `enable_server_reflection(pool=...)`: the served pool's answers,
    with the files that `documented` holds (by file name) documented."""

    def __init__(self, served: descriptor_pool.DescriptorPool,
                 documented: Mapping[str, descriptor_pb2.FileDescriptorProto]) -> None:
        self._served = served
        self._documented = dict(documented)

    @property
    def documented_files(self) -> tuple[str, ...]:
        return tuple(sorted(self._documented))

    def FindFileByName(self, file_name: str) -> DocumentedFile:  # noqa: N802
        return DocumentedFile(self._served.FindFileByName(file_name), self._documented)

    def FindFileContainingSymbol(self, symbol: str) -> DocumentedFile:  # noqa: N802
        return DocumentedFile(self._served.FindFileContainingSymbol(symbol), self._documented)

    def __getattr__(self, attribute: str):  # message and extension lookups: the served pool's
        return getattr(self._served, attribute)


class GuardedReflection(reflection.aio.ReflectionServicer):
    """grpcio's reflection servicer, with the caller's role checked first (`Authorizer.require`:
    unix-socket callers are trusted; a TCP caller without a token is UNAUTHENTICATED)."""

    def __init__(self, service_names: Iterable[str], auth: Authorizer, pool: object) -> None:
        super().__init__(tuple(service_names), pool=pool)
        self._auth = auth

    async def ServerReflectionInfo(self, request_iterator, context: grpc.aio.ServicerContext):  # noqa: N802
        await self._auth.require(context, Role.OBSERVER)
        async for response in super().ServerReflectionInfo(request_iterator, context):
            yield response


def enable_reflection(service_names: Iterable[str], server: grpc.aio.Server, auth: Authorizer) -> None:
    """Reflection on `server` for `service_names` (and itself), documented, behind `auth`."""
    servicer = GuardedReflection((*service_names, reflection.SERVICE_NAME), auth, reflection_pool())
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)


def reflection_pool(
    descriptor_set: Traversable | None = None,
    served: descriptor_pool.DescriptorPool | None = None,
) -> DocumentedPool | descriptor_pool.DescriptorPool:
    """The pool to give the reflection service: `served` (default: the default pool, which
    the generated code and grpcio's health and reflection modules fill) with the comments
    of `descriptor_set` (default: the one shipped with kvbudget.v1). Never raises: without
    a usable set it is `served` itself, and the log says why."""
    served = descriptor_pool.Default() if served is None else served
    source = bundled_descriptor_set() if descriptor_set is None else descriptor_set
    try:
        files = descriptor_pb2.FileDescriptorSet.FromString(source.read_bytes()).file
    except (OSError, DecodeError) as exc:
        log.warning("reflection: cannot read the descriptor set %s (%s): clients see the API without its "
                    "comments", source, exc)
        return served
    documented: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    stale: list[str] = []
    for file in files:
        try:
            served_file = served.FindFileByName(file.name)
        except KeyError:
            continue  # not a file this daemon serves
        if _without_docs(file) == _without_docs(_as_proto(served_file)):
            documented[file.name] = file
        else:
            stale.append(file.name)
    if stale:
        # A client must get the types the daemon serves, so a differing file is served bare.
        log.warning("reflection: %s in the descriptor set differ from the generated code (run "
                    "protos/generate.sh): served without comments", ", ".join(stale))
    if not documented:
        if not stale:
            log.warning("reflection: the descriptor set %s holds none of the served files: clients see the API "
                        "without its comments", source)
        return served
    return DocumentedPool(served, documented)


def _as_proto(file: FileDescriptor) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    return proto


def _without_docs(file: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """The file as the generated code holds it, to compare the two: no source info and no
    `json_name` (protoc's descriptor set spells out the default json names, the Python
    generator leaves them to be derived; either way they are the same names)."""
    bare = descriptor_pb2.FileDescriptorProto()
    bare.CopyFrom(file)
    bare.ClearField("source_code_info")
    _clear_json_names(bare.extension)
    for message in bare.message_type:
        _clear_message_json_names(message)
    return bare


def _clear_message_json_names(message: descriptor_pb2.DescriptorProto) -> None:
    _clear_json_names(message.field)
    _clear_json_names(message.extension)
    for nested in message.nested_type:
        _clear_message_json_names(nested)


def _clear_json_names(fields: Iterable[descriptor_pb2.FieldDescriptorProto]) -> None:
    for field in fields:
        field.ClearField("json_name")
