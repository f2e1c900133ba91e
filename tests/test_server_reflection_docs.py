"""Server reflection carries the .proto comments, as `grpcurl describe kvbudget.v1.StepRequest`
shows them: a reflection client of a real daemon gets the contract's files with their source
info, the same types the daemon serves, and health and reflection still listed and resolvable.
Without a usable descriptor set the daemon serves reflection without comments, and says so.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from daemon_harness import DaemonProcess
from kvbudget.daemon.server.reflection import DocumentedPool, bundled_descriptor_set, reflection_pool
from kvbudget.v1 import engine_pb2

PROTO_DIR = Path(__file__).resolve().parents[1] / "protos" / "kvbudget" / "v1"

# FileDescriptorProto paths (descriptor.proto field numbers): message_type = 4, service = 6,
# and within them field = 2, method = 2.
MESSAGE_TYPE, SERVICE, FIELD, METHOD = 4, 6, 2, 2


@pytest.fixture(scope="module")
def channel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[grpc.Channel]:
    with DaemonProcess(tmp_path_factory.mktemp("reflection")) as daemon, grpc.insecure_channel(daemon.target) as ch:
        yield ch


def _reflect(channel: grpc.Channel, **request: str) -> reflection_pb2.ServerReflectionResponse:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    (response,) = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(**request)]), timeout=10)
    return response


def _files_containing(channel: grpc.Channel, symbol: str) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    response = _reflect(channel, file_containing_symbol=symbol)
    assert response.HasField("file_descriptor_response"), response.error_response
    files = [descriptor_pb2.FileDescriptorProto.FromString(blob)
             for blob in response.file_descriptor_response.file_descriptor_proto]
    return {file.name: file for file in files}


def _comments(file: descriptor_pb2.FileDescriptorProto, *path: int) -> str:
    """The leading and trailing comments at `path`, as a reflection client (grpcurl) shows them."""
    for location in file.source_code_info.location:
        if tuple(location.path) == path:
            return location.leading_comments + location.trailing_comments
    return ""


def _index(items, name: str) -> int:
    return next(index for index, item in enumerate(items) if item.name == name)


@pytest.mark.slow
def test_describe_shows_the_proto_comments(channel: grpc.Channel) -> None:
    files = _files_containing(channel, "kvbudget.v1.EngineService")
    engine = files["kvbudget/v1/engine.proto"]
    step_request = _index(engine.message_type, "StepRequest")
    session_id = _index(engine.message_type[step_request].field, "session_id")
    engine_service = _index(engine.service, "EngineService")
    step = _index(engine.service[engine_service].method, "Step")
    # engine.proto: the message's, a field's and a method's leading comment
    assert "A request id appears at most once per list" in _comments(engine, MESSAGE_TYPE, step_request)
    assert "Required: OpenSessionResponse.session_id" in _comments(
        engine, MESSAGE_TYPE, step_request, FIELD, session_id)
    assert "One call per engine scheduler step" in _comments(engine, SERVICE, engine_service, METHOD, step)
    # its dependency comes documented too
    assert files["kvbudget/v1/common.proto"].source_code_info.location


@pytest.mark.slow
def test_a_reflection_client_gets_the_types_the_daemon_serves(channel: grpc.Channel) -> None:
    pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
    reflected = pool.FindMessageTypeByName("kvbudget.v1.StepRequest")

    def shape(message) -> list[tuple[str, int, int, str]]:
        return [(field.name, field.number, field.type, field.message_type.full_name if field.message_type else "")
                for field in message.fields]

    assert shape(reflected) == shape(engine_pb2.StepRequest.DESCRIPTOR)


@pytest.mark.slow
def test_services_are_listed_and_health_and_reflection_resolve(channel: grpc.Channel) -> None:
    listed = {service.name for service in _reflect(channel, list_services="").list_services_response.service}
    assert listed == {"kvbudget.v1.EngineService", "kvbudget.v1.ObserverService", "kvbudget.v1.AdminService",
                      "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"}
    for service in listed:
        package, _, name = service.rpartition(".")
        assert any(file.package == package and name in {s.name for s in file.service}
                   for file in _files_containing(channel, service).values()), service


def test_the_shipped_set_documents_every_contract_file() -> None:
    import kvbudget.daemon.server.lifecycle  # noqa: F401  (what the daemon imports: every file it serves)

    pool = reflection_pool()
    assert isinstance(pool, DocumentedPool)
    assert pool.documented_files == tuple(sorted(f"kvbudget/v1/{proto.name}" for proto in PROTO_DIR.glob("*.proto")))


@pytest.mark.parametrize("contents", [None, b"\xff not a descriptor set"], ids=["missing", "unreadable"])
def test_without_a_usable_set_reflection_serves_the_default_pool(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, contents: bytes | None) -> None:
    descriptor_set = tmp_path / "descriptor_set.binpb"
    if contents is not None:
        descriptor_set.write_bytes(contents)
    with caplog.at_level(logging.WARNING, logger="kvbudget.daemon"):
        pool = reflection_pool(descriptor_set)
    assert pool is descriptor_pool.Default()
    assert [record.levelno for record in caplog.records] == [logging.WARNING]
    assert "without its comments" in caplog.records[0].getMessage()


def test_a_stale_file_of_the_set_is_served_without_comments(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # engine.proto as it was before a field was added: a client must not learn that old shape
    descriptor_set = descriptor_pb2.FileDescriptorSet.FromString(bundled_descriptor_set().read_bytes())
    engine = next(file for file in descriptor_set.file if file.name == "kvbudget/v1/engine.proto")
    step_request = engine.message_type[_index(engine.message_type, "StepRequest")]
    del step_request.field[-1]
    stale_set = tmp_path / "descriptor_set.binpb"
    stale_set.write_bytes(descriptor_set.SerializeToString())
    with caplog.at_level(logging.WARNING, logger="kvbudget.daemon"):
        pool = reflection_pool(stale_set)
    assert isinstance(pool, DocumentedPool)
    assert "kvbudget/v1/engine.proto" not in pool.documented_files
    assert "kvbudget/v1/common.proto" in pool.documented_files
    served = descriptor_pb2.FileDescriptorProto()
    pool.FindFileContainingSymbol("kvbudget.v1.StepRequest").CopyToProto(served)
    assert [field.name for field in served.message_type[_index(served.message_type, "StepRequest")].field] == [
        field.name for field in engine_pb2.StepRequest.DESCRIPTOR.fields]
    assert not served.HasField("source_code_info")
    assert "kvbudget/v1/engine.proto" in caplog.text
