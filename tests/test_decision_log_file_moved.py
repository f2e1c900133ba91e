"""The decision log's file removed or renamed while the daemon has it open.

The daemon's connections keep writing through their open descriptors into a file nobody
can read any more, and that is gone when the daemon exits (a restart starts a new, empty
log at db_path). So once db_path is no longer the file the log opened, writes fail like
writes to a full disk: the engine hears UNAVAILABLE rather than a promise of a decision
no reader will ever see, the decisions are kept, and it goes on when the file is back.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvbudget.client import EngineClient
from kvbudget.daemon.log import files
from kvbudget.daemon.log.decision_log import DecisionLog
from kvbudget.daemon.log.query import query_decisions
from kvbudget.daemon.log.unwritten import UnwrittenError
from kvbudget.daemon.core.records import RequestSpec

from daemon_harness import DaemonProcess, await_until
from test_decision_log import make_decision


@pytest.fixture
def check_every_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """The file is checked on every write (the daemon checks at most every FILE_CHECK_S)."""
    monkeypatch.setattr(files, "FILE_CHECK_S", 0.0)


def logged_seqs(path: Path) -> list[int]:
    rows = query_decisions(path, limit=None, newest_first=False)
    assert [r["id"] for r in rows] == list(range(1, len(rows) + 1))
    return [r["seq"] for r in rows]


def test_a_renamed_log_refuses_writes_keeps_the_decisions_and_goes_on_once_it_is_back(
    tmp_path: Path, check_every_write: None
) -> None:
    path = tmp_path / "decisions.db"
    log = DecisionLog(path, unwritten_retry_s=3600.0)
    log.start()
    try:
        assert log.commit_inline([make_decision(1)])
        path.rename(tmp_path / "elsewhere.db")
        with pytest.raises(UnwrittenError, match="removed or renamed while the daemon had it open"):
            log.commit_inline([make_decision(2)])
        failed = log.append([make_decision(3)])
        with pytest.raises(UnwrittenError):
            failed.result(timeout=30)
        assert log.num_unwritten == 2
        assert not log.write_unwritten()  # still gone
        (tmp_path / "elsewhere.db").rename(path)
        assert log.write_unwritten()
        assert log.num_unwritten == 0
        assert log.commit_inline([make_decision(4)])
        log.flush()
    finally:
        log.close()
    assert logged_seqs(path) == [1, 2, 3, 4]


def test_a_log_replaced_by_another_file_refuses_writes(tmp_path: Path, check_every_write: None) -> None:
    path = tmp_path / "decisions.db"
    log = DecisionLog(path, unwritten_retry_s=3600.0)
    log.start()
    try:
        assert log.commit_inline([make_decision(1)])
        path.rename(tmp_path / "old.db")
        path.write_bytes(b"")  # (logrotate's `create`)
        with pytest.raises(UnwrittenError, match="replaced by another file"):
            log.commit_inline([make_decision(2)])
    finally:
        log.close()  # says the kept decision is lost


async def health(target: str) -> int:
    async with grpc.aio.insecure_channel(target) as channel:
        return (await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)).status


@pytest.mark.slow
async def test_a_daemon_whose_log_is_renamed_answers_unavailable_and_goes_on_once_it_is_back(tmp_path: Path) -> None:
    with DaemonProcess(tmp_path, "--num-gpu-blocks", "2049") as daemon:
        engine = EngineClient(daemon.target, "e1", heartbeat=False)
        await engine.open()
        told = [d.request_id for d in await engine.step(submits=[RequestSpec("a", 100, 28)])]
        moved = tmp_path / "moved.db"
        daemon.db_path.rename(moved)
        # Steps go on until a write checks the file (at most FILE_CHECK_S after the
        # rename): what they were told of is in the renamed file, which comes back.
        for i in range(100_000):
            spec = RequestSpec(f"b{i}", 16, 4)
            try:
                told += [d.request_id for d in await engine.step(submits=[spec])]
            except grpc.aio.AioRpcError as error:
                failed = error
                break
        else:
            pytest.fail("every step was answered while the log was renamed away")
        assert failed.code() == grpc.StatusCode.UNAVAILABLE
        assert "removed or renamed while the daemon had it open" in failed.details()
        assert await health(daemon.target) == health_pb2.HealthCheckResponse.NOT_SERVING
        moved.rename(daemon.db_path)

        async def serving_again() -> bool:
            return await health(daemon.target) == health_pb2.HealthCheckResponse.SERVING

        await await_until(serving_again, timeout=30)
        told += [d.request_id for d in await engine.step(submits=[spec])]  # the same step again: its reply
        assert told[-1] == spec.request_id
        await engine.close()
    rows = daemon.decision_rows("kind = 'admit'")
    assert [r["request_id"] for r in rows] == told
    assert "removed or renamed while the daemon had it open" in daemon.stderr()
