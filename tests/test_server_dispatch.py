"""The core's dispatcher and replay table, in process (no gRPC): what reaches watchers.

Regression: an engine that died mid-Step while its commit was queued behind others had its
handler cancelled; awaiting the commit future directly cancelled it, the dispatcher met the
cancellation and ended, and from then on no watcher (nor Events stream) received a decision
while admission went on. The caller now gets a shielded future.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time

import grpc
import pytest

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.server.service import CoreOptions, CoreService
from kvbudget.daemon.log.decision_log import DecisionLog
from kvbudget.daemon.core.records import Decision, DecisionKind, Reason, RequestSpec
from kvbudget.daemon.server.sessions import ReplayTable, SessionTable
from kvbudget.daemon.server.watch import WatchHub
from kvbudget.v1 import common_pb2

from test_admission_support import SMALL_LAYOUTS


@pytest.fixture
async def core(tmp_path):
    controller = AdmissionController(SMALL_LAYOUTS["full"], 30, AdmissionConfig(max_model_len=64))
    decision_log = DecisionLog(tmp_path / "decisions.db")
    decision_log.start()
    service = CoreService(
        controller, decision_log, common_pb2.PoolPlan(block_size_tokens=8),
        SessionTable(5.0, max_ttl_s=3600.0, max_sessions=8), WatchHub(4),
        options=CoreOptions(tick_s=3600.0),  # the tests call tick themselves
    )
    await service.start()
    yield service
    await service.stop()
    decision_log.close()
    controller.check_integrity()


async def received(watcher, count: int, timeout: float = 10.0) -> list[str]:
    """Request ids the watcher got, once it has `count` decisions (or the timeout)."""
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += [d.request_id for d in watcher.take()[0]]
        await asyncio.sleep(0.01)
    return got


def submit(core: CoreService, request_id: str) -> list[Decision]:
    now = time.time()
    return core.controller.submit(RequestSpec(request_id, 16, 16, engine_id="e", arrival_s=now), now)


async def test_a_cancelled_caller_does_not_stop_the_dispatcher(core: CoreService, tmp_path) -> None:
    watcher = core.watch_hub.add(100)
    # Another connection holds the write lock, so a row appended now waits in the writer:
    # the next record() cannot commit inline and queues behind it.
    blocker = sqlite3.connect(tmp_path / "decisions.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    ahead = core.log.append([Decision(seq=0, time_s=0.0, kind=DecisionKind.POLICY, reason=Reason.NONE,
                                      request_id="")])
    committed = core.record(submit(core, "a"), origin_engine="e")
    assert not committed.done()

    async def step_handler() -> None:  # what the Step servicer does with the future
        await committed

    handler = asyncio.create_task(step_handler())
    await asyncio.sleep(0)
    handler.cancel()  # the engine died mid-Step: gRPC cancels its handler
    await asyncio.gather(handler, return_exceptions=True)
    blocker.execute("ROLLBACK")
    blocker.close()
    await asyncio.to_thread(ahead.result, 10)

    # "a" was committed all the same, so watchers see it; and later batches flow too.
    await core.record(submit(core, "b"), origin_engine="e")
    assert await received(watcher, 2) == ["a", "b"]
    assert core.dispatcher.running  # the dispatcher is alive


async def test_a_failing_publish_does_not_stop_the_dispatcher(core: CoreService) -> None:
    class BrokenOnce:
        calls = 0

        def record(self, decisions, latency) -> None:
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("boom")

    core.metrics = BrokenOnce()
    watcher = core.watch_hub.add(100)
    await core.record(submit(core, "a"))
    await core.record(submit(core, "b"))
    assert await received(watcher, 2) == ["a", "b"]
    await asyncio.sleep(0.05)
    assert core.metrics.calls == 2


async def test_a_failed_commit_is_published_only_once_written_and_before_the_next(core: CoreService, tmp_path) -> None:
    watcher = core.watch_hub.add(100)
    other = sqlite3.connect(tmp_path / "decisions.db")
    other.execute("ALTER TABLE decisions_recent RENAME TO decisions_moved")  # commits go there
    other.commit()
    with pytest.raises(Exception, match="write failed"):
        await core.record(submit(core, "late"))
    # Not in the file, so not heard of: the caller was told it was not committed.
    assert await received(watcher, 1, timeout=0.2) == []
    assert core.log.num_unwritten == 1
    other.execute("ALTER TABLE decisions_moved RENAME TO decisions_recent")
    other.commit()
    other.close()
    # The pool made it, so the next write puts it first, and watchers hear of both, in order.
    await core.record(submit(core, "next"))
    assert await received(watcher, 2) == ["late", "next"]
    assert core.log.num_unwritten == 0


async def test_the_ticker_decides_nothing_while_the_log_cannot_write(core: CoreService, tmp_path) -> None:
    session = core.sessions.open("e", 0.01, time.monotonic())
    await core.record(submit(core, "held"))
    other = sqlite3.connect(tmp_path / "decisions.db")
    other.execute("ALTER TABLE decisions_recent RENAME TO decisions_moved")
    other.commit()
    with pytest.raises(Exception, match="write failed"):
        await core.record(submit(core, "late"))
    await asyncio.sleep(0.05)  # the lease lapses
    await core.tick(time.monotonic())
    assert core.sessions.get(session.session_id) is not None  # not expired: that would be a decision
    assert core.controller.num_running == 2
    other.execute("ALTER TABLE decisions_moved RENAME TO decisions_recent")
    other.commit()
    other.close()
    assert core.log.write_unwritten()
    await core.tick(time.monotonic())  # now it is: both requests released, and logged
    assert core.sessions.get(session.session_id) is None
    assert core.controller.num_running == 0


# ----------------------------------------------------------------------- replays
def replay(replay_id: str, position: int, *, done: bool = False) -> common_pb2.ReplayState:
    return common_pb2.ReplayState(replay_id=replay_id, trace="mooncake", position=position, total=10, done=done)


def test_a_silent_replay_is_marked_done_after_the_stale_time() -> None:
    table = ReplayTable(stale_after_s=30.0)
    assert table.report(replay("dead", 3), now_monotonic=100.0)
    assert table.report(replay("alive", 1), now_monotonic=100.0)
    assert table.expire(now_monotonic=129.9) == []  # 29.9 s of silence: still running
    assert table.report(replay("alive", 2), now_monotonic=120.0)
    assert table.expire(now_monotonic=130.0) == ["dead"]  # 30 s since its last report
    dead, alive = table.get("dead"), table.get("alive")
    assert dead.done and dead.position == 3  # the last position it reached stays
    assert not alive.done
    assert table.expire(now_monotonic=200.0) == ["alive"]  # done ones are not expired twice


def test_finished_replays_make_room_and_unfinished_ones_do_not() -> None:
    table = ReplayTable(max_replays=2)
    assert table.report(replay("a", 1), 0.0) and table.report(replay("b", 1), 0.0)
    assert not table.report(replay("c", 1), 0.0)  # full of running replays
    assert table.report(replay("a", 10, done=True), 1.0)  # updates are always taken
    assert table.report(replay("c", 1), 1.0)  # "a" finished: dropped to make room
    assert sorted(r.replay_id for r in table.values()) == ["b", "c"]


def test_the_table_keeps_its_own_copy_of_a_report() -> None:
    table = ReplayTable(stale_after_s=1.0)
    sent = replay("r", 4)
    table.report(sent, 0.0)
    table.expire(5.0)
    assert table.get("r").done and not sent.done


async def test_the_core_tick_expires_silent_replays_in_the_snapshot(core: CoreService) -> None:
    now = time.monotonic()
    core.replays.report(replay("rp", 3), now)
    assert not core.snapshot_proto(fresh=True).replays[0].done
    await core.tick(now + core.options.replay_stale_s)
    [state] = core.snapshot_proto(fresh=True).replays
    assert (state.replay_id, state.position, state.done) == ("rp", 3, True)


async def test_a_batch_nobody_hears_of_skips_the_dispatcher(core: CoreService) -> None:
    # No watcher, no metrics, only the caller's own decisions: nothing to dispatch.
    committed = core.record(submit(core, "quiet"), origin_engine="e")
    assert committed.done() and core.dispatcher.num_queued == 0
    # Another engine's decision must reach that engine's Events stream: dispatched.
    core.record(submit(core, "other"), origin_engine="someone-else")
    assert core.dispatcher.num_queued == 1
    # A watcher makes every batch worth dispatching, the caller's own included. It also
    # hears "other", which was still queued when it joined; never "quiet".
    watcher = core.watch_hub.add(100)
    await core.record(submit(core, "watched"), origin_engine="e")
    assert await received(watcher, 2) == ["other", "watched"]


async def test_every_caller_may_share_the_resolved_future(core: CoreService) -> None:
    first = core.record(submit(core, "a"), origin_engine="e")
    second = core.record([], origin_engine="e")
    assert first.done() and second.done() and first.result() is None
    first.cancel()  # a no-op on a done future: the next caller is not affected
    assert not core.record(submit(core, "b"), origin_engine="e").cancelled()


class _Aborted(Exception):
    pass


class _Context:
    """What the servicer asks of a grpc.aio context: the caller and abort."""

    def peer(self) -> str:
        return "unix:"

    def invocation_metadata(self) -> tuple:
        return ()

    async def abort(self, code, message: str, trailing_metadata=()) -> None:  # (the details: error_details)
        raise _Aborted(code, message)


async def test_a_lapsed_lease_is_not_renewed_by_a_call_before_the_ticker_sees_it(core: CoreService) -> None:
    # The ticker takes lapsed sessions back every 0.1 s; a call in between used to renew
    # the lease and carry on (a grow sent 1.06 s into a 1 s lease went through 4 times in 10).
    from kvbudget.daemon.server.auth import Authorizer
    from kvbudget.daemon.server.servicers import EngineServicer
    from kvbudget.v1 import engine_pb2

    servicer = EngineServicer(core, Authorizer(None, trust_tcp=True))
    session = core.sessions.open("e", 1.0, time.monotonic())
    reply = await servicer.Step(engine_pb2.StepRequest(session_id=session.session_id), _Context())
    assert list(reply.decisions) == []  # live: served
    session.expires_at = time.monotonic() - 0.05  # lapsed 50 ms ago; no tick since
    for call in (
        servicer.Step(engine_pb2.StepRequest(session_id=session.session_id), _Context()),
        servicer.Heartbeat(engine_pb2.HeartbeatRequest(session_id=session.session_id), _Context()),
    ):
        with pytest.raises(_Aborted) as aborted:
            await call
        code, message = aborted.value.args
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert message == "session_id: its lease lapsed (1 s without a call): open a new one"
    assert session.expires_at < time.monotonic()  # not renewed: the next tick expires it
    await core.tick(time.monotonic())
    assert core.sessions.get(session.session_id) is None


async def test_a_reply_past_the_message_limit_goes_out_on_the_events_stream(core: CoreService, monkeypatch) -> None:
    # gRPC failed the send after the step was applied and logged: the engine heard nothing
    # and its retry got ALREADY_EXISTS. (The limit is 64 MiB; here it is made 10 kB.)
    from kvbudget.daemon.server import steps
    from kvbudget.daemon.server.auth import Authorizer
    from kvbudget.daemon.server.servicers import EngineServicer
    from kvbudget.v1 import engine_pb2

    monkeypatch.setattr(steps, "MAX_MESSAGE_BYTES", 10_000)
    servicer = EngineServicer(core, Authorizer(None, trust_tcp=True))
    session = core.sessions.open("e", 60.0, time.monotonic())
    submits = [engine_pb2.Submit(request_id=f"r{i}", prompt_tokens=8, max_new_tokens=8) for i in range(1001)]
    with pytest.raises(_Aborted) as aborted:
        await servicer.Step(engine_pb2.StepRequest(session_id=session.session_id, submits=submits), _Context())
    code, message = aborted.value.args
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert message.startswith("this step was applied and logged, but its reply (")
    assert message.endswith("its 1001 decisions go out on the Events stream instead (the oldest dropped past 10000); "
                            "send smaller steps")
    events = [session.events.get_nowait() for _ in range(session.events.qsize())]
    assert [d.request_id for d in events] == [f"r{i}" for i in range(1001)]
    assert core.log.figures().rows_written == 1001  # applied and logged before anyone heard


class _StreamContext(_Context):
    """An Events call's context whose client goes away during its first write."""

    def __init__(self, fail_first_write: bool) -> None:
        self.fail_first_write = fail_first_write
        self.written: list[str] = []

    async def write(self, message) -> None:
        if self.fail_first_write:
            self.fail_first_write = False
            raise asyncio.CancelledError  # the call ended mid-write
        self.written.append(message.decision.request_id)


async def test_a_decision_an_events_stream_could_not_send_goes_first_on_the_next(core: CoreService) -> None:
    # An ADMIT lost this way left the engine waiting for a request that held its blocks.
    from kvbudget.daemon.server.auth import Authorizer
    from kvbudget.daemon.server.servicers import EngineServicer
    from kvbudget.v1 import engine_pb2

    servicer = EngineServicer(core, Authorizer(None, trust_tcp=True))
    session = core.sessions.open("e", 60.0, time.monotonic())
    request = engine_pb2.EventsRequest(session_id=session.session_id)
    first, second = _StreamContext(fail_first_write=True), _StreamContext(fail_first_write=False)
    for request_id in ("r1", "r2"):
        session.push_event(submit(core, request_id)[0])
    with pytest.raises(asyncio.CancelledError):
        await servicer.Events(request, first)
    assert first.written == [] and session.events.qsize() == 2  # r1 is back, at the front
    reading = asyncio.ensure_future(servicer.Events(request, second))
    await asyncio.sleep(0)
    session.push_event(submit(core, "r3")[0])
    for _ in range(10):
        await asyncio.sleep(0)
    assert second.written == ["r1", "r2", "r3"]  # in the order made
    session.end_events()
    await reading


async def test_a_decision_taken_as_a_newer_stream_takes_over_goes_to_the_newer(core: CoreService) -> None:
    from kvbudget.daemon.server.auth import Authorizer
    from kvbudget.daemon.server.servicers import EngineServicer
    from kvbudget.v1 import engine_pb2

    servicer = EngineServicer(core, Authorizer(None, trust_tcp=True))
    session = core.sessions.open("e", 60.0, time.monotonic())
    request = engine_pb2.EventsRequest(session_id=session.session_id)
    old, new = _StreamContext(fail_first_write=False), _StreamContext(fail_first_write=False)
    reading_old = asyncio.ensure_future(servicer.Events(request, old))
    await asyncio.sleep(0)
    # In one turn of the loop: a decision arrives and a newer stream takes over.
    session.push_event(submit(core, "r1")[0])
    reading_new = asyncio.ensure_future(servicer.Events(request, new))
    for _ in range(10):
        await asyncio.sleep(0)
    assert await reading_old is None and old.written == []
    assert new.written == ["r1"]
    session.end_events()
    await reading_new


async def test_an_op_the_controller_refuses_after_validation_is_internal_logged_and_its_step_recorded(
    core: CoreService, monkeypatch, caplog
) -> None:
    # A broken invariant (validation passed an op the controller refuses) is the daemon's
    # bug: INTERNAL, in the journal naming the op; what the ops before it did stands, so
    # their decisions are logged (pool and log agree) and a resend gets the same answer.
    from kvbudget.daemon.core.admission import AdmissionError
    from kvbudget.daemon.server.auth import Authorizer
    from kvbudget.daemon.server.servicers import EngineServicer
    from kvbudget.v1 import engine_pb2

    servicer = EngineServicer(core, Authorizer(None, trust_tcp=True))
    session = core.sessions.open("e", 60.0, time.monotonic())
    await core.record(submit(core, "done") + submit(core, "grown"), "e")

    def refused_grow(request_id, num_tokens, now):
        raise AdmissionError("num_tokens", "refused (injected)")

    monkeypatch.setattr(core.controller, "grow", refused_grow)
    request = engine_pb2.StepRequest(
        session_id=session.session_id, step_seq=1,
        finishes=[engine_pb2.Finish(request_id="done")], grows=[engine_pb2.Grow(request_id="grown", num_tokens=20)],
    )
    for _ in range(2):  # the step, then the same step sent again
        with pytest.raises(_Aborted) as aborted:
            await servicer.Step(request, _Context())
        code, message = aborted.value.args
        assert code == grpc.StatusCode.INTERNAL
        assert message.startswith("grows[0].num_tokens: num_tokens: refused (injected)")
    assert "step broke an invariant at grows[0].num_tokens" in caplog.text
    assert core.controller.find("done") is None  # the finish before it stands...
    rows = sqlite3.connect(core.log.path).execute("SELECT kind, request_id FROM decisions ORDER BY id").fetchall()
    assert rows[-1] == ("release", "done")  # ...and is in the log
