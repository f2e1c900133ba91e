"""The RPC fuzz of tests/test_trust_fuzz.py at full length (issue 30, point 8).

    python bench/fuzz_rpcs.py [--calls 10000] [--seed 30] [--check-every 1000] [--engines 4]

Starts a real daemon (a temp folder, unix socket, the test harness's small pool), makes
`--calls` seeded calls (tests/rpc_fuzz.py: valid steps, steps with one known fault, resends,
sessions opened, replaced and closed, heartbeats, snapshots, estimates), checks every
outcome's code and field as it comes and the pool against the log every `--check-every`
calls, then stops the daemon and checks it exited 0 with no traceback or ERROR. Prints
the outcomes per RPC and code; exits 1 on the first failure, naming it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemon_harness import DaemonProcess  # noqa: E402
from tests.rpc_fuzz import FuzzFailure, RpcFuzz  # noqa: E402


async def fuzz(workdir: Path, calls: int, seed: int, check_every: int, engines: int) -> int:
    with DaemonProcess(workdir, "--max-ops-per-step", "64", lease_ttl_s=3600) as daemon:
        runner = RpcFuzz(daemon.target, seed, num_engines=engines, max_ops_per_step=64)
        started = time.perf_counter()
        try:
            done = 0
            while done < calls:
                batch = min(check_every, calls - done)
                await runner.run(batch)
                done += batch
                await runner.check_pool_and_log(daemon.decision_rows())
        except FuzzFailure as failure:
            print(f"FAILED: {failure}")
            return 1
        finally:
            await runner.close()
        elapsed = time.perf_counter() - started
        alive = daemon.process.poll() is None
        rows = len(daemon.decision_rows())
    stderr = daemon.stderr()
    print(f"{runner.calls:,} calls ({runner.skipped} drawn resends before any step sent nothing), seed {seed}, "
          f"{elapsed:.1f} s; {rows:,} decisions in the log; pool and log agreed at every check")
    for outcome, count in sorted(runner.outcomes.items()):
        print(f"  {outcome:32} {count:7,}")
    troubled = "Traceback" in stderr or "ERROR" in stderr
    print(f"daemon alive to the end: {alive}; exit status {daemon.process.returncode}; "
          f"traceback or ERROR in its journal: {troubled}")
    return 0 if alive and daemon.process.returncode == 0 and not troubled else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--check-every", type=int, default=1_000)
    parser.add_argument("--engines", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        sys.exit(asyncio.run(fuzz(Path(workdir), args.calls, args.seed, args.check_every, args.engines)))


if __name__ == "__main__":
    main()
