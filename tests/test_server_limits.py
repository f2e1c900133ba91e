"""Limits the daemon enforces come back as RESOURCE_EXHAUSTED naming what ran out."""

from __future__ import annotations

import grpc
import pytest

from kvbudget.daemon.server.lifecycle import MAX_WATCHERS
from kvbudget.v1 import observer_pb2, observer_pb2_grpc

from daemon_harness import DaemonProcess

pytestmark = pytest.mark.slow


def test_one_watcher_too_many_is_resource_exhausted_and_the_others_keep_going(tmp_path) -> None:
    with DaemonProcess(tmp_path) as daemon, grpc.insecure_channel(daemon.target) as channel:
        observer = observer_pb2_grpc.ObserverServiceStub(channel)
        streams = [observer.Watch(observer_pb2.WatchRequest(interval_ms=1000)) for _ in range(MAX_WATCHERS)]
        try:
            for stream in streams:
                assert next(stream).snapshot.num_blocks == 64  # each got its full snapshot first
            extra = observer.Watch(observer_pb2.WatchRequest(interval_ms=1000))
            with pytest.raises(grpc.RpcError) as info:
                next(extra)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert info.value.details().startswith("watchers")
            # The refused one took nothing away: an existing watcher still gets its updates.
            assert next(streams[0]).snapshot.num_blocks == 64
        finally:
            for stream in streams:
                stream.cancel()
