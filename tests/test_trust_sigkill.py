"""A daemon SIGKILLed mid-traffic (issue 30, point 8, with point 5): four engines step
against it, each one's step loop sending submits, grows and finishes; the daemon is killed
once a count of steps is served, while calls are in flight, and started again on the same
log, three times over. After each restart: the log reads, every decision any engine was
told of is in it as told, and every request the killed daemon left open was closed by the
start (expire `daemon_restart`), before the new daemon decided
anything; at the end, after a clean stop, no request is open."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import grpc
import pytest

from kvbudget.client import EngineClient
from kvbudget.daemon.core.records import RequestSpec

from tests.daemon_harness import DaemonProcess

pytestmark = pytest.mark.slow

ENGINES, STEPS_BEFORE_THE_KILL, KILLS = 4, 120, 3
ENDING = {"reject", "release", "expire"}


async def engine_loop(target: str, name: str, told: dict, served: list, enough: asyncio.Event) -> None:
    """Steps until the daemon dies: each step submits two requests, grows the previous
    step's to their length and finishes the ones before; every decision told is kept."""
    engine = EngineClient(target, name, heartbeat=False, call_timeout_s=3.0, step_resends=0)
    try:
        await engine.open()
        older: list[str] = []
        previous: list[str] = []
        for i in range(10**6):
            new = [f"{name}-{engine.sessions_opened}-{i}-{j}" for j in range(2)]
            decisions = await engine.step(submits=[RequestSpec(r, prompt_tokens=40, max_new_tokens=24) for r in new],
                                          grows=[(r, 64) for r in previous], finishes=older)
            for d in decisions:
                told[d.seq] = (d.kind.value, d.request_id)
            older, previous = previous, new
            served[0] += 1
            if served[0] == STEPS_BEFORE_THE_KILL:
                enough.set()
    except grpc.aio.AioRpcError:
        pass  # the daemon was killed under this call (or before it: the wait for it timed out)
    finally:
        await engine.close()


def last_rows(rows: list[dict]) -> dict[str, dict]:
    last: dict[str, dict] = {}
    for row in sorted(rows, key=lambda r: r["seq"]):
        if row["request_id"]:
            last[row["request_id"]] = row
    return last


async def test_every_decision_told_survives_a_sigkill_and_the_restart_closes_what_was_open(tmp_path: Path) -> None:
    told: dict[int, tuple[str, str]] = {}
    for _ in range(KILLS):
        daemon = DaemonProcess(tmp_path, lease_ttl_s=3600).start()
        served, enough = [0], asyncio.Event()
        loops = [asyncio.create_task(engine_loop(daemon.target, f"e{k}", told, served, enough))
                 for k in range(ENGINES)]
        waiting = asyncio.ensure_future(enough.wait())
        await asyncio.wait([waiting, asyncio.gather(*loops)], return_when=asyncio.FIRST_COMPLETED)
        assert enough.is_set(), daemon.stderr()  # (no engine loop ended before the kill)
        daemon.signal(signal.SIGKILL)  # (the engines' next calls are in flight or on their way)
        assert daemon.wait() == -signal.SIGKILL
        await asyncio.gather(*loops)
        at_the_kill = daemon.decision_rows()  # (readable as the killed daemon left it)
        open_at_the_kill = sorted((r for r in last_rows(at_the_kill).values() if r["kind"] not in ENDING),
                                  key=lambda r: r["seq"])
        newest = max(r["seq"] for r in at_the_kill)
        with DaemonProcess(tmp_path, lease_ttl_s=3600) as restarted:
            rows = restarted.decision_rows()
            by_seq = {r["seq"]: (r["kind"], r["request_id"]) for r in rows}
            assert [seq for seq, what in told.items() if by_seq.get(seq) != what] == []
            closing = sorted((r for r in rows if r["seq"] > newest), key=lambda r: r["seq"])
            assert [(r["seq"], r["request_id"], r["kind"], r["reason"]) for r in closing] == [
                (newest + i, r["request_id"], "expire", "daemon_restart") for i, r in enumerate(open_at_the_kill, 1)
            ]
            assert all(r["detail"].startswith("daemon_restart") for r in closing)
            assert open_at_the_kill  # (the kill did cut requests off: the check above had work)
    assert [r for r in last_rows(restarted.decision_rows()).values() if r["kind"] not in ENDING] == []
    assert len(told) > KILLS * STEPS_BEFORE_THE_KILL
