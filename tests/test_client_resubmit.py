"""EngineClient(resubmit=True) across a daemon that stops or is killed and starts again on the
same socket and log (issue 30, point 5): the engine's requests run again, nothing is lost,
and the log shows each request's closing row, then its resubmission. A real daemon
process; the log read with plain sqlite3."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from kvbudget.client import EngineClient, Resubmitted
from kvbudget.daemon.core.records import RequestSpec

from tests.daemon_harness import DaemonProcess

pytestmark = pytest.mark.slow


def rows_after(daemon: DaemonProcess, seq: int) -> list[tuple]:
    rows = daemon.decision_rows("seq > ? ORDER BY seq", (seq,))
    return [(r["request_id"], r["kind"], r["reason"], r["detail"].split(":")[0], r["prompt_tokens"],
             r["max_new_tokens"]) for r in rows]


async def run_until_down(daemon: DaemonProcess, resubmitted: list[Resubmitted]) -> tuple[EngineClient, int]:
    """Engine e: r0 (32 + 32) grown to 40 and 40 computed, r3 finished, r1 (512) running and
    r2 (512) waiting: 3 + 32 of the 64 blocks held, 29 free."""
    engine = EngineClient(daemon.target, "e", heartbeat=False, resubmit=True, on_resubmit=resubmitted.append)
    await engine.open()
    await engine.step(submits=[RequestSpec("r0", 32, 32), RequestSpec("r3", 16, 16)])
    await engine.step(grows=[("r0", 40)], finishes=["r3"])
    decisions = await engine.step(progress=[("r0", 40)],
                                  submits=[RequestSpec("r1", 512, 16), RequestSpec("r2", 512, 16)])
    assert [(d.request_id, d.kind.value) for d in decisions] == [("r1", "admit"), ("r2", "queue")]
    return engine, max(row["seq"] for row in daemon.decision_rows())


async def resubmit_after(engine: EngineClient, tmp_path: Path, resubmitted: list[Resubmitted]) -> DaemonProcess:
    """The daemon is gone; a new one starts on the same socket and log, and the engine's
    next step (a new request r4) finds its session unknown."""
    old_session = engine.session_id
    restarted = DaemonProcess(tmp_path).start()
    decisions = await engine.step(submits=[RequestSpec("r4", 16, 16)])
    # r0 again as it stands: 40 computed tokens its prompt, 32 - 8 still to generate (3
    # blocks); r1 32 blocks; r2 waits again (29 free < 32); r4, the step that found the
    # loss, fits in 1 of them.
    assert [(d.request_id, d.kind.value, d.prompt_tokens, d.max_new_tokens, d.blocks_held) for d in decisions] == [
        ("r0", "admit", 40, 24, (3,)),
        ("r1", "admit", 512, 16, (32,)),
        ("r2", "queue", 512, 16, ()),
        ("r4", "admit", 16, 16, (1,)),
    ]
    [told] = resubmitted
    assert (told.old_session_id, told.session_id) == (old_session, engine.session_id)
    assert told.old_session_id != told.session_id
    assert told.request_ids == ("r0", "r1", "r2", "r4")
    assert told.decisions == tuple(decisions)
    assert "unknown session" in told.reason
    return restarted


async def test_a_sigterm_stop_and_restart_resubmits_after_the_closing_rows(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path).start()
    resubmitted: list[Resubmitted] = []
    try:
        engine, last = await run_until_down(daemon, resubmitted)
    finally:
        assert daemon.stop() == 0
    restarted = await resubmit_after(engine, tmp_path, resubmitted)
    try:
        assert rows_after(restarted, last) == [
            ("r2", "reject", "draining", "daemon_stop", 512, 16),
            ("r1", "expire", "draining", "daemon_stop", 512, 16),
            ("r0", "expire", "draining", "daemon_stop", 32, 32),
            ("r0", "admit", "fits", "", 40, 24),
            ("r1", "admit", "fits", "", 512, 16),
            ("r2", "queue", "pool_full", "", 512, 16),
            ("r4", "admit", "fits", "", 16, 16),
        ]
        # Running again: r0 finishes, and the new daemon gives its blocks to r2.
        decisions = await engine.step(finishes=["r0", "r1"])
        assert [(d.request_id, d.kind.value) for d in decisions] == [
            ("r0", "release"), ("r1", "release"), ("r2", "admit")]
        await engine.close()
    finally:
        restarted.stop()


async def test_a_sigkill_and_restart_resubmits_after_the_closing_rows(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path).start()
    resubmitted: list[Resubmitted] = []
    try:
        engine, last = await run_until_down(daemon, resubmitted)
    finally:
        daemon.signal(signal.SIGKILL)
        daemon.wait()
        daemon.stop()
    restarted = await resubmit_after(engine, tmp_path, resubmitted)
    try:
        closing = [row[:4] for row in rows_after(restarted, last)[:3]]
        assert closing == [
            ("r0", "expire", "daemon_restart", "daemon_restart"),
            ("r1", "expire", "daemon_restart", "daemon_restart"),
            ("r2", "expire", "daemon_restart", "daemon_restart"),
        ]
        assert [row[:2] for row in rows_after(restarted, last)[3:]] == [
            ("r0", "admit"), ("r1", "admit"), ("r2", "queue"), ("r4", "admit")]
        await engine.close()
    finally:
        restarted.stop()


async def test_without_resubmit_the_client_still_raises_session_lost(tmp_path: Path) -> None:
    """The default (what the vLLM adapter relies on): the engine hears SessionLost and
    resubmits itself; nothing is submitted behind its back."""
    from kvbudget.client import SessionLost

    daemon = DaemonProcess(tmp_path).start()
    engine = EngineClient(daemon.target, "e", heartbeat=False)
    await engine.open()
    await engine.step(submits=[RequestSpec("r0", 32, 32)])
    assert daemon.stop() == 0
    restarted = DaemonProcess(tmp_path).start()
    try:
        last = max(row["seq"] for row in restarted.decision_rows())
        with pytest.raises(SessionLost):
            await engine.step(submits=[RequestSpec("r1", 16, 16)])
        assert restarted.decision_rows("seq > ?", (last,)) == []
        await engine.close()
    finally:
        restarted.stop()
