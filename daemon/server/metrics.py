"""Prometheus metrics for the daemon, on their own registry (no process-global state).

Names are `kvbudget_` plus vLLM's where one exists, so dashboards built for vLLM read the
same way: `kv_cache_usage_perc` (a 0-1 ratio, like vLLM's despite the name),
`num_requests_waiting`, `num_requests_running`, `num_preemptions_total`. The rest break the
pool down by state, layer group and tenant (the MAX_TENANT_SERIES that matter most, the rest
summed), and count decisions by kind and reason (every pair the core decides at 0 from the start).

Two feeds: `record()` with each batch of decisions (counters, latency) and `update()` with a
periodic snapshot (gauges). Cumulative figures the core keeps in its snapshot (prefix-cache
queries, blocks reclaimed) become counters by adding the increase since the last snapshot.
"""

from __future__ import annotations

import copy
import heapq
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.exposition import start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import RestrictedRegistry

from kvbudget import __version__
from kvbudget.daemon.core.records import OTHER_TENANTS, Decision, DecisionKind, Reason, Snapshot, TenantSnapshot

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

# From a few tens of microseconds (an in-memory decision) to seconds: a commit held by the
# decision log's write stall (its upkeep behind: decision_pacing) waits that long, and above
# 1 s it all read "+Inf" alike.
LATENCY_BUCKETS_S = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)


# Every (kind, reason) the admission core decides. Their series exist from the start, at 0:
# a counter series that first appears at 37 has its first 37 lost to rate() and increase()
# (the first preemption burst, say), and an alert on `rate(...{kind="admit"}) == 0` has
# nothing to compare while nothing was ever admitted. Both labels are closed enums, so this
# is a fixed, small set; a pair missing here is still counted, from its first decision on.
DECISION_PAIRS: tuple[tuple[DecisionKind, Reason], ...] = (
    (DecisionKind.ADMIT, Reason.FITS),
    (DecisionKind.ADMIT, Reason.PREFIX_HIT),
    (DecisionKind.QUEUE, Reason.QUEUE_AHEAD),
    (DecisionKind.QUEUE, Reason.POOL_FULL),
    (DecisionKind.QUEUE, Reason.BUDGET_FULL),
    (DecisionKind.QUEUE, Reason.WATERMARK),
    (DecisionKind.QUEUE, Reason.TENANT_QUOTA),
    (DecisionKind.REJECT, Reason.PROMPT_TOO_LONG),
    (DecisionKind.REJECT, Reason.NEVER_FITS),
    (DecisionKind.REJECT, Reason.TENANT_QUOTA),
    (DecisionKind.REJECT, Reason.QUEUE_FULL),
    (DecisionKind.REJECT, Reason.DEADLINE),
    (DecisionKind.REJECT, Reason.DRAINING),
    (DecisionKind.GROW, Reason.FITS),
    (DecisionKind.DENY, Reason.POOL_FULL),
    (DecisionKind.DENY, Reason.OVER_RESERVATION),
    (DecisionKind.DENY, Reason.NOT_RUNNING),
    (DecisionKind.PREEMPT, Reason.GROWTH),
    (DecisionKind.PREEMPT, Reason.PRIORITY),
    (DecisionKind.RECLAIM, Reason.WINDOW),
    (DecisionKind.RELEASE, Reason.FINISHED),
    (DecisionKind.RELEASE, Reason.ABORTED),
    (DecisionKind.EXPIRE, Reason.LEASE_EXPIRED),
    (DecisionKind.POLICY, Reason.SWITCH),
)

# Tenant names come from the engines' requests (often an end user or API key), not from
# the config, and an unbounded queue may hold any number of them: one series per tenant
# would let traffic decide the exporter's size (20,000 queued tenants made 80,000 series, a
# 5 MB scrape taking 4 s, and 0.4 s of every second spent on the event loop setting them).
# The largest tenants get their own series; the rest are summed into one, so a sum over
# tenants stays exact.
MAX_TENANT_SERIES = 50


# prometheus-client adds a `<name>_created` sample (the unix time the series was born) to
# every counter, histogram and summary. vLLM's /metrics has none, dashboards built for it
# never read them, and here they would be one more gauge beside each of ours (dozens in a
# scrape). prometheus-client's only switch is process-global: disable_created_metrics() (or
# PROMETHEUS_DISABLE_CREATED_SERIES, read at import) turns them off for every registry in
# the process, the tests' and any embedding program's included, and a later
# enable_created_metrics() anywhere would turn them back on here. So the daemon's own
# registry leaves them out as it collects (_Registry below): both exposition formats,
# the HTTP server and render() read through it, and nothing outside it changes.
_CREATED_TYPES = frozenset({"counter", "histogram", "summary"})


def _without_created(families: Iterable[Metric]) -> Iterator[Metric]:
    """The families, less the `_created` samples of counters, histograms and summaries (a
    copy of a family that had any; one that had nothing else is left out altogether)."""
    for family in families:
        if family.type in _CREATED_TYPES:
            created = family.name + "_created"
            samples = [sample for sample in family.samples if sample.name != created]
            if len(samples) != len(family.samples):
                if not samples:
                    continue  # a `?name[]=x_created` scrape: not even its HELP and TYPE
                family = copy.copy(family)
                family.samples = samples
        yield family


class _Registry(CollectorRegistry):
    """A CollectorRegistry whose collect() (and `?name[]=` restricted views) leave the
    `_created` samples out; registering, and every name, as in its base."""

    def collect(self) -> Iterable[Metric]:
        return _without_created(super().collect())

    def restricted_registry(self, names: Iterable[str]) -> _Restricted:
        return _Restricted(super().restricted_registry(names))


class _Restricted:
    """A restricted view (the HTTP server's, for `?name[]=`), less the `_created` samples:
    RestrictedRegistry reads the collectors itself, not through _Registry.collect()."""

    def __init__(self, restricted: RestrictedRegistry) -> None:
        self._restricted = restricted

    def collect(self) -> Iterable[Metric]:
        return _without_created(self._restricted.collect())


class GpuMemory(Protocol):
    """What metrics read from `gpu.GpuInfo` (duck-typed, so tests need no NVML)."""

    present: bool
    total_bytes: int
    used_bytes: int
    free_bytes: int


class LogFigures(Protocol):
    """What metrics read from `decision_log.LogFigures`."""

    database_bytes: int
    wal_bytes: int
    rows_written: int
    rows_folded: int
    wal_resets: int
    stalls: int
    stall_seconds: float


class Metrics:
    def __init__(self) -> None:
        self.registry: CollectorRegistry = _Registry(auto_describe=True)  # no `_created` (_Registry)
        r = self.registry
        # What prometheus-client serves by default (and so vLLM's /metrics): process_* (CPU,
        # memory, open files) and python_gc_* (passes by generation: interpreter.py's
        # settled heap shows as few gen-0 and almost no gen-2 passes under load).
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        # An info metric, as vLLM's *_info gauges: the value is always 1, the labels are the
        # facts. `* on(instance) group_left(version)` puts the version on any other series,
        # so a dashboard can tell which hosts still run an old daemon after an upgrade.
        Gauge("kvbudget_build_info", "The kvbudget version this daemon runs (always 1)", ["version"],
              registry=r).labels(version=__version__).set(1)
        # The gauges only a snapshot (or the GPU probe, or the log's figures) can set are
        # registered by the first update() that has it (see _register_once): the HTTP server
        # serves before the core's first metrics tick, and until then these would read 0 (a
        # pool of 0 blocks, no GPU), which is a value, not the absence of one.
        self.kv_cache_usage = Gauge(
            "kvbudget_kv_cache_usage_perc", "KV-cache usage: held blocks / pool blocks (0-1 ratio)", registry=None
        )
        self.requests_waiting = Gauge(
            "kvbudget_num_requests_waiting", "Requests waiting for admission", registry=None
        )
        self.requests_running = Gauge(
            "kvbudget_num_requests_running", "Requests admitted and holding blocks", registry=None
        )
        self.preemptions = Counter(
            "kvbudget_num_preemptions", "Running requests preempted, by reason", ["reason"], registry=r
        )
        self.num_blocks = Gauge("kvbudget_num_blocks", "Pool capacity in blocks (null block excluded)", registry=None)
        self.blocks = Gauge(
            "kvbudget_blocks",
            "Pool blocks by state: free (never cached) + evictable (cached, unreferenced) + held "
            "= capacity; reserved = promised to running requests but not yet held",
            ["state"],
            registry=r,
        )
        self.group_blocks = Gauge(
            "kvbudget_group_blocks", "Blocks per KV-cache group and state (held, reserved)",
            ["layer_type", "group", "state"], registry=r,
        )
        self.group_reclaimed = Counter(
            "kvbudget_group_blocks_reclaimed", "Blocks that left a sliding window / chunk, per group",
            ["layer_type", "group"], registry=r,
        )
        # Registered by set_certificate_expiry / set_client_ca_expiry, with TLS (mutual TLS)
        # only: a 0 without would read as a certificate long expired to an alert on it.
        self.certificate_expiry: Gauge | None = None
        self.client_ca_expiry: Gauge | None = None
        self.tenant_blocks = Gauge(
            "kvbudget_tenant_blocks", "Blocks per tenant and state (held, reserved)", ["tenant", "state"], registry=r
        )
        self.tenant_requests = Gauge(
            "kvbudget_tenant_requests", "Requests per tenant and state (running, waiting)",
            ["tenant", "state"], registry=r,
        )
        self.prefix_queries = Counter(
            "kvbudget_prefix_cache_queries", "Prompt blocks looked up in the prefix cache", registry=r
        )
        self.prefix_hits = Counter(
            "kvbudget_prefix_cache_hits", "Prompt blocks found in the prefix cache", registry=r
        )
        self.decisions = Counter(
            "kvbudget_decisions", "Decisions by kind and reason", ["kind", "reason"], registry=r
        )
        self.decision_latency = Histogram(
            "kvbudget_decision_latency_seconds",
            "Time from an engine's call to its decisions being ready (log commit included)",
            buckets=LATENCY_BUCKETS_S, registry=r,
        )
        self.log_bytes = Gauge(
            "kvbudget_decision_log_bytes", "Size of the decision log's files (database, wal)", ["file"], registry=r
        )
        self.log_rows = Counter(
            "kvbudget_decision_log_rows", "Decision log rows committed, and moved into the indexed table",
            ["state"], registry=r,
        )
        self.log_wal_resets = Counter(
            "kvbudget_decision_log_wal_resets", "Times the WAL was past its bound and was started over", registry=r
        )
        self.log_stalls = Counter(
            "kvbudget_decision_log_stalls", "Times commits waited for the log's upkeep (too many rows unindexed or owed to retention)", registry=r
        )
        self.log_stall_seconds = Counter(
            "kvbudget_decision_log_stall_seconds", "Time commits waited for the log's upkeep, in all", registry=r
        )
        self.log_unwritten = Gauge(
            "kvbudget_decision_log_unwritten_decisions",
            "Decisions a failed log write left (a full disk), waiting to be written first; steps are refused while > 0",
            registry=None,
        )
        self.policy = Gauge("kvbudget_policy", "The admission policy in force (1 for it)", ["policy"], registry=r)
        self.gpu_present = Gauge("kvbudget_gpu_present", "1 when NVML sees a GPU", registry=None)
        self.gpu_memory = Gauge(
            "kvbudget_gpu_memory_bytes", "GPU memory by state (total, used, free), from NVML", ["state"], registry=r
        )
        self._lock = threading.Lock()  # update() reads and writes the "last seen" figures
        self._registered: set[int] = set()  # ids of the gauges _register_once registered
        self._last_cumulative: dict[tuple[str, ...], float] = {}
        self._last_labels: dict[str, set[tuple[str, ...]]] = {}
        # (kind, reason) -> its decisions child and, for preempts, its preemptions child
        self._decision_children: dict[tuple[object, object], tuple[Counter, Counter | None]] = {}
        for kind, reason in DECISION_PAIRS:
            self._decision_children[(kind, reason)] = self._children_of(kind, reason)
        self._server: WSGIServer | None = None
        self._server_thread: threading.Thread | None = None

    # ------------------------------------------------------------------ feeds
    def record(self, decisions: Sequence[Decision], latency_s: float | None = None) -> None:
        """Count one batch of decisions; `latency_s` is the batch's call-to-ready time.

        `labels()` costs several microseconds (it builds and locks a label key), so each
        (kind, reason) child is looked up once and kept; a batch adds one sum per pair.
        """
        counts: dict[tuple[str, str], int] = {}
        get = counts.get
        for decision in decisions:
            key = (decision.kind, decision.reason)
            counts[key] = get(key, 0) + 1
        children = self._decision_children
        for key, count in counts.items():
            pair = children.get(key)
            if pair is None:
                pair = children[key] = self._children_of(*key)
            pair[0].inc(count)
            if pair[1] is not None:
                pair[1].inc(count)
        if latency_s is not None:
            self.decision_latency.observe(latency_s)

    def _children_of(self, kind: object, reason: object) -> tuple[Counter, Counter | None]:
        """The decisions counter's child for (kind, reason), and the preemptions one for a preempt."""
        kind_text, reason_text = _value(kind), _value(reason)
        preempt = self.preemptions.labels(reason=reason_text) if kind_text == DecisionKind.PREEMPT.value else None
        return self.decisions.labels(kind=kind_text, reason=reason_text), preempt

    def set_certificate_expiry(self, not_after_unix_s: float) -> None:
        """The TLS certificate served now expires then (the server, at start and each reload);
        0.0 (its expiry could not be read) exports nothing new."""
        self._set_expiry("certificate_expiry", not_after_unix_s, "kvbudget_tls_certificate_expiry_timestamp_seconds",
                         "When the TLS certificate the TCP listeners present expires (unix time)")

    def set_client_ca_expiry(self, not_after_unix_s: float) -> None:
        """The first of the client CA certificates expires then (mutual TLS; at start and
        each reload); 0.0 exports nothing new."""
        self._set_expiry("client_ca_expiry", not_after_unix_s, "kvbudget_tls_client_ca_expiry_timestamp_seconds",
                         "When the first CA certificate that client certificates are verified against expires "
                         "(unix time)")

    def _set_expiry(self, attribute: str, not_after_unix_s: float, name: str, documentation: str) -> None:
        """Registers the gauge the first time it has a value (see __init__), then sets it."""
        if not not_after_unix_s:
            return
        with self._lock:
            gauge = getattr(self, attribute)
            if gauge is None:
                gauge = Gauge(name, documentation, registry=self.registry)
                setattr(self, attribute, gauge)
            gauge.set(not_after_unix_s)

    def update(self, snapshot: Snapshot, gpu: GpuMemory | None = None, log: LogFigures | None = None) -> None:
        """Set the gauges from a snapshot (and the GPU probe and the decision log, when given)."""
        with self._lock:
            self._register_once(self.kv_cache_usage, self.requests_waiting, self.requests_running, self.num_blocks)
            self.kv_cache_usage.set(snapshot.usage)
            self.requests_waiting.set(snapshot.num_waiting)
            self.requests_running.set(snapshot.num_running)
            self.num_blocks.set(snapshot.num_blocks)
            self.blocks.labels(state="free").set(snapshot.num_free_blocks - snapshot.num_evictable_blocks)
            self.blocks.labels(state="evictable").set(snapshot.num_evictable_blocks)
            self.blocks.labels(state="held").set(snapshot.num_held_blocks)
            self.blocks.labels(state="reserved").set(snapshot.num_reserved_blocks)
            self._set_labelled(self.policy, {(snapshot.policy,): 1.0})

            group_values: dict[tuple[str, ...], float] = {}
            for index, group in enumerate(snapshot.groups):
                labels = (group.kind, str(index))
                group_values[(*labels, "held")] = group.blocks_held
                group_values[(*labels, "reserved")] = group.blocks_reserved
                self._add_increase(self.group_reclaimed.labels(*labels), ("reclaimed", *labels),
                                   group.blocks_reclaimed)
            self._set_labelled(self.group_blocks, group_values)

            tenant_blocks, tenant_requests = _tenant_series(snapshot.tenants)
            self._set_labelled(self.tenant_blocks, tenant_blocks)
            self._set_labelled(self.tenant_requests, tenant_requests)

            self._add_increase(self.prefix_queries, ("prefix_queries",), snapshot.prefix_query_blocks)
            self._add_increase(self.prefix_hits, ("prefix_hits",), snapshot.prefix_hit_blocks)

            if log is not None:
                self._register_once(self.log_unwritten)
                self.log_bytes.labels(file="database").set(log.database_bytes)
                self.log_bytes.labels(file="wal").set(log.wal_bytes)
                self.log_unwritten.set(log.num_unwritten)
                self._add_increase(self.log_rows.labels(state="written"), ("log_rows_written",), log.rows_written)
                self._add_increase(self.log_rows.labels(state="folded"), ("log_rows_folded",), log.rows_folded)
                self._add_increase(self.log_wal_resets, ("log_wal_resets",), log.wal_resets)
                self._add_increase(self.log_stalls, ("log_stalls",), log.stalls)
                self._add_increase(self.log_stall_seconds, ("log_stall_seconds",), log.stall_seconds)

            if gpu is not None:
                self._register_once(self.gpu_present)
                self.gpu_present.set(1.0 if gpu.present else 0.0)
                if gpu.present:
                    self.gpu_memory.labels(state="total").set(gpu.total_bytes)
                    self.gpu_memory.labels(state="used").set(gpu.used_bytes)
                    self.gpu_memory.labels(state="free").set(gpu.free_bytes)

    def _register_once(self, *gauges: Gauge) -> None:
        """Registers each gauge the first time it has a value (see __init__)."""
        for gauge in gauges:
            if id(gauge) not in self._registered:
                self.registry.register(gauge)
                self._registered.add(id(gauge))

    def _add_increase(self, counter: Counter, key: tuple[str, ...], cumulative: float) -> None:
        last = self._last_cumulative.get(key, 0)
        # A smaller figure means the core was rebuilt: its count restarted from zero.
        increase = cumulative - last if cumulative >= last else cumulative
        if increase:
            counter.inc(increase)
        self._last_cumulative[key] = cumulative

    def _set_labelled(self, gauge: Gauge, values: dict[tuple[str, ...], float]) -> None:
        """Set a labelled gauge to exactly these series: ones no longer present are removed
        (a tenant removed, a policy switched) rather than frozen at their last value."""
        previous = self._last_labels.get(gauge._name, set())
        for labels in previous - values.keys():
            gauge.remove(*labels)
        for labels, value in values.items():
            gauge.labels(*labels).set(value)
        self._last_labels[gauge._name] = set(values)

    # ------------------------------------------------------------------ exposition
    def render(self) -> bytes:
        """The text exposition format, as /metrics serves it."""
        return generate_latest(self.registry)

    def start_http(self, host: str, port: int) -> int:
        """Serve /metrics on a background thread; returns the bound port (0 = ephemeral)."""
        if self._server is not None:
            raise RuntimeError("metrics HTTP server already started")
        self._server, self._server_thread = start_http_server(port, addr=host, registry=self.registry)
        return int(self._server.server_port)

    def stop(self) -> None:
        """Stop the HTTP server, if started. Idempotent."""
        server, thread = self._server, self._server_thread
        self._server = self._server_thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5.0)


TenantSeries = dict[tuple[str, ...], float]


def _tenant_series(tenants: Sequence[TenantSnapshot]) -> tuple[TenantSeries, TenantSeries]:
    """The (tenant, state) values of the blocks and requests gauges: the MAX_TENANT_SERIES
    tenants that matter most by name, the others summed under OTHER_TENANTS."""
    blocks: TenantSeries = {}
    requests: TenantSeries = {}
    named = tenants
    if len(tenants) > MAX_TENANT_SERIES:
        # One slot goes to the sum of the rest. nsmallest: O(n log k), and a fixed order for
        # ties (by name), so the same tenants keep their series from one update to the next.
        candidates = [t for t in tenants if t.tenant != OTHER_TENANTS]  # a tenant of that name joins the sum
        named = heapq.nsmallest(MAX_TENANT_SERIES - 1, candidates, key=_tenant_rank)
        kept = {t.tenant for t in named}
        rest = [t for t in tenants if t.tenant not in kept]
        _add_tenant(blocks, requests, OTHER_TENANTS, rest)
    for tenant in named:
        _add_tenant(blocks, requests, tenant.tenant, (tenant,))
    return blocks, requests


def _tenant_rank(tenant: TenantSnapshot) -> tuple[bool, int, int, str]:
    """Smallest first: tenants the config names (a quota or a weight: the operator's own
    dashboards name them), then by blocks held and reserved, then by requests."""
    configured = tenant.quota_blocks is not None or tenant.weight != 1.0
    return (not configured, -(tenant.blocks_held + tenant.blocks_reserved), -(tenant.running + tenant.waiting),
            tenant.tenant)


def _add_tenant(blocks: TenantSeries, requests: TenantSeries, name: str, tenants: Sequence[TenantSnapshot]) -> None:
    blocks[(name, "held")] = sum(t.blocks_held for t in tenants)
    blocks[(name, "reserved")] = sum(t.blocks_reserved for t in tenants)
    requests[(name, "running")] = sum(t.running for t in tenants)
    requests[(name, "waiting")] = sum(t.waiting for t in tenants)


def _value(enum_or_str: object) -> str:
    return str(getattr(enum_or_str, "value", enum_or_str))
