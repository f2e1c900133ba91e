"""A real daemon process: a request's whole life, two engines competing, clean stops.

Numbers (llama-3.1-8b preset: 32 full-attention layers, one KV group, 16-token blocks;
`--num-gpu-blocks 65` = 64 usable + the null block; policy guaranteed):
  r1: prompt 100, max_new 28 -> L = 128 -> reserved cdiv(128, 16) = 8 blocks,
      held at admission cdiv(100, 16) = 7 (ids 1..7 of a fresh pool).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import stat
import subprocess
import sys

import pytest

from kvbudget.client import EngineClient, ObserverClient
from kvbudget.daemon.core.records import DecisionKind, Reason, RequestSpec

from daemon_harness import DaemonProcess, await_until

pytestmark = pytest.mark.slow


@pytest.fixture
def daemon(tmp_path):
    with DaemonProcess(tmp_path, "--policy", "guaranteed") as process:
        yield process


async def test_full_request_lifecycle(daemon: DaemonProcess) -> None:
    async with EngineClient(daemon.target, "engine-a") as engine, ObserverClient(daemon.target) as observer:
        assert engine.plan.num_blocks == 64
        assert engine.plan.block_size_tokens == 16

        [admit] = await engine.step(submits=[RequestSpec("r1", prompt_tokens=100, max_new_tokens=28)])
        assert (admit.kind, admit.reason) == (DecisionKind.ADMIT, Reason.FITS)
        assert admit.new_block_ids == ((1, 2, 3, 4, 5, 6, 7),)
        assert admit.blocks_held == (7,) and admit.blocks_reserved == (8,)
        snapshot = await observer.snapshot()
        assert (snapshot.num_held_blocks, snapshot.num_reserved_blocks, snapshot.num_running) == (7, 1, 1)
        assert [e.engine_id for e in snapshot.engines] == ["engine-a"]
        assert snapshot.engines[0].blocks_held == 7

        # Full attention frees nothing while computing: progress is not a decision.
        assert await engine.step(progress=[("r1", 100)]) == []
        [grow] = await engine.step(grows=[("r1", 128)])
        assert grow.kind == DecisionKind.GROW and grow.new_block_ids == ((8,),)

        [release] = await engine.step(finishes=["r1"])
        assert (release.kind, release.reason, release.freed_blocks) == (DecisionKind.RELEASE, Reason.FINISHED, 8)
        snapshot = await observer.snapshot()
        assert (snapshot.num_held_blocks, snapshot.num_free_blocks, snapshot.num_running) == (0, 64, 0)

        received = [admit, grow, release]
    rows = daemon.decision_rows()
    assert [(r["seq"], r["kind"], r["request_id"]) for r in rows] == [
        (d.seq, d.kind.value, d.request_id) for d in received
    ]


async def test_two_engines_competing(daemon: DaemonProcess) -> None:
    """A's request takes the whole budget (512 + 512 tokens = 64 blocks); B's 2-block request
    waits (budget_full), and is admitted on B's Events stream the moment A finishes."""
    async with EngineClient(daemon.target, "engine-a") as a, EngineClient(daemon.target, "engine-b") as b:
        [big] = await a.step(submits=[RequestSpec("big", prompt_tokens=512, max_new_tokens=512)])
        assert big.kind == DecisionKind.ADMIT and big.blocks_reserved == (64,)
        [queued] = await b.step(submits=[RequestSpec("small", prompt_tokens=16, max_new_tokens=16)])
        assert (queued.kind, queued.reason) == (DecisionKind.QUEUE, Reason.BUDGET_FULL)

        events = b.events()
        first_event = asyncio.ensure_future(anext(events))  # B's session queues it meanwhile
        released = await a.step(finishes=["big"])
        # A's reply carries only A's decisions; B's admission goes to B's stream.
        assert [(d.kind, d.request_id) for d in released] == [(DecisionKind.RELEASE, "big")]
        admitted = await asyncio.wait_for(first_event, 30)
        assert (admitted.kind, admitted.request_id, admitted.engine_id) == (DecisionKind.ADMIT, "small", "engine-b")
        assert admitted.new_block_ids == ((1,),)  # cdiv(16, 16) = 1 held of 2 reserved
        await events.aclose()
    seqs = {r["seq"] for r in daemon.decision_rows()}
    assert {big.seq, queued.seq, released[0].seq, admitted.seq} <= seqs


async def test_ops_written_against_a_waiting_request_do_not_break_the_step(daemon: DaemonProcess) -> None:
    """"y" waits behind "x" (x reserves all 64 blocks). One step finishes x and carries
    progress 20 and a grow to 24 for y, written while y waited: they meet y still waiting
    (the queue is tried once the step's own ops are in), so the progress is ignored and the
    grow is DENY not_running; then y is admitted with 16 slots, the ADMIT telling the
    engine its new state."""
    async with EngineClient(daemon.target, "engine-a") as engine:
        await engine.step(submits=[RequestSpec("x", 512, 512)])
        [queued] = await engine.step(submits=[RequestSpec("y", 16, 16)])
        assert queued.kind == DecisionKind.QUEUE
        decisions = await engine.step(finishes=["x"], progress=[("y", 20)], grows=[("y", 24)])
        assert [(d.kind, d.reason, d.request_id) for d in decisions] == [
            (DecisionKind.RELEASE, Reason.FINISHED, "x"), (DecisionKind.DENY, Reason.NOT_RUNNING, "y"),
            (DecisionKind.ADMIT, Reason.FITS, "y")]
        assert decisions[2].num_tokens == 16
        # While it waits, a grow is answered, not refused: DENY not_running.
        [wait] = await engine.step(submits=[RequestSpec("z", 512, 496)])  # cdiv(1008, 16) = 63 > 64 - 2
        assert wait.kind == DecisionKind.QUEUE
        [deny] = await engine.step(grows=[("z", 600)])
        assert (deny.kind, deny.reason) == (DecisionKind.DENY, Reason.NOT_RUNNING)


async def test_sigterm_flushes_the_log_and_exits_zero(daemon: DaemonProcess) -> None:
    received = []
    async with EngineClient(daemon.target, "engine-a", heartbeat=False) as engine:
        for step in range(20):
            ids = [f"s{step}-{i}" for i in range(10)]
            received += await engine.step(submits=[RequestSpec(r, 16, 16) for r in ids])
            received += await engine.step(finishes=ids)
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(60) == 0
    rows = daemon.decision_rows()
    # 20 steps x 10 requests x (ADMIT + RELEASE) = 400 decisions, all received, all logged.
    assert len(received) == 400
    assert sorted(r["seq"] for r in rows) == sorted(d.seq for d in received)
    assert "stopped" in daemon.stderr()
    assert not daemon.socket_path.exists()


def test_sd_notify_ready_status_watchdog_then_stopping(tmp_path) -> None:
    notify_path = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(notify_path)
    listener.settimeout(30)
    # WATCHDOG_USEC without WATCHDOG_PID applies to the daemon: ping every 0.5 s / 2.
    process = DaemonProcess(tmp_path, env={"NOTIFY_SOCKET": notify_path, "WATCHDOG_USEC": "500000"})
    try:
        process.start()  # returns once health says SERVING
        messages = [listener.recv(4096).decode()]
        while messages[-1].startswith("EXTEND_TIMEOUT_USEC="):  # more start time while mapping the pool
            messages.append(listener.recv(4096).decode())
        # The first message after those: ready, once health said SERVING.
        assert "READY=1" in messages[-1].splitlines()
        while not (any(m.startswith("STATUS=") and "blocks held" in m for m in messages)
                   and sum("WATCHDOG=1" in m for m in messages) >= 2):
            messages.append(listener.recv(4096).decode())
        process.signal(signal.SIGTERM)
        while not any("STOPPING=1" in m for m in messages):
            messages.append(listener.recv(4096).decode())
        assert process.wait(60) == 0
    finally:
        process.stop()
        listener.close()


async def test_metrics_endpoint_counts_decisions(tmp_path) -> None:
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def scrape() -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()

    with DaemonProcess(tmp_path, "--metrics-address", f"127.0.0.1:{port}") as daemon:
        async with EngineClient(daemon.target, "m") as engine:
            await engine.step(submits=[RequestSpec("m1", 32, 16)])  # cdiv(32, 16) = 2 blocks held

            async def usage_seen() -> str | None:
                text = await asyncio.to_thread(scrape)
                # Gauges follow the snapshot on the daemon's 1 s metrics tick: 2 / 64 blocks.
                return text if "kvbudget_kv_cache_usage_perc 0.03125" in text else None

            text = await await_until(usage_seen, timeout=30, interval=0.2)
        assert 'kvbudget_decisions_total{kind="admit",reason="fits"} 1.0' in text
        assert "kvbudget_decision_latency_seconds_count 1.0" in text
        # The decision log: its one row, and its files (the database file is never empty).
        assert 'kvbudget_decision_log_rows_total{state="written"} 1.0' in text
        database_bytes = next(line for line in text.splitlines()
                              if line.startswith('kvbudget_decision_log_bytes{file="database"}'))
        assert float(database_bytes.split()[-1]) > 0
        assert 'kvbudget_decision_log_bytes{file="wal"}' in text
        # prometheus-client's process and interpreter series, as on any Python exporter.
        assert "process_resident_memory_bytes " in text
        assert 'python_gc_collections_total{generation="0"}' in text
        assert "python_info{" in text
        assert "kvbudget_tls_certificate_expiry" not in text  # no TLS: no certificate to expire


def test_socket_mode_stale_socket_and_live_socket(tmp_path) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "kvbudget.sock"))
    stale.close()  # the file stays, nobody listens: what a SIGKILLed daemon leaves
    with DaemonProcess(tmp_path) as first:
        mode = stat.S_IMODE(os.stat(first.socket_path).st_mode)
        assert mode == 0o660
        second = subprocess.run(first.args, capture_output=True, text=True, timeout=60)
        assert second.returncode == 2
        assert second.stderr.strip().splitlines() == [
            f"kvbudget daemon: error: listen: another process is serving on {first.socket_path}"
        ]
        assert stat.S_ISSOCK(os.stat(first.socket_path).st_mode)  # the live socket is untouched


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvbudget", "daemon", *args], capture_output=True, text=True,
                          timeout=60)


def test_tcp_without_tokens_or_tls_is_refused(tmp_path) -> None:
    result = _run_cli("--model", "llama-3.1-8b", "--num-gpu-blocks", "65", "--listen", "127.0.0.1:50999",
                      "--db-path", str(tmp_path / "d.db"))
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert "listen" in line and "tokens_file or TLS" in line


def test_check_config_validates_and_names_bad_keys(tmp_path) -> None:
    ok = _run_cli("--model", "llama-3.1-8b", "--num-gpu-blocks", "65", "--check-config",
                  "--db-path", str(tmp_path / "d.db"), "--device", "cpu")
    assert ok.returncode == 0, ok.stderr
    assert "config OK: llama-3.1-8b, 65 blocks of 16 tokens (64 usable + the null block" in ok.stdout
    assert ok.stdout.rstrip().endswith("(kept: 30 days or 10 GiB, whichever comes first)")  # the defaults
    for flags, kept in (
        (("--retention-days", "0", "--retention-max-bytes", "0"), "forever"),
        (("--retention-days", "7", "--retention-max-rows", "1000000", "--retention-max-bytes", "1500000000"),
         "7 days, 1,000,000 decisions or 1.4 GiB, whichever comes first"),
        (("--retention-days", "0", "--retention-max-bytes", str(512 * 2**20)), "512 MiB"),
    ):
        shown = _run_cli("--model", "llama-3.1-8b", "--num-gpu-blocks", "65", "--check-config", *flags,
                         "--db-path", str(tmp_path / "d.db"))  # (the default's folder may not be ours to write)
        assert shown.stdout.rstrip().endswith(f"(kept: {kept})"), (flags, shown.stdout, shown.stderr)
    bad_file = tmp_path / "kvbudget.toml"
    bad_file.write_text('[pool]\nnum_gpu_blocks = 65\nbogus = 1\n[model]\nname = "llama-3.1-8b"\n')
    bad = _run_cli("--config", str(bad_file), "--check-config")
    assert bad.returncode == 2
    [line] = bad.stderr.strip().splitlines()
    assert "pool.bogus" in line
    no_size = _run_cli("--model", "llama-3.1-8b", "--device", "cpu", "--check-config")
    assert no_size.returncode == 2
    assert "num_gpu_blocks" in no_size.stderr and len(no_size.stderr.strip().splitlines()) == 1


async def test_engine_client_batch_builder(daemon: DaemonProcess) -> None:
    async with EngineClient(daemon.target, "engine-a") as engine:
        batch = engine.batch()
        batch.submit(RequestSpec("x", 32, 16))
        batch.submit(RequestSpec("y", 32, 16))
        assert len(batch) == 2
        decisions = await batch.flush()
        assert [(d.kind, d.request_id) for d in decisions] == [(DecisionKind.ADMIT, "x"), (DecisionKind.ADMIT, "y")]
        assert len(batch) == 0
        batch.finish("x")
        batch.abort("y")
        decisions = await batch.flush()
        assert [(d.reason, d.request_id) for d in decisions] == [(Reason.FINISHED, "x"), (Reason.ABORTED, "y")]


async def test_owned_pool_memory_is_shared_memory_on_a_cpu_host(tmp_path) -> None:
    """Without a GPU the owned pool is one POSIX shared-memory segment engines map by name:
    65 blocks (the null block included) x 32 layers x 65,536-byte pages = 136,314,880 bytes."""
    pytest.importorskip("torch")
    with DaemonProcess(tmp_path, "--memory-mode", "owned") as daemon:  # --device cpu (harness)
        async with EngineClient(daemon.target, "mapper") as engine, ObserverClient(daemon.target) as observer:
            memory = engine.plan.memory
            assert (memory.device, memory.size_bytes) == ("cpu", 136_314_880)
            segment = f"/dev/shm/{memory.shm_name}"
            assert os.path.getsize(segment) == 136_314_880
            gpu = (await observer.snapshot()).gpu
            assert not gpu.present and gpu.note.startswith("no GPU")
            assert gpu.pool_bytes == 136_314_880
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(60) == 0
        assert not os.path.exists(segment)  # unlinked on the way out
