"""What a /metrics scrape costs with its gauges computed at scrape (the core's snapshot read
on the event loop as the scrape asks), against the 1 s ticker that set them before, and a
bare round trip to the same HTTP server (`/favicon.ico`, which prometheus-client answers
empty), in the same run.

    python bench/bench_metrics_scrape.py [--waiting 2000] [--tenants 200] [--scrapes 200]

A real AdmissionController (a 64k-block pool, 128 running requests, `--waiting` queued over
`--tenants` tenants) on an asyncio loop in its own thread, as in the daemon; one Metrics fed
by the ticker's update() beforehand ("ticker": the scrape only renders), one reading at
scrape through metrics_scrape.read_at_scrape ("at scrape": the hop to the loop, the snapshot,
update(), render). Scrapes are interleaved over HTTP on loopback; p50s in ms. Also the
event loop's share (one snapshot and update(), p50 of 50): the ticker spent it each second,
a scrape spends it once.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
import urllib.request

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core.records import RequestSpec
from kvbudget.daemon.core.spec import KV_DTYPES, AttentionSpec, group_layers
from kvbudget.daemon.server.metrics import Metrics
from kvbudget.daemon.server.metrics_scrape import read_at_scrape


def loaded_controller(waiting: int, tenants: int) -> AdmissionController:
    layout = group_layers([AttentionSpec(16, 8, 128, KV_DTYPES["bf16"])] * 2)
    ctrl = AdmissionController(layout, 65_536, AdmissionConfig(max_model_len=1 << 20, policy="guaranteed"))
    for i in range(128):  # 512 blocks each: the whole pool
        ctrl.submit(RequestSpec(f"run{i}", 4096, 4096, tenant=f"t{i % tenants}"), 0.0)
    for i in range(waiting):
        ctrl.submit(RequestSpec(f"wait{i}", 4096, 4096, tenant=f"t{i % tenants}"), 0.0)
    return ctrl


def get_ms(url: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as response:
        response.read()
    return (time.perf_counter() - started) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiting", type=int, default=2000, help="requests queued")
    parser.add_argument("--tenants", type=int, default=200, help="tenants they come from")
    parser.add_argument("--scrapes", type=int, default=200, help="scrapes of each kind")
    args = parser.parse_args()
    ctrl = loaded_controller(args.waiting, args.tenants)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def figures():
        return ctrl.snapshot(time.time()), None, None

    ticker, at_scrape = Metrics(), Metrics()
    ticker.update(*figures())  # (what the ticker did on the loop each second)
    read_at_scrape(at_scrape, loop, figures)
    ports = {"bare": ticker.start_http("127.0.0.1", 0), "at scrape": at_scrape.start_http("127.0.0.1", 0)}
    ports["ticker"] = ports["bare"]
    urls = {name: f"http://127.0.0.1:{port}/{'favicon.ico' if name == 'bare' else 'metrics'}"
            for name, port in ports.items()}
    times: dict[str, list[float]] = {name: [] for name in urls}
    for _ in range(5):
        for url in urls.values():
            get_ms(url)
    for _ in range(args.scrapes):  # interleaved, so drift hits all alike
        for name, url in urls.items():
            times[name].append(get_ms(url))
    # The loop's share either way: one snapshot and update(), each second or each scrape.
    loop_ms = statistics.median(_timed_on_loop(loop, lambda: ticker.update(*figures())) for _ in range(50))
    ticker.stop()
    at_scrape.stop()
    print(f"{args.waiting} waiting, {args.tenants} tenants; scrape p50 over HTTP:")
    for name, samples in times.items():
        print(f"  {name:10} {statistics.median(samples):7.2f} ms")
    print(f"loop time, one snapshot + update(): {loop_ms:.2f} ms; the ticker spent it every second, at scrape "
          f"every scrape ({loop_ms / 15:.3f} ms a second at a 15 s scrape interval)")


def _timed_on_loop(loop: asyncio.AbstractEventLoop, call) -> float:
    """Milliseconds `call` takes when run on `loop`."""
    async def timed() -> float:
        started = time.perf_counter()
        call()
        return (time.perf_counter() - started) * 1e3

    return asyncio.run_coroutine_threadsafe(timed(), loop).result()


if __name__ == "__main__":
    main()
