"""The observer's and operator's client: snapshots, the Watch stream, decision queries
and the admin calls."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from kvbudget.client.channel import open_channel, task_cancelling
from kvbudget.client.target import call_metadata
from kvbudget.client.messages import PolicySwitch, policy_switch
from kvbudget.daemon.core.records import Decision
from kvbudget.daemon.wire import convert
from kvbudget.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    engine_pb2,
    engine_pb2_grpc,
    observer_pb2,
    observer_pb2_grpc,
)


class ObserverClient:
    """Read-only views, plus the admin calls (which need an admin token over TCP)."""

    def __init__(
        self, target: str, token: str | None = None, *, credentials: grpc.ChannelCredentials | None = None
    ) -> None:
        self._metadata = call_metadata(token)
        self._channel = open_channel(target, credentials)
        self._observer = observer_pb2_grpc.ObserverServiceStub(self._channel)
        self._admin = admin_pb2_grpc.AdminServiceStub(self._channel)
        self._engine = engine_pb2_grpc.EngineServiceStub(self._channel)  # (ReportReplay)
        self._closed = False

    async def __aenter__(self) -> ObserverClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        await self._channel.close()

    async def snapshot(self, *, timeout: float = 10.0, wait_for_ready: bool = True) -> common_pb2.Snapshot:
        """`wait_for_ready=False`: fail at once (UNAVAILABLE, "Connection refused") when no
        daemon is there, instead of waiting `timeout` for one (DEADLINE_EXCEEDED)."""
        response = await self._observer.GetSnapshot(
            observer_pb2.GetSnapshotRequest(), metadata=self._metadata, timeout=timeout, wait_for_ready=wait_for_ready
        )
        return response.snapshot

    async def watch(self, interval_ms: int = 100, max_decisions: int = 200) -> AsyncIterator[observer_pb2.WatchResponse]:
        """The snapshot, then an update every `interval_ms`, until the stream or close() ends it."""
        call = self._observer.Watch(
            observer_pb2.WatchRequest(interval_ms=interval_ms, max_decisions=max_decisions),
            metadata=self._metadata,
            wait_for_ready=True,
        )
        try:
            async for message in call:
                yield message
        except asyncio.CancelledError:
            # close() closing the channel cancels the call: that ends the iteration.
            if self._closed and not task_cancelling():
                return
            raise
        finally:
            call.cancel()

    async def query_decisions(
        self,
        *,
        request_id: str = "",
        engine_id: str = "",
        tenant: str = "",
        kind: str | None = None,
        since_unix_s: float = 0.0,
        until_unix_s: float = 0.0,
        limit: int = 100,
        before_seq: int = 0,
    ) -> list[Decision]:
        """Newest first, at most `limit`. To page back, pass the oldest seq returned as
        `before_seq` (0: no bound): exact, where `until_unix_s` skips decisions that share
        the oldest one's time (one step's do)."""
        request = observer_pb2.QueryDecisionsRequest(
            request_id=request_id,
            engine_id=engine_id,
            tenant=tenant,
            kind=convert.kind_to_proto(kind) if kind else common_pb2.DECISION_KIND_UNSPECIFIED,
            since_unix_s=since_unix_s,
            until_unix_s=until_unix_s,
            limit=limit,
            before_seq=before_seq,
        )
        response = await self._observer.QueryDecisions(request, metadata=self._metadata, timeout=30.0)
        return [convert.decision_from_proto(d) for d in response.decisions]

    async def estimate(self, tokens_per_request: int) -> observer_pb2.EstimateResponse:
        return await self._observer.Estimate(
            observer_pb2.EstimateRequest(tokens_per_request=tokens_per_request), metadata=self._metadata, timeout=10.0
        )

    async def ask_admission(self, request: observer_pb2.AskAdmissionRequest) -> observer_pb2.AskAdmissionResponse:
        """How soon a request of this shape could be admitted (docs/routing.md); changes nothing."""
        return await self._observer.AskAdmission(request, metadata=self._metadata, timeout=10.0)

    async def report_replay(self, replay: common_pb2.ReplayState) -> None:
        """EngineService.ReportReplay; a daemon older than it (0.1) gets the deprecated
        ObserverService one instead."""
        try:
            await self._engine.ReportReplay(
                engine_pb2.EngineServiceReportReplayRequest(replay=replay), metadata=self._metadata, timeout=10.0
            )
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            await self._observer.ReportReplay(
                observer_pb2.ReportReplayRequest(replay=replay), metadata=self._metadata, timeout=10.0
            )

    async def set_policy(self, policy: str) -> PolicySwitch:
        """Switches the admission policy; says the previous one and what it did to the queue."""
        response = await self._admin.SetPolicy(
            admin_pb2.SetPolicyRequest(policy=convert.policy_to_proto(policy)), metadata=self._metadata, timeout=10.0
        )
        return policy_switch(policy, response)

    async def set_tenant_quota(self, tenant: str, max_share: float = 0.0, weight: float = 0.0) -> None:
        await self._admin.SetTenantQuota(
            admin_pb2.SetTenantQuotaRequest(tenant=tenant, max_share=max_share, weight=weight),
            metadata=self._metadata,
            timeout=10.0,
        )

    async def drain(self) -> int:
        response = await self._admin.Drain(admin_pb2.DrainRequest(), metadata=self._metadata, timeout=10.0)
        return response.running
