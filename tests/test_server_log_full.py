"""A real daemon whose decision log's disk fills, then has room again.

The disk fills the way SQLite sees it: while a flag file exists, the daemon's log
connection has `PRAGMA max_page_count` pinned to the file's size, so a write needing a
new page fails with SQLITE_FULL, as on a full disk. Everything else is the daemon as
shipped, over its unix socket.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvbudget.client import EngineClient, ObserverClient
from kvbudget.daemon.core.records import RequestSpec
from kvbudget.v1 import common_pb2, engine_pb2, engine_pb2_grpc

from daemon_harness import DaemonProcess, await_until
from full_disk import fill

pytestmark = pytest.mark.slow

FULL_DISK_DAEMON = textwrap.dedent(
    """
    import os, sys
    from kvbudget.cli.main import main
    from kvbudget.daemon.log.store import LogStore

    FLAG = os.environ["KVBUDGET_TEST_DISK_FULL"]
    insert = LogStore.insert
    room = []

    def insert_on_a_disk_that_may_be_full(self, rows):
        cursor = self._cursor
        if not room:
            room.append(cursor.execute("PRAGMA max_page_count").fetchone()[0])
        if os.path.exists(FLAG):
            pages = cursor.execute("PRAGMA page_count").fetchone()[0]
            cursor.execute(f"PRAGMA max_page_count={pages}")
        else:
            cursor.execute(f"PRAGMA max_page_count={room[0]}")
        return insert(self, rows)

    LogStore.insert = insert_on_a_disk_that_may_be_full
    sys.exit(main(sys.argv[1:]))
    """
)


async def health(target: str) -> int:
    async with grpc.aio.insecure_channel(target) as channel:
        return (await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)).status


async def test_a_full_log_disk_refuses_steps_loses_no_decision_and_recovers_by_itself(tmp_path) -> None:
    flag = tmp_path / "disk-is-full"
    # A long lease: the engine sends no heartbeats, and the waits for the disk below take seconds.
    daemon = DaemonProcess(tmp_path, "--num-gpu-blocks", "2049", env={"KVBUDGET_TEST_DISK_FULL": str(flag)}, lease_ttl_s=600)
    daemon.args[1:3] = ["-c", FULL_DISK_DAEMON]  # (in place of `-m kvbudget`)
    with daemon:
        engine = EngineClient(daemon.target, "e1", heartbeat=False)
        await engine.open()
        async with ObserverClient(daemon.target) as observer:
            await engine.step(submits=[RequestSpec("a", 100, 28)])
            flag.touch()
            # 20 prompts of 75 blocks: rows of ~650 bytes, more pages than the full disk has.
            big = [RequestSpec(f"b{i}", 1200, 28) for i in range(20)]
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await engine.step(submits=big)
            assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
            assert failed.value.details().startswith("decision log: ")
            assert "database or disk is full" in failed.value.details()
            assert failed.value.details().endswith(
                "this step was applied and its decisions wait to be written: send the same step again to get "
                "them once they are")
            # Sent again while the disk is still full: the same answer, nothing applied twice.
            with pytest.raises(grpc.aio.AioRpcError) as again:
                await engine.step(submits=big)
            assert again.value.code() == grpc.StatusCode.UNAVAILABLE
            assert again.value.details().endswith("wait to be written (20 decisions in all): send it again later")

            # The pool made those 20 admissions; the log keeps them to write first.
            snapshot = await observer.snapshot()
            assert snapshot.num_running == 21
            assert snapshot.decision_log.num_unwritten_decisions == 20
            assert "database or disk is full" in snapshot.decision_log.write_error
            assert await health(daemon.target) == health_pb2.HealthCheckResponse.NOT_SERVING
            # Nothing more is decided meanwhile: a step is refused with nothing applied.
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await engine.step(submits=[RequestSpec("c", 100, 28)], aborts=["a"])
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert refused.value.details().endswith("so this step was not applied: retry once the log can write")
            snapshot = await observer.snapshot()
            assert snapshot.num_running == 21 and snapshot.decision_log.num_unwritten_decisions == 20
            assert [r["request_id"] for r in daemon.decision_rows()] == ["a"]
            # Closing or replacing the session decides too (releases, expiries): refused
            # alike, with the session left as it was (it was closed, and answered UNAVAILABLE).
            async with grpc.aio.insecure_channel(daemon.target) as channel:
                stub = engine_pb2_grpc.EngineServiceStub(channel)
                for refused_call in (
                    stub.CloseSession(engine_pb2.CloseSessionRequest(session_id=engine.session_id)),
                    stub.OpenSession(engine_pb2.OpenSessionRequest(engine_id="e1", replace_existing=True)),
                ):
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await refused_call
                    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
                    assert "was not applied: retry once the log can write" in refused.value.details()
            # So is an operator's quota: its `admin` row could not be written (issue 32).
            quota = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "kvbudget", "admin", "--target", daemon.target, "set-quota", "team-z",
                 "--max-share", "0.5"],
                capture_output=True, text=True, timeout=60,
            )
            assert quota.returncode == 2 and len(quota.stderr.splitlines()) == 1
            assert "so the quota was not applied: retry once the log can write" in quota.stderr
            snapshot = await observer.snapshot()
            assert snapshot.num_running == 21 and snapshot.decision_log.num_unwritten_decisions == 20
            assert [e.engine_id for e in snapshot.engines] == ["e1"]
            assert "team-z" not in [t.tenant for t in snapshot.tenants]
            doctor = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "kvbudget", "doctor", "--target", daemon.target, "--samples", "1"],
                capture_output=True, text=True, timeout=60,
            )
            assert doctor.returncode != 0
            assert "decision log cannot write" in doctor.stdout
            assert "20 decisions wait to be written" in doctor.stdout

            flag.unlink()  # room again: the daemon's writer retries each second by itself

            async def serving_again() -> bool:
                return await health(daemon.target) == health_pb2.HealthCheckResponse.SERVING

            await await_until(serving_again, timeout=30)
            rows = daemon.decision_rows()
            assert [r["request_id"] for r in rows] == ["a", *(f"b{i}" for i in range(20))]
            assert [r["id"] for r in rows] == list(range(1, 22))
            assert all(r["kind"] == "admit" for r in rows)
            assert (await observer.snapshot()).decision_log.num_unwritten_decisions == 0

            # The same step sent again now gets its decisions: the admissions made (and
            # logged) the first time, not ALREADY_EXISTS.
            decisions = await engine.step(submits=big)
            assert [(d.request_id, d.kind.value) for d in decisions] == [(f"b{i}", "admit") for i in range(20)]
            assert [len(d.new_block_ids[0]) for d in decisions] == [75] * 20
            assert len(daemon.decision_rows()) == 21  # answered from memory: nothing decided twice
            # Only once: the step after it is a step like any other.
            with pytest.raises(grpc.aio.AioRpcError) as duplicate:
                await engine.step(submits=big)
            assert duplicate.value.code() == grpc.StatusCode.ALREADY_EXISTS

            # An engine may also move on instead: it aborts what the failed step submitted.
            flag.touch()
            more = [RequestSpec(f"m{i}", 16, 4) for i in range(300)]  # ~75 pages: more than the folds freed
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await engine.step(submits=more)
            assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
            flag.unlink()
            await await_until(serving_again, timeout=30)
            logged = {r["request_id"]: r["kind"] for r in daemon.decision_rows() if r["request_id"].startswith("m")}
            assert list(logged) == [spec.request_id for spec in more]
            # Once it moves on (a next step, here an empty one), the reply it never took arrives
            # on its Events stream instead: the decisions of that step, as logged (so an engine
            # that gave up on it hears what it holds). The aborts come after reading them: the
            # client drops a decision older than one it already returned for the same request
            # (by seq), so after the aborts' releases these admissions would rightly not surface.
            await engine.step()
            streamed = []

            async def stream_those() -> None:
                async for event in engine.events():
                    streamed.append(event)
                    if len(streamed) == len(more):
                        return

            await asyncio.wait_for(stream_those(), timeout=30)
            assert [(d.request_id, d.kind.value) for d in streamed] == list(logged.items())
            assert all(d.new_block_ids[0] for d in streamed)  # admitted: with the blocks they held
            await engine.step(aborts=[spec.request_id for spec in (*big, *more)])
            await engine.step(submits=[RequestSpec("c", 100, 28)])
            snapshot = await observer.snapshot()
            assert snapshot.num_running == 2
        await engine.close()
    rows = daemon.decision_rows()
    # Every decision the pool made is in the log, in order: what it holds is what the log says.
    live: set[str] = set()
    for row in rows:
        if row["kind"] == "admit":
            live.add(row["request_id"])
        elif row["kind"] in ("release", "abort", "reclaim"):
            live.discard(row["request_id"])
    assert live == set()  # the session closed: everything released
    assert [r["id"] for r in rows] == list(range(1, len(rows) + 1))
    stderr = daemon.stderr()
    assert "20 decisions kept to be written first once writes work again" in stderr
    assert "decision log: writes work again; the 20 decisions kept since" in stderr
    assert "decision log: writes work again; the 300 decisions kept since" in stderr


async def test_a_really_full_disk_fails_a_write_and_the_daemon_resumes_once_there_is_room(tmp_path, small_disk) -> None:
    daemon = DaemonProcess(tmp_path, "--num-gpu-blocks", "8001", "--db-path", str(small_disk / "decisions.db"))
    daemon.db_path = small_disk / "decisions.db"
    with daemon:
        engine = EngineClient(daemon.target, "e1", heartbeat=False)
        await engine.open()
        await engine.step(submits=[RequestSpec("a", 100, 28)])
        fill(small_disk)
        # 100 rows of ~650 bytes: more WAL than any slack the file already has.
        big = [RequestSpec(f"b{i}", 1200, 28) for i in range(100)]
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await engine.step(submits=big)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "database or disk is full" in failed.value.details()
        assert await health(daemon.target) == health_pb2.HealthCheckResponse.NOT_SERVING
        (small_disk / "filler").unlink()

        async def serving_again() -> bool:
            return await health(daemon.target) == health_pb2.HealthCheckResponse.SERVING

        await await_until(serving_again, timeout=30)
        decisions = await engine.step(submits=big)  # the same step again: its decisions
        assert [d.request_id for d in decisions] == [f"b{i}" for i in range(100)]
        rows = daemon.decision_rows()
        assert [r["request_id"] for r in rows] == ["a", *(f"b{i}" for i in range(100))]
        await engine.close()


async def test_a_daemon_stopped_while_its_log_cannot_write_stops_and_says_what_is_lost(tmp_path) -> None:
    flag = tmp_path / "disk-is-full"
    # A long lease: the engine sends no heartbeats, and the waits for the disk below take seconds.
    daemon = DaemonProcess(tmp_path, "--num-gpu-blocks", "2049", env={"KVBUDGET_TEST_DISK_FULL": str(flag)}, lease_ttl_s=600)
    daemon.args[1:3] = ["-c", FULL_DISK_DAEMON]
    with daemon:
        engine = EngineClient(daemon.target, "e1", heartbeat=False)
        await engine.open()
        await engine.step(submits=[RequestSpec("a", 100, 28)])
        async with ObserverClient(daemon.target) as observer:
            stream = observer.watch()
            await stream.__anext__()  # a watcher, so the kept batch goes to the dispatcher, which waits on it
            flag.touch()
            with pytest.raises(grpc.aio.AioRpcError):
                await engine.step(submits=[RequestSpec(f"b{i}", 1200, 28) for i in range(20)])
            daemon.signal(signal.SIGTERM)
            # It stops the usual way, not waiting for a write that cannot happen.
            assert await asyncio.to_thread(daemon.wait, 60) == 0
            await stream.aclose()
    stderr = daemon.stderr()
    assert "decision log: 20 decisions were never written" in stderr
    assert "Traceback" not in stderr
    assert [r["request_id"] for r in daemon.decision_rows()] == ["a"]


HELD_COMMIT_DAEMON = textwrap.dedent(
    """
    import os, sqlite3, sys, time
    from kvbudget.cli.main import main
    from kvbudget.daemon.log.decision_log import DecisionLog
    from kvbudget.daemon.log.store import LogStore

    HOLD, FULL = os.environ["KVBUDGET_TEST_HOLD"], os.environ["KVBUDGET_TEST_FULL"]
    inline, insert = DecisionLog.commit_inline, LogStore.insert

    def commit_inline(self, decisions, max_rows=1024):  # while held: the writer thread's path
        return False if os.path.exists(HOLD) else inline(self, decisions, max_rows)

    def insert_held_then_full(self, rows):
        while os.path.exists(HOLD):
            time.sleep(0.01)
        if os.path.exists(FULL):
            raise sqlite3.OperationalError("database or disk is full")
        return insert(self, rows)

    DecisionLog.commit_inline = commit_inline
    LogStore.insert = insert_held_then_full
    sys.exit(main(sys.argv[1:]))
    """
)


async def test_a_step_whose_caller_left_before_its_write_failed_is_answered_when_sent_again(tmp_path) -> None:
    # A numbered step is applied, its write waits in the writer thread past the call's
    # deadline, then fails (a full disk). The first call is gone: it set nothing for the
    # retry. Its resend learns of the failure, and from then on the step is "applied, its
    # decisions waiting", as if the first call had stayed: the same ops sent again under a
    # new number (as StepBatch flushes them) get its reply once the disk has room, not
    # ALREADY_EXISTS for a request whose blocks the engine never heard of.
    hold, full = tmp_path / "hold", tmp_path / "full"
    daemon = DaemonProcess(tmp_path, env={"KVBUDGET_TEST_HOLD": str(hold), "KVBUDGET_TEST_FULL": str(full)})
    daemon.args[1:3] = ["-c", HELD_COMMIT_DAEMON]  # (in place of `-m kvbudget`)
    with daemon:
        async with grpc.aio.insecure_channel(daemon.target) as channel:
            stub = engine_pb2_grpc.EngineServiceStub(channel)
            opened = await stub.OpenSession(engine_pb2.OpenSessionRequest(engine_id="e1", lease_ttl_s=600))

            def step(step_seq: int, timeout: float = 30.0):
                return stub.Step(engine_pb2.StepRequest(
                    session_id=opened.session_id, step_seq=step_seq,
                    submits=[engine_pb2.Submit(request_id="r", prompt_tokens=100, max_new_tokens=28)],
                ), timeout=timeout)  # fmt: skip

            hold.touch()
            full.touch()
            with pytest.raises(grpc.aio.AioRpcError) as gone:
                await step(1, timeout=0.5)
            assert gone.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await asyncio.sleep(0.5)  # the daemon hears the call is gone (its handler is cancelled)
            hold.unlink()  # the write goes on, and fails
            with pytest.raises(grpc.aio.AioRpcError) as waiting:
                await step(1)
            assert waiting.value.code() == grpc.StatusCode.UNAVAILABLE
            assert waiting.value.details().endswith(
                "this step was applied and its decisions wait to be written: send it again later")
            full.unlink()
            [admit] = (await step(2)).decisions  # the same ops, numbered anew
            assert (admit.request_id, admit.kind) == ("r", common_pb2.DECISION_KIND_ADMIT)
            assert len(admit.new_blocks[0].block_ids) == 7  # cdiv(100, 16)
    # (the stop closes the request still open: expire `draining`, docs/log-schema.md)
    assert [(row["request_id"], row["kind"]) for row in daemon.decision_rows()] == [("r", "admit"), ("r", "expire")]
