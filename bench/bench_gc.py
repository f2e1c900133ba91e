"""What CPython's cyclic garbage collector costs the daemon under batched load, settled or not.

    python bench/bench_gc.py [--rounds 4] [--seconds 10]

`kvbudget daemon` settles its heap once it is up (daemon/server/interpreter.py: a full
collection, `gc.freeze()`, a gen-0 threshold of 5,000). This starts, in turn, a daemon as
shipped ("settled") and one that keeps CPython's defaults ("defaults": settle_heap
skipped from outside, as bench/step_variant.py does), drives each with bench_roundtrip's
batched throughput load for `--seconds`, and reads back from the daemon (gc.callbacks,
counted from the end of start-up, written when it exits) the time spent in collector
passes, the passes per generation and the longest one; with the decisions/s each round. The order alternates
from round to round, so drift hits both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = ("settled", "defaults")
HERE = Path(__file__).resolve()


def _as_daemon(variant: str, report_path: str, daemon_argv: list[str]) -> int:
    """The daemon, timing every collector pass; `defaults` never settles its heap."""
    passes = [0, 0, 0]
    seconds = [0.0, 0.0, 0.0]
    longest = [0.0]
    started: list[float] = [0.0]
    clock = time.perf_counter

    def timer(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = clock()
            return
        took = clock() - started[0]
        passes[info["generation"]] += 1
        seconds[info["generation"]] += took
        longest[0] = max(longest[0], took)

    gc.callbacks.append(timer)
    from kvbudget.cli import cmd_daemon

    settle = cmd_daemon._settle_heap

    def on_ready() -> None:  # start-up is done: count from here (settling's own pass excluded)
        if variant == "settled":
            settle()
        passes[:] = [0, 0, 0]
        seconds[:] = [0.0, 0.0, 0.0]
        longest[0] = 0.0

    cmd_daemon._settle_heap = on_ready  # type: ignore[assignment]

    def write() -> None:
        with open(report_path, "w") as f:
            json.dump({"passes": passes, "seconds": seconds, "longest_s": longest[0],
                       "thresholds": gc.get_threshold(), "frozen": gc.get_freeze_count()}, f)

    atexit.register(write)
    from kvbudget.cli.main import main

    return main(daemon_argv)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    if args.rounds <= 0 or args.seconds <= 0:
        parser.error("--rounds and --seconds must be positive")
    sys.path.insert(0, str(HERE.parent))
    from bench_roundtrip import start_daemon, throughput

    results: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for round_index in range(args.rounds):
        for variant in VARIANTS if round_index % 2 == 0 else VARIANTS[::-1]:
            with tempfile.TemporaryDirectory() as tmp:
                report = Path(tmp) / "gc.json"
                process, target = start_daemon(
                    Path(tmp), 4096, launcher=(str(HERE), "--as-daemon", variant, str(report)))
                try:
                    done, elapsed, _ = asyncio.run(throughput(target, 4, 256, args.seconds))
                finally:
                    process.terminate()
                    process.wait(60)
                figures = json.loads(report.read_text())
            figures["rate"] = done / elapsed
            figures["gc_share"] = sum(figures["seconds"]) / elapsed
            results[variant].append(figures)
            print(f"round {round_index + 1} {variant:8}: {figures['rate']:8,.0f} decisions/s, "
                  f"gc {sum(figures['seconds']):.3f} s of {elapsed:.1f} s, passes {figures['passes']} "
                  f"(gen 0, 1, 2), longest {figures['longest_s'] * 1e3:.1f} ms, "
                  f"thresholds {tuple(figures['thresholds'])}", flush=True)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
          f"4 engines x 256 submits + 256 finishes per step, {args.seconds:g} s a round")
    for variant in VARIANTS:
        rows = results[variant]
        print(f"{variant:8}: median {statistics.median(r['rate'] for r in rows):,.0f} decisions/s, "
              f"gc {statistics.median(r['gc_share'] for r in rows):.1%} of the time, "
              f"longest pass {max(r['longest_s'] for r in rows) * 1e3:.1f} ms")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--as-daemon":
        raise SystemExit(_as_daemon(sys.argv[2], sys.argv[3], sys.argv[4:]))
    main()
