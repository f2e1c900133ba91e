"""The engine client across a daemon restart: it re-opens its session, says so once, and its
Events stream follows the new daemon."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from kvbudget.client import EngineClient, SessionLost
from kvbudget.daemon.core.records import DecisionKind, Reason, RequestSpec

from daemon_harness import DaemonProcess

pytestmark = pytest.mark.slow


async def test_client_survives_a_daemon_restart(tmp_path) -> None:
    first = DaemonProcess(tmp_path, "--policy", "guaranteed", lease_ttl_s=3).start()
    a = EngineClient(first.target, "engine-a", call_timeout_s=60)
    try:
        await a.open()
        [admit] = await a.step(submits=[RequestSpec("before", 16, 16)])
        assert admit.kind == DecisionKind.ADMIT
        events = a.events()
        next_event = asyncio.ensure_future(anext(events))
        assert first.stop() == 0

        second = DaemonProcess(tmp_path, "--policy", "guaranteed", lease_ttl_s=3).start()
        try:
            with pytest.raises(SessionLost):
                await a.step(submits=[RequestSpec("lost", 16, 16)])
            assert a.sessions_opened == 2
            # The new daemon does not know "before": the engine resubmits what it still runs.
            async with EngineClient(second.target, "engine-b") as b:
                [big] = await b.step(submits=[RequestSpec("big", 512, 512)])  # the whole budget: 64 blocks
                assert big.kind == DecisionKind.ADMIT
                [queued] = await a.step(submits=[RequestSpec("before", 16, 16)])
                assert (queued.kind, queued.reason) == (DecisionKind.QUEUE, Reason.BUDGET_FULL)
                await b.step(finishes=["big"])
                admitted = await asyncio.wait_for(next_event, 60)
                assert (admitted.kind, admitted.request_id, admitted.engine_id) == (
                    DecisionKind.ADMIT, "before", "engine-a")
            await events.aclose()
        finally:
            await a.close()
            second.stop()
    finally:
        first.stop()


async def test_replace_existing_session_expires_the_old_ones_requests(tmp_path) -> None:
    with DaemonProcess(tmp_path, "--policy", "guaranteed") as daemon:
        old = EngineClient(daemon.target, "engine-a", heartbeat=False)
        await old.open()
        await old.step(submits=[RequestSpec("orphan", 32, 16)])  # cdiv(32, 16) = 2 blocks held
        async with EngineClient(daemon.target, "engine-a", replace_existing=True) as new:
            # The restarted engine's fresh session ends the old one: its request expires.
            [expire] = daemon.decision_rows("kind = 'expire'")
            assert (expire["request_id"], expire["reason"], expire["freed_blocks"]) == ("orphan", "lease_expired", 2)
            # The old process cannot take the engine id back: its re-open is refused.
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await old.step(finishes=["orphan"])
            assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
            [admit] = await new.step(submits=[RequestSpec("orphan", 32, 16)])
            assert admit.kind == DecisionKind.ADMIT
        await old.close()  # its session is gone already: nothing to release, no error
