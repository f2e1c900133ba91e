"""Every request ends in the log (issue 30, point 5): a clean stop gives each open request
its closing row, and a start after a SIGKILL closes what the killed daemon left open, each
with a reason (docs/log-schema.md, "How every request ends"). A real daemon process; the
log read with plain sqlite3, as an operator's tool would."""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path

from kvbudget.client import EngineClient
from kvbudget.daemon.core.records import RequestSpec

from tests.daemon_harness import DaemonProcess
from tests.test_observe_metrics import metrics_port, sample_value, scrape

# 64 usable blocks of 16 tokens: two 512-token prompts (32 blocks each) fill the pool and
# the third waits.
PROMPT = 512


def last_rows(daemon: DaemonProcess) -> dict[str, tuple[str, str, str]]:
    """Each request's newest row: (kind, reason, the detail's first word)."""
    rows = daemon.decision_rows("request_id != '' ORDER BY seq")
    return {row["request_id"]: (row["kind"], row["reason"], row["detail"].split(":")[0]) for row in rows}


def closed_through(daemon: DaemonProcess) -> int:
    connection = sqlite3.connect(f"file:{daemon.db_path}?mode=ro", uri=True)
    try:
        row = connection.execute("SELECT value FROM meta WHERE key = 'closed_through_seq'").fetchone()
    finally:
        connection.close()
    return int(row[0]) if row else 0


async def open_three(daemon: DaemonProcess) -> EngineClient:
    """Engine e with r0, r1 running and r2 waiting; the session left open."""
    engine = EngineClient(daemon.target, "e", heartbeat=False)
    await engine.open()
    decisions = await engine.step(submits=[RequestSpec(f"r{i}", prompt_tokens=PROMPT, max_new_tokens=16)
                                           for i in range(3)])
    assert [(d.request_id, d.kind.value) for d in decisions] == [("r0", "admit"), ("r1", "admit"), ("r2", "queue")]
    return engine


async def test_a_clean_stop_closes_every_open_request_with_its_reason(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path).start()
    try:
        engine = await open_three(daemon)
        async with EngineClient(daemon.target, "done", heartbeat=False) as other:  # closed before the stop
            await other.step(submits=[RequestSpec("d0", prompt_tokens=16, max_new_tokens=16)])
    finally:
        assert daemon.stop() == 0
    await engine.close()
    assert last_rows(daemon) == {
        "r0": ("expire", "draining", "daemon_stop"),
        "r1": ("expire", "draining", "daemon_stop"),
        "r2": ("reject", "draining", "daemon_stop"),
        "d0": ("release", "aborted", ""),  # its engine closed its session: not the stop's
    }
    assert closed_through(daemon) == max(row["seq"] for row in daemon.decision_rows())


async def test_a_start_after_a_sigkill_closes_what_the_killed_daemon_left_open(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path).start()
    engine = await open_three(daemon)
    await engine.step(finishes=["r0"])  # r2 is admitted in r0's place
    daemon.signal(signal.SIGKILL)
    daemon.wait()
    await engine.close()
    seq_at_the_kill = max(row["seq"] for row in daemon.decision_rows())
    with DaemonProcess(tmp_path, "--metrics-address", "127.0.0.1:0") as restarted:
        # The start's closing rows are counted: 2 of kind expire, reason daemon_restart.
        scraped = scrape(metrics_port(restarted))
        assert sample_value(scraped, "kvbudget_decisions_total", kind="expire", reason="daemon_restart") == 2
        closing = restarted.decision_rows("seq > ? ORDER BY seq", (seq_at_the_kill,))
        assert [(row["seq"], row["request_id"], row["kind"], row["reason"]) for row in closing] == [
            (seq_at_the_kill + 1, "r1", "expire", "daemon_restart"),
            (seq_at_the_kill + 2, "r2", "expire", "daemon_restart"),
        ]
        assert [row["detail"].split(":")[0] for row in closing] == ["daemon_restart"] * 2
        assert [row["detail"].rsplit(" ", 1)[1] for row in closing] == ["admit", "admit"]
        async with EngineClient(restarted.target, "e", heartbeat=False) as engine:
            (admitted,) = await engine.step(submits=[RequestSpec("r3", prompt_tokens=16, max_new_tokens=16)])
            assert admitted.seq == seq_at_the_kill + 3  # numbered on after the closing rows
    assert last_rows(restarted) == {
        "r0": ("release", "finished", ""),
        "r1": ("expire", "daemon_restart", "daemon_restart"),
        "r2": ("expire", "daemon_restart", "daemon_restart"),
        "r3": ("release", "aborted", ""),
    }
    with DaemonProcess(tmp_path) as again:  # nothing left open: a third start adds no row
        assert again.decision_rows("seq > ?", (seq_at_the_kill + 4,)) == []
