"""The daemon under batched load for minutes: is the rate it holds the rate it can keep up?

    python bench/bench_sustained.py [--seconds 120] [--chunk 10] [--engines 4] [--batch 256]
                                    [--request-ids uuid|sequential] [--max-rows 0] [--max-bytes 0]

bench_roundtrip's throughput runs for seconds. A daemon runs for weeks, and its decision
log's upkeep (folding committed rows into the indexed table, purging past the retention
bound) runs beside the commits on the same connection. A load the commits take but the
upkeep cannot follow shows only after a while: rows pile up unindexed (the recent table,
which `kvbudget log --request` scans, and which every start-up and clean stop must fold).

This starts a real daemon (unix socket, durable log; `--max-rows` > 0 adds retention by
rows, `--max-bytes` > 0 by the file's size, otherwise it has none), drives `--engines` engines with steps of `--batch` submits and the previous batch's
finishes for `--seconds`, and every `--chunk` seconds prints: decisions/s, the p50 / p99 /
max time of one Step, the rows waiting to be folded, the rows indexed and the database
file's size. Then it sends
SIGTERM and times the stop (which folds what is left), and checks the exit status.

Request ids are `cmpl-<uuid4 hex>-0` (as vLLM makes them) unless `--request-ids
sequential`: random ids cost the fold a page of the request_id index per row.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_roundtrip import start_daemon  # noqa: E402

from kvbudget.client import EngineClient, step_message  # noqa: E402
from kvbudget.v1 import engine_pb2  # noqa: E402


def backlog(db_path: Path) -> tuple[int, int]:
    """(rows waiting to be folded, rows indexed), from each table's primary key: both hold
    a run of consecutive ids, so this reads two index ends, not the rows."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5.0)
    try:
        spans = []
        for table in ("decisions_recent", "decisions_indexed"):
            low, high = conn.execute(f"SELECT min(id), max(id) FROM {table}").fetchone()
            spans.append(0 if low is None else high - low + 1)
        return spans[0], spans[1]
    finally:
        conn.close()


async def drive(target: str, args: argparse.Namespace, db_path: Path) -> None:
    clients = [EngineClient(target, f"sustained-{i}", heartbeat=True) for i in range(args.engines)]
    for client in clients:
        await client.open()
    previous: list[list[str]] = [[] for _ in clients]
    counter = [0]
    started = time.perf_counter()
    total = 0

    async def engine_loop(index: int, until: float, step_s: list[float]) -> int:
        done = 0
        while time.perf_counter() < until:
            if args.request_ids == "uuid":
                ids = [f"cmpl-{uuid.uuid4().hex}-0" for _ in range(args.batch)]
            else:
                ids = [f"e{index}-{counter[0] + i}" for i in range(args.batch)]
                counter[0] += args.batch
            message = step_message(
                "", submits=[engine_pb2.Submit(request_id=r, prompt_tokens=16, max_new_tokens=16) for r in ids],
                finishes=previous[index],
            )
            t0 = time.perf_counter()
            response = await clients[index].step_raw(message)
            step_s.append(time.perf_counter() - t0)
            done += len(response.decisions)
            previous[index] = ids
        return done

    print(f"{'t (s)':>6} {'decisions/s':>12} {'step p50':>9} {'p99':>8} {'max':>8}   {'unfolded':>9} {'indexed':>10}"
          f" {'file MB':>8}")
    while (elapsed := time.perf_counter() - started) < args.seconds - 1e-6:
        until = time.perf_counter() + min(args.chunk, args.seconds - elapsed)
        t0 = time.perf_counter()
        step_s: list[float] = []
        done = sum(await asyncio.gather(*(engine_loop(i, until, step_s) for i in range(len(clients)))))
        rate = done / (time.perf_counter() - t0)
        total += done
        unfolded, indexed = backlog(db_path)
        ordered = sorted(step_s)
        p99 = ordered[max(0, int(len(ordered) * 0.99) - 1)]
        print(f"{time.perf_counter() - started:6.0f} {rate:12,.0f} {statistics.median(ordered) * 1e3:7.1f}ms "
              f"{p99 * 1e3:6.1f}ms {ordered[-1] * 1e3:6.1f}ms   {unfolded:9,} {indexed:10,}"
              f" {db_path.stat().st_size / 1e6:8.0f}", flush=True)
    for index, client in enumerate(clients):
        await client.step(finishes=previous[index])
        await client.close()
    print(f"whole run: {total:,} decisions in {time.perf_counter() - started:.0f} s = "
          f"{total / (time.perf_counter() - started):,.0f} decisions/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--chunk", type=float, default=10.0)
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--request-ids", choices=("sequential", "uuid"), default="uuid")
    parser.add_argument("--max-rows", type=int, default=0, help="retention by rows (0: none)")
    parser.add_argument("--max-bytes", type=int, default=0, help="retention by the file's bytes (0: none)")
    args = parser.parse_args()
    if min(args.seconds, args.chunk, args.engines, args.batch) <= 0 or min(args.max_rows, args.max_bytes) < 0:
        parser.error("--seconds, --chunk, --engines and --batch must be positive, --max-rows and --max-bytes >= 0")
    num_blocks = max(4096, 4 * args.engines * args.batch + 1)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
          f"{args.engines} engines x {args.batch} submits + {args.batch} finishes per step, "
          f"{args.request_ids} request ids, retention max rows {args.max_rows or 'none'}, "
          f"max bytes {args.max_bytes or 'none'}")
    with tempfile.TemporaryDirectory() as tmp:
        db_path = Path(tmp) / "kvbudget.db"
        extra = ["--retention-max-rows", str(args.max_rows), "--retention-max-bytes", str(args.max_bytes)]
        process, target = start_daemon(Path(tmp), num_blocks, extra_flags=extra)
        try:
            asyncio.run(drive(target, args, db_path))
            unfolded, indexed = backlog(db_path)
            t0 = time.perf_counter()
            process.send_signal(signal.SIGTERM)
            status = process.wait(300)
            stop_s = time.perf_counter() - t0
            unfolded_after, indexed_after = backlog(db_path)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    print(f"SIGTERM with {unfolded:,} rows unfolded: stopped in {stop_s:.2f} s, exit status {status}; "
          f"after: {unfolded_after:,} unfolded, {indexed_after:,} indexed")


if __name__ == "__main__":
    main()
