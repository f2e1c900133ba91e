"""Per-engine figures in the snapshot (EngineState): an engine's blocks held are its distinct
pool blocks, so a prefix block its requests share counts once (the service's engine tally,
kvbudget.daemon.server.service).

Every figure below is worked out by hand; `check_integrity` recounts the pool from the block
tables after every operation.

An engine's session that ends by expiry (lease lapsed, replaced) is told of its requests'
EXPIRE decisions on its Events stream before the stream ends, and no other session is.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.server.service import CoreService
from kvbudget.daemon.log.decision_log import DecisionLog
from kvbudget.daemon.core.records import Decision, RequestSpec
from kvbudget.daemon.server.sessions import Session, SessionTable
from kvbudget.daemon.core.spec import group_layers
from kvbudget.daemon.server.watch import WatchHub
from kvbudget.v1 import common_pb2, engine_pb2, engine_pb2_grpc

from daemon_harness import DaemonProcess
from test_admission_support import full_spec, kinds

BLOCK_SIZE = 16
PREFIX = (101, 102)  # a 32-token prefix: 2 full prompt blocks every request below shares


@pytest.fixture
def core(tmp_path):
    layout = group_layers([full_spec(BLOCK_SIZE)])  # one full-attention group
    config = AdmissionConfig(max_model_len=256, max_num_batched_tokens=256, watermark=0.0, policy="guaranteed")
    controller = AdmissionController(layout, 20, config)
    decision_log = DecisionLog(tmp_path / "decisions.db")
    decision_log.start()
    service = CoreService(
        controller, decision_log, common_pb2.PoolPlan(block_size_tokens=BLOCK_SIZE),
        SessionTable(600.0, max_ttl_s=3600.0, max_sessions=8), WatchHub(4),
    )
    for engine_id in ("e", "f"):
        service.sessions.open(engine_id, 600.0, time.monotonic())
    yield service
    decision_log.close()
    controller.check_integrity()


def shared(request_id: str, engine_id: str) -> RequestSpec:
    """40 tokens: the 2 shared prefix blocks (hits once published) and 1 block of its own."""
    return RequestSpec(request_id, 40, 0, PREFIX, engine_id=engine_id)


def engines(core: CoreService) -> dict[str, tuple[int, int, int]]:
    """(blocks held, running, waiting) per engine, as the snapshot says."""
    return {e.engine_id: (e.blocks_held, e.running, e.waiting) for e in core.snapshot_proto(fresh=True).engines}


def test_a_prefix_two_requests_of_one_engine_share_counts_once(core: CoreService) -> None:
    ctrl = core.controller
    # a: cdiv(40, 16) = 3 blocks; its progress publishes its 2 full prompt blocks.
    assert kinds(ctrl.submit(shared("a", "e"), 0.0)) == [("admit", "fits", "a")]
    ctrl.progress("a", 40, 0.0)
    ctrl.check_integrity()
    assert engines(core)["e"] == (3, 1, 0)
    # b hits a's 2 blocks and takes 1 of its own: the pool holds 3 + 1 = 4, and so does
    # engine e (summing each request's 3 would say 6, more than the pool holds).
    assert kinds(ctrl.submit(shared("b", "e"), 0.0)) == [("admit", "prefix_hit", "b")]
    ctrl.check_integrity()
    assert ctrl.pool.num_held_blocks == 4
    assert engines(core) == {"e": (4, 2, 0), "f": (0, 0, 0)}
    # a ends: its own block goes, the 2 shared stay with b: 2 + 1 = 3.
    assert kinds(ctrl.finish("a", 1.0)) == [("release", "finished", "a")]
    ctrl.check_integrity()
    assert ctrl.pool.num_held_blocks == 3
    assert engines(core)["e"] == (3, 1, 0)


def test_a_prefix_two_engines_share_counts_once_for_each(core: CoreService) -> None:
    ctrl = core.controller
    ctrl.submit(shared("a", "e"), 0.0)
    ctrl.progress("a", 40, 0.0)
    ctrl.submit(shared("b", "e"), 0.0)
    # c (engine f) hits the same 2 blocks and takes 1 of its own: the pool holds 4 + 1 = 5;
    # e holds 4 (2 shared + a's 1 + b's 1), f holds 3 (2 shared + c's 1). 4 + 3 = 7 is the
    # pool's 5 plus the 2 blocks the two engines share, each counted by both.
    assert kinds(ctrl.submit(shared("c", "f"), 0.0)) == [("admit", "prefix_hit", "c")]
    ctrl.check_integrity()
    assert ctrl.pool.num_held_blocks == 5
    assert engines(core) == {"e": (4, 2, 0), "f": (3, 1, 0)}
    # e's requests end: f's figure does not move (no block changes hands).
    ctrl.finish("a", 1.0)
    ctrl.finish("b", 1.0)
    ctrl.check_integrity()
    assert ctrl.pool.num_held_blocks == 3
    assert engines(core) == {"e": (0, 0, 0), "f": (3, 1, 0)}


# ---------------------------------------------------------------- expiry on the Events stream
WAIT_S = 20.0  # a bound against a hang, not a measurement


async def stream_to_end(session: Session) -> list[Decision]:
    """What the session's Events stream would send, up to its end marker."""
    heard: list[Decision] = []
    while (decision := await asyncio.wait_for(session.events.get(), WAIT_S)) is not None:
        heard.append(decision)
    return heard


def submit_unattended(core: CoreService, request_id: str) -> asyncio.Future:
    """A decision for engine e that no call of e made (as the ticker's are): it is streamed."""
    now = time.time()
    return core.record(core.controller.submit(RequestSpec(request_id, 16, 16, engine_id="e"), now))


async def test_an_expired_session_hears_its_requests_expired_before_its_stream_ends(core: CoreService) -> None:
    await core.start()
    try:
        session = core.sessions.of_engine("e")
        for request_id in ("a", "b"):
            now = time.time()
            await core.record(core.controller.submit(RequestSpec(request_id, 16, 16, engine_id="e"), now), "e")
        core.controller.check_integrity()
        await core.record(core.close_engine(session, expire=True))
        core.controller.check_integrity()
        assert core.sessions.of_engine("e") is None  # out of the table at once
        # The latest request first, as expire_engine makes them.
        assert kinds(await stream_to_end(session)) == [
            ("expire", "lease_expired", "b"), ("expire", "lease_expired", "a"),
        ]
        assert core.controller.pool.num_held_blocks == 0
    finally:
        await core.stop()


async def test_the_expiry_of_a_replaced_session_does_not_reach_the_session_replacing_it(core: CoreService) -> None:
    await core.start()
    try:
        old = core.sessions.of_engine("e")
        await core.record(core.controller.submit(RequestSpec("a", 16, 16, engine_id="e"), time.time()), "e")
        # What OpenSession(replace_existing) does: the new session opens before the old
        # one's EXPIRE decisions are published.
        expired = core.record(core.close_engine(old, expire=True))
        new = core.sessions.open("e", 600.0, time.monotonic())
        await expired
        # A later decision for engine e is the new session's, and the first on its stream.
        await submit_unattended(core, "c")
        core.controller.check_integrity()
        assert kinds([await asyncio.wait_for(new.events.get(), WAIT_S)]) == [("admit", "fits", "c")]
        assert new.events.qsize() == 0
        assert kinds(await stream_to_end(old)) == [("expire", "lease_expired", "a")]
    finally:
        await core.stop()


@pytest.mark.slow
def test_an_engine_whose_lease_lapsed_hears_its_requests_expired_on_its_open_stream(tmp_path) -> None:
    with DaemonProcess(tmp_path, "--policy", "guaranteed") as daemon:
        channel = grpc.insecure_channel(daemon.target)
        try:
            engine = engine_pb2_grpc.EngineServiceStub(channel)
            # A short lease, and no heartbeat: it lapses while the engine reads its stream.
            session_id = engine.OpenSession(
                engine_pb2.OpenSessionRequest(engine_id="qa-e", lease_ttl_s=2), timeout=WAIT_S
            ).session_id
            submit = engine_pb2.Submit(request_id="r-1", prompt_tokens=16, max_new_tokens=16)
            reply = engine.Step(engine_pb2.StepRequest(session_id=session_id, submits=[submit]), timeout=WAIT_S)
            assert [d.kind for d in reply.decisions] == [common_pb2.DECISION_KIND_ADMIT]
            stream = engine.Events(engine_pb2.EventsRequest(session_id=session_id), timeout=WAIT_S)
            heard = [message.decision for message in stream]  # up to the stream's end
        finally:
            channel.close()
    assert [(d.kind, d.reason, d.request_id) for d in heard] == [
        (common_pb2.DECISION_KIND_EXPIRE, "lease_expired", "r-1"),
    ]
