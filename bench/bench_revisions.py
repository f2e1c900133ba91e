"""Two revisions side by side: admission / ping ratio and batched throughput, interleaved.

    python bench/bench_revisions.py OTHER_CHECKOUT [--rounds 6] [--calls 1000] [--seconds 3]

This machine's speed drifts by 15-30% from minute to minute, more than most changes are
worth, so a figure from one run against one from another run says little. This starts a
daemon of this checkout and one of OTHER_CHECKOUT (with its own `.venv`, e.g.
`git worktree add ../kvbudget-base <rev> && ../kvbudget-base/dev setup`) and runs
bench_roundtrip's latency rounds and throughput runs on each in turn, alternating which
goes first, so drift hits both alike; it prints every round and the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench_roundtrip import latency, start_daemon, stop_daemons, throughput

HERE = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", help="another checkout of kvbudget, set up with its own .venv")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=1000, help="latency calls of each kind per round")
    parser.add_argument("--seconds", type=float, default=3.0, help="throughput run per round")
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    other = Path(args.other).resolve()
    python_of = {"this": (sys.executable, str(HERE)), "other": (str(other / ".venv" / "bin" / "python"), str(other))}
    if not Path(python_of["other"][0]).exists():
        raise SystemExit(f"{other}: no .venv/bin/python (run its ./dev setup first)")
    num_blocks = max(4096, 4 * args.engines * args.batch + 1)
    ratios: dict[str, list[float]] = {name: [] for name in python_of}
    rates: dict[str, list[float]] = {name: [] for name in python_of}
    with tempfile.TemporaryDirectory() as tmp:
        daemons = {
            name: start_daemon(Path(tmp), num_blocks, python=python, cwd=cwd, name=name)
            for name, (python, cwd) in python_of.items()
        }
        try:
            for r in range(args.rounds):
                for name in ("this", "other") if r % 2 == 0 else ("other", "this"):
                    target = daemons[name][1]
                    lat = asyncio.run(latency(target, args.calls))
                    done, elapsed, _ = asyncio.run(throughput(target, args.engines, args.batch, args.seconds))
                    ratios[name].append(lat["admission"][0] / lat["ping"][0])
                    rates[name].append(done / elapsed)
                    print(f"round {r + 1} {name:5s}: ping p50 {lat['ping'][0] * 1e6:5.0f} us, admission / ping "
                          f"{ratios[name][-1]:.2f}x, {rates[name][-1]:,.0f} decisions/s", flush=True)
        finally:
            stop_daemons(daemons.values())
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    for name in python_of:
        print(f"{name:5s} ({python_of[name][1]}): admission / ping median {statistics.median(ratios[name]):.3f}x "
              f"(goal <= 1.2x), throughput median {statistics.median(rates[name]):,.0f} decisions/s "
              f"(goal >= 50,000/s), min {min(rates[name]):,.0f}")


if __name__ == "__main__":
    main()
