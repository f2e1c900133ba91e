"""The decision log in the long run: retention and queries on a big log, and a row limit under load.

    python bench/bench_retention.py [--rows 1000000] [--seconds 60] [--rate 15000] [--max-rows 300000]
                                    [--request-ids uuid|sequential]

1. A big log (`--rows` rows, folded): what one retention pass costs with nothing due (the
   daemon runs one a minute, holding the connection its commits need), what finding the
   newest id costs (every start-up), and `kvbudget log --since 10m` on a log quiet for
   ten minutes. None of these may grow with the log.
2. Steady appends of 512-decision steps at `--rate` rows/s for `--seconds`, into a log that
   keeps `--max-rows` rows (a pass a minute, as in the daemon, and one after every fold
   that leaves the log past the limit): every 5 s, rows/s, commit latency p50 / p99 / max (the wait an engine's Step
   would see), and the rows the log holds. With the purge keeping up, the rows held stay
   near the limit and the p99 stays where it is without retention.

Request ids are `cmpl-<uuid4 hex>-0` (as vLLM makes them) unless `--request-ids
sequential`: random ids cost the request_id index a page per row in the fold and purge.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_decision_log import sample_decisions  # noqa: E402

from kvbudget.daemon.log import upkeep  # noqa: E402
from kvbudget.daemon.log.decision_log import DecisionLog  # noqa: E402
from kvbudget.daemon.log.query import query_decisions  # noqa: E402


def steps(request_ids: str):
    """Endless 512-decision steps, each with new request ids."""
    base = sample_decisions(512)
    n = 0
    while True:
        if request_ids == "uuid":
            yield [dataclasses.replace(d, request_id=f"cmpl-{uuid.uuid4().hex}-0") for d in base]
        else:
            yield [dataclasses.replace(d, request_id=f"r-{n + i:010d}") for i, d in enumerate(base)]
        n += len(base)


def big_log(path: Path, rows: int, request_ids: str) -> None:
    started = time.perf_counter()
    with DecisionLog(path, checkpoint_interval_s=None) as log:
        written = 0
        for step in steps(request_ids):
            if written >= rows:
                break
            log.append(step)
            written += len(step)
        log.flush()
    # Logged 20 minutes ago: nothing in the last ten, nothing older than a day.
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE decisions_indexed SET logged_at = logged_at - 1200")
    print(f"  built a log of {written:,} rows in {time.perf_counter() - started:.0f} s")


def timed_ms(call) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1e3


def bench_big_log(directory: Path, rows: int, request_ids: str) -> None:
    path = directory / "big.db"
    big_log(path, rows, request_ids)
    conn = sqlite3.connect(path, isolation_level=None)
    now = time.time()
    for label, limits in (("30-day age limit", {"retention_s": 30 * 86400.0, "max_rows": None}),
                          ("row limit above the log", {"retention_s": None, "max_rows": 10 * rows})):
        ms = min(timed_ms(lambda: upkeep.purge_oldest(conn, chunk_rows=1024, now=now, **limits)) for _ in range(3))
        print(f"  {'retention pass, ' + label + ', nothing due':52s} {ms:9.3f} ms")
    # (Revisions before upkeep.newest_id asked the view: run this file with another
    # checkout's python to compare.)
    newest = getattr(upkeep, "newest_id", lambda c: c.execute("SELECT max(id) FROM decisions").fetchone())
    ms = min(timed_ms(lambda: newest(conn)) for _ in range(3))
    print(f"  {'newest id (every start-up)':52s} {ms:9.3f} ms")
    conn.close()
    ms = min(timed_ms(lambda: query_decisions(path, since_s=now - 600)) for _ in range(3))
    print(f"  {'query --since 10m, nothing in the window':52s} {ms:9.3f} ms")


def bench_row_limit(directory: Path, seconds: float, rate: float, max_rows: int, request_ids: str) -> None:
    log = DecisionLog(directory / "limit.db", max_rows=max_rows)
    log.start()
    written = 0
    started = window_start = time.perf_counter()
    window_rows = 0
    waits: list[float] = []
    try:
        for step in steps(request_ids):
            now = time.perf_counter()
            if now - started >= seconds:
                break
            t0 = time.perf_counter()
            if not log.commit_inline(step):
                log.append(step).result()
            waits.append(time.perf_counter() - t0)
            written += len(step)
            window_rows += len(step)
            ahead = written / rate - (time.perf_counter() - started)
            if ahead > 0:
                time.sleep(ahead)
            if time.perf_counter() - window_start >= 5.0:
                waits.sort()
                print(f"  {written:9,} rows  {window_rows / (time.perf_counter() - window_start):7,.0f} rows/s  "
                      f"commit p50 {waits[len(waits) // 2] * 1e3:6.2f} ms  p99 {waits[int(len(waits) * 0.99)] * 1e3:6.1f} ms"
                      f"  max {waits[-1] * 1e3:6.1f} ms  rows held {written - log.rows_deleted:9,}", flush=True)
                window_start, window_rows, waits = time.perf_counter(), 0, []
    finally:
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=15_000.0, help="rows/s appended in part 2")
    parser.add_argument("--max-rows", type=int, default=300_000)
    parser.add_argument("--request-ids", choices=("uuid", "sequential"), default="uuid")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, sqlite {sqlite3.sqlite_version}, "
          f"{args.request_ids} request ids")
    with tempfile.TemporaryDirectory() as tmp:
        print("1. a big log:")
        bench_big_log(Path(tmp), args.rows, args.request_ids)
        print(f"2. {args.rate:,.0f} rows/s for {args.seconds:.0f} s into a log keeping {args.max_rows:,} rows:")
        bench_row_limit(Path(tmp), args.seconds, args.rate, args.max_rows, args.request_ids)


if __name__ == "__main__":
    main()
