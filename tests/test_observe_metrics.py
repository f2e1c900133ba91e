"""/metrics as an operator scrapes it from a real daemon: a port the daemon chose, a valid
exposition, series that exist before their first event, bounded tenant series, counters
that only go forward through a policy switch and a drain."""

from __future__ import annotations

import asyncio
import re
import subprocess
import urllib.request
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from kvbudget.client import EngineClient, ObserverClient
from kvbudget.daemon.core.records import DecisionKind, RequestSpec

from daemon_harness import DaemonProcess, wait_until

pytestmark = pytest.mark.slow

# `--metrics-address 127.0.0.1:0` lets the kernel pick the port; the daemon's log says which.
METRICS_LINE = re.compile(r"metrics on http://127\.0\.0\.1:(\d+)/metrics")


def metrics_port(daemon: DaemonProcess) -> int:
    found = wait_until(lambda: METRICS_LINE.search(daemon.stderr()), timeout=30)
    return int(found.group(1))


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


async def scrape_async(port: int) -> str:
    return await asyncio.to_thread(scrape, port)


def kvbudget_samples(text: str) -> list[Sample]:
    return [sample for family in text_string_to_metric_families(text) if family.name.startswith("kvbudget_")
            for sample in family.samples]


def sample_value(text: str, name: str, **labels: str) -> float | None:
    for sample in kvbudget_samples(text):
        if sample.name == name and sample.labels == labels:
            return sample.value
    return None


def counter_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every counter's `_total` sample, by name and labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text) if family.type == "counter"
        for sample in family.samples if sample.name.endswith("_total")
    }


def pool_known(text: str) -> str | None:
    """The scrape, once the core's first snapshot has set the pool's gauges."""
    return text if sample_value(text, "kvbudget_num_blocks") is not None else None


def label_sum(text: str, name: str, label: str, **labels: str) -> tuple[set[str], float]:
    """The values `label` takes on `name`'s samples that match `labels`, and their sum."""
    matching = [s for s in kvbudget_samples(text)
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    return {s.labels[label] for s in matching}, sum(s.value for s in matching)


class ScrapedAtOnce(DaemonProcess):
    """A daemon scraped as soon as its log names the metrics port, before it is SERVING:
    what Prometheus, which knows nothing of health, may do when the daemon restarts."""

    def start(self) -> ScrapedAtOnce:
        self._stderr = open(self.stderr_path, "w")
        self.process = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=self._stderr,
                                        env=self.env, cwd=self.workdir)
        try:
            self.port = metrics_port(self)
            self.first_scrape = scrape(self.port)
            self.wait_serving()
        except BaseException:
            self.stop()  # (__exit__ is not called when __enter__ raises)
            raise
        return self


def test_exposition_is_valid_and_names_follow_the_conventions(tmp_path) -> None:
    """What `promtool check metrics` checks, and a series for each event before it first
    happens (a counter born at N has its first N lost to rate())."""
    with ScrapedAtOnce(tmp_path, "--metrics-address", "127.0.0.1:0") as daemon:
        # Before the core starts (it reads them at scrape from then on): the pool's gauges are absent
        # until a snapshot sets them, never a pool of 0 blocks.
        assert sample_value(daemon.first_scrape, "kvbudget_num_blocks") in (None, 64.0)
        text = wait_until(lambda: pool_known(scrape(daemon.port)), timeout=30, interval=0.2)
    assert sample_value(text, "kvbudget_num_blocks") == 64.0
    help_lines = Counter(line.split()[2] for line in text.splitlines() if line.startswith("# HELP "))
    type_lines = Counter(line.split()[2] for line in text.splitlines() if line.startswith("# TYPE "))
    assert [name for name, n in (help_lines + type_lines).items() if n != 2] == []  # one HELP and one TYPE each
    families = [f for f in text_string_to_metric_families(text) if f.name.startswith("kvbudget_")]
    for family in families:
        assert family.documentation, family.name
        assert re.fullmatch(r"kvbudget_[a-z][a-z0-9_]*", family.name), family.name
        # Base units only: seconds and bytes, never ms or MiB.
        assert not re.search(r"_(ms|milliseconds|us|minutes|hours|kb|mb|mib|gib)(_|$)", family.name), family.name
        if family.type == "gauge":
            assert not family.name.endswith("_total"), family.name
        if family.type == "counter":
            assert {s.name for s in family.samples} <= {family.name + "_total"}  # no `_created`, as vLLM's
    assert [name for name in help_lines if name.endswith("_created")] == []
    # Nothing decided yet, and already: the preemptions vLLM counts, and the admissions
    # the guide's stuck-queue alert compares against, at 0.
    assert sample_value(text, "kvbudget_num_preemptions_total", reason="growth") == 0.0
    assert sample_value(text, "kvbudget_num_preemptions_total", reason="priority") == 0.0
    assert sample_value(text, "kvbudget_decisions_total", kind="admit", reason="fits") == 0.0
    assert sample_value(text, "kvbudget_decisions_total", kind="reject", reason="draining") == 0.0
    # The model, at the first scrape already (known before the server starts), as vLLM's model_name.
    assert sample_value(daemon.first_scrape, "kvbudget_model_info", model_name="llama-3.1-8b", block_size="16",
                        tensor_parallel_size="1", pipeline_parallel_size="1") == 1.0
    assert sample_value(text, "kvbudget_prefix_cache_query_tokens_total", model_name="llama-3.1-8b") == 0.0
    assert sample_value(text, "kvbudget_tenant_request_queue_time_seconds_count", model_name="llama-3.1-8b",
                        tenant="(other)") == 0.0


MAX_TENANT_SERIES, OTHER_TENANTS = 50, "(other)"  # metrics.py's (test_metrics.py pins them)
RUNNING = 4  # 256-token prompts: 16 blocks each, the whole 64-block pool
WAITING = 120  # 512-token prompts (32 blocks each), each of its own tenant


async def test_tenant_series_are_bounded_and_counters_survive_a_switch_and_a_drain(tmp_path) -> None:
    with DaemonProcess(tmp_path, "--metrics-address", "127.0.0.1:0") as daemon:
        port = metrics_port(daemon)
        async with EngineClient(daemon.target, "m") as engine, ObserverClient(daemon.target) as admin:
            running = [RequestSpec(f"run-{i}", 256, 16, tenant="batch") for i in range(RUNNING)]
            waiting = [RequestSpec(f"wait-{i}", 512, 16, tenant=f"user-{i}") for i in range(WAITING)]
            decisions = await engine.step(submits=running + waiting)
            assert Counter(d.kind for d in decisions) == {DecisionKind.ADMIT: RUNNING, DecisionKind.QUEUE: WAITING}

            # The gauges are read at scrape: the first scrape after the step sees its queue.
            before = await scrape_async(port)
            assert sample_value(before, "kvbudget_num_requests_waiting") == WAITING
            names, waiting_sum = label_sum(before, "kvbudget_tenant_requests", "tenant", state="waiting")
            assert len(names) == MAX_TENANT_SERIES  # 121 tenants: 49 by name and the sum of the rest
            assert OTHER_TENANTS in names and "batch" in names  # the largest by blocks keeps its name
            assert waiting_sum == WAITING  # the sum over tenants is exact
            assert label_sum(before, "kvbudget_tenant_blocks", "tenant", state="held")[1] == 64

            await admin.set_policy("guaranteed")
            assert await admin.drain() == RUNNING

            after = await scrape_async(port)
    assert sample_value(after, "kvbudget_policy", policy="guaranteed") == 1.0
    assert sample_value(after, "kvbudget_num_requests_waiting") == 0
    assert sample_value(after, "kvbudget_num_requests_running") == RUNNING  # running ones finish
    assert sample_value(after, "kvbudget_kv_cache_usage_perc") == 1.0
    assert label_sum(after, "kvbudget_policy", "policy")[0] == {"guaranteed"}  # one policy in force
    assert label_sum(after, "kvbudget_tenant_requests", "tenant")[0] == {"batch"}  # the waiting ones left
    assert sample_value(after, "kvbudget_decisions_total", kind="reject", reason="draining") == WAITING
    assert sample_value(after, "kvbudget_decisions_total", kind="policy", reason="switch") == 1
    counters_before, counters_after = counter_samples(before), counter_samples(after)
    went_back = {key: (value, counters_after.get(key)) for key, value in counters_before.items()
                 if counters_after.get(key, -1) < value}
    assert went_back == {}


def test_an_ipv6_metrics_address_is_logged_as_a_url_with_brackets(tmp_path) -> None:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback on this host")
    with DaemonProcess(tmp_path, "--metrics-address", "[::1]:0") as daemon:
        found = wait_until(lambda: re.search(r"metrics on (\S+)", daemon.stderr()), timeout=30)
        url = found.group(1)
        # What the log says can be pasted into curl or a scrape config as it is.
        assert re.fullmatch(r"http://\[::1\]:\d+/metrics", url), url
        with urllib.request.urlopen(url, timeout=10) as response:
            assert b"kvbudget_build_info" in response.read()
