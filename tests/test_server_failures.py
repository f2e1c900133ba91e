"""Processes dying: an engine SIGKILLed mid-flight, the daemon SIGKILLed under load."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import sys
import textwrap

import grpc
import pytest

from kvbudget.client import EngineClient, ObserverClient
from kvbudget.daemon.core.records import RequestSpec

from daemon_harness import DaemonProcess, await_until

pytestmark = pytest.mark.slow

ENGINE_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from kvbudget.client import EngineClient
    from kvbudget.daemon.core.records import RequestSpec

    async def main():
        engine = EngineClient(sys.argv[1], "doomed")
        await engine.open()
        await engine.step(submits=[RequestSpec(f"d{i}", 100, 28) for i in range(3)])
        print("ready", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


async def test_sigkilled_engine_gets_its_blocks_taken_back(tmp_path) -> None:
    # 3 requests x cdiv(100, 16) = 21 blocks held; lease 3 s, heartbeats every 1 s.
    with DaemonProcess(tmp_path, "--policy", "guaranteed", lease_ttl_s=3) as daemon:
        engine = subprocess.Popen([sys.executable, "-c", ENGINE_SCRIPT, daemon.target], stdout=subprocess.PIPE,
                                  text=True)
        try:
            assert (await asyncio.to_thread(engine.stdout.readline)).strip() == "ready"
            async with ObserverClient(daemon.target) as observer:
                snapshot = await observer.snapshot()
                assert snapshot.num_held_blocks == 21
                await asyncio.sleep(4)  # past the TTL: the heartbeats keep the lease
                snapshot = await observer.snapshot()
                assert [(e.engine_id, e.blocks_held) for e in snapshot.engines] == [("doomed", 21)]

                engine.send_signal(signal.SIGKILL)
                engine.wait(30)

                async def pool_empty():
                    s = await observer.snapshot()
                    return s.num_held_blocks == 0 and not s.engines and s.num_free_blocks == 64

                await await_until(pool_empty, timeout=30)
        finally:
            engine.kill()
            engine.wait()
        expired = daemon.decision_rows("kind = 'expire'")
        assert sorted((r["request_id"], r["reason"], r["engine_id"]) for r in expired) == [
            (f"d{i}", "lease_expired", "doomed") for i in range(3)
        ]
        assert sum(r["freed_blocks"] for r in expired) == 21


async def test_every_decision_a_client_received_survives_a_daemon_sigkill(tmp_path) -> None:
    daemon = DaemonProcess(tmp_path, "--policy", "guaranteed", lease_ttl_s=30).start()
    received: list = []
    killed = asyncio.Event()

    async def engine_loop(name: str) -> None:
        client = EngineClient(daemon.target, name, heartbeat=False, call_timeout_s=10)
        await client.open()
        previous: list[str] = []
        step = 0
        try:
            while not killed.is_set():
                ids = [f"{name}-{step}-{i}" for i in range(20)]
                step += 1
                try:
                    # each request: prompt 16 + 16 new = 2 blocks reserved; 20 per step fit
                    decisions = await client.step(submits=[RequestSpec(r, 16, 16) for r in ids], finishes=previous)
                except grpc.aio.AioRpcError:
                    return  # the daemon died under this call: nothing was promised
                received.extend(decisions)
                previous = ids
        finally:
            client._closed = True  # noqa: SLF001 - skip CloseSession on a dead daemon
            await client._channel.close()  # noqa: SLF001

    async def killer() -> None:
        while len(received) < 2000:
            await asyncio.sleep(0.01)
        daemon.signal(signal.SIGKILL)
        killed.set()

    try:
        await asyncio.gather(engine_loop("e1"), engine_loop("e2"), killer())
        daemon.wait(30)
        assert len(received) >= 2000
        at_the_kill = daemon.decision_rows()
        logged = {r["seq"] for r in at_the_kill}
        missing = [d for d in received if d.seq not in logged]
        assert missing == []
        newest_row = {r["request_id"]: r["kind"] for r in sorted(at_the_kill, key=lambda r: r["seq"])}
        left_open = sum(kind not in ("reject", "release", "expire") for kind in newest_row.values())
        # It restarts on the same log file, closes what the killed daemon left open (one
        # expire `daemon_restart` row each: docs/log-schema.md) and keeps appending.
        restarted = DaemonProcess(tmp_path, "--policy", "guaranteed").start()
        try:
            async with EngineClient(restarted.target, "e1") as client:
                [admit] = await client.step(submits=[RequestSpec("after-restart", 16, 16)])
            rows = restarted.decision_rows()
            assert len(rows) == len(logged) + left_open + 1 + 1  # + ADMIT + the RELEASE on CloseSession
            assert admit.seq == max(logged) + left_open + 1
            # ...numbering on from the log's last decision: a seq names one decision for good.
            assert [r["seq"] for r in rows[len(logged):]] == list(range(max(logged) + 1, max(logged) + left_open + 3))
        finally:
            restarted.stop()
    finally:
        daemon.stop()


# A daemon whose decision log's writer thread stops on an error (injected: a bug, say) when
# it commits a decision for request "poison"; everything else as shipped.
BROKEN_WRITER_DAEMON = textwrap.dedent(
    """
    import sys
    from kvbudget.cli.main import main
    from kvbudget.daemon.log.decision_log import DecisionLog
    from kvbudget.daemon.log.writer import Writer

    commit, commit_inline = Writer._commit, DecisionLog.commit_inline

    def poisoned(decisions):
        return any(d.request_id == "poison" for d in decisions)

    def broken_commit(self, batch):
        if any(poisoned(p.decisions) for p in batch):
            raise RuntimeError("injected fault")
        return commit(self, batch)

    def queue_poison(self, decisions, max_rows=1024):  # (so that the writer thread gets it)
        return False if poisoned(decisions) else commit_inline(self, decisions, max_rows)

    Writer._commit, DecisionLog.commit_inline = broken_commit, queue_poison
    sys.exit(main(sys.argv[1:]))
    """
)


async def test_a_daemon_whose_log_writer_stops_says_so_and_exits_1(tmp_path) -> None:
    from daemon_harness import DEFAULT_ARGS
    from kvbudget.client.target import wait_until_serving

    target = f"unix://{tmp_path / 'kvbudget.sock'}"
    db_path = tmp_path / "decisions.db"
    process = subprocess.Popen(
        [sys.executable, "-c", BROKEN_WRITER_DAEMON, "daemon", *DEFAULT_ARGS, "--db-path", str(db_path),
         "--listen", target], stderr=subprocess.PIPE, text=True,
    )
    try:
        assert await asyncio.to_thread(wait_until_serving, target, process) is None
        engine = EngineClient(target, "e1", heartbeat=False)
        await engine.open()
        await engine.step(submits=[RequestSpec("fine", 100, 28)])
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await engine.step(submits=[RequestSpec("poison", 100, 28)])
        # Told at once that nothing was committed (not left to its deadline), and the daemon
        # stops the usual way and exits 1, for systemd's Restart=on-failure.
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "writer stopped: RuntimeError('injected fault')" in error.value.details()
        assert await asyncio.to_thread(process.wait, 60) == 1
        stderr = process.stderr.read()
        assert "stopping:" in stderr and "writer stopped" in stderr
        assert "Traceback" in stderr  # the writer's, logged once
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    conn = sqlite3.connect(db_path)
    try:
        logged = [row[0] for row in conn.execute("SELECT request_id FROM decisions ORDER BY id")]
    finally:
        conn.close()
    assert logged == ["fine"]  # the poisoned decision was never committed, nor claimed to be
