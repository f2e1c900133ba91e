"""The gauges are computed at scrape: each /metrics request reads the core on its event loop
(the HTTP server's thread never touches the core's state), once per scrape."""

from __future__ import annotations

import asyncio
import threading
import urllib.request

from kvbudget.daemon.server.metrics import Metrics
from kvbudget.daemon.server.metrics_scrape import read_at_scrape

from test_metrics import snapshot


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


async def test_each_scrape_reads_the_core_on_its_loop_once() -> None:
    metrics = Metrics()
    port = metrics.start_http("127.0.0.1", 0)
    loop_thread = threading.get_ident()
    waiting, reads = [3], []

    def read():
        reads.append(threading.get_ident())
        return snapshot(num_waiting=waiting[0]), None, None

    try:
        read_at_scrape(metrics, asyncio.get_running_loop(), read)
        assert reads == []  # nothing read until someone asks
        first = await asyncio.to_thread(scrape, port)
        waiting[0] = 7
        second = await asyncio.to_thread(scrape, port)
    finally:
        metrics.stop()
    assert "kvbudget_num_requests_waiting 3.0" in first.splitlines()
    assert "kvbudget_num_requests_waiting 7.0" in second.splitlines()  # no tick in between: read at scrape
    assert reads == [loop_thread, loop_thread]  # on the loop, once a scrape


def test_a_closed_loop_leaves_the_last_figures_served() -> None:
    """The daemon stopping: its loop is closed while Prometheus still scrapes."""
    metrics = Metrics()
    metrics.update(snapshot(num_waiting=5))
    loop = asyncio.new_event_loop()
    loop.close()
    read_at_scrape(metrics, loop, lambda: (snapshot(num_waiting=9), None, None))
    scraped: list[str] = []
    scraper = threading.Thread(target=lambda: scraped.append(metrics.render().decode()))
    scraper.start()
    scraper.join()
    assert "kvbudget_num_requests_waiting 5.0" in scraped[0].splitlines()


def test_a_failed_read_leaves_the_last_figures_and_says_why(caplog) -> None:
    metrics = Metrics()
    metrics.update(snapshot(num_waiting=5))
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    runner = threading.Thread(target=lambda: (loop.call_soon(ready.set), loop.run_forever()))
    runner.start()
    ready.wait()

    def broken():
        raise OSError("decision log figures unreadable")

    try:
        read_at_scrape(metrics, loop, broken)
        text = metrics.render().decode()  # (from this thread: the loop runs on another)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join()
        loop.close()
    assert "kvbudget_num_requests_waiting 5.0" in text.splitlines()
    assert "metrics: reading the core for a scrape failed" in caplog.text
