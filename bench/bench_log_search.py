"""The dashboard's whole-log search (`s`): what a page of QueryDecisions costs, end to end.

    python bench/bench_log_search.py [--decisions 40000]

Starts a daemon (the test harness's: llama-3.1-8b, a 2,000-block pool, CPU), logs
`--decisions` decisions (admit + release pairs, 200 a step), then times the first page and
a search for a word found nowhere (every page read) with pages of 2,000 (the dashboard's)
and of 10,000 (the most QueryDecisions gives). Wall time: on a shared machine, runs vary.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from daemon_harness import DaemonProcess  # noqa: E402

from kvbudget.client import EngineClient  # noqa: E402
from kvbudget.daemon.core.records import RequestSpec  # noqa: E402
from kvbudget.tui.log_search import DaemonPages, LogSearch  # noqa: E402


async def measure(target: str, decisions: int) -> None:
    async with EngineClient(target, "bench") as engine:
        for k in range(max(1, decisions // 400)):
            ids = [f"r{k}-{i}" for i in range(200)]
            await engine.step(submits=[RequestSpec(i, prompt_tokens=16, max_new_tokens=4) for i in ids])
            await engine.step(finishes=ids)
    pages = DaemonPages(target)
    try:
        for size in (2000, 10000):
            started = time.perf_counter()
            await pages(0, size)
            first = time.perf_counter() - started
            search = LogSearch(pages, "no-such-word", page_size=size, want=1, max_read=10**9)
            started, count, progress = time.perf_counter(), 0, None
            async for progress in search.more():
                count += 1
            whole = time.perf_counter() - started
            print(f"pages of {size:,}: the first {first * 1000:.0f} ms; the whole log, {progress.read:,} decisions "
                  f"in {count} pages, {whole:.2f} s ({progress.read / whole:,.0f} decisions/s)")
    finally:
        await pages.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=40_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        daemon = DaemonProcess(Path(tmp), "--num-gpu-blocks", "2001").start()
        try:
            asyncio.run(measure(daemon.target, args.decisions))
        finally:
            daemon.stop()


if __name__ == "__main__":
    main()
