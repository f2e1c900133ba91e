"""Decision-log write speed and group-commit latency.

    python bench/bench_decision_log.py [--rows 200000] [--batch 1000] [--seconds 3]

1. Raw write paths into the log's two tables (WAL, synchronous=NORMAL, 1 KiB pages), rows/s:
   sqlite-utils `insert_all` (dicts), raw `executemany` in batches, one commit per row;
   each into `decisions_indexed` (its indexes) and into `decisions_recent` (no index,
   where the daemon's commits land; DESIGN.md's reference figures were measured without
   secondary indexes), plus one commit per row with synchronous=FULL.
2. `DecisionLog` end to end (Decision -> row conversion + group commit), rows/s, when one
   producer appends engine steps of `--step` decisions and waits only at the end.
3. Group-commit latency, append -> future done, p50 / p99: closed loop, N producers each
   appending one step and waiting for its commit before the next (an engine's Step call
   that must not reply before its decisions are durable).
4. One caller, closed loop: `append` (writer-thread hand-off) vs `commit_inline` (the
   daemon's path: commit in the caller's thread when nothing is queued ahead), p50 / p99
   per step of 1, 2 and `--step` decisions.
5. Folding recent rows into the indexed table (`upkeep.fold_below`, one
   transaction a chunk): us per row and per chunk, by chunk size. A commit waits for at
   most one chunk, so the chunk size bounds that wait.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import threading
import time
from pathlib import Path

import sqlite_utils

from kvbudget.daemon.log import decision_log as dl
from kvbudget.daemon.log.store import PAGE_SIZE
from kvbudget.daemon.log import upkeep
from kvbudget.daemon.log import schema
from kvbudget.daemon.core.records import Decision, DecisionKind, Reason


def sample_decisions(n: int, start: int = 0) -> list[Decision]:
    return [
        Decision(
            seq=start + i, time_s=time.time(), kind=DecisionKind.ADMIT, reason=Reason.FITS,
            request_id=f"req-{start + i}", engine_id=f"engine-{i % 4}", tenant=("chat", "batch")[i % 2],
            policy="optimistic", prompt_tokens=1200, max_new_tokens=256, num_tokens=1200,
            blocks_reserved=(75, 18), blocks_held=(75, 18),
            new_block_ids=(tuple(range(1000 + i, 1008 + i)), (7, 8)), num_free_blocks=20000 - i % 1000,
            num_running=64, num_waiting=3,
        )
        for i in range(n)
    ]


def fresh_db(directory: Path, name: str, *, indexes: bool, synchronous: str = "NORMAL") -> sqlite_utils.Database:
    path = directory / f"{name}.db"
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
    db = sqlite_utils.Database(conn)
    db.enable_wal()
    conn.execute(f"PRAGMA synchronous={synchronous}")
    db[table_of(indexes)].create(schema.COLUMN_TYPES, pk="id", column_order=["id", *schema.COLUMNS])
    if indexes:
        for column in schema.INDEXED_COLUMNS:
            db[schema.INDEXED].create_index([column], index_name=f"idx_{column}")
    return db


def table_of(indexes: bool) -> str:
    return schema.INDEXED if indexes else schema.RECENT


def insert_sql(indexes: bool) -> str:
    return f"INSERT INTO {table_of(indexes)} VALUES ({', '.join('?' * (1 + len(schema.COLUMNS)))})"


def rate(rows: int, seconds: float) -> str:
    return f"{rows / seconds:>10,.0f} rows/s"


class Timer:
    """Wall and CPU time of a block: on a shared machine rows per CPU-second is the steadier figure."""

    def __enter__(self) -> Timer:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def bench_raw(directory: Path, rows: list[tuple], batch: int, indexes: bool) -> dict[str, tuple[float, float]]:
    """name -> (rows per wall second, rows per CPU second)."""
    label = "indexed" if indexes else "recent (no index)"
    results: dict[str, tuple[float, float]] = {}
    dicts = [dict(zip(("id", *schema.COLUMNS), r)) for r in rows]

    db = fresh_db(directory, f"insert_all-{label}", indexes=indexes)
    with Timer() as t:
        for i in range(0, len(dicts), batch):
            with db.atomic():
                db[table_of(indexes)].insert_all(dicts[i : i + batch], batch_size=batch)
    results[f"insert_all, batches of {batch}, {label}"] = (len(dicts) / t.wall, len(dicts) / t.cpu)
    db.conn.close()

    db = fresh_db(directory, f"executemany-{label}", indexes=indexes)
    with Timer() as t:
        for i in range(0, len(rows), batch):
            db.conn.execute("BEGIN")
            db.conn.executemany(insert_sql(indexes), rows[i : i + batch])
            db.conn.execute("COMMIT")
    results[f"executemany, batches of {batch}, {label}"] = (len(rows) / t.wall, len(rows) / t.cpu)
    db.conn.close()

    single = rows[: max(1, len(rows) // 10)]
    for synchronous in ("NORMAL", "FULL") if indexes else ("NORMAL",):
        db = fresh_db(directory, f"per-row-{label}-{synchronous}", indexes=indexes, synchronous=synchronous)
        some = single if synchronous == "NORMAL" else single[: max(1, len(single) // 10)]
        with Timer() as t:
            for row in some:
                db.conn.execute("BEGIN")
                db.conn.execute(insert_sql(indexes), row)
                db.conn.execute("COMMIT")
        name = f"one commit per row, synchronous={synchronous}, {label}"
        results[name] = (len(some) / t.wall, len(some) / max(t.cpu, 1e-9))
        db.conn.close()
    return results


def bench_log_throughput(
    directory: Path, total: int, step: int, checkpoint_s: float | None
) -> tuple[float, float, int]:
    steps = [sample_decisions(step, i * step) for i in range(total // step)]
    log = dl.DecisionLog(directory / f"log-throughput-{checkpoint_s}.db", checkpoint_interval_s=checkpoint_s)
    log.start()
    with Timer() as t:
        futures = [log.append(s) for s in steps]
        for f in futures:
            f.result()
    batches = log.batches_committed
    log.close()
    return len(steps) * step / t.wall, len(steps) * step / t.cpu, batches


def bench_latency(
    directory: Path, producers: int, step: int, seconds: float, checkpoint_s: float | None
) -> tuple[list[float], int, int]:
    log = dl.DecisionLog(directory / f"log-latency-{producers}-{checkpoint_s}.db", checkpoint_interval_s=checkpoint_s)
    log.start()
    latencies: list[float] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds
    decisions = sample_decisions(step)

    def producer() -> None:
        mine: list[float] = []
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            log.append(decisions).result()
            mine.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=producer) for _ in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows, batches = log.rows_written, log.batches_committed
    log.close()
    return latencies, rows, batches


def bench_inline(directory: Path, step: int, count: int) -> dict[str, list[float]]:
    """Latency of one caller's commits through the writer thread vs in its own thread."""
    log = dl.DecisionLog(directory / f"log-inline-{step}.db")
    log.start()
    decisions = sample_decisions(step)
    results: dict[str, list[float]] = {"writer thread (append)": [], "inline (commit_inline)": []}
    for _ in range(count // 100):  # interleaved so drift hits both alike
        for _ in range(100):
            t0 = time.perf_counter()
            log.append(decisions).result()
            results["writer thread (append)"].append(time.perf_counter() - t0)
        for _ in range(100):
            t0 = time.perf_counter()
            if not log.commit_inline(decisions):  # the writer is folding: it queues
                log.append(decisions).result()
            results["inline (commit_inline)"].append(time.perf_counter() - t0)
    log.close()
    return results


def bench_fold(directory: Path, chunk_rows: int, rounds: int = 10, per_round: int = 4096) -> tuple[float, float]:
    """(us per folded row, p50 ms per chunk) moving `per_round` committed rows per round."""
    path = directory / f"fold-{chunk_rows}.db"
    log = dl.DecisionLog(path, fold_interval_s=1e9, fold_rows=10**9, checkpoint_interval_s=None)
    log.start()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA wal_autocheckpoint=0")
    upkeep.prepare_fold_below(conn)
    chunks: list[float] = []
    for r in range(rounds):
        steps = sample_decisions(per_round, r * per_round)
        for i in range(0, per_round, 512):
            log.commit_inline(steps[i : i + 512])
        first = r * per_round + 1
        for below in range(first + chunk_rows, first + per_round + chunk_rows, chunk_rows):
            t0 = time.perf_counter()
            upkeep.fold_below(conn, min(below, first + per_round))
            chunks.append(time.perf_counter() - t0)
    conn.close()
    log.close()
    return sum(chunks) / (rounds * per_round) * 1e6, statistics.median(chunks) * 1e3


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 10) - 1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--step", type=int, default=32, help="decisions per engine step (one append)")
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each latency run")
    parser.add_argument("--dir", default=None, help="where the databases go (default: a temp dir)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        directory = Path(tmp)
        now = time.time()
        decisions = sample_decisions(args.rows)
        with Timer() as t:
            rows = [schema.decision_row(i + 1, d, now) for i, d in enumerate(decisions)]
        print(f"cpu count {os.cpu_count()}, sqlite {sqlite3.sqlite_version}, rows {args.rows}")
        print(f"Decision -> row conversion: {rate(args.rows, t.wall)}  {args.rows / t.cpu:>10,.0f} rows/CPU-s")
        print("\n1. raw write paths (WAL, synchronous=NORMAL unless said): rows/s wall, rows per CPU-s")
        for indexes in (False, True):
            for name, (wall, cpu) in bench_raw(directory, rows, args.batch, indexes).items():
                print(f"  {name:<52} {wall:>10,.0f} rows/s  {cpu:>10,.0f} rows/CPU-s")

        checkpoint_modes = ((1.0, "checkpoints on their own thread"), (None, "SQLite auto-checkpoint in commits"))
        print(f"\n2. DecisionLog end to end, appends of {args.step} decisions, waited at the end")
        for checkpoint_s, label in checkpoint_modes:
            throughput, per_cpu, batches = bench_log_throughput(directory, args.rows, args.step, checkpoint_s)
            print(f"  {throughput:>10,.0f} decisions/s ({per_cpu:,.0f} per CPU-s) in {batches} transactions "
                  f"({args.rows // args.step / max(batches, 1):.1f} appends per commit), {label}")

        print(f"\n3. group-commit latency, closed loop, appends of {args.step}, {args.seconds:.0f} s each")
        for (checkpoint_s, label), producers in [(m, n) for m in checkpoint_modes for n in (1, 4, 16)]:
            latencies, written, batches = bench_latency(directory, producers, args.step, args.seconds, checkpoint_s)
            print(
                f"  {label[:18]:<18} {producers:>2} producer(s): p50 {percentile(latencies, 50) * 1e6:>7,.0f} us  "
                f"p99 {percentile(latencies, 99) * 1e6:>7,.0f} us  "
                f"{written / args.seconds:>9,.0f} decisions/s  "
                f"{len(latencies) / max(batches, 1):.1f} appends per commit"
            )

        print("\n4. one caller, closed loop: writer-thread hand-off vs inline commit")
        for step in (1, 2, args.step):
            for name, latencies in bench_inline(directory, step, 2000).items():
                print(f"  {step:>4} decisions, {name:<24} p50 {percentile(latencies, 50) * 1e6:>7,.0f} us  "
                      f"p99 {percentile(latencies, 99) * 1e6:>7,.0f} us")

        print("\n5. folding into the indexes, one transaction a chunk")
        for chunk_rows in (128, 256, 512, 1024, 4096):
            per_row_us, chunk_ms = bench_fold(directory, chunk_rows)
            print(f"  chunks of {chunk_rows:>4} rows: {per_row_us:5.2f} us per row, p50 {chunk_ms:6.2f} ms per chunk")


if __name__ == "__main__":
    main()
