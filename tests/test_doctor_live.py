"""`kvbudget doctor` and the systemd handshake against a real daemon process.

Each test starts `kvbudget daemon` on a unix socket in a temp folder (CPU, accounting-only
mode, llama-3.1-8b preset: one full-attention group, 16-token blocks), stages a situation
with a real engine session, then runs the real `kvbudget doctor` command against it.

Pool: --num-gpu-blocks 1000, of which 999 are usable (block 0 is the null block);
max_model_len 12,000 tokens = 750 blocks. A request's prompt is held at admission up to
max_num_batched_tokens (8,192 tokens = 512 blocks), the rest of its promise is reserved.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import kvbudget
from kvbudget.client import EngineClient
from kvbudget.daemon.core.records import DecisionKind, RequestSpec
from kvbudget.v1 import observer_pb2, observer_pb2_grpc

pytestmark = pytest.mark.slow

POOL_BLOCKS = 1000
MAX_MODEL_LEN = 12_000
START_TIMEOUT_S = 60.0


def daemon_command(tmp: Path, policy: str) -> list[str]:
    return [
        sys.executable, "-m", "kvbudget", "daemon",
        "--model", "llama-3.1-8b",
        "--num-gpu-blocks", str(POOL_BLOCKS),
        "--max-model-len", str(MAX_MODEL_LEN),
        "--memory-mode", "accounting",
        "--device", "cpu",
        "--policy", policy,
        "--listen", f"unix://{tmp}/kvbudget.sock",
        "--db-path", str(tmp / "decisions.db"),
    ]  # fmt: skip


def wait_serving(target: str, proc: subprocess.Popen, timeout_s: float = START_TIMEOUT_S) -> None:
    """Until the daemon's health service says SERVING (or it died, or time ran out)."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"daemon exited with {proc.returncode}: {proc.stderr.read()}")  # type: ignore[union-attr]
            with contextlib.suppress(grpc.RpcError):
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0).status == health_pb2.HealthCheckResponse.SERVING:
                    return
            time.sleep(0.1)
    raise AssertionError("daemon did not become SERVING in time")


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@contextlib.contextmanager
def running_daemon(tmp: Path, policy: str, env: dict[str, str] | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    target = f"unix://{tmp}/kvbudget.sock"
    proc = subprocess.Popen(
        daemon_command(tmp, policy),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        yield target, proc
    finally:
        stop(proc)
        if proc.stderr is not None:
            proc.stderr.close()


@contextlib.asynccontextmanager
async def engine(target: str) -> AsyncIterator[EngineClient]:
    client = EngineClient(target, "engine-live", call_timeout_s=20.0)
    await client.open()
    try:
        yield client
    finally:
        await client.close()


async def doctor(target: str, *extra: str) -> tuple[int, dict]:
    """The real command, as an operator runs it; the engine's loop keeps heartbeating."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvbudget", "doctor", "--target", target,
        "--samples", "3", "--interval", "0.3", "--json", *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode in (0, 1), err.decode()
    return proc.returncode, json.loads(out)


def kinds(decisions) -> list[tuple[str, DecisionKind]]:
    return [(d.request_id, d.kind) for d in decisions]


# ------------------------------------------------------------------ three staged situations


async def test_doctor_says_healthy_with_room_to_spare(tmp_path: Path) -> None:
    with running_daemon(tmp_path, "optimistic") as (target, proc):
        await asyncio.to_thread(wait_serving, target, proc)
        async with engine(target) as client:
            # 4 prompts of 800 tokens = 4 x 50 blocks = 200 of 999 held (20 %), nothing waits
            decisions = await client.step(
                submits=[RequestSpec(f"r{i}", prompt_tokens=800, max_new_tokens=200) for i in range(4)]
            )
            assert [k for _, k in kinds(decisions)] == [DecisionKind.ADMIT] * 4
            # The daemon's settings as a config file: the pool it implies is the one running
            # (num_gpu_blocks 1000 = 999 usable + the null block).
            config = tmp_path / "kvbudget.toml"
            config.write_text(f'[model]\nname = "llama-3.1-8b"\n[pool]\nnum_gpu_blocks = {POOL_BLOCKS}\n')
            code, report = await doctor(target, "--config", str(config))
    assert report["verdict"] == "healthy", report
    assert code == 0
    # Which daemon answered: this package's version, up for the few seconds of the test.
    assert report["daemon_version"] == kvbudget.__version__
    assert 0 < report["daemon_uptime_s"] < 120
    (size,) = [f for f in report["findings"] if f["check"] == "pool size"]
    assert size["status"] == "ok", size
    assert size["data"]["config_num_blocks"] == size["data"]["plan_num_blocks"] == POOL_BLOCKS - 1
    # The daemon reports its log's disk (the temp dir's file system) and its size bound.
    (log_disk,) = [f for f in report["findings"] if f["check"] == "log disk"]
    assert log_disk["data"]["disk_total_bytes"] > 0 and log_disk["data"]["log_bytes"] > 0
    assert log_disk["data"]["max_bytes"] == 10 * 2**30  # retention_max_bytes' default


async def test_doctor_says_budget_bound_with_a_queue_and_flat_memory(tmp_path: Path) -> None:
    with running_daemon(tmp_path, "guaranteed") as (target, proc):
        await asyncio.to_thread(wait_serving, target, proc)
        async with engine(target) as client:
            # guaranteed promises the worst case at L = prompt + max new tokens (capped at
            # max_model_len) and holds the prompt now:
            #   a: L = 8000 + 4000 = 12000 -> 750 promised, cdiv(8000, 16) = 500 held
            #   b: L = 3200 + 400  = 3600  -> 225 promised, cdiv(3200, 16) = 200 held
            # 975 of 999 blocks promised; c needs cdiv(800 + 200, 16) = 63 > 999 - 975 = 24
            first = await client.step(
                submits=[
                    RequestSpec("a", prompt_tokens=8000, max_new_tokens=4000),
                    RequestSpec("b", prompt_tokens=3200, max_new_tokens=400),
                ]
            )
            assert kinds(first) == [("a", DecisionKind.ADMIT), ("b", DecisionKind.ADMIT)]
            assert [d.blocks_held for d in first] == [(500,), (200,)]
            queued = await client.step(submits=[RequestSpec("c", prompt_tokens=800, max_new_tokens=200)])
            assert kinds(queued)[0] == ("c", DecisionKind.QUEUE)
            code, report = await doctor(target)
    # held 700/999 = 70 % (not mostly free), committed 975/999 = 97.6 % (>= 90 %);
    # no GPU on the test machine: memory is skipped, not climbing
    assert report["verdict"] == "budget-bound", report
    assert code == 1
    memory = next(f for f in report["findings"] if f["check"] == "gpu memory")
    assert memory["status"] in ("ok", "skipped")


async def test_doctor_says_stuck_queue_with_a_mostly_free_pool(tmp_path: Path) -> None:
    with running_daemon(tmp_path, "naive") as (target, proc):
        await asyncio.to_thread(wait_serving, target, proc)
        async with engine(target) as client:
            # naive charges every request max_model_len: cdiv(12000, 16) = 750 blocks each,
            # though a 320-token prompt holds cdiv(320, 16) = 20; 750 > 999 - 750 = 249 free.
            first = await client.step(submits=[RequestSpec("a", prompt_tokens=320)])
            assert kinds(first)[0] == ("a", DecisionKind.ADMIT)
            second = await client.step(submits=[RequestSpec("b", prompt_tokens=320)])
            assert kinds(second)[0] == ("b", DecisionKind.QUEUE)
            code, report = await doctor(target)
    # held 20/999 = 2 % (mostly free), reserved 730 >= 4 x 20: max_model_len-sized reservations
    assert report["verdict"] == "stuck queue (formula drift)", report
    assert code == 1
    assert "lower max new tokens" in report["knob"] and "layer-aware policy" in report["knob"]
    reservations = next(f for f in report["findings"] if f["check"] == "reservations")
    assert reservations["status"] == "warn"
    assert "max_model_len-sized reservations" in reservations["summary"]


async def test_doctor_names_the_tenant_whose_quota_holds_the_queue(tmp_path: Path) -> None:
    with running_daemon(tmp_path, "optimistic") as (target, proc):
        await asyncio.to_thread(wait_serving, target, proc)
        async with grpc.aio.insecure_channel(target) as channel:  # team-a: 0.5 x 999 = 499 blocks
            from kvbudget.v1 import admin_pb2, admin_pb2_grpc

            await admin_pb2_grpc.AdminServiceStub(channel).SetTenantQuota(
                admin_pb2.SetTenantQuotaRequest(tenant="team-a", max_share=0.5))
        async with engine(target) as client:
            # optimistic holds the prompt: a and b cdiv(3200, 16) = 200 blocks each, 400 of
            # team-a's 499; c needs 200 more > the 99 left: it waits for the quota, with 60 %
            # of the pool free (which looked like formula drift to a count of blocks alone).
            decisions = await client.step(submits=[
                RequestSpec(name, prompt_tokens=3200, max_new_tokens=100, tenant="team-a") for name in "abc"])
            assert kinds(decisions) == [("a", DecisionKind.ADMIT), ("b", DecisionKind.ADMIT), ("c", DecisionKind.QUEUE)]
            code, report = await doctor(target)
    assert report["verdict"] == "budget-bound", report
    assert report["knob"].startswith("tenant(s) team-a at quota: raise [tenants.NAME] max_share")
    (queue,) = [f for f in report["findings"] if f["check"] == "queue"]
    assert queue["summary"] == "1 request waiting, 1 of them for a tenant quota; 40% of the pool held"
    assert code == 1  # not healthy


# ------------------------------------------------------------------ systemd's notify protocol


def received_until(listener: socket.socket, assignment: str) -> list[str]:
    """Datagrams from the daemon until one carries `assignment`; socket.timeout if none does."""
    messages: list[str] = []
    while True:
        lines = listener.recv(4096).decode().splitlines()
        messages.extend(lines)
        if assignment in lines:
            return messages


def test_ready_only_after_serving_and_stopping_on_sigterm(tmp_path: Path) -> None:
    notify_path = tmp_path / "notify.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(notify_path))
    listener.settimeout(START_TIMEOUT_S)
    env = {"NOTIFY_SOCKET": str(notify_path), "WATCHDOG_USEC": "400000"}
    try:
        with running_daemon(tmp_path, "optimistic", env) as (target, proc):
            # READY=1 comes once the pool, the log and the gRPC server are up: by the time
            # systemd hears it, health must already say SERVING
            received_until(listener, "READY=1")
            with grpc.insecure_channel(target) as channel:
                health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
                assert health.status == health_pb2.HealthCheckResponse.SERVING
                snapshot = observer_pb2_grpc.ObserverServiceStub(channel).GetSnapshot(
                    observer_pb2.GetSnapshotRequest(), timeout=5
                )
                assert snapshot.snapshot.num_blocks == POOL_BLOCKS - 1  # the null block
            # the watchdog is pinged at half WATCHDOG_USEC (0.2 s) while serving
            listener.settimeout(5)
            received_until(listener, "WATCHDOG=1")
            proc.send_signal(signal.SIGTERM)
            received_until(listener, "STOPPING=1")
            assert proc.wait(timeout=30) == 0
    finally:
        listener.close()


# ------------------------------------------------------------------ the engine guide's example


def guide_example() -> str:
    """The first python block of docs/engine-integration.md, as a reader copies it."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "engine-integration.md").read_text()
    start = text.index("```python\n") + len("```python\n")
    return text[start : text.index("```", start)]


async def test_engine_guide_example_runs_against_a_real_daemon(tmp_path: Path, capsys) -> None:
    namespace: dict[str, object] = {"__name__": "engine_guide_example"}
    exec(compile(guide_example(), "docs/engine-integration.md", "exec"), namespace)
    with running_daemon(tmp_path, "optimistic") as (target, proc):
        await asyncio.to_thread(wait_serving, target, proc)
        tables = await namespace["run_engine"](target, decode_steps=3)  # type: ignore[operator]
        # chat-1 holds cdiv(900, 16) = 57 blocks (912 slots): 3 decode steps need no new one;
        # both finished, so nothing is left in the engine's tables or the daemon's pool
        assert tables.tables == {} and tables.waiting == set()
        with grpc.insecure_channel(target) as channel:
            snapshot = observer_pb2_grpc.ObserverServiceStub(channel).GetSnapshot(
                observer_pb2.GetSnapshotRequest(), timeout=5
            ).snapshot
        assert (snapshot.num_running, snapshot.num_waiting, snapshot.num_held_blocks) == (0, 0, 0)
        assert snapshot.decisions_by_kind["admit"] == 2
        assert snapshot.decisions_by_kind["release"] == 2
    assert "pool: 999 blocks of 16 tokens, 1 KV-cache group(s)" in capsys.readouterr().out
