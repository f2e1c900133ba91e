"""What a microsecond in the Step handler costs the round trip, measured with known work.

    python bench/bench_handler_cost.py [--spins 25,50,100,150] [--rounds 2] [--calls 1500]

bench_roundtrip's admission figure is the ping plus whatever the handler adds. This calibrates
that addition: it starts one daemon answering one-submit Steps with a canned reply
(bench/step_variant.py `canned`) and one per `--spins` value that first spins that many
microseconds in a loop touching no memory (`spin:N`), measures the ping and the Step on
each in turn (the order rotating each round, so drift hits all alike), and prints the
Step's p50 over the ping's p50 in microseconds, median over rounds. The slope is what one
microsecond of handler costs the caller; the canned figure is the Step RPC's own cost
over the health Check.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench_roundtrip import start_daemon, stop_daemons
from bench_step_parts import one_round

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spins", default="25,50,100,150", help="microseconds of spin, comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--calls", type=int, default=1500, help="calls of each kind per daemon per round")
    args = parser.parse_args()
    spins = [0, *(int(value) for value in args.spins.split(",") if value)]
    extra_us: dict[int, list[float]] = {spin: [] for spin in spins}
    pings_us: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        daemons = {
            spin: start_daemon(Path(tmp), 4096, name=f"spin{spin}",
                               launcher=(str(HERE / "step_variant.py"), f"spin:{spin}", os.devnull))
            for spin in spins
        }
        serial = 0
        try:
            for r in range(args.rounds):
                for spin in spins[r % len(spins):] + spins[: r % len(spins)]:
                    serial += 1
                    ping, step = asyncio.run(one_round(daemons[spin][1], args.calls, serial, finish=False))
                    extra_us[spin].append((step - ping) * 1e6)
                    pings_us.append(ping * 1e6)
                print(f"round {r + 1}: " + "  ".join(f"{spin} us {extra_us[spin][-1]:+.0f}" for spin in spins),
                      flush=True)
        finally:
            stop_daemons(daemons.values())
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; ping p50 "
          f"{min(pings_us):.0f}-{max(pings_us):.0f} us; {args.rounds} rounds x {args.calls} calls of each kind")
    print("one-submit Step p50 over the ping's p50, median over rounds:")
    for spin in spins:
        print(f"  handler spins {spin:4d} us   {statistics.median(extra_us[spin]):+5.0f} us")


if __name__ == "__main__":
    sys.exit(main())
