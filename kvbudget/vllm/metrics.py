"""The adapter's counters: plain numbers (tests, the bench) and, when prometheus_client is
importable, Prometheus counters beside vLLM's own metrics."""

from __future__ import annotations

import contextlib

NAMES = {
    "steps": "Steps the kvbudget daemon decided",
    "drift": "Requests whose blocks per KV-cache group differed between vLLM and the kvbudget daemon after a step",
    "unreachable_steps": "Steps scheduled without the kvbudget daemon (fail_open: vLLM's own admission; fail_closed: none new)",
    "link_failures": "Times the kvbudget daemon stopped answering",
    "resyncs": "New sessions with the kvbudget daemon, running requests submitted again",
    "daemon_preemptions": "Requests vLLM preempted because the kvbudget daemon did",
    "rejections": "Requests the kvbudget daemon rejected (finished with an error)",
}


class AdapterMetrics:
    def __init__(self) -> None:
        self.counts = dict.fromkeys(NAMES, 0)
        self._prometheus = {}
        with contextlib.suppress(Exception):  # (no prometheus_client, or registered twice)
            from prometheus_client import Counter

            for name, text in NAMES.items():
                self._prometheus[name] = Counter(f"kvbudget_vllm_{name}", text)

    def add(self, name: str, amount: int = 1) -> None:
        self.counts[name] += amount
        counter = self._prometheus.get(name)
        if counter is not None and amount:
            counter.inc(amount)
