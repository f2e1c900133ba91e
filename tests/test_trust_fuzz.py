"""The daemon's RPCs fuzzed (issue 30, point 8): 3,000 seeded calls against a real daemon,
valid steps and steps with one known fault, sessions opened, replaced and closed, resends,
heartbeats, snapshots, estimates (tests/rpc_fuzz.py). Every refusal has the code and names
the field the fault was in, a resend gets the same reply; after every 500 calls the
daemon's pool agrees with its log (running, waiting, blocks held, free + held = the pool,
decisions by kind), every decision a reply carried is in the log as told, and no request
of a refused step is; the daemon is alive at the end. bench/fuzz_rpcs.py runs more calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.daemon_harness import DaemonProcess
from tests.rpc_fuzz import RpcFuzz

pytestmark = pytest.mark.slow

CALLS, CHECK_EVERY = 3_000, 500


@pytest.mark.parametrize("seed", [30])
async def test_fuzzed_rpcs_get_their_codes_and_the_pool_agrees_with_the_log(tmp_path: Path, seed: int) -> None:
    with DaemonProcess(tmp_path, "--max-ops-per-step", "64", lease_ttl_s=3600) as daemon:
        fuzz = RpcFuzz(daemon.target, seed, max_ops_per_step=64)
        try:
            for _ in range(CALLS // CHECK_EVERY):
                await fuzz.run(CHECK_EVERY)
                await fuzz.check_pool_and_log(daemon.decision_rows())
        finally:
            await fuzz.close()
        assert daemon.process.poll() is None, daemon.stderr()
        # Each kind of call and of refusal came up (the generator reached them all).
        assert {"Step OK", "Step NOT_FOUND", "Step ALREADY_EXISTS", "Step INVALID_ARGUMENT",
                "Step FAILED_PRECONDITION", "OpenSession OK", "OpenSession ALREADY_EXISTS",
                "OpenSession INVALID_ARGUMENT", "CloseSession OK", "Heartbeat FAILED_PRECONDITION",
                "Estimate INVALID_ARGUMENT"} <= set(fuzz.outcomes)
        assert sum(fuzz.outcomes.values()) == CALLS - fuzz.skipped
    assert daemon.process.returncode == 0
    assert "Traceback" not in daemon.stderr() and "ERROR" not in daemon.stderr()
