"""The daemon's RPCs fuzzed (issue 30, point 8): 10,000 seeded calls against a real daemon
(lifecycle.Daemon, serving on a unix socket in this process), valid steps and steps with
one known fault, sessions opened, replaced and closed, resends, heartbeats, snapshots,
estimates (tests/rpc_fuzz.py). Every refusal has the code and names the field the fault
was in, and a resend gets the same reply. After every call's reply, the daemon's core is
recounted from scratch (`AdmissionController.check_integrity`: the pool's free, held and
evictable blocks and cache maps, every running request's tables against the ledger's
totals and budget formulas, tenants, the waiting queue's counters and order). After every
1,000 calls, the pool agrees with the log (running, waiting, blocks held, free + held = the
pool, decisions by kind), every decision a reply carried is in the log as told, and no
request of a refused step is. The daemon stops cleanly (0) with no ERROR logged.
bench/fuzz_rpcs.py runs the same against a daemon process, as many calls as asked."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path

import pytest

from kvbudget.daemon.config.loading import load_config
from kvbudget.daemon.server.lifecycle import Daemon

from tests.daemon_harness import await_until
from tests.rpc_fuzz import RpcFuzz

pytestmark = pytest.mark.slow

CALLS, LOG_CHECK_EVERY = 10_000, 1_000


def log_rows(db_path: Path) -> list[dict]:
    connection = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    connection.row_factory = sqlite3.Row
    try:
        return [dict(row) for row in connection.execute("SELECT * FROM decisions")]
    finally:
        connection.close()


@pytest.mark.parametrize("seed", [30])
async def test_fuzzed_rpcs_get_their_codes_and_the_pool_stays_whole_after_every_call(
    tmp_path: Path, seed: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="kvbudget")
    db_path, target = tmp_path / "decisions.db", f"unix://{tmp_path}/kvbudget.sock"
    config = load_config(None, {
        "model": "llama-3.1-8b", "num_gpu_blocks": 65, "memory_mode": "accounting", "device": "cpu",
        "max_model_len": 2048, "db_path": str(db_path), "listen": target,
        "lease_ttl_s": 3600, "max_ops_per_step": 64,
    })
    daemon = Daemon(config)
    serving = asyncio.create_task(daemon.serve())
    checked = 0

    def check_core() -> None:
        nonlocal checked
        daemon.core.controller.check_integrity()
        checked += 1

    try:
        async def up() -> bool:
            return daemon.core is not None

        await await_until(up, timeout=60)
        fuzz = RpcFuzz(target, seed, max_ops_per_step=64)
        try:
            for _ in range(CALLS // LOG_CHECK_EVERY):
                await fuzz.run(LOG_CHECK_EVERY, after_each=check_core)
                await fuzz.check_pool_and_log(log_rows(db_path))
        finally:
            await fuzz.close()
    finally:
        daemon.request_stop()
        assert await asyncio.wait_for(serving, 60) == 0
    assert checked == CALLS
    # Each kind of call and of refusal came up (the generator reached them all).
    assert {"Step OK", "Step NOT_FOUND", "Step ALREADY_EXISTS", "Step INVALID_ARGUMENT",
            "Step FAILED_PRECONDITION", "OpenSession OK", "OpenSession ALREADY_EXISTS",
            "OpenSession INVALID_ARGUMENT", "CloseSession OK", "Heartbeat FAILED_PRECONDITION",
            "Estimate INVALID_ARGUMENT"} <= set(fuzz.outcomes)
    assert sum(fuzz.outcomes.values()) == CALLS - fuzz.skipped
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
