"""A bound on one step's ops (issue 30, point 4): a legal 100,000-op step held the event loop
for 2 s, and an engine with a 1 s lease lost its session meanwhile. `server.max_ops_per_step`
(10,000 unless set) refuses a bigger step with INVALID_ARGUMENT naming the field and the
setting, before any of it is read or applied; a value past the core's own cap is refused
at start in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from kvbudget.client import EngineClient
from kvbudget.daemon.core.records import RequestSpec

from tests.daemon_harness import DEFAULT_ARGS, DaemonProcess


async def test_a_step_over_the_bound_is_invalid_argument_and_changes_nothing(tmp_path: Path) -> None:
    with DaemonProcess(tmp_path, "--max-ops-per-step", "3") as daemon:
        async with EngineClient(daemon.target, "e", heartbeat=False) as engine:
            specs = [RequestSpec(f"r{i}", prompt_tokens=16, max_new_tokens=16) for i in range(4)]
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await engine.step(submits=specs)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.details() == ("submits: at most 3 operations per step (server.max_ops_per_step), "
                                               "got 4: send them in smaller steps")
            decisions = await engine.step(submits=specs[:3])  # at the bound: served
            assert [d.request_id for d in decisions] == ["r0", "r1", "r2"]
        assert [row["request_id"] for row in daemon.decision_rows("kind = 'admit'")] == ["r0", "r1", "r2"]


@pytest.mark.parametrize("value, problem", [
    ("100001", "max_ops_per_step: at most 100,000, got 100,001"),
    ("0", "max_ops_per_step: must be positive, got 0"),
])
def test_a_bound_past_the_cores_cap_or_below_one_is_refused_in_one_line(tmp_path: Path, value: str,
                                                                        problem: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kvbudget", "daemon", *DEFAULT_ARGS, "--check-config", "--max-ops-per-step", value,
         "--db-path", str(tmp_path / "d.db"), "--listen", f"unix://{tmp_path}/k.sock"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [f"kvbudget daemon: error: {problem}"]
