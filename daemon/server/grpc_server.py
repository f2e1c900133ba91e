"""The daemon's gRPC server: the three services, health and reflection on one
`grpc.aio.Server`, every handler counted while in flight, bound to the configured listeners."""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvbudget.daemon.config.settings import DaemonConfig
from kvbudget.daemon.server.auth import Authorizer
from kvbudget.daemon.server.health import SERVICE_NAMES, Health
from kvbudget.daemon.server.in_flight import InFlightCalls
from kvbudget.daemon.server.listeners import Listener, bind
from kvbudget.daemon.server.malformed import add_checked
from kvbudget.daemon.server.reflection import enable_reflection
from kvbudget.daemon.server.service import CoreService
from kvbudget.daemon.server.servicers import AdminServicer, EngineServicer, ObserverServicer
from kvbudget.daemon.server.steps import MAX_MESSAGE_BYTES
from kvbudget.daemon.server.startup import StartupError
from kvbudget.daemon.config.tls_files import TlsError, key_file_warnings, read_client_ca, read_pair
from kvbudget.daemon.server.tls import ServedCertificate, warn_if_expired
from kvbudget.v1 import admin_pb2_grpc, engine_pb2_grpc, observer_pb2_grpc

log = logging.getLogger("kvbudget.daemon")
_GRPC_CORE_LOG = "grpc._cython.cygrpc"  # (grpc.aio's server logs a handler's failures here)


class _CancelledCallFilter(logging.Filter):
    """A reply gRPC could not send because the caller was gone (cancelled, past its deadline,
    disconnected) is logged by grpc.aio as `ERROR: ExecuteBatchError raised in core by servicer
    method` with a traceback, depending on a race with the cancellation. Nothing failed on the
    daemon's side: it becomes one DEBUG line."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if type(error).__name__ != "ExecuteBatchError":
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.msg, record.args = "%s: the caller left before its reply was sent", (record.getMessage(),)
        record.exc_info = record.exc_text = None
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def quiet_cancelled_calls() -> None:
    """Installs `_CancelledCallFilter` once (idempotent)."""
    core_log = logging.getLogger(_GRPC_CORE_LOG)
    if not any(isinstance(f, _CancelledCallFilter) for f in core_log.filters):
        core_log.addFilter(_CancelledCallFilter())


def served_certificate(config: DaemonConfig) -> ServedCertificate | None:
    """With TLS: the certificate the TCP listeners present (and the client CAs), read again."""
    if not config.tls_enabled:
        return None
    try:
        client_ca = read_client_ca(config.tls_client_ca_file) if config.tls_client_ca_file else None
        certificate = ServedCertificate(read_pair(config.tls_cert_file, config.tls_key_file), client_ca)
    except TlsError as exc:  # (the config checked it; the files changed since)
        raise StartupError(f"{exc.field}: {exc}") from None
    log.info("tls certificate %s", certificate.pair.describe())
    if client_ca is not None:
        log.info("tls client certificates required, signed by %s", client_ca.describe())
    warn_if_expired(certificate.pair, client_ca)
    for warning in key_file_warnings(config.tls_key_file):
        log.warning("%s", warning)
    return certificate


def build_server(
    config: DaemonConfig, core: CoreService, health: Health, auth: Authorizer, calls: InFlightCalls,
    certificate: ServedCertificate | None, on_drain: Callable[[], object],
) -> tuple[grpc.aio.Server, list[Listener]]:
    """The server, its services added and its listeners bound (not started yet)."""
    quiet_cancelled_calls()
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ]
    )
    add_checked(engine_pb2_grpc.add_EngineServiceServicer_to_server, EngineServicer(core, auth), server, calls)
    add_checked(
        observer_pb2_grpc.add_ObserverServiceServicer_to_server,
        ObserverServicer(core, auth, db_path=config.db_path, watch_max_hz=config.watch_max_hz), server, calls,
    )
    add_checked(
        admin_pb2_grpc.add_AdminServiceServicer_to_server,
        AdminServicer(core, auth, on_drain=on_drain), server, calls,
    )
    add_checked(health_pb2_grpc.add_HealthServicer_to_server, health, server, calls)  # (bad bytes: INVALID_ARGUMENT)
    # The served descriptors with the .proto comments, so `grpcurl describe` shows the docs;
    # over TCP behind a token, as the observer's calls are (health stays open).
    enable_reflection((*SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name), server, auth)
    return server, [bind(server, address, certificate) for address in config.listen]
