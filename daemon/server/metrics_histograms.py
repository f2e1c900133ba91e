"""The queue-time histograms, observed on the event loop as plain counts and read into
histogram families at scrape: prometheus-client's Histogram.observe takes ~1.6 us (its
locks), which a step admitting 64 requests paid 64 times; a batch's waits are added in one
call, each counted once (the whole histogram is the sum of the tenants' at scrape)."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from kvbudget.daemon.core.records import OTHER_TENANTS


class QueueTimeHistograms:
    """Two families from one set of counts: `name` (no labels) and `tenant_name` (model_name,
    tenant). A tenant the config names has its own series; every other tenant is counted
    under OTHER_TENANTS: tenant names come from the engines' requests, so only the configured
    ones may add series (the exporter's size stays the operator's choice)."""

    def __init__(self, name: str, documentation: str, tenant_name: str, tenant_documentation: str,
                 buckets: tuple[float, ...], registry: CollectorRegistry) -> None:
        self.name, self.documentation, self.bounds = name, documentation, buckets
        self.tenant_name, self.tenant_documentation = tenant_name, tenant_documentation
        self.model_name = ""
        # tenant -> per-bucket counts (not cumulative; the last bucket above every bound), then
        # the sum of the values. Its keys are the named tenants and OTHER_TENANTS.
        self._rows: dict[str, list[float]] = {}
        self.name_tenants(())
        registry.register(self)

    def name_tenants(self, tenants: Iterable[str]) -> None:
        """These tenants get their own series (at 0 from now, so rate() sees their first wait);
        a series once served stays, as a counter does, though a reload no longer names it."""
        for tenant in (*tenants, OTHER_TENANTS):
            if tenant not in self._rows:
                self._rows[tenant] = [0] * (len(self.bounds) + 2)

    def observe_all(self, values: list[float], tenants: list[str]) -> None:
        """values[i] observed for tenants[i] (a batch's admissions: one call for all of them)."""
        rows, bounds = self._rows, self.bounds
        other = rows[OTHER_TENANTS]
        for value, tenant in zip(values, tenants):
            row = rows.get(tenant, other)
            row[bisect_left(bounds, value)] += 1
            row[-1] += value

    def collect(self) -> Iterator[Metric]:
        # (copies: the event loop may add a row or count while a scrape reads)
        rows = sorted((tenant, list(row)) for tenant, row in list(self._rows.items()))
        whole = [sum(column) for column in zip(*(row for _, row in rows))]
        family = HistogramMetricFamily(self.name, self.documentation)
        family.add_metric([], _buckets(self.bounds, whole[:-1]), whole[-1])
        yield family
        family = HistogramMetricFamily(self.tenant_name, self.tenant_documentation, labels=["model_name", "tenant"])
        for tenant, row in rows:
            family.add_metric([self.model_name, tenant], _buckets(self.bounds, row[:-1]), row[-1])
        yield family


def _buckets(bounds: tuple[float, ...], counts: list[float]) -> list[tuple[str, float]]:
    """Per-bucket counts (the last: above every bound) as the cumulative (le, count) pairs."""
    cumulative, buckets = 0.0, []
    for bound, count in zip((*bounds, math.inf), counts):
        cumulative += count
        buckets.append((floatToGoString(bound), cumulative))
    return buckets
