"""A big step applied in slices (issue 30, point 4): the event loop is let go between
slices of 200 ops, the decisions are those of the whole step applied at once, and nothing
else changes the pool meanwhile (another engine's step waits for the last slice). In
process: the real controller, CoreService and DecisionLog on a file."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

from kvbudget.client import EngineClient
from kvbudget.daemon.config.settings import DaemonConfig
from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core.step import StepOps, apply_step
from kvbudget.daemon.log.decision_log import DecisionLog
from kvbudget.daemon.server.reload import ReloadPlan
from kvbudget.daemon.server.reload_apply import apply_reload
from kvbudget.daemon.server.service import CoreOptions, CoreService
from kvbudget.daemon.server.sessions import SessionTable
from kvbudget.daemon.server.watch import WatchHub
from kvbudget.daemon.wire import convert
from kvbudget.v1 import common_pb2, engine_pb2

from test_admission_support import SMALL_LAYOUTS
from tests.daemon_harness import DaemonProcess

OPS = 3_000  # fifteen slices
NUM_BLOCKS = 2_500  # 3,000 one-block requests: 2,463 admitted (the 1.5% watermark keeps 37 free), 537 queued


def controller() -> AdmissionController:
    return AdmissionController(SMALL_LAYOUTS["full"], NUM_BLOCKS, AdmissionConfig(max_model_len=64))


def submits(engine_id: str) -> tuple[engine_pb2.StepRequest, StepOps]:
    request = engine_pb2.StepRequest(step_seq=1)
    request.submits.extend(engine_pb2.Submit(request_id=f"r{i}", prompt_tokens=4, max_new_tokens=4)
                           for i in range(OPS))
    now = 1000.0
    return request, StepOps(submits=[convert.submit_to_spec(op, engine_id, now) for op in request.submits])


def core_service(tmp_path: Path) -> tuple[CoreService, DecisionLog]:
    """A daemon's core on a real decision log, no lease ticks during the test."""
    log = DecisionLog(tmp_path / "decisions.db")
    log.start()
    core = CoreService(controller(), log, common_pb2.PoolPlan(block_size_tokens=8),
                       SessionTable(5.0, max_ttl_s=3600.0, max_sessions=8), WatchHub(4),
                       options=CoreOptions(tick_s=3600.0))
    return core, log


async def test_a_big_step_lets_the_loop_go_between_slices_and_decides_as_a_whole_one(tmp_path: Path) -> None:
    core, log = core_service(tmp_path)
    await core.start()
    try:
        big = await core.open_session("big", 60, "", False)
        small = await core.open_session("small", 60, "", False)
        request, ops = submits("big")
        request.session_id = big.session_id
        seen_mid_step: list[int] = []
        step = asyncio.ensure_future(core.steps.step(request, time.perf_counter()))
        other = None
        while not step.done():
            await asyncio.sleep(0)
            held = core.controller.snapshot(0.0).num_held_blocks
            if 0 < held < NUM_BLOCKS and other is None:  # between two slices
                seen_mid_step.append(held)
                other = asyncio.ensure_future(core.steps.step(engine_pb2.StepRequest(
                    session_id=small.session_id, submits=[engine_pb2.Submit(request_id="s", prompt_tokens=4)]),
                    time.perf_counter()))
        reply = await step
        other_reply = await other
    finally:
        await core.stop()
        log.close()
    assert seen_mid_step == [200]  # the loop ran after the first slice's 200 admits
    twin = controller()
    whole = apply_step(twin, ops, 1000.0)
    fields = ("seq", "kind", "reason", "request_id", "blocks_held", "new_block_ids", "num_free_blocks", "num_waiting")
    sliced = [tuple(getattr(d, f) for f in fields) for d in map(convert.decision_from_proto, reply.decisions)]
    assert sliced == [tuple(getattr(d, f) for f in fields) for d in whole]
    assert [d.kind.value for d in whole].count("queue") == 537
    # The other engine's step waited for the last slice: its decision comes after them all.
    [queued] = other_reply.decisions
    assert queued.seq == OPS + 1


async def test_a_big_step_of_finishes_with_nothing_waiting_is_sliced_and_decides_as_a_whole_one(tmp_path: Path) -> None:
    core, log = core_service(tmp_path)
    twin = controller()
    await core.start()
    try:
        session = await core.open_session("big", 60, "", False)
        admitted = engine_pb2.StepRequest(session_id=session.session_id, step_seq=1)
        admitted.submits.extend(engine_pb2.Submit(request_id=f"r{i}", prompt_tokens=4, max_new_tokens=4)
                                for i in range(2_400))  # (all admitted: twelve slices)
        await core.steps.step(admitted, time.perf_counter())
        apply_step(twin, StepOps(submits=[convert.submit_to_spec(op, "big", 1000.0) for op in admitted.submits]), 1000.0)
        finishes = engine_pb2.StepRequest(session_id=session.session_id, step_seq=2)
        finishes.finishes.extend(engine_pb2.Finish(request_id=f"r{i}") for i in range(2_400))
        step = asyncio.ensure_future(core.steps.step(finishes, time.perf_counter()))
        seen_mid_step = set()
        while not step.done():
            await asyncio.sleep(0)
            held = core.controller.snapshot(0.0).num_held_blocks
            if 0 < held < 2_400:
                seen_mid_step.add(held)
        reply = await step
    finally:
        await core.stop()
        log.close()
    assert seen_mid_step == set(range(2_200, 0, -200))  # after each slice's 200 releases but the last
    whole = apply_step(twin, StepOps(finishes=[f"r{i}" for i in range(2_400)]), 1000.0)
    fields = ("seq", "kind", "reason", "request_id", "freed_blocks", "num_free_blocks")
    sliced = [tuple(getattr(d, f) for f in fields) for d in map(convert.decision_from_proto, reply.decisions)]
    assert sliced == [tuple(getattr(d, f) for f in fields) for d in whole]
    assert len(whole) == 2_400


async def test_a_big_step_whose_caller_left_between_slices_is_applied_whole_and_kept_for_the_resend(
    tmp_path: Path,
) -> None:
    core, log = core_service(tmp_path)
    await core.start()
    try:
        session = await core.open_session("big", 60, "", False)
        request, _ = submits("big")
        request.session_id = session.session_id
        step = asyncio.ensure_future(core.steps.step(request, time.perf_counter()))
        while core.controller.snapshot(0.0).num_held_blocks == 0:
            await asyncio.sleep(0)
        step.cancel()  # (after the first slice: its caller's deadline passed)
        while core.steps.gate.busy:
            await asyncio.sleep(0)
        assert core.controller.snapshot(0.0).num_held_blocks == 2_463  # every slice applied
        resent = await core.steps.step(request, time.perf_counter())  # the same step, its reply lost
    finally:
        await core.stop()
        log.close()
    assert step.cancelled()
    assert len(resent.decisions) == OPS and resent.decisions[-1].seq == OPS  # nothing applied twice


async def test_another_engines_decision_made_by_a_big_step_reaches_its_events_stream(tmp_path: Path) -> None:
    # The sliced step tells the dispatcher, slice by slice, whether any decision is another
    # engine's (the dispatcher no longer scans the whole step): a queued request of "small"
    # admitted by "big"'s big step must still reach small's Events stream.
    core, log = core_service(tmp_path)
    await core.start()
    try:
        big = await core.open_session("big", 60, "", False)
        small = await core.open_session("small", 60, "", False)
        request, _ = submits("big")  # 2,463 admitted, 537 queued
        request.session_id = big.session_id
        await core.steps.step(request, time.perf_counter())
        queued = await core.steps.step(engine_pb2.StepRequest(
            session_id=small.session_id, submits=[engine_pb2.Submit(request_id="s", prompt_tokens=4)]),
            time.perf_counter())
        finishes = engine_pb2.StepRequest(session_id=big.session_id, step_seq=2)
        finishes.finishes.extend(engine_pb2.Finish(request_id=f"r{i}") for i in range(1_100))
        reply = await core.steps.step(finishes, time.perf_counter())  # (requests wait: applied whole)
        event = await asyncio.wait_for(small.events.get(), 60)  # (a guard: it is there once committed)
    finally:
        await core.stop()
        log.close()
    assert [d.kind for d in queued.decisions] == [common_pb2.DECISION_KIND_QUEUE]
    # 1,100 releases, then the queue pass: big's 537 first (FIFO), then small's
    assert len(reply.decisions) == 1_100 + 537
    assert (event.kind.value, event.request_id, event.engine_id) == ("admit", "s", "small")


async def test_a_big_steps_reply_serialized_slice_by_slice_is_the_whole_replys_bytes(tmp_path: Path) -> None:
    core, log = core_service(tmp_path)
    await core.start()
    try:
        session = await core.open_session("big", 60, "", False)
        request, _ = submits("big")
        request.session_id = session.session_id
        sent = await core.steps.step(request, time.perf_counter(), wire=True)  # (what the server sends)
        kept = await core.steps.step(request, time.perf_counter())  # the same step again: its kept reply
    finally:
        await core.stop()
        log.close()
    assert len(kept.decisions) == OPS and kept.num_free_blocks == 37
    assert sent == kept.SerializeToString()


async def test_a_big_step_over_grpc_gets_its_decisions_in_the_logs_order(tmp_path: Path) -> None:
    with DaemonProcess(tmp_path) as daemon:
        async with EngineClient(daemon.target, "e", heartbeat=False) as engine:
            request = engine_pb2.StepRequest()
            request.submits.extend(engine_pb2.Submit(request_id=f"r{i}", prompt_tokens=4, max_new_tokens=4)
                                   for i in range(1_500))  # (over 1,000: sliced, its reply sent as bytes)
            reply = await engine.step_raw(request)
        rows = daemon.decision_rows("engine_id = 'e' AND seq <= 1500 ORDER BY seq")  # (not the closing rows at stop)
    assert [(d.seq, d.request_id) for d in reply.decisions] == [(r["seq"], r["request_id"]) for r in rows]
    assert [d.request_id for d in reply.decisions] == [f"r{i}" for i in range(1_500)]
    assert reply.num_free_blocks == reply.decisions[-1].num_free_blocks


async def test_a_reloads_new_margins_wait_for_a_big_steps_last_slice(tmp_path: Path) -> None:
    # A reload sent between two slices raises the watermark from 1.5% to 10% (250 of 2,500
    # blocks kept free): had it landed there, the later slices would admit fewer.
    core, log = core_service(tmp_path)
    running = DaemonConfig()
    raised = ReloadPlan(dataclasses.replace(running, watermark=0.10), ("watermark 0.015 -> 0.1",), (), None)
    await core.start()
    try:
        session = await core.open_session("big", 60, "", False)
        request, _ = submits("big")
        request.session_id = session.session_id
        step = asyncio.ensure_future(core.steps.step(request, time.perf_counter()))
        while core.controller.snapshot(0.0).num_held_blocks == 0:
            await asyncio.sleep(0)
        held_at_reload = core.controller.snapshot(0.0).num_held_blocks
        reload = asyncio.ensure_future(apply_reload(core, raised, running, None, None))
        reply = await step
        _, changes = await reload
    finally:
        await core.stop()
        log.close()
    assert held_at_reload == 200  # (sent after the first slice)
    kinds = [d.kind for d in reply.decisions]
    assert kinds.count(common_pb2.DECISION_KIND_ADMIT) == 2_463  # every slice under the 1.5% watermark
    assert changes == ("watermark 0.015 -> 0.1",)


async def test_a_watcher_hears_a_big_steps_decisions_all_and_in_order(tmp_path: Path) -> None:
    # The dispatcher hands a big batch on 1,000 at a time, the loop let go between.
    core, log = core_service(tmp_path)
    await core.start()
    try:
        watcher = core.watch_hub.add(10_000)
        session = await core.open_session("big", 60, "", False)
        request, _ = submits("big")
        request.session_id = session.session_id
        reply = await core.steps.step(request, time.perf_counter())
        heard: list = []
        for _ in range(100_000):  # (turns of the loop; the dispatcher needs a few)
            decisions, dropped = watcher.take()
            heard += decisions
            if len(heard) >= OPS or dropped:
                break
            await asyncio.sleep(0)
    finally:
        await core.stop()
        log.close()
    assert dropped == 0
    assert [d.seq for d in heard] == [d.seq for d in reply.decisions] == list(range(1, OPS + 1))
