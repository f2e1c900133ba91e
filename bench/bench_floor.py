"""The floor under issue #4's latency goal: a bare grpc.aio server whose handler only commits one row.

    python bench/bench_floor.py [--rounds 6] [--calls 600]

bench_roundtrip compares one admission Step with a health Check on the daemon (goal: p50
<= 1.2x). This asks what the same comparison gives with nothing of KVBudget in it: a
minimal `grpc.aio` server in its own process, on a unix socket, with two methods taking
and returning raw bytes (no protobuf, no interceptor, no validation, no pool):

  - ping: returns at once (the bare ping);
  - commit: inserts one row of the decision log's width (24 columns, two short JSON
    lists) into a table with no index but its primary key, in its own transaction, in a
    file set up as the decision log sets up its own (WAL, synchronous=NORMAL, 1 KiB pages,
    no automatic checkpoint), then returns: what "committed before the reply goes out"
    costs with nothing else around it.

Both are called from this process, in interleaved blocks of 100 (so drift hits both
alike), one call at a time. The figure is commit p50 / ping p50, median over rounds: the
lowest ratio a daemon bound by that contract can show on this machine, before it has
validated, decided or built a reply.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from kvbudget.client.target import wait_until_serving

SERVICE = "floor.Floor"
BLOCK = 100
ROW = (1.0, 1, 1.0, "admit", "fits", "cmpl-0123456789abcdef-0", "engine-0", "", "guaranteed",
       16, 16, 32, 0, "[2]", "[2]", "[[17, 18]]", 0, 0, 4000, 0, 1, "")


async def serve(path: str, db_path: str) -> None:
    from grpc_health.v1 import health_pb2_grpc
    from grpc_health.v1.health import aio as health_aio

    conn = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA page_size=1024")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    columns = ", ".join(f"c{i}" for i in range(len(ROW)))
    conn.execute(f"CREATE TABLE IF NOT EXISTS rows (id INTEGER PRIMARY KEY, {columns})")
    insert = f"INSERT INTO rows VALUES (NULL, {', '.join('?' * len(ROW))})"
    cursor = conn.cursor()

    async def ping(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b""

    async def commit(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        cursor.execute(insert, ROW)
        return b"ok"

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
        "Ping": grpc.unary_unary_rpc_method_handler(ping),
        "Commit": grpc.unary_unary_rpc_method_handler(commit),
    }),))
    health_pb2_grpc.add_HealthServicer_to_server(health_aio.HealthServicer(), server)  # (readiness only)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    await server.wait_for_termination()


async def measure(target: str, rounds: int, calls: int) -> list[float]:
    ratios = []
    async with grpc.aio.insecure_channel(target) as channel:
        methods = {name: channel.unary_unary(f"/{SERVICE}/{name}") for name in ("Ping", "Commit")}
        for round_number in range(rounds + 1):  # the first round warms up, untimed
            samples: dict[str, list[float]] = {"Ping": [], "Commit": []}
            for _ in range(calls // BLOCK):
                for name, method in methods.items():
                    for _ in range(BLOCK):
                        t0 = time.perf_counter()
                        await method(b"")
                        samples[name].append(time.perf_counter() - t0)
            if round_number:
                ping, commit = (statistics.median(samples[n]) for n in ("Ping", "Commit"))
                ratios.append(commit / ping)
                print(f"round {round_number}: ping p50 {ping * 1e6:.0f} us  commit p50 {commit * 1e6:.0f} us  "
                      f"ratio {commit / ping:.3f}x  (+{(commit - ping) * 1e6:.0f} us)", flush=True)
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=600, help="calls of each kind per round")
    parser.add_argument("--serve", nargs=2, metavar=("SOCKET", "DB"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(*args.serve))
        return
    with tempfile.TemporaryDirectory() as tmp:
        socket_path, db_path = os.path.join(tmp, "floor.sock"), os.path.join(tmp, "floor.db")
        server = subprocess.Popen([sys.executable, __file__, "--serve", socket_path, db_path])
        try:
            target = f"unix://{socket_path}"
            why = wait_until_serving(target, server)
            if why is not None:
                raise SystemExit(f"floor server {why}")
            ratios = asyncio.run(measure(target, args.rounds, args.calls))
        finally:
            server.terminate()
            server.wait(30)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(f"floor: one-row commit p50 / bare ping p50 = {statistics.median(ratios):.3f}x "
          f"(min {min(ratios):.3f} - max {max(ratios):.3f}) over {len(ratios)} rounds; issue #4's goal: <= 1.2x")


if __name__ == "__main__":
    main()
