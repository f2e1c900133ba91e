"""Issue 30, point 3: Step replies and the Events stream are two calls, and a decision on
Events can arrive after a later Step reply about the same request. EngineClient returns
each request's decisions in the daemon's order (by seq) and drops an older one, so an
engine that applies what step() and events() give it in arrival order cannot go wrong.

Through a real daemon, in the order that broke engines: B's request is preempted by A's
growth (a PREEMPT on B's Events), then admitted again in B's own step (an ADMIT in B's
Step reply, newer); B reads the Step reply first, then Events.
"""

from __future__ import annotations

import asyncio

import pytest

from kvbudget.client.engine import EngineClient
from kvbudget.client.ordering import DecisionOrder
from kvbudget.daemon.core.records import Decision, DecisionKind, Reason
from kvbudget.v1 import engine_pb2

from daemon_harness import DaemonProcess

pytestmark = pytest.mark.slow
WAIT_S = 20.0  # a bound, not a measurement


def _submit(request_id: str, prompt: int, new: int, priority: int = 0) -> engine_pb2.Submit:
    return engine_pb2.Submit(request_id=request_id, prompt_tokens=prompt, max_new_tokens=new, priority=priority)


async def _mixed(target: str) -> tuple[list[Decision], list[Decision]]:
    async with EngineClient(target, "order-a", heartbeat=False) as a, \
            EngineClient(target, "order-b", heartbeat=False) as b:
        # Of the 64 blocks: A's a-0 1, B's r-0 1 and r-1 20 (the worst priority), A's x-1 40.
        await a.step(submits=[_submit("a-0", 16, 16)])
        await b.step(submits=[_submit("r-0", 16, 16), _submit("r-1", 320, 16, priority=5)])
        [admit] = await a.step(submits=[_submit("x-1", 640, 200)])
        assert admit.kind is DecisionKind.ADMIT
        # x-1 growing by 10 blocks preempts r-1: a PREEMPT on B's Events, not yet read.
        assert [d.kind for d in await a.step(grows=[("x-1", 800)])] == [DecisionKind.GROW]
        # A ends x-1 in a step that starts nothing (admit_seqs=0): r-1 waits, and B's own
        # next step (it ends r-0) admits it again: a newer ADMIT, in B's Step reply.
        await a.step(finishes=["x-1"], admit_seqs=0)
        from_step = await b.step(finishes=["r-0"])
        # r-2 waits for r-1's blocks; B ends r-1 starting nothing, and A's next step admits
        # r-2: an ADMIT on B's Events, after the stale PREEMPT.
        [queued] = await b.step(submits=[_submit("r-2", 960, 16)])
        assert queued.kind is DecisionKind.QUEUE
        await b.step(finishes=["r-1"], admit_seqs=0)
        await a.step(progress=[("a-0", 8)])
        heard: list[Decision] = []

        async def read() -> None:
            async for decision in b.events():
                heard.append(decision)
                if decision.request_id == "r-2":
                    return

        await asyncio.wait_for(read(), WAIT_S)
        return from_step, heard


def test_an_events_decision_older_than_a_step_reply_is_dropped(tmp_path) -> None:
    with DaemonProcess(tmp_path, "--policy", "optimistic", lease_ttl_s=600) as daemon:
        from_step, heard = asyncio.run(_mixed(daemon.target))
    assert [(d.kind, d.request_id) for d in from_step] == [(DecisionKind.RELEASE, "r-0"), (DecisionKind.ADMIT, "r-1")]
    # What B's engine applies, in arrival order: r-1 stays running (its ADMIT), never
    # taken for waiting by the stale PREEMPT; r-2's ADMIT comes through.
    assert [(d.kind, d.request_id) for d in heard] == [(DecisionKind.ADMIT, "r-2")]


def _decision(seq: int, kind: DecisionKind, request_id: str) -> Decision:
    return Decision(seq=seq, time_s=0.0, kind=kind, reason=Reason.NONE, request_id=request_id)


def test_per_request_newest_wins_and_an_ended_id_may_come_back() -> None:
    order = DecisionOrder(max_ended=2)
    assert order.fresh([_decision(5, DecisionKind.ADMIT, "r"), _decision(6, DecisionKind.GROW, "r")])
    assert order.fresh([_decision(4, DecisionKind.PREEMPT, "r"), _decision(6, DecisionKind.GROW, "r")]) == []
    assert order.fresh([_decision(3, DecisionKind.QUEUE, "other")])  # other requests: their own order
    assert order.fresh([_decision(7, DecisionKind.RELEASE, "r")])
    assert order.fresh([_decision(6, DecisionKind.ADMIT, "r")]) == []  # late, of the ended request
    assert order.fresh([_decision(9, DecisionKind.QUEUE, "r")])  # the id used again
