"""Prometheus metrics for the daemon, on their own registry (no process-global state).

Names are `kvbudget_` plus vLLM's where one exists, so dashboards built for vLLM read the
same way: `kv_cache_usage_perc` (a 0-1 ratio, like vLLM's despite the name),
`num_requests_waiting`, `num_requests_running`, `num_preemptions_total`. The rest break the
pool down by state, layer group and tenant, and count decisions by kind and reason.

Two feeds: `record()` with each batch of decisions (counters, latency) and `update()` with a
periodic snapshot (gauges). Cumulative figures the core keeps in its snapshot (prefix-cache
queries, blocks reclaimed) become counters by adding the increase since the last snapshot.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
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

from kvbudget import __version__
from kvbudget.daemon.records import Decision, DecisionKind, Snapshot

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

# From a few tens of microseconds (an in-memory decision) to a second (a slow disk commit).
LATENCY_BUCKETS_S = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)


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
        self.registry = CollectorRegistry(auto_describe=True)
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
        self.kv_cache_usage = Gauge(
            "kvbudget_kv_cache_usage_perc", "KV-cache usage: held blocks / pool blocks (0-1 ratio)", registry=r
        )
        self.requests_waiting = Gauge(
            "kvbudget_num_requests_waiting", "Requests waiting for admission", registry=r
        )
        self.requests_running = Gauge(
            "kvbudget_num_requests_running", "Requests admitted and holding blocks", registry=r
        )
        self.preemptions = Counter(
            "kvbudget_num_preemptions", "Running requests preempted, by reason", ["reason"], registry=r
        )
        self.num_blocks = Gauge("kvbudget_num_blocks", "Pool capacity in blocks (null block excluded)", registry=r)
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
            registry=r,
        )
        self.policy = Gauge("kvbudget_policy", "The admission policy in force (1 for it)", ["policy"], registry=r)
        self.gpu_present = Gauge("kvbudget_gpu_present", "1 when NVML sees a GPU", registry=r)
        self.gpu_memory = Gauge(
            "kvbudget_gpu_memory_bytes", "GPU memory by state (total, used, free), from NVML", ["state"], registry=r
        )
        self._lock = threading.Lock()  # update() reads and writes the "last seen" figures
        self._last_cumulative: dict[tuple[str, ...], float] = {}
        self._last_labels: dict[str, set[tuple[str, ...]]] = {}
        # (kind, reason) -> its decisions child and, for preempts, its preemptions child
        self._decision_children: dict[tuple[object, object], tuple[Counter, Counter | None]] = {}
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

            tenant_blocks: dict[tuple[str, ...], float] = {}
            tenant_requests: dict[tuple[str, ...], float] = {}
            for tenant in snapshot.tenants:
                tenant_blocks[(tenant.tenant, "held")] = tenant.blocks_held
                tenant_blocks[(tenant.tenant, "reserved")] = tenant.blocks_reserved
                tenant_requests[(tenant.tenant, "running")] = tenant.running
                tenant_requests[(tenant.tenant, "waiting")] = tenant.waiting
            self._set_labelled(self.tenant_blocks, tenant_blocks)
            self._set_labelled(self.tenant_requests, tenant_requests)

            self._add_increase(self.prefix_queries, ("prefix_queries",), snapshot.prefix_query_blocks)
            self._add_increase(self.prefix_hits, ("prefix_hits",), snapshot.prefix_hit_blocks)

            if log is not None:
                self.log_bytes.labels(file="database").set(log.database_bytes)
                self.log_bytes.labels(file="wal").set(log.wal_bytes)
                self.log_unwritten.set(log.num_unwritten)
                self._add_increase(self.log_rows.labels(state="written"), ("log_rows_written",), log.rows_written)
                self._add_increase(self.log_rows.labels(state="folded"), ("log_rows_folded",), log.rows_folded)
                self._add_increase(self.log_wal_resets, ("log_wal_resets",), log.wal_resets)
                self._add_increase(self.log_stalls, ("log_stalls",), log.stalls)
                self._add_increase(self.log_stall_seconds, ("log_stall_seconds",), log.stall_seconds)

            if gpu is not None:
                self.gpu_present.set(1.0 if gpu.present else 0.0)
                if gpu.present:
                    self.gpu_memory.labels(state="total").set(gpu.total_bytes)
                    self.gpu_memory.labels(state="used").set(gpu.used_bytes)
                    self.gpu_memory.labels(state="free").set(gpu.free_bytes)

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


def _value(enum_or_str: object) -> str:
    return str(getattr(enum_or_str, "value", enum_or_str))
