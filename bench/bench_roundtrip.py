"""Admission round trip vs a bare gRPC ping, and decisions/s with batched steps.

    python bench/bench_roundtrip.py [--calls 3000] [--engines 4] [--batch 256] [--seconds 5] [--metrics]
                                    [--request-ids sequential|uuid] [--pin]

Starts a real `kvbudget daemon` process (unix socket, durable decision log in a temp dir)
and drives it from this process, so every figure crosses a process boundary:

1. Latency, closed loop, one call at a time, p50 / p99:
   - ping: the standard health Check on the same grpc.aio server (no work behind it);
   - admission: one Step carrying one submit (one decision, committed to SQLite before the
     reply); the round's requests are finished afterwards, untimed;
   - step: one Step carrying one submit and the finish of the previous request (2
     decisions, both committed before the reply), an engine's steady state.
   Goal (issue #4): admission p50 <= 1.2 x ping p50. The difference in microseconds is
   printed too: on the 2-core machine it stays at ~200-220 us while the ping's p50 drifts
   between ~700 and ~1100 us from minute to minute (and falls to ~700 us with the daemon
   and this process pinned to a core each), so the ratio moves with the ping.
2. Throughput: `--engines` concurrent engine sessions, each Step carrying `--batch` submits
   and the finishes of its previous batch (2 x batch decisions per step, committed before
   each reply). Goal: >= 50,000 decisions/s on 2 cores. Request ids are `e<engine>-<step>-<i>`
   unless `--request-ids uuid` (`cmpl-<uuid4 hex>-0`, as vLLM makes them): random ids land
   all over the log's request_id index, which costs the background fold and checkpoints
   more pages per row than ids that sort in arrival order.

The machine's speed drifts by up to 2x from day to day (the same revision ran 50k decisions/s
one day and 26k the next), so the run also measures DESIGN.md's two reference figures on
the spot: the bare ping (reference p50 ~430 us) and a raw SQLite insert rate (WAL,
synchronous=NORMAL, `executemany` of 1,000 five-column rows a transaction: reference
~400k rows/s). How far today's figures sit from the references says how fast the machine is
now, beside the goals, which were set on it at the reference speed.

The daemon runs without /metrics unless `--metrics` is given (then every batch is also
counted by the Prometheus metrics, on an ephemeral loopback port). `--pin` puts the daemon
(every thread) on the last CPU and this process on the first, where the scheduler would
otherwise move them between the cores.
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
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvbudget.client import EngineClient, step_message
from kvbudget.client.target import wait_until_serving
from kvbudget.v1 import engine_pb2


def start_daemon(
    workdir: Path, num_blocks: int, metrics: bool = False, *, python: str = sys.executable,
    cwd: str | None = None, name: str = "kvbudget", launcher: Sequence[str] = ("-m", "kvbudget"),
    extra_flags: Sequence[str] = (), cpus: set[int] | None = None, quiet: bool = False,
) -> tuple[subprocess.Popen, str]:
    """A daemon of `python`'s kvbudget (another checkout's venv: bench_revisions.py), started
    by `launcher` (bench_step_parts.py: step_variant.py with a part of Step changed), with
    `extra_flags` after the bench's own (bench_sustained.py: retention), on `cpus` if given
    (set before exec, so every thread the daemon starts inherits it); `quiet` sends its
    stderr (the journal) to /dev/null (bench_soak.py: a warning per expired lease)."""
    socket_path = workdir / f"{name}.sock"
    target = f"unix://{socket_path}"
    process = subprocess.Popen(
        [python, *launcher, "daemon", "--model", "llama-3.1-8b",
         "--num-gpu-blocks", str(num_blocks), "--memory-mode", "accounting", "--device", "cpu",
         "--max-model-len", "2048", "--policy", "guaranteed", "--listen", target,
         "--db-path", str(workdir / f"{name}.db"), "--retention-days", "0", "--log-level", "warning",
         *(["--metrics-address", "127.0.0.1:0"] if metrics else []), *extra_flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL if quiet else None,
        cwd=cwd,
        preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
    )
    why = wait_until_serving(target, process)
    if why is not None:
        raise SystemExit(f"daemon {why}")
    return process, target


def stop_daemons(daemons: Iterable[tuple[subprocess.Popen, str]]) -> None:
    """SIGTERM each of `start_daemon`'s results and wait for it (a clean stop folds the log)."""
    for process, _ in daemons:
        process.terminate()
        process.wait(60)


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.99) - 1]


async def latency(target: str, calls: int) -> dict[str, tuple[float, float]]:
    channel = grpc.aio.insecure_channel(target)
    health = health_pb2_grpc.HealthStub(channel)
    ping_request = health_pb2.HealthCheckRequest()
    engine = EngineClient(target, "latency", heartbeat=False)
    await engine.open()
    results: dict[str, list[float]] = {"ping": [], "admission": [], "step": []}
    previous: list[str] = []

    def submit(request_id: str) -> engine_pb2.Submit:
        return engine_pb2.Submit(request_id=request_id, prompt_tokens=16, max_new_tokens=16)

    # Interleave the kinds in rounds so drift (other load, CPU frequency) hits all alike.
    for round_start in range(0, calls + 200, 100):
        warm = round_start < 200
        for _ in range(100):
            t0 = time.perf_counter()
            await health.Check(ping_request)
            if not warm:
                results["ping"].append(time.perf_counter() - t0)
        # Admission alone: one submit, one decision. The round's requests are finished
        # afterwards in one untimed step.
        admitted = []
        for i in range(100):
            request_id = f"a{round_start + i}"
            message = step_message("", submits=[submit(request_id)])
            t0 = time.perf_counter()
            response = await engine.step_raw(message)
            if not warm:
                results["admission"].append(time.perf_counter() - t0)
            assert len(response.decisions) == 1
            admitted.append(request_id)
        await engine.step(finishes=admitted)
        # A steady-state engine step: one submit and the finish of the previous request.
        for i in range(100):
            request_id = f"r{round_start + i}"
            message = step_message("", submits=[submit(request_id)], finishes=previous)
            t0 = time.perf_counter()
            response = await engine.step_raw(message)
            if not warm:
                results["step"].append(time.perf_counter() - t0)
            assert len(response.decisions) == 1 + len(previous)
            previous = [request_id]
    await engine.step(finishes=previous)
    await engine.close()
    await channel.close()
    return {name: percentiles(samples) for name, samples in results.items()}


def sqlite_reference_rate(directory: Path, seconds: float = 1.5) -> float:
    """Rows/s of DESIGN.md's raw SQLite reference (~400k rows/s): WAL, synchronous=NORMAL,
    one `executemany` of 1,000 rows per transaction, no index but the primary key."""
    conn = sqlite3.connect(directory / "reference.db", isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, request_id TEXT, blocks INTEGER, tokens INTEGER, at REAL)")
        rows = [(None, f"req-{i}", i, 2 * i, 1.5) for i in range(1000)]
        written = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            conn.execute("BEGIN")
            conn.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?)", rows)
            conn.execute("COMMIT")
            written += len(rows)
        return written / (time.perf_counter() - t0)
    finally:
        conn.close()


async def throughput(
    target: str, engines: int, batch: int, seconds: float, request_ids: str = "sequential"
) -> tuple[int, float, int]:
    done = 0
    steps = 0
    stop_at = time.perf_counter() + seconds

    async def engine_loop(index: int) -> None:
        nonlocal done, steps
        client = EngineClient(target, f"tp-{index}", heartbeat=False)
        await client.open()
        previous: list[str] = []
        n = 0
        while time.perf_counter() < stop_at:
            if request_ids == "uuid":
                ids = [f"cmpl-{uuid.uuid4().hex}-0" for _ in range(batch)]
            else:
                ids = [f"e{index}-{n}-{i}" for i in range(batch)]
            n += 1
            message = step_message(
                "", submits=[engine_pb2.Submit(request_id=r, prompt_tokens=16, max_new_tokens=16) for r in ids],
                finishes=previous,
            )
            response = await client.step_raw(message)
            done += len(response.decisions)
            steps += 1
            previous = ids
        await client.step(finishes=previous)
        await client.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(engine_loop(i) for i in range(engines)))
    return done, time.perf_counter() - t0, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--metrics", action="store_true", help="serve /metrics (count every decision)")
    parser.add_argument("--request-ids", choices=("sequential", "uuid"), default="sequential",
                        help="the throughput run's request ids (uuid: as vLLM makes them)")
    parser.add_argument("--pin", action="store_true", help="the daemon on the last CPU, this process on the first")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if args.pin and len(cpus) < 2:
        raise SystemExit("--pin needs two CPUs")
    if args.pin:
        os.sched_setaffinity(0, {cpus[0]})
    # Each in-flight request holds 1 block of 2 reserved (16 + 16 tokens); a step keeps two
    # batches alive (this one's submits, the previous one's until finished).
    num_blocks = max(4096, 4 * args.engines * args.batch + 1)
    with tempfile.TemporaryDirectory() as tmp:
        process, target = start_daemon(Path(tmp), num_blocks, args.metrics, cpus={cpus[-1]} if args.pin else None)
        try:
            lat = asyncio.run(latency(target, args.calls))
            done, elapsed, steps = asyncio.run(
                throughput(target, args.engines, args.batch, args.seconds, args.request_ids))
            sqlite_rate = sqlite_reference_rate(Path(tmp))
            rows = subprocess.run(["sqlite3", str(Path(tmp) / "kvbudget.db"), "SELECT count(*) FROM decisions"],
                                  capture_output=True, text=True).stdout.strip() or "?"
        finally:
            process.terminate()
            process.wait(60)
    ping_p50, ping_p99 = lat["ping"]
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (figures scale with it)"
          + (f"; daemon pinned to CPU {cpus[-1]}, this process to CPU {cpus[0]}" if args.pin else ""))
    adm_p50, adm_p99 = lat["admission"]
    step_p50, step_p99 = lat["step"]
    print(f"latency, {args.calls} calls each, separate processes over a unix socket:")
    print(f"  bare ping (health Check)          p50 {ping_p50 * 1e6:7.0f} us   p99 {ping_p99 * 1e6:7.0f} us")
    print(f"  admission (Step, 1 submit)        p50 {adm_p50 * 1e6:7.0f} us   p99 {adm_p99 * 1e6:7.0f} us"
          f"   ratio p50 {adm_p50 / ping_p50:.2f}x  (goal <= 1.2x), +{(adm_p50 - ping_p50) * 1e6:.0f} us")
    print(f"  step (1 submit + 1 finish)        p50 {step_p50 * 1e6:7.0f} us   p99 {step_p99 * 1e6:7.0f} us"
          f"   ratio p50 {step_p50 / ping_p50:.2f}x, +{(step_p50 - ping_p50) * 1e6:.0f} us")
    print(f"throughput, {args.engines} engines x {args.batch} submits + {args.batch} finishes per step, "
          f"{args.request_ids} request ids:")
    print(f"  {done} decisions in {elapsed:.2f} s over {steps} steps = {done / elapsed:,.0f} decisions/s "
          f"(goal >= 50,000/s); rows in the log: {rows}")
    print(f"the machine now, against DESIGN.md's reference figures for it: ping p50 "
          f"{ping_p50 * 1e6:.0f} us (reference ~430 us), raw SQLite insert {sqlite_rate / 1000:,.0f}k rows/s "
          f"(reference ~400k)")


if __name__ == "__main__":
    main()
