"""What one snapshot costs with a deep waiting queue, beside a bare ping in the same run.

    python bench/bench_snapshot.py [--waiting 20000] [--engines 4] [--tenants 1] [--calls 200]

A dashboard's Watch and the Prometheus tick each build a snapshot on the daemon's event
loop, so its cost is loop time taken from admission. It grows with what the snapshot
counts: the waiting requests per engine and per reason. This starts a real daemon
(guaranteed policy, the harness's 64-block pool, unix socket), lets one request reserve the
whole pool, queues `--waiting` more from `--engines` engine sessions over `--tenants`
tenants, and times `--calls` GetSnapshot calls against as many health Checks (the bare
ping), interleaved; then the same with the queue empty. p50s, in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from grpc_health.v1 import health_pb2, health_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from daemon_harness import DaemonProcess  # noqa: E402

from kvbudget.client import EngineClient, ObserverClient  # noqa: E402
from kvbudget.daemon.core.records import RequestSpec  # noqa: E402


async def timed(call, calls: int) -> float:
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


async def measure(target: str, calls: int) -> tuple[float, float, int]:
    import grpc

    async with ObserverClient(target) as observer, grpc.aio.insecure_channel(target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        ping = lambda: health.Check(health_pb2.HealthCheckRequest())  # noqa: E731
        for _ in range(5):
            await observer.snapshot()
            await ping()
        snapshot_ms = ping_ms = 0.0
        rounds = 4
        for _ in range(rounds):  # interleaved, so drift hits both alike
            ping_ms += await timed(ping, calls // rounds) / rounds
            snapshot_ms += await timed(observer.snapshot, calls // rounds) / rounds
        return ping_ms, snapshot_ms, (await observer.snapshot()).num_waiting


async def run(workdir: Path, waiting: int, engines: int, tenants: int, calls: int) -> None:
    with DaemonProcess(workdir, "--policy", "guaranteed") as daemon:
        clients = [EngineClient(daemon.target, f"engine-{i}") for i in range(engines)]
        for client in clients:
            await client.open()
        # 16 + 1008 tokens = 1,024 = the harness pool's 64 blocks, all reserved: the rest wait.
        await clients[0].step(submits=[RequestSpec("whole-pool", 16, 1008)])
        empty = await measure(daemon.target, calls)
        per_engine = -(-waiting // engines)
        for e, client in enumerate(clients):
            ids = range(e * per_engine, min(waiting, (e + 1) * per_engine))
            for start in range(ids.start, ids.stop, 1000):
                await client.step(submits=[RequestSpec(f"w{i}", 16, 16, tenant=f"t{i % tenants}")
                                           for i in range(start, min(ids.stop, start + 1000))])
        full = await measure(daemon.target, calls)
        for client in clients:
            await client.close()
    print(f"GetSnapshot p50 over {calls} calls, {engines} engine sessions, {tenants} tenant(s):")
    for (ping_ms, snapshot_ms, num_waiting) in (empty, full):
        print(f"  {num_waiting:>7,} waiting: snapshot {snapshot_ms:6.2f} ms, bare ping {ping_ms:5.2f} ms, "
              f"snapshot - ping {snapshot_ms - ping_ms:6.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiting", type=int, default=20000)
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--tenants", type=int, default=1)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(Path(tmp), args.waiting, args.engines, args.tenants, args.calls))


if __name__ == "__main__":
    main()
