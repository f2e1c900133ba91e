"""Block pool speed and size for a 1M-block pool.

    python bench/bench_pool.py [--num-blocks 1000000] [--batch 16] [--rounds 200000]

Reports pool creation time, block operations per second (one allocate of `batch` blocks and
one free of them = 2 x batch block operations), the same with prefix-cache traffic
(cache + free to evictable + touch), and the process's peak RSS. Goals (issue #2):
>= 1M block operations/s, RSS <= 150 MB, creation <= 1 s.
"""

from __future__ import annotations

import argparse
from array import array
import resource
import time

from kvbudget.daemon.core.pool import BlockPool


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-blocks", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=100_000)
    args = parser.parse_args()

    rss_before = peak_rss_mb()
    t0 = time.perf_counter()
    pool = BlockPool(args.num_blocks)
    create_s = time.perf_counter() - t0

    # Fill half the pool so allocations come from the middle of a busy stack.
    held = array("i")
    for _ in range(args.num_blocks // (2 * args.batch)):
        held.extend(pool.allocate(args.batch))
    t0 = time.perf_counter()
    for _ in range(args.rounds):
        ids = pool.allocate(args.batch)
        pool.free(ids)
    plain_s = time.perf_counter() - t0
    plain_ops = 2 * args.batch * args.rounds / plain_s
    rss_plain = peak_rss_mb()

    # Prefix-cache traffic: cache a block, let it go evictable, hit it again, free again.
    t0 = time.perf_counter()
    rounds = args.rounds // 4
    for i in range(rounds):
        ids = pool.allocate(args.batch)
        for j, block_id in enumerate(ids):
            pool.cache_block(block_id, (i, j))
        pool.free(reversed(ids))
        pool.touch(ids)
        pool.free(reversed(ids))
    cached_s = time.perf_counter() - t0
    cached_ops = 5 * args.batch * rounds / cached_s  # allocate, cache, free, touch, free

    pool.free(held)
    t0 = time.perf_counter()
    pool.check_integrity()
    check_s = time.perf_counter() - t0

    print(f"pool of {args.num_blocks:,} blocks, batch {args.batch}")
    print(f"  create            {create_s * 1e3:8.1f} ms")
    print(f"  allocate+free     {plain_ops / 1e6:8.2f} M block ops/s")
    print(f"  with prefix cache {cached_ops / 1e6:8.2f} M block ops/s")
    print(f"  integrity check   {check_s * 1e3:8.1f} ms")
    print(f"  peak RSS, pool    {rss_plain:8.1f} MB (interpreter alone {rss_before:.1f} MB)")
    print(f"  peak RSS, + {rounds * args.batch:,} cached hashes {peak_rss_mb():.1f} MB")


if __name__ == "__main__":
    main()
