"""Watch as a dashboard lives with it on a real daemon: a reader slower than the decisions
sees each one once, in order, or counted as dropped; a watcher whose client dies gives its
slot back."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

import grpc
import pytest

from kvbudget.client import EngineClient, ObserverClient
from kvbudget.daemon.core.records import RequestSpec
from kvbudget.daemon.server.lifecycle import MAX_WATCHERS

from daemon_harness import DaemonProcess, await_until

pytestmark = pytest.mark.slow

STEPS = 100
PER_STEP = 3  # submits, then as many finishes: 2 * PER_STEP decisions a round


async def test_a_slow_reader_sees_each_decision_once_in_order_or_counted_as_dropped(tmp_path) -> None:
    total = STEPS * 2 * PER_STEP
    with DaemonProcess(tmp_path) as daemon:
        async with EngineClient(daemon.target, "e") as engine, ObserverClient(daemon.target) as observer:
            updates = observer.watch(interval_ms=40, max_decisions=5)
            first = await anext(updates)
            assert sum(first.snapshot.decisions_by_kind.values()) == 0  # a fresh log: seqs 1..total

            async def drive() -> None:
                for k in range(STEPS):
                    ids = [f"s{k}-{i}" for i in range(PER_STEP)]
                    await engine.step(submits=[RequestSpec(rid, 16, 16) for rid in ids])
                    await engine.step(finishes=ids)

            driver = asyncio.create_task(drive())
            last_seq, received, dropped, gaps_unexplained = 0, 0, 0, []
            while last_seq < total:
                update = await asyncio.wait_for(anext(updates), 30)
                seqs = [d.seq for d in update.decisions]
                if seqs:
                    # The dropped ones are the oldest: exactly the gap before this update's first.
                    if seqs[0] - last_seq - 1 != update.dropped_decisions:
                        gaps_unexplained.append((last_seq, seqs[0], update.dropped_decisions))
                    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # in order, none twice
                    last_seq = seqs[-1]
                else:
                    assert update.dropped_decisions == 0  # nothing kept, so nothing was dropped
                received += len(seqs)
                dropped += update.dropped_decisions
                await asyncio.sleep(0.1)  # slower than the updates come: its buffer overflows
            await driver
            await updates.aclose()
    assert gaps_unexplained == []
    assert received + dropped == total
    assert dropped > 0  # (the reader was slow enough to test something)


# Opens MAX_WATCHERS watchers on its own channels, reads each one's first snapshot and
# never reads again; then waits to be killed.
HOLDER = """
import asyncio, sys
import grpc
from kvbudget.v1 import observer_pb2, observer_pb2_grpc

async def main() -> None:
    calls = []
    for _ in range(int(sys.argv[2])):
        channel = grpc.aio.insecure_channel(sys.argv[1])
        call = observer_pb2_grpc.ObserverServiceStub(channel).Watch(
            observer_pb2.WatchRequest(interval_ms=1, max_decisions=10000))
        await call.read()
        calls.append((channel, call))
    print("holding", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def watch_refused(target: str) -> grpc.StatusCode | None:
    """The status a new watcher is refused with, or None when it gets its snapshot."""
    async with ObserverClient(target) as observer:
        updates = observer.watch()
        try:
            await asyncio.wait_for(anext(updates), 10)
            return None
        except grpc.aio.AioRpcError as error:
            return error.code()
        finally:
            await updates.aclose()


async def test_watchers_of_a_killed_client_give_their_slots_back(tmp_path) -> None:
    with DaemonProcess(tmp_path) as daemon:
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, daemon.target, str(MAX_WATCHERS)],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
            async with EngineClient(daemon.target, "e") as engine:
                for k in range(20):  # decisions the stuck watchers cannot take
                    ids = [f"k{k}-{i}" for i in range(10)]
                    await engine.step(submits=[RequestSpec(rid, 16, 16) for rid in ids])
                    await engine.step(finishes=ids)
            assert await watch_refused(daemon.target) == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            holder.send_signal(signal.SIGKILL)
            holder.wait(30)

        async def all_slots_free() -> bool:
            return await watchers_accepted(daemon.target, MAX_WATCHERS) == MAX_WATCHERS

        await await_until(all_slots_free, timeout=30, interval=0.2)


async def watchers_accepted(target: str, count: int) -> int:
    """How many of `count` watchers opened at once get their first snapshot (all closed after)."""
    async with ObserverClient(target) as observer:
        streams = [observer.watch(interval_ms=1000) for _ in range(count)]
        try:
            firsts = await asyncio.gather(*(asyncio.wait_for(anext(s), 10) for s in streams), return_exceptions=True)
            return sum(1 for first in firsts if not isinstance(first, BaseException))
        finally:
            for stream in streams:
                await stream.aclose()
