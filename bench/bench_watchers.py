"""What each Watch stream costs the daemon: building its updates' decisions, and live.

    python bench/bench_watchers.py [--watchers 0 1 8 32] [--live [--rounds 3] [--seconds 3]]

In process: 500 decisions (an admit of 44 blocks each) sent to N watchers, each update's
decisions built on its own (`convert.add_decisions` per watcher: the baseline) and through
the hub (`WatchHub.add_to`: each message built once, copied into the other updates); best
of 5, per decision and watcher.

--live: starts a real daemon (unix socket, durable log, as bench_roundtrip) and, for each count of
watchers in turn (the order rotating each round, so drift hits all alike), opens that many
Watch streams as the dashboard opens them (every 50 ms, up to 500 decisions each) from a
separate process that reads and discards, then runs bench_roundtrip's batched throughput
load. Every watcher is sent the same decisions: what each one costs the daemon beyond the
first is what building its updates costs. Prints, per round and as medians, decisions/s and
the daemon's CPU time per decision (user + system, from /proc: its own cost, which the
load and the watchers' process, competing for the same cores, do not blur as much).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_roundtrip import start_daemon, stop_daemons, throughput

WATCHER_SCRIPT = """
import asyncio, sys
import grpc
from kvbudget.v1 import observer_pb2, observer_pb2_grpc

async def main(target, n):
    channel = grpc.aio.insecure_channel(target)
    stub = observer_pb2_grpc.ObserverServiceStub(channel)
    calls = [stub.Watch(observer_pb2.WatchRequest(interval_ms=50, max_decisions=500)) for _ in range(n)]
    firsts = [asyncio.ensure_future(c.read()) for c in calls]
    await asyncio.gather(*firsts)
    print("ready", flush=True)
    async def drain(call):
        async for _ in call:
            pass
    await asyncio.gather(*(drain(c) for c in calls), return_exceptions=True)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def start_watchers(target: str, count: int) -> subprocess.Popen | None:
    if count == 0:
        return None
    process = subprocess.Popen([sys.executable, "-c", WATCHER_SCRIPT, target, str(count)],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        raise SystemExit("watchers did not start")
    return process


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its threads so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def in_process(counts: list[int]) -> None:
    from kvbudget.daemon.wire import convert
    from kvbudget.daemon.core.records import Decision, DecisionKind, Reason
    from kvbudget.daemon.server.watch import WatchHub
    from kvbudget.v1 import observer_pb2

    def admit(seq: int) -> Decision:
        return Decision(
            seq=seq, time_s=float(seq), kind=DecisionKind.ADMIT, reason=Reason.FITS, request_id=f"req-{seq}",
            engine_id="engine-0", tenant="t", policy="guaranteed", prompt_tokens=700, max_new_tokens=128,
            num_tokens=700, blocks_reserved=(52,), blocks_held=(44,), new_block_ids=(tuple(range(seq, seq + 44)),),
            num_free_blocks=3000, num_running=40)

    seq = 0
    print("in process: 500 decisions to N watchers, us per decision and watcher (best of 5)")
    for count in (n for n in counts if n > 0):
        figures = []
        for shared in (False, True):
            hub = WatchHub(max(counts))
            for _ in range(count):
                hub.add(500)
            best = float("inf")
            for _ in range(5):
                batch = [admit(seq + i) for i in range(500)]
                seq += 500
                started = time.perf_counter()
                for _ in range(count):
                    update = observer_pb2.WatchResponse()
                    if shared:
                        hub.add_to(update.decisions, batch)
                    else:
                        convert.add_decisions(update.decisions, batch)
                best = min(best, time.perf_counter() - started)
            figures.append(best / count / 500 * 1e6)
        print(f"  {count:3d} watchers: each builds its own {figures[0]:5.2f} us, through the hub {figures[1]:5.2f} us "
              f"({figures[0] / figures[1]:.1f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watchers", type=int, nargs="+", default=[0, 1, 8, 32])
    parser.add_argument("--live", action="store_true", help="also against a real daemon under load")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    in_process(args.watchers)
    if not args.live:
        return
    rates: dict[int, list[float]] = {n: [] for n in args.watchers}
    cpu_us: dict[int, list[float]] = {n: [] for n in args.watchers}
    with tempfile.TemporaryDirectory() as tmp:
        daemon = start_daemon(Path(tmp), max(4096, 4 * args.engines * args.batch + 1))
        try:
            for round_index in range(args.rounds):
                shift = round_index % len(args.watchers)
                for count in args.watchers[shift:] + args.watchers[:shift]:
                    watchers = start_watchers(daemon[1], count)
                    try:
                        cpu_before = cpu_seconds(daemon[0].pid)
                        done, elapsed, _ = asyncio.run(throughput(daemon[1], args.engines, args.batch, args.seconds))
                        cpu = cpu_seconds(daemon[0].pid) - cpu_before
                    finally:
                        if watchers is not None:
                            watchers.terminate()
                            watchers.wait(30)
                    rates[count].append(done / elapsed)
                    cpu_us[count].append(cpu / done * 1e6)
                    print(f"round {round_index + 1}: {count:3d} watchers  {done / elapsed:9,.0f} decisions/s  "
                          f"daemon CPU {cpu / done * 1e6:5.1f} us/decision", flush=True)
                    time.sleep(0.5)  # the streams' ends reach the daemon
        finally:
            stop_daemons([daemon])
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
          f"{args.engines} engines x {args.batch} submits + finishes per step")
    for count in args.watchers:
        print(f"  {count:3d} watchers: median {statistics.median(rates[count]):9,.0f} decisions/s, "
              f"daemon CPU {statistics.median(cpu_us[count]):5.1f} us/decision")


if __name__ == "__main__":
    main()
