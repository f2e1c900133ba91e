"""Where an admission round trip's time goes beyond a bare ping: one part taken out at a time.

    python bench/bench_step_parts.py [--rounds 8] [--calls 600]

bench_roundtrip gives one figure, admission p50 / ping p50 (issue #4's goal: <= 1.2x).
This splits what lies above 1.0x. It starts one daemon per variant of bench/step_variant.py
(unix socket, durable decision log, as bench_roundtrip) and, in each round, measures on each
daemon in turn (the order rotating, so drift hits all alike) `--calls` health Checks and
`--calls` one-submit Steps, interleaved in blocks of 100:

  - full: the daemon as shipped;
  - no-commit: the same without the SQLite insert of the Step's decision, so
    full - no-commit is what the durable commit adds;
  - journal: the same with the Step's decision appended to a file with one os.write
    instead of inserted into SQLite, so journal - no-commit is the least a journal in front
    of SQLite (the contract change the issue's notes offered) would still cost, and
    full - journal what it would save;
  - canned: one-submit Steps answered with a reply built once, so canned - 1.0 is what
    the Step RPC costs over the health Check with no work behind it (message sizes,
    metadata, deadline), and full - canned is the handler's work;
  - spin: canned after 100 us of a loop that touches no memory, so spin - canned is what
    100 us in the handler would cost the round trip if its code and data were in cache
    (more than 100 us: the client sleeps longer meanwhile, and wakes slower);
  - staged: the daemon as shipped with a clock around each stage of the handler; it prints
    their p50s, in process (they add up to the handler's time, not the round trip's).

Every figure is a median over rounds of per-round p50 ratios; min-max shows the spread.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench_roundtrip import start_daemon, stop_daemons
from kvbudget.client import EngineClient, step_message
from kvbudget.v1 import engine_pb2

HERE = Path(__file__).resolve().parent
VARIANTS = ("full", "no-commit", "journal", "canned", "spin", "staged")
BLOCK = 100  # calls of one kind in a row


async def one_round(target: str, calls: int, serial: int, finish: bool) -> tuple[float, float]:
    """(ping p50, admission p50) in seconds of `calls` of each, in blocks (the first block of
    each is warm-up)."""
    channel = grpc.aio.insecure_channel(target)
    health = health_pb2_grpc.HealthStub(channel)
    ping_request = health_pb2.HealthCheckRequest()
    engine = EngineClient(target, f"parts-{serial}", heartbeat=False)
    await engine.open()
    ping: list[float] = []
    admission: list[float] = []
    for block in range(calls // BLOCK + 1):
        warm = block == 0
        for _ in range(BLOCK):
            t0 = time.perf_counter()
            await health.Check(ping_request)
            if not warm:
                ping.append(time.perf_counter() - t0)
        admitted = []
        for i in range(BLOCK):
            request_id = f"p{serial}-{block}-{i}"
            message = step_message("", submits=[engine_pb2.Submit(request_id=request_id, prompt_tokens=16,
                                                                  max_new_tokens=16)])
            t0 = time.perf_counter()
            response = await engine.step_raw(message)
            if not warm:
                admission.append(time.perf_counter() - t0)
            assert len(response.decisions) == 1
            admitted.append(request_id)
        if finish:  # (canned Steps admit nothing)
            await engine.step(finishes=admitted)
    await engine.close()
    await channel.close()
    return statistics.median(ping), statistics.median(admission)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=600, help="calls of each kind per daemon per round")
    args = parser.parse_args()
    ratios: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        stages_path = Path(tmp) / "stages.json"
        daemons = {
            name: start_daemon(Path(tmp), 4096, name=name,
                               launcher=(str(HERE / "step_variant.py"), name, str(stages_path)))
            for name in VARIANTS
        }
        serial = 0
        try:
            for r in range(args.rounds):
                order = VARIANTS[r % len(VARIANTS):] + VARIANTS[: r % len(VARIANTS)]
                for name in order:
                    serial += 1
                    ping, admission = asyncio.run(one_round(daemons[name][1], args.calls, serial,
                                                            finish=name not in ("canned", "spin")))
                    ratios[name].append(admission / ping)
                print(f"round {r + 1}: " + "  ".join(f"{name} {ratios[name][-1]:.3f}x" for name in VARIANTS),
                      flush=True)
        finally:
            stop_daemons(daemons.values())
        stages = json.loads(stages_path.read_text()) if stages_path.exists() else None

    def median(name: str) -> float:
        return statistics.median(ratios[name])

    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
          f"{args.rounds} rounds x {args.calls} calls of each kind per daemon")
    print("admission p50 / ping p50, median over rounds (min - max):")
    for name in VARIANTS:
        print(f"  {name:10s} {median(name):.3f}x  ({min(ratios[name]):.3f} - {max(ratios[name]):.3f})")
    print("what lies above 1.0x, from the medians:")
    print(f"  the Step RPC itself (canned - 1.0)            {median('canned') - 1.0:+.3f}x")
    print(f"  the durable commit (full - no-commit)         {median('full') - median('no-commit'):+.3f}x")
    print(f"  a journal write instead (journal - no-commit) {median('journal') - median('no-commit'):+.3f}x")
    print(f"  the handler's work (full - canned)            {median('full') - median('canned'):+.3f}x  (commit included)")
    print(f"  100 us of work that finds the cache warm      {median('spin') - median('canned'):+.3f}x  (spin - canned)")
    if stages is not None:
        p50 = stages["p50_us"]
        print(f"handler stages in process (staged daemon, {stages['steps']} one-submit Steps), p50:")
        print("  " + "  ".join(f"{name} {p50[name]:.1f} us" for name in (*("validate", "apply", "commit", "reply",
                                                                           "other"), "handler")))


if __name__ == "__main__":
    sys.exit(main())
