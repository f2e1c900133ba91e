"""QA of EngineClient's numbered steps as an engine calls them: overlapping step() calls
on one client, and resends, against a real daemon.

The daemon keeps only each session's last numbered step. Two steps of one client in flight
at once (a scheduler loop's step and an abort sent from a request handler's task) therefore
must reach it one after the other, each with its resends, in number order: else the lower
one's resend comes after the higher one and is refused FAILED_PRECONDITION "step_seq: N is
below this session's last step", its outcome lost although it was applied.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

import kvbudget.client.engine as client_module
from kvbudget.client import EngineClient
from kvbudget.daemon.core.records import DecisionKind, RequestSpec

from daemon_harness import DaemonProcess

pytestmark = pytest.mark.slow


@pytest.fixture
def daemon(tmp_path):
    with DaemonProcess(tmp_path, "--policy", "guaranteed", lease_ttl_s=600) as process:
        yield process


class LoseFirstReply(grpc.aio.UnaryUnaryClientInterceptor):
    """Lets the daemon answer step `seq`'s first send, then says the connection dropped
    mid-call (UNAVAILABLE "Socket closed"): the step was applied and its reply lost. It
    says so only once `others` (steps sent meanwhile) have had their answers, or once it is
    clear that none is on its way."""

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.lost = False
        self.others_sent = 0
        self.others_answered = asyncio.Event()

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        call = await continuation(client_call_details, request)
        if not client_call_details.method.endswith(b"/Step"):
            return call
        if request.step_seq != self.seq or self.lost:
            self.others_sent += 1
            await call
            self.others_answered.set()
            return call
        self.lost = True
        await call  # applied and logged: the daemon answered
        for _ in range(200):  # an overlapping step reaches here within a few loop turns
            if self.others_sent:
                break
            await asyncio.sleep(0)
        if self.others_sent:
            await asyncio.wait_for(self.others_answered.wait(), 30)
        raise grpc.aio.AioRpcError(
            grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "Socket closed")


def _with_interceptor(monkeypatch, interceptor) -> None:
    def channel(target, credentials):
        return grpc.aio.insecure_channel(target, interceptors=[interceptor])

    monkeypatch.setattr(client_module, "open_channel", channel)


async def test_overlapping_steps_of_one_client_each_get_their_reply_across_a_resend(
    daemon: DaemonProcess, monkeypatch
) -> None:
    """Step 1's reply is lost while step 2, called meanwhile, is in flight: step 1's resend
    must still get step 1's reply (old client: step 2 reached the daemon first, and step 1's
    resend was refused "step_seq: 1 is below this session's last step (2)")."""
    lose = LoseFirstReply(seq=1)
    _with_interceptor(monkeypatch, lose)
    async with EngineClient(daemon.target, "qa-overlap", heartbeat=False) as engine:
        first = asyncio.create_task(engine.step(submits=[RequestSpec("a", 32, 16)]))
        second = asyncio.create_task(engine.step(submits=[RequestSpec("b", 32, 16)]))
        [admit_a], [admit_b] = await asyncio.gather(first, second)
        assert lose.lost
        assert [(admit_a.kind, admit_a.request_id), (admit_b.kind, admit_b.request_id)] == [
            (DecisionKind.ADMIT, "a"), (DecisionKind.ADMIT, "b")]
        rows = daemon.decision_rows("kind = 'admit'")
        assert sorted(row["request_id"] for row in rows) == ["a", "b"]  # each applied once
        assert admit_a.seq in {row["seq"] for row in rows if row["request_id"] == "a"}
        released = await engine.step(finishes=["a", "b"])
        assert [d.kind for d in released] == [DecisionKind.RELEASE, DecisionKind.RELEASE]


class HoldFirstSend(grpc.aio.UnaryUnaryClientInterceptor):
    """Holds step `seq` back on its way until the steps sent meanwhile were answered (calls
    on one channel are not promised to arrive in the order they were started)."""

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.others_sent = 0
        self.others_answered = asyncio.Event()

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        if client_call_details.method.endswith(b"/Step") and request.step_seq == self.seq:
            for _ in range(200):
                if self.others_sent:
                    break
                await asyncio.sleep(0)
            if self.others_sent:
                await asyncio.wait_for(self.others_answered.wait(), 30)
            return await continuation(client_call_details, request)
        call = await continuation(client_call_details, request)
        if client_call_details.method.endswith(b"/Step"):
            self.others_sent += 1
            await call
            self.others_answered.set()
        return call


async def test_a_step_called_first_is_not_refused_for_arriving_second(daemon: DaemonProcess, monkeypatch) -> None:
    """Old client: each step took its number when called and was sent at once, so the one
    called first but arriving second was refused "step_seq: 1 is below ... (2)"."""
    _with_interceptor(monkeypatch, HoldFirstSend(seq=1))
    async with EngineClient(daemon.target, "qa-order", heartbeat=False) as engine:
        first = asyncio.create_task(engine.step(submits=[RequestSpec("a", 16, 1)]))
        second = asyncio.create_task(engine.step(submits=[RequestSpec("b", 16, 1)]))
        [admit_a], [admit_b] = await asyncio.gather(first, second)
        assert [(admit_a.request_id, admit_a.kind), (admit_b.request_id, admit_b.kind)] == [
            ("a", DecisionKind.ADMIT), ("b", DecisionKind.ADMIT)]
        assert admit_a.seq < admit_b.seq  # applied in the order they were called
