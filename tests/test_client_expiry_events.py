"""Lease expiry and the Events stream as an engine sees them through `EngineClient`.

The daemon here is the real core and engine servicer, served in process on a unix socket,
with the ticker (lease expiry, queue scheduling) driven by the test: `lapse()` makes a
session's lease run out, `tick()` is what the daemon's ticker does on its next round. So
the window between a lease lapsing and the ticker taking the session back, 0.1 s at most
in a running daemon, can be held open and hit on purpose.

Regression (lapsed, not yet taken back): an engine whose call arrived in that window
heard FAILED_PRECONDITION "its lease lapsed", and its client's re-open got ALREADY_EXISTS
(its own old session still held the engine id): `step()` raised ALREADY_EXISTS, which the
guide says means another process took the engine id over, and the heartbeats stopped for
good. In a real daemon, 11 of 20 engines that stepped 1.000 to 1.066 s after their last
call (1 s leases) met it. OpenSession now takes a lapsed session back itself (its EXPIRE
decisions logged, as the ticker's would be) before it opens the new one, so any client's
re-open works: `step()` raises SessionLost, once.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from kvbudget.client import EngineClient, SessionLost
from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.server.auth import Authorizer
from kvbudget.daemon.server.service import CoreOptions, CoreService
from kvbudget.daemon.log.decision_log import DecisionLog
from kvbudget.daemon.core.records import Decision, RequestSpec
from kvbudget.daemon.server.servicers import EngineServicer
from kvbudget.daemon.server.sessions import SessionTable
from kvbudget.daemon.core.spec import group_layers
from kvbudget.daemon.server.watch import WatchHub
from kvbudget.v1 import common_pb2, engine_pb2_grpc

from test_admission_support import full_spec, kinds

BLOCK_SIZE = 16
NUM_BLOCKS = 20
WAIT_S = 20.0  # a bound against a hang, not a measurement


class HookedEngineServicer(EngineServicer):
    """The engine servicer; a test may put `open_hook(open_session, request, context)`
    around OpenSession (grpc takes the methods when the servicer is added)."""

    open_hook = None

    async def OpenSession(self, request, context):
        if self.open_hook is not None:
            return await self.open_hook(super().OpenSession, request, context)
        return await super().OpenSession(request, context)


class InProcessDaemon:
    """The core and the engine servicer on a unix socket; the test runs the ticker."""

    def __init__(self, tmp_path) -> None:
        layout = group_layers([full_spec(BLOCK_SIZE)])
        config = AdmissionConfig(max_model_len=256, max_num_batched_tokens=256, watermark=0.0, policy="guaranteed")
        self.controller = AdmissionController(layout, NUM_BLOCKS, config)
        self.log = DecisionLog(tmp_path / "decisions.db")
        self.core = CoreService(
            self.controller, self.log, common_pb2.PoolPlan(block_size_tokens=BLOCK_SIZE, num_blocks=NUM_BLOCKS),
            SessionTable(600.0, max_ttl_s=3600.0, max_sessions=64), WatchHub(4),
            options=CoreOptions(tick_s=3600.0),  # the test calls tick() itself
        )
        self.servicer = HookedEngineServicer(self.core, Authorizer({}))
        self.target = f"unix://{tmp_path / 'kvbudget.sock'}"
        self.server = grpc.aio.server()
        engine_pb2_grpc.add_EngineServiceServicer_to_server(self.servicer, self.server)
        self.server.add_insecure_port(self.target)

    async def start(self) -> None:
        self.log.start()
        await self.server.start()
        await self.core.start()

    async def stop(self) -> None:
        self.core.end_all_streams()
        await self.server.stop(0)
        await self.core.stop()
        self.log.close()

    async def tick(self) -> None:
        """The ticker's round: lapsed sessions expired, the queue scheduled."""
        await self.core.tick(time.monotonic())

    def lapse(self, engine_id: str) -> None:
        """The engine has been silent past its lease (a partition, a stall)."""
        self.core.sessions.of_engine(engine_id).expires_at = time.monotonic() - 1.0

    def held(self) -> int:
        self.controller.check_integrity()
        return self.controller.pool.num_held_blocks


@pytest.fixture
async def daemon(tmp_path):
    d = InProcessDaemon(tmp_path)
    await d.start()
    yield d
    await d.stop()
    d.controller.check_integrity()


async def read_events(client: EngineClient, heard: list[Decision]) -> None:
    async for decision in client.events():
        heard.append(decision)


async def until(predicate) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.01)


def spec(request_id: str, prompt: int, new: int) -> RequestSpec:
    return RequestSpec(request_id, prompt_tokens=prompt, max_new_tokens=new)


async def test_a_step_in_the_lapsed_window_is_session_lost_not_already_exists(daemon) -> None:
    refused_opens: list[str] = []
    ticks: list[asyncio.Future] = []

    async def open_then_tick(open_session, request, context):
        existing = daemon.core.sessions.of_engine(request.engine_id)
        if existing is None or existing.expires_at > time.monotonic():
            return await open_session(request, context)
        # Its own lapsed session still holds the engine id: refused. The ticker's next round
        # comes right after: the window between the lapse and the ticker is held open so long.
        refused_opens.append(request.engine_id)
        try:
            return await open_session(request, context)
        finally:
            asyncio.get_running_loop().call_soon(lambda: ticks.append(asyncio.ensure_future(daemon.tick())))

    daemon.servicer.open_hook = open_then_tick
    async with EngineClient(daemon.target, "e", heartbeat=False) as client:
        first = client.session_id
        # a: a 16-token prompt holds cdiv(16, 16) = 1 block (its 16 new tokens are reserved)
        assert kinds(await client.step(submits=[spec("a", 16, 16)])) == [("admit", "fits", "a")]
        assert daemon.held() == 1
        daemon.lapse("e")  # the session is still listed: the ticker has not seen it yet
        with pytest.raises(SessionLost, match="lease lapsed"):
            await client.step()
        # Its re-open met its own lapsed session once, waited for the tick, then opened.
        assert refused_opens == ["e"]
        assert client.session_id != first and client.sessions_opened == 2
        assert daemon.held() == 0  # a's block went back (EXPIRE)
        # Told once: the next step is an ordinary one of the new session.
        assert kinds(await client.step(submits=[spec("a", 16, 16)])) == [("admit", "fits", "a")]
        assert daemon.held() == 1
    assert daemon.held() == 0  # close() released a


async def test_heartbeats_in_the_lapsed_window_go_on_and_the_next_step_is_session_lost(daemon) -> None:
    refused_opens: list[str] = []
    ticks: list[asyncio.Future] = []

    async def open_then_tick(open_session, request, context):
        existing = daemon.core.sessions.of_engine(request.engine_id)
        if existing is not None and existing.expires_at <= time.monotonic():
            refused_opens.append(request.engine_id)
            asyncio.get_running_loop().call_soon(lambda: ticks.append(asyncio.ensure_future(daemon.tick())))
        return await open_session(request, context)

    daemon.servicer.open_hook = open_then_tick
    # A 1 s lease: a heartbeat every 1/3 s.
    async with EngineClient(daemon.target, "e", lease_ttl_s=1) as client:
        assert kinds(await client.step(submits=[spec("a", 16, 16)])) == [("admit", "fits", "a")]
        daemon.lapse("e")  # (a stall past the lease: the next heartbeat finds it lapsed)
        await until(lambda: client.sessions_opened == 2)
        assert refused_opens == ["e"]  # its own lapsed session, once; then the tick took it back
        assert not client._heartbeat_task.done()  # the heartbeats did not stop
        assert daemon.held() == 0
        with pytest.raises(SessionLost, match="lease lapsed"):
            await client.step(submits=[spec("b", 16, 16)])  # not sent: the heartbeat found out
        assert kinds(await client.step(submits=[spec("a", 16, 16)])) == [("admit", "fits", "a")]
        assert daemon.held() == 1


async def test_events_hear_the_expiry_then_follow_the_new_session_each_decision_once(daemon) -> None:
    async with (
        EngineClient(daemon.target, "e", heartbeat=False) as engine,
        EngineClient(daemon.target, "f", heartbeat=False) as other,
    ):
        heard: list[Decision] = []
        reader = asyncio.create_task(read_events(engine, heard))
        # Reserved (guaranteed: prompt + max new tokens, in 16-token blocks, of 20):
        # a1 cdiv(16 + 16, 16) = 2; big cdiv(min(256 + 32, 256), 16) = 16, 18 in all;
        # q cdiv(32 + 16, 16) = 3 > 20 - 18 = 2 left: it waits.
        assert kinds(await engine.step(submits=[spec("a1", 16, 16)])) == [("admit", "fits", "a1")]
        assert kinds(await other.step(submits=[spec("big", 256, 32)])) == [("admit", "fits", "big")]
        [queued] = await engine.step(submits=[spec("q", 32, 16)])
        assert queued.kind.value == "queue"
        first = engine.session_id
        await until(lambda: daemon.core.sessions.get(first).events_reader is not None)  # reading

        daemon.lapse("e")
        await daemon.tick()
        # Its stream hears both expired (the latest request first), then ends.
        await until(lambda: len(heard) == 2)
        assert kinds(heard) == [("expire", "lease_expired", "q"), ("expire", "lease_expired", "a1")]
        assert daemon.core.dispatcher.num_expiring == 0
        assert daemon.held() == 16  # big's 16 prompt blocks

        with pytest.raises(SessionLost, match="unknown session"):
            await engine.step(submits=[spec("a1", 16, 16)])
        # The engine resubmits both: the same 18 reserved, q waits again.
        assert kinds(await engine.step(submits=[spec("a1", 16, 16)])) == [("admit", "fits", "a1")]
        [queued] = await engine.step(submits=[spec("q", 32, 16)])
        assert queued.kind.value == "queue"
        # big finishes: 2 reserved, q's 3 fit; its admission is the engine's, on Events.
        assert kinds(await other.step(finishes=["big"])) == [("release", "finished", "big")]
        await until(lambda: len(heard) == 3)
        assert kinds(heard[2:]) == [("admit", "fits", "q")]
        assert heard[0].seq + 1 == heard[1].seq < heard[2].seq  # each once, in the order made
        assert engine.session_id != first and engine.sessions_opened == 2
        assert kinds(await engine.step(finishes=["q"])) == [("release", "finished", "q")]  # told once
        assert len(heard) == 3
    await asyncio.wait_for(reader, WAIT_S)  # close() ended the iteration
    assert daemon.held() == 0


async def test_a_replaced_engine_hears_its_expiry_and_its_replacement_never_does(daemon) -> None:
    old = EngineClient(daemon.target, "e", heartbeat=False)
    new = EngineClient(daemon.target, "e", heartbeat=False, replace_existing=True)
    other = EngineClient(daemon.target, "f", heartbeat=False)
    try:
        await old.open()
        await other.open()
        heard_old: list[Decision] = []
        heard_new: list[Decision] = []
        old_reader = asyncio.create_task(read_events(old, heard_old))
        # big cdiv(min(256 + 64, 256), 16) = 16 of 20 reserved; a cdiv(16 + 16, 16) = 2
        assert kinds(await other.step(submits=[spec("big", 256, 64)])) == [("admit", "fits", "big")]
        assert kinds(await old.step(submits=[spec("a", 16, 16)])) == [("admit", "fits", "a")]
        await until(lambda: daemon.core.sessions.get(old.session_id).events_reader is not None)

        await new.open()  # another process takes engine id e over: a is expired
        new_reader = asyncio.create_task(read_events(new, heard_new))
        await until(lambda: len(heard_old) == 1)
        assert kinds(heard_old) == [("expire", "lease_expired", "a")]
        assert daemon.core.dispatcher.num_expiring == 0
        # The new session's own: b cdiv(48, 16) = 3 fits (16 + 3 = 19), c 3 more does not.
        assert kinds(await new.step(submits=[spec("b", 32, 16)])) == [("admit", "fits", "b")]
        [queued] = await new.step(submits=[spec("c", 32, 16)])
        assert queued.kind.value == "queue"
        assert kinds(await other.step(finishes=["big"])) == [("release", "finished", "big")]
        await until(lambda: len(heard_new) == 1)
        assert kinds(heard_new) == [("admit", "fits", "c")]  # and never a's expiry
        # The old client never takes the id back: its step says who holds it.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await old.step()
        assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert "engine_id" in refused.value.details()
        assert len(heard_old) == 1
    finally:
        await old.close()
        await new.close()
        await other.close()
    await asyncio.wait_for(old_reader, WAIT_S)
    await asyncio.wait_for(new_reader, WAIT_S)
    assert daemon.held() == 0


async def test_twenty_engines_expiring_in_one_tick_each_hear_their_own_and_nothing_stays(daemon) -> None:
    clients = [EngineClient(daemon.target, f"e{i}", heartbeat=False) for i in range(20)]
    readers: list[asyncio.Task] = []
    heard: list[list[Decision]] = [[] for _ in clients]
    try:
        for i, client in enumerate(clients):
            await client.open()
            # each cdiv(8 + 8, 16) = 1 block: 20 of 20
            assert kinds(await client.step(submits=[spec(f"r{i}", 8, 8)])) == [("admit", "fits", f"r{i}")]
            readers.append(asyncio.create_task(read_events(client, heard[i])))
        assert daemon.controller.pool.num_free_blocks == 0
        sessions = [daemon.core.sessions.of_engine(f"e{i}") for i in range(20)]
        await until(lambda: all(s.events_reader is not None for s in sessions))
        for i in range(20):
            daemon.lapse(f"e{i}")
        await daemon.tick()
        await until(lambda: all(len(h) == 1 for h in heard))
        for i, h in enumerate(heard):
            assert kinds(h) == [("expire", "lease_expired", f"r{i}")]
        assert all(s.closed for s in sessions)  # every old stream was ended
        assert daemon.core.dispatcher.num_expiring == 0
        assert len(daemon.core.sessions) == 0
        assert daemon.held() == 0 and daemon.controller.pool.num_free_blocks == 20
    finally:
        for client in clients:
            await client.close()
    await asyncio.wait_for(asyncio.gather(*readers), WAIT_S)
