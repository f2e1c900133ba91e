"""The daemon under churn for many minutes: does its memory, or anything else it holds, grow?

    python bench/bench_soak.py [--seconds 600] [--chunk 60] [--workers 3] [--steps 5]
                               [--batch 64] [--vanish-every 3] [--lease-ttl-s 2] [--max-rows 200000]
                               [--tenants none|per-session]

A daemon runs for weeks while engines come and go. bench_sustained drives a few engines
that stay; this one keeps the churn a host sees over weeks within minutes, on a real
daemon (unix socket, durable log with retention by `--max-rows` rows, /metrics on):

  - `--workers` loops, each opening a session under a fresh engine id, making `--steps`
    steps of `--batch` submits (uuid request ids, prompts of 1-600 tokens, and with
    `--tenants per-session`, the default, a tenant name of the session's own, as a host
    whose engines pass a user or API key as the tenant would see) and the previous
    step's finishes, then closing it; every `--vanish-every`th session is not closed but
    dropped with its channel, so its lease expires and the daemon takes its blocks back;
  - one observer that opens a Watch, reads five updates, cancels it, reads a snapshot and
    the last 50 decisions, and starts again on a new channel.

Every `--chunk` seconds it prints the daemon's resident memory (VmRSS), its open file
descriptors and threads (from /proc), sessions opened and dropped so far, the decisions/s
of the chunk (all the log took: admits of queued requests, pushed on the Events stream,
and lease expiries too, not only those in Step replies: about 3x these), and the rows in
the log (retention holds it near `--max-rows`).
At the end: the growth of each over the second half of the run
(the first half warms caches: SQLite's page cache, the allocator's arenas, the memos), as
a least-squares slope per hour, and per thousand sessions.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_roundtrip import start_daemon  # noqa: E402
from bench_sustained import backlog  # noqa: E402

from kvbudget.client import EngineClient, ObserverClient  # noqa: E402
from kvbudget.daemon.log.query import newest_id  # noqa: E402
from kvbudget.v1 import engine_pb2  # noqa: E402


@dataclass
class Counts:
    sessions: int = 0
    dropped: int = 0
    watches: int = 0
    decisions: int = 0


@dataclass
class Sample:
    t_s: float
    rss_mb: float
    fds: int
    threads: int
    sessions: int
    log_rows: int
    logged: int  # decisions logged since the start: the newest id (ids run from 1 without a gap)


@dataclass
class Soak:
    target: str
    pid: int
    db_path: Path
    args: argparse.Namespace
    counts: Counts = field(default_factory=Counts)

    def sample(self, t_s: float) -> Sample:
        rss_kb = threads = 0
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    rss_kb = int(line.split()[1])
                elif line.startswith("Threads:"):
                    threads = int(line.split()[1])
        fds = len(os.listdir(f"/proc/{self.pid}/fd"))
        return Sample(t_s, rss_kb / 1024, fds, threads, self.counts.sessions, sum(backlog(self.db_path)),
                      newest_id(self.db_path))

    async def engine_worker(self, worker: int, until: float) -> None:
        args, counts = self.args, self.counts
        serial = 0
        while time.monotonic() < until:
            serial += 1
            engine = EngineClient(self.target, f"soak-{worker}-{serial}-{uuid.uuid4().hex[:8]}",
                                  heartbeat=False, lease_ttl_s=args.lease_ttl_s)
            await engine.open()
            previous: list[str] = []
            tenant = f"user-{uuid.uuid4().hex[:12]}" if args.tenants == "per-session" else ""
            for _ in range(args.steps):
                ids = [f"cmpl-{uuid.uuid4().hex}-0" for _ in range(args.batch)]
                submits = [engine_pb2.Submit(request_id=r, prompt_tokens=random.randint(1, 600), max_new_tokens=64,
                                             tenant=tenant)
                           for r in ids]
                counts.decisions += len(await engine.step(submits=submits, finishes=previous))
                previous = ids
            counts.sessions += 1
            if serial % args.vanish_every == 0:
                await engine._channel.close()  # noqa: SLF001  (a vanished engine: no CloseSession, the lease expires)
                counts.dropped += 1
            else:
                counts.decisions += len(await engine.step(finishes=previous))
                await engine.close()

    async def observer(self, until: float) -> None:
        while time.monotonic() < until:
            async with ObserverClient(self.target) as observer:
                updates = 0
                async for _ in observer.watch(interval_ms=50):
                    updates += 1
                    if updates == 5:
                        break
                await observer.snapshot()
                await observer.query_decisions(limit=50)
            self.counts.watches += 1

    async def run(self) -> list[Sample]:
        args = self.args
        started = time.monotonic()
        until = started + args.seconds
        tasks = [asyncio.create_task(self.engine_worker(w, until)) for w in range(args.workers)]
        tasks.append(asyncio.create_task(self.observer(until)))
        samples = [self.sample(0.0)]
        print(f"{'t (s)':>6} {'RSS MB':>8} {'fds':>5} {'threads':>7} {'sessions':>9} {'dropped':>8} {'decisions/s':>12} {'log rows':>10}")
        self._print(samples[-1], 0.0)
        while (now := time.monotonic()) < until:
            await asyncio.sleep(min(args.chunk, until - now))
            elapsed = time.monotonic() - started
            samples.append(self.sample(elapsed))
            self._print(samples[-1], (samples[-1].logged - samples[-2].logged) / (elapsed - samples[-2].t_s))
        await asyncio.gather(*tasks)
        await asyncio.sleep(args.lease_ttl_s * 2)  # the last dropped sessions expire
        samples.append(self.sample(time.monotonic() - started))
        async with ObserverClient(self.target) as observer:
            pool = await observer.snapshot()
        # Every session was closed or has expired: the pool must be whole again.
        print(f"after the last leases expired: RSS {samples[-1].rss_mb:.1f} MB, {samples[-1].fds} fds, "
              f"{samples[-1].threads} threads; pool {pool.num_free_blocks:,} of {pool.num_blocks:,} blocks free, "
              f"{pool.num_running} running, {pool.num_waiting} waiting, {len(pool.engines)} engines, "
              f"{pool.num_preemptions:,} preemptions; {samples[-1].logged:,} decisions logged, "
              f"{self.counts.decisions:,} of them in Step replies")
        return samples

    def _print(self, s: Sample, rate: float) -> None:
        print(f"{s.t_s:6.0f} {s.rss_mb:8.1f} {s.fds:5d} {s.threads:7d} {s.sessions:9,} {self.counts.dropped:8,}"
              f" {rate:12,.0f} {s.log_rows:10,}", flush=True)


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs (0 with fewer than two distinct xs)."""
    if len(set(xs)) < 2:
        return 0.0
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)


def report(samples: list[Sample], max_rows: int) -> None:
    during = samples[:-1]  # (the last one is after the load stopped)
    half = [s for s in during if s.t_s >= during[-1].t_s / 2]
    hours = [s.t_s / 3600 for s in half]
    sessions = [s.sessions / 1000 for s in half]
    print(f"second half of the run ({half[0].t_s:.0f}-{half[-1].t_s:.0f} s, "
          f"{half[-1].sessions - half[0].sessions:,} sessions), least-squares growth:")
    for name, values in (("RSS (MB)", [s.rss_mb for s in half]), ("fds", [float(s.fds) for s in half]),
                         ("threads", [float(s.threads) for s in half])):
        print(f"  {name:9s} {slope(hours, values):+9.2f} per hour   {slope(sessions, values):+8.3f} per 1,000 sessions"
              f"   (from {values[0]:.1f} to {values[-1]:.1f})")
    print(f"rows in the log, sampled: at most {max(s.log_rows for s in samples):,} "
          f"({max(s.log_rows for s in samples) / max_rows:.2f}x the retention bound of {max_rows:,})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--chunk", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--vanish-every", type=int, default=3)
    parser.add_argument("--lease-ttl-s", type=int, default=2)
    parser.add_argument("--max-rows", type=int, default=200_000, help="the log's retention by rows")
    parser.add_argument("--tenants", choices=("none", "per-session"), default="per-session",
                        help="per-session: each session's requests carry a tenant name of their own")
    args = parser.parse_args()
    if min(args.seconds, args.chunk, args.workers, args.steps, args.batch, args.vanish_every, args.lease_ttl_s,
           args.max_rows) <= 0:
        parser.error("every option must be positive")
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; {args.workers} engine loops "
          f"x {args.steps} steps of {args.batch} submits per session, one session in {args.vanish_every} dropped "
          f"(lease {args.lease_ttl_s} s), one observer; retention {args.max_rows:,} rows; tenants {args.tenants}")
    with tempfile.TemporaryDirectory() as tmp:
        num_blocks = max(8192, 2 * args.workers * args.batch * 40)
        # Retention by rows keeps the file (and what the log's upkeep walks) bounded, as a
        # long-running daemon's would be; warnings (each expired lease) go to /dev/null.
        process, target = start_daemon(
            Path(tmp), num_blocks, metrics=True, quiet=True,
            extra_flags=["--lease-ttl-s", str(args.lease_ttl_s), "--retention-max-rows", str(args.max_rows)],
        )
        try:
            samples = asyncio.run(Soak(target, process.pid, Path(tmp) / "kvbudget.db", args).run())
        finally:
            process.terminate()
            process.wait(60)
    report(samples, args.max_rows)


if __name__ == "__main__":
    main()
