"""Prometheus metrics for the daemon, on their own registry (metrics_registry.py). Two feeds:
`record()` with each batch of decisions (counters, latency) and `update()` with a snapshot
(gauges), as each scrape asks (metrics_scrape.py); cumulative figures in the snapshot become
counters by their increase."""

from __future__ import annotations

import heapq
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from prometheus_client import Counter, Gauge, generate_latest
from prometheus_client.exposition import start_http_server

from kvbudget.daemon.core.records import OTHER_TENANTS, Decision, DecisionKind, Reason, Snapshot, TenantSnapshot
from kvbudget.daemon.server.metrics_registry import Families, define_families

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

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
    (DecisionKind.EXPIRE, Reason.DAEMON_RESTART),  # (the start's closing rows: closing.py)
    (DecisionKind.POLICY, Reason.SWITCH),
)

# Tenant names come from the engines' requests (often an end user or API key), not from
# the config, and an unbounded queue may hold any number of them: one series per tenant
# would let traffic decide the exporter's size (20,000 queued tenants made 80,000 series, a
# 5 MB scrape taking 4 s, and 0.4 s of every second spent on the event loop setting them).
# The largest tenants get their own series; the rest are summed into one, so a sum over
# tenants stays exact.
MAX_TENANT_SERIES = 50
_ADMIT, _QUEUE, _PREEMPT, _GROW = DecisionKind.ADMIT, DecisionKind.QUEUE, DecisionKind.PREEMPT, DecisionKind.GROW
_ENDS = (DecisionKind.REJECT, DecisionKind.RELEASE, DecisionKind.EXPIRE)  # a request's end: forget its wait


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


class PoolPlanFacts(Protocol):
    """What describe_pool reads from the pool's plan (a PoolPlan message)."""

    model: str
    block_size_tokens: int


class LayoutFacts(Protocol):
    """What describe_pool reads from the daemon's config (a DaemonConfig)."""

    tensor_parallel_size: int
    pipeline_parallel_size: int
    tenants: Iterable[str]  # the tenants the config names ([tenants.NAME])


class Metrics:
    def __init__(self) -> None:
        self.families: Families = define_families()
        self.registry = self.families.registry  # no `_created` samples (metrics_registry)
        # Registered by set_certificate_expiry / set_client_ca_expiry, with TLS (mutual TLS)
        # only: a 0 without would read as a certificate long expired to an alert on it.
        self.certificate_expiry: Gauge | None = None
        self.client_ca_expiry: Gauge | None = None
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
        self._waiting_since: dict[str, float] = {}  # request id -> its first QUEUE's time
        self._preempted: set[str] = set()  # request ids whose next ADMIT is a re-admission
        self._model_name, self._block_size = "", 0  # until describe_pool

    # ------------------------------------------------------------------ feeds
    def record(self, decisions: Sequence[Decision], latency_s: float | None = None) -> None:
        """Count one batch of decisions; `latency_s` is the batch's call-to-ready time.

        `labels()` costs several microseconds (it builds and locks a label key), so each
        (kind, reason) child is looked up once and kept; a batch adds one sum per pair.
        """
        counts: dict[tuple[str, str], int] = {}
        get = counts.get
        # The queue-time histogram: a request's first QUEUE starts its wait, its first ADMIT
        # ends it (one admitted at once waited 0); a preempted request's next admission is
        # not a new wait. Only live requests are followed: an end forgets them. (Inline: a
        # method call per decision cost more than the rest of the loop.)
        waiting, preempted, waits, tenants = self._waiting_since, self._preempted, [], []
        for decision in decisions:
            kind = decision.kind
            key = (kind, decision.reason)
            counts[key] = get(key, 0) + 1
            if kind is _GROW:  # (the commonest, and not a request's wait: one test)
                continue
            if kind is _ADMIT:
                queued_at = waiting.pop(decision.request_id, None)
                if decision.request_id in preempted:
                    preempted.discard(decision.request_id)
                else:
                    waits.append(decision.time_s - queued_at if queued_at is not None else 0.0)
                    tenants.append(decision.tenant)
            elif kind is _QUEUE:
                waiting.setdefault(decision.request_id, decision.time_s)
            elif kind is _PREEMPT:
                preempted.add(decision.request_id)
            elif kind in _ENDS and (waiting or preempted):
                waiting.pop(decision.request_id, None)
                preempted.discard(decision.request_id)
        if waits:
            self.families.queue_time.observe_all(waits, tenants)
        children = self._decision_children
        for key, count in counts.items():
            pair = children.get(key)
            if pair is None:
                pair = children[key] = self._children_of(*key)
            pair[0].inc(count)
            if pair[1] is not None:
                pair[1].inc(count)
        if latency_s is not None:
            self.families.decision_latency.observe(latency_s)

    def _children_of(self, kind: object, reason: object) -> tuple[Counter, Counter | None]:
        """The decisions counter's child for (kind, reason), and the preemptions one for a preempt."""
        kind_text, reason_text = _value(kind), _value(reason)
        families = self.families
        preempt = families.preemptions.labels(reason=reason_text) if kind_text == DecisionKind.PREEMPT.value else None
        return families.decisions.labels(kind=kind_text, reason=reason_text), preempt

    def describe_pool(self, plan: PoolPlanFacts, config: LayoutFacts) -> None:
        """What the daemon serves, once at start: kvbudget_model_info, model_name on the
        series that carry it, the prefix cache in tokens, and the tenants the config names
        (each its own queue-time series; a reload's new ones are named by update())."""
        f = self.families
        with self._lock:
            self._model_name, self._block_size = plan.model, plan.block_size_tokens
            f.queue_time.model_name = plan.model
            f.queue_time.name_tenants(config.tenants)
            self._register_once(f.model_info, f.prefix_query_tokens, f.prefix_hit_tokens)
            f.model_info.labels(plan.model, str(plan.block_size_tokens), str(config.tensor_parallel_size),
                                str(config.pipeline_parallel_size)).set(1)
            f.prefix_query_tokens.labels(plan.model)
            f.prefix_hit_tokens.labels(plan.model)

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
            self._update_pool(snapshot)
            if log is not None:
                self._update_log(log)
            if gpu is not None:
                self._update_gpu(gpu)

    def _update_pool(self, snapshot: Snapshot) -> None:
        f = self.families
        self._register_once(f.kv_cache_usage, f.requests_waiting, f.requests_running, f.num_blocks,
                            f.reserved_blocks)
        f.kv_cache_usage.set(snapshot.usage)
        f.requests_waiting.set(snapshot.num_waiting)
        f.requests_running.set(snapshot.num_running)
        f.num_blocks.set(snapshot.num_blocks)
        f.blocks.labels(state="free").set(snapshot.num_free_blocks - snapshot.num_evictable_blocks)
        f.blocks.labels(state="evictable").set(snapshot.num_evictable_blocks)
        f.blocks.labels(state="held").set(snapshot.num_held_blocks)
        f.blocks.labels(state="reserved").set(snapshot.num_reserved_blocks)
        f.pool_blocks.labels(state="free").set(snapshot.num_free_blocks - snapshot.num_evictable_blocks)
        f.pool_blocks.labels(state="evictable").set(snapshot.num_evictable_blocks)
        f.pool_blocks.labels(state="held").set(snapshot.num_held_blocks)
        f.reserved_blocks.set(snapshot.num_reserved_blocks)
        self._set_labelled(f.policy, {(snapshot.policy,): 1.0})

        group_values: dict[tuple[str, ...], float] = {}
        for index, group in enumerate(snapshot.groups):
            labels = (group.kind, str(index))
            group_values[(*labels, "held")] = group.blocks_held
            group_values[(*labels, "reserved")] = group.blocks_reserved
            self._add_increase(f.group_reclaimed.labels(*labels), ("reclaimed", *labels), group.blocks_reclaimed)
        self._set_labelled(f.group_blocks, group_values)

        tenant_blocks, tenant_requests = tenant_series(snapshot.tenants)
        self._set_labelled(f.tenant_blocks, tenant_blocks)
        self._set_labelled(f.tenant_requests, tenant_requests)

        self._add_increase(f.prefix_queries, ("prefix_queries",), snapshot.prefix_query_blocks)
        self._add_increase(f.prefix_hits, ("prefix_hits",), snapshot.prefix_hit_blocks)
        if self._block_size:  # (described: the block size known)
            self._add_increase(f.prefix_query_tokens.labels(self._model_name), ("prefix_query_tokens",),
                               snapshot.prefix_query_blocks * self._block_size)
            self._add_increase(f.prefix_hit_tokens.labels(self._model_name), ("prefix_hit_tokens",),
                               snapshot.prefix_hit_blocks * self._block_size)
        f.queue_time.name_tenants(t.tenant for t in snapshot.tenants if _configured(t))

    def _update_log(self, log: LogFigures) -> None:
        f = self.families
        self._register_once(f.log_unwritten)
        f.log_bytes.labels(file="database").set(log.database_bytes)
        f.log_bytes.labels(file="wal").set(log.wal_bytes)
        f.log_unwritten.set(log.num_unwritten)
        self._add_increase(f.log_rows.labels(state="written"), ("log_rows_written",), log.rows_written)  # deprecated
        self._add_increase(f.log_rows.labels(state="folded"), ("log_rows_folded",), log.rows_folded)  # deprecated
        self._add_increase(f.log_rows_written, ("log_rows_written_total",), log.rows_written)
        self._add_increase(f.log_rows_folded, ("log_rows_folded_total",), log.rows_folded)
        self._add_increase(f.log_wal_resets, ("log_wal_resets",), log.wal_resets)
        self._add_increase(f.log_stalls, ("log_stalls",), log.stalls)
        self._add_increase(f.log_stall_seconds, ("log_stall_seconds",), log.stall_seconds)

    def _update_gpu(self, gpu: GpuMemory) -> None:
        f = self.families
        self._register_once(f.gpu_present)
        f.gpu_present.set(1.0 if gpu.present else 0.0)
        if gpu.present:
            f.gpu_memory.labels(state="total").set(gpu.total_bytes)
            f.gpu_memory.labels(state="used").set(gpu.used_bytes)
            f.gpu_memory.labels(state="free").set(gpu.free_bytes)
        from kvbudget.daemon.config.gpu import pool_gpus

        per_gpu = {
            (_gpu_label(g), state): getattr(g, f"{state}_bytes")
            for g in pool_gpus(gpu) if g.present for state in ("total", "used", "free")  # type: ignore[attr-defined]
        }
        if per_gpu or id(f.pool_gpu_memory) in self._registered:
            self._register_once(f.pool_gpu_memory)
            self._set_labelled(f.pool_gpu_memory, per_gpu)

    def _register_once(self, *gauges: Gauge) -> None:
        """Registers each gauge the first time it has a value (see metrics_registry.Families)."""
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


def tenant_series(tenants: Sequence[TenantSnapshot]) -> tuple[TenantSeries, TenantSeries]:
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
    return (not _configured(tenant), -(tenant.blocks_held + tenant.blocks_reserved), -(tenant.running + tenant.waiting),
            tenant.tenant)


def _configured(tenant: TenantSnapshot) -> bool:
    """A tenant the config names, as a snapshot tells (a quota or a weight)."""
    return tenant.quota_blocks is not None or tenant.weight != 1.0


def _add_tenant(blocks: TenantSeries, requests: TenantSeries, name: str, tenants: Sequence[TenantSnapshot]) -> None:
    blocks[(name, "held")] = sum(t.blocks_held for t in tenants)
    blocks[(name, "reserved")] = sum(t.blocks_reserved for t in tenants)
    requests[(name, "running")] = sum(t.running for t in tenants)
    requests[(name, "waiting")] = sum(t.waiting for t in tenants)


def _value(enum_or_str: object) -> str:
    return str(getattr(enum_or_str, "value", enum_or_str))


def _gpu_label(gpu: object) -> str:
    """The `gpu` label: NVML's id of the GPU, else (a probe that did not say) CUDA's index."""
    return str(getattr(gpu, "nvml_device", "") or getattr(gpu, "index", 0))
