"""The decision log's indexes for the queries sqlite-utils and Datasette users write.

    python bench/bench_log_indexes.py [--rows 1000000] [--repeat 5]

Builds a log of `--rows` folded rows as a kvbudget from before the seq index left it (the
index dropped), times each query on the `decisions` view (best of `--repeat`, ms) and its
plan, opens the log as the daemon does (which adds the missing index: that build is timed
too), and times the queries again. Seq and logged_at rise with id here, as in a daemon's log.
"""

from __future__ import annotations

import argparse
import dataclasses
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_decision_log import sample_decisions  # noqa: E402

from kvbudget.daemon.log.decision_log import DecisionLog  # noqa: E402
from kvbudget.daemon.log.schema import COLUMNS, INDEXED, decision_row  # noqa: E402

START = 1.7e9  # logged_at of row 0; a row a millisecond


def queries(rows: int) -> dict[str, tuple[str, tuple]]:
    middle = rows // 2
    return {
        "newest by seq": ("SELECT * FROM decisions ORDER BY seq DESC LIMIT 100", ()),
        "page back by seq": ("SELECT * FROM decisions WHERE seq < ? ORDER BY seq DESC LIMIT 100", (middle,)),
        "seq range": ("SELECT * FROM decisions WHERE seq BETWEEN ? AND ?", (middle, middle + 99)),
        "time range": (
            "SELECT * FROM decisions WHERE logged_at >= ? AND logged_at < ? ORDER BY logged_at",
            (START + middle / 1000, START + (middle + 100) / 1000),
        ),
        "newest by time": ("SELECT * FROM decisions ORDER BY logged_at DESC LIMIT 100", ()),
    }


def build(path: Path, rows: int) -> None:
    """A log as the daemon makes it, then rows inserted straight into the indexed table (as
    folds leave them), then the seq index dropped: a log from before it existed."""
    with DecisionLog(path, checkpoint_interval_s=None):
        pass
    base = sample_decisions(512)
    insert = f"INSERT INTO {INDEXED} VALUES ({', '.join('?' * (1 + len(COLUMNS)))})"
    conn = sqlite3.connect(path)
    with conn:
        for first in range(1, rows + 1, len(base)):
            batch = [
                decision_row(first + i, dataclasses.replace(d, seq=first + i), START + (first + i) / 1000)
                for i, d in enumerate(base[: rows + 1 - first])
            ]
            conn.executemany(insert, batch)
        conn.execute("DROP INDEX IF EXISTS idx_decisions_seq")
    conn.close()


def measure(path: Path, rows: int, repeat: int) -> dict[str, float]:
    conn = sqlite3.connect(path)
    results = {}
    for name, (sql, params) in queries(rows).items():
        best = float("inf")
        for _ in range(repeat):
            started = time.perf_counter()
            conn.execute(sql, params).fetchall()
            best = min(best, time.perf_counter() - started)
        plan = "; ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))
        print(f"  {name:18} {best * 1000:9.1f} ms   {plan}")
        results[name] = best
    conn.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "decisions.db"
        started = time.perf_counter()
        build(path, args.rows)
        print(f"built {args.rows:,} rows in {time.perf_counter() - started:.1f} s")
        print("before (a log without the seq index):")
        before = measure(path, args.rows, args.repeat)
        started = time.perf_counter()
        with DecisionLog(path, checkpoint_interval_s=None):
            pass
        print(f"opened as the daemon does (adds the index) in {time.perf_counter() - started:.2f} s")
        print("after:")
        after = measure(path, args.rows, args.repeat)
        print("speed-up: " + ", ".join(f"{n} x{before[n] / after[n]:,.0f}" for n in before))


if __name__ == "__main__":
    main()
