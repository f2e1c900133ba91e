"""What one decision's durable commit costs SQLite, warm and cold: the floor under the Step's commit.

    python bench/bench_commit_cold.py [--commits 3000]

bench_step_parts says the commit stage of a one-submit Step takes ~40 us in the daemon,
and callgrind (bench_step_footprint) counts only ~17,500 of the Step's ~240,000
instructions in libsqlite3. This times the same kind of commit with nothing around it:
one row inserted in its own transaction into a table with no index but the primary key,
in a file set up as the decision log sets up its own (WAL, synchronous=NORMAL, 1 KiB pages,
no automatic checkpoint), four ways:

  - warm: commits back to back;
  - after sleep: 0.5 ms asleep before each (the daemon waits for the next Step);
  - after thrash: an 8 MiB buffer written over before each (every cache line evicted, as
    a Step's gRPC and Python work evict SQLite's code and data);
  - after both.

The gap between warm and cold is what the commit pays for its code and data coming back
from memory, and the system calls (six fcntl locks and two writes a commit in WAL mode)
for the kernel's: a smaller or fewer-columned row moves it little.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

SCRATCH_BYTES = 8 << 20
SLEEP_S = 0.0005
ROW = (None, "cmpl-0123456789abcdef-0", "e0", "", 1, 2, 1.5, "[1, 2]", "[]", 3)


def commit_p50_us(directory: Path, name: str, commits: int, *, sleep: bool, thrash: bool) -> float:
    conn = sqlite3.connect(directory / f"{name}.db", isolation_level=None)
    try:
        conn.execute("PRAGMA page_size=1024")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, request_id TEXT, engine_id TEXT, tenant TEXT, "
                     "kind INTEGER, blocks INTEGER, at REAL, block_ids TEXT, freed TEXT, seq INTEGER)")
        cursor = conn.cursor()
        scratch = bytearray(SCRATCH_BYTES)
        zeros = bytes(len(scratch[::64]))
        samples = []
        for _ in range(commits):
            if thrash:
                scratch[::64] = zeros  # one write per cache line
            if sleep:
                time.sleep(SLEEP_S)
            t0 = time.perf_counter()
            cursor.execute("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", ROW)
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples) * 1e6
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=3000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"one-row commits (WAL, synchronous=NORMAL), p50 of {args.commits}:")
        for name, sleep, thrash in (("warm", False, False), ("after sleep", True, False),
                                    ("after thrash", False, True), ("after both", True, True)):
            p50 = commit_p50_us(Path(tmp), name.replace(" ", "-"), args.commits, sleep=sleep, thrash=thrash)
            print(f"  {name:<13} {p50:6.1f} us")


if __name__ == "__main__":
    main()
