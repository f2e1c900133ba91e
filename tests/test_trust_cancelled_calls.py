"""Cancelled calls never log ERROR (issue 30, point 6): a caller gone (cancelled, past its
deadline) just as its reply is sent made grpc.aio log `ERROR: ExecuteBatchError raised in
core by servicer method [...]` with a traceback into the daemon's journal, about once in a
thousand cancelled calls (a race inside gRPC with the cancellation's arrival). The daemon's
filter on gRPC's logger turns it into one DEBUG line, shown only at --log-level debug.

The race cannot be hit on demand, so this drives gRPC's own logger with gRPC's own error,
as its server does (grpc/_cython/_cygrpc/aio/server.pyx.pxi `_handle_exceptions`)."""

from __future__ import annotations

import logging

import pytest
from grpc._cython import cygrpc

from kvbudget.daemon.server.grpc_server import quiet_cancelled_calls

GRPC_CORE_LOG = logging.getLogger("grpc._cython.cygrpc")


def _grpc_logs_a_failed_reply() -> None:
    try:
        raise cygrpc.ExecuteBatchError('Failed "execute_batch": (SendInitialMetadataOperation,)')
    except cygrpc.ExecuteBatchError:
        GRPC_CORE_LOG.exception("ExecuteBatchError raised in core by servicer method [%s]",
                                "/kvbudget.v1.ObserverService/GetSnapshot")


@pytest.mark.parametrize("level", [logging.INFO, logging.DEBUG])
def test_a_reply_to_a_caller_gone_is_one_debug_line_not_an_error(caplog: pytest.LogCaptureFixture,
                                                                 level: int) -> None:
    quiet_cancelled_calls()
    quiet_cancelled_calls()  # (once, however often the server is built)
    caplog.set_level(level)
    _grpc_logs_a_failed_reply()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    shown = [r for r in caplog.records if r.name == GRPC_CORE_LOG.name]
    if level == logging.DEBUG:
        [record] = shown
        assert record.exc_info is None and "\n" not in record.getMessage()
        assert record.getMessage() == ("ExecuteBatchError raised in core by servicer method "
                                       "[/kvbudget.v1.ObserverService/GetSnapshot]: the caller left before its "
                                       "reply was sent")
    else:
        assert shown == []


def test_any_other_error_grpc_logs_stays_an_error(caplog: pytest.LogCaptureFixture) -> None:
    quiet_cancelled_calls()
    caplog.set_level(logging.INFO)
    try:
        raise ValueError("a servicer's own bug")
    except ValueError:
        GRPC_CORE_LOG.exception("Unexpected [%s] raised by servicer method [%s]", "ValueError", "/x")
    [record] = [r for r in caplog.records if r.name == GRPC_CORE_LOG.name]
    assert record.levelno == logging.ERROR and record.exc_info is not None
