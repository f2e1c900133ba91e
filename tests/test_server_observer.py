"""The observer service on a real daemon: watch, snapshot, decisions, estimate, replays."""

from __future__ import annotations

import asyncio
import time

import pytest

import kvbudget
from kvbudget.cli.main import main
from kvbudget.client import EngineClient, ObserverClient
from kvbudget.daemon.core.records import DecisionKind, RequestSpec
from kvbudget.tui.state import DashboardState
from kvbudget.v1 import common_pb2, observer_pb2

from daemon_harness import DaemonProcess, await_until

pytestmark = pytest.mark.slow


@pytest.fixture
def daemon(tmp_path):
    with DaemonProcess(tmp_path, "--policy", "guaranteed") as process:
        yield process


async def test_watch_snapshot_first_then_coalesced_updates_dropping_oldest(daemon) -> None:
    async with EngineClient(daemon.target, "e") as engine, ObserverClient(daemon.target) as observer:
        updates = observer.watch(interval_ms=1500, max_decisions=2)
        first = await anext(updates)
        assert first.snapshot.num_blocks == 64 and first.snapshot.plan.model == "llama-3.1-8b"
        assert list(first.decisions) == [] and first.dropped_decisions == 0
        # 5 ADMITs before the next update; the watcher keeps the newest 2 and counts 3 dropped.
        await engine.step(submits=[RequestSpec(f"w{i}", 16, 16) for i in range(5)])
        second = await asyncio.wait_for(anext(updates), 30)
        assert [d.request_id for d in second.decisions] == ["w3", "w4"]
        assert second.dropped_decisions == 3
        assert second.snapshot.num_running == 5 and second.snapshot.num_held_blocks == 5
        await updates.aclose()


async def test_query_estimate_and_replays(daemon) -> None:
    async with EngineClient(daemon.target, "e") as engine, ObserverClient(daemon.target) as observer:
        await engine.step(submits=[RequestSpec("q1", 100, 28), RequestSpec("q2", 16, 16)])
        await engine.step(finishes=["q1"])
        q1 = await observer.query_decisions(request_id="q1", limit=10)
        assert sorted(d.kind for d in q1) == sorted([DecisionKind.ADMIT, DecisionKind.RELEASE])
        admits = await observer.query_decisions(kind="admit")
        assert sorted(d.request_id for d in admits) == ["q1", "q2"]
        assert admits[0].new_block_ids  # block ids survive the log round trip

        # Full attention: cdiv(1024, 16) = 64 blocks per request -> 64 / 64 = 1.0;
        # cdiv(100, 16) = 7 -> 64 / 7.
        estimate = await observer.estimate(1024)
        assert (estimate.max_concurrency, list(estimate.blocks_per_request)) == (1.0, [64])
        assert (await observer.estimate(100)).max_concurrency == pytest.approx(64 / 7)

        await observer.report_replay(common_pb2.ReplayState(replay_id="rp", trace="mooncake", position=3, total=10))
        snapshot = await observer.snapshot()
        assert [(r.replay_id, r.position, r.total) for r in snapshot.replays] == [("rp", 3, 10)]
        # The log's upkeep rides along (doctor reads it): 2 admits + 1 release committed, no stall.
        assert snapshot.decision_log.rows_written == 3 and snapshot.decision_log.stalls == 0
        assert snapshot.decision_log.database_bytes > 0
        switch = await observer.set_policy("optimistic")
        assert (switch.previous, switch.changed, switch.num_admitted, switch.num_rejected) == (
            "guaranteed", True, 0, 0)
        assert not (await observer.set_policy("optimistic")).changed  # in force already: a no-op
        assert (await observer.snapshot()).policy == common_pb2.POLICY_OPTIMISTIC


async def test_snapshots_say_which_daemon_process_took_them(tmp_path, capsys) -> None:
    """Its start (once, at start-up: the same in every snapshot) and its version; a daemon
    restarted on the same log starts anew. Both daemons idle, so their counters are equal
    and the clock goes forward: only the start time tells the dashboard it restarted."""
    with pytest.raises(SystemExit):
        main(["--version"])
    printed_version = capsys.readouterr().out.split()[-1]  # "kvbudget 0.1.0"
    before = time.time()
    with DaemonProcess(tmp_path) as daemon:
        after = time.time()
        async with ObserverClient(daemon.target) as observer:
            first = await observer.snapshot()

            async def later():
                snapshot = await observer.snapshot()
                return snapshot if snapshot.time_unix_s > first.time_unix_s else None

            second = await await_until(later)  # a snapshot taken later...
    assert before <= first.started_unix_s <= after
    assert second.started_unix_s == first.started_unix_s  # ...by the same process
    assert first.daemon_version == second.daemon_version == kvbudget.__version__ == printed_version

    with DaemonProcess(tmp_path) as restarted:
        async with ObserverClient(restarted.target) as observer:
            third = await observer.snapshot()
    assert third.started_unix_s > first.started_unix_s
    assert sum(third.decisions_by_kind.values()) == sum(second.decisions_by_kind.values()) == 0
    state = DashboardState.initial(daemon.target)
    for snapshot in (first, second, third):
        state = state.with_response(observer_pb2.WatchResponse(snapshot=snapshot))
    assert state.restarts == 1
