"""The daemon's Prometheus registry and the metric families on it. Names are `kvbudget_` plus
vLLM's where one exists, so dashboards built for vLLM read the same way; the registry leaves
out prometheus-client's `_created` samples (vLLM's /metrics has none)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import RestrictedRegistry

from kvbudget import __version__
from kvbudget.daemon.server.metrics_histograms import QueueTimeHistograms

# From a few tens of microseconds (an in-memory decision) to seconds: a commit held by the
# decision log's write stall (its upkeep behind: daemon/log/pacing.py) waits that long, and above
# 1 s it all read "+Inf" alike.
LATENCY_BUCKETS_S = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)


# A request's wait for admission, from admitted as it came (0) to minutes in a full pool.
QUEUE_TIME_BUCKETS_S = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

# A deprecated family's HELP starts so; it is served, unchanged, until the release named.
DEPRECATED = "Deprecated since 0.2, removed in 0.3:"

# No `<name>_created` samples (vLLM's /metrics has none): prometheus-client's own switch is
# process-global, so this registry leaves them out as it collects (docs/architecture/server.md).
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
    `_created` samples out, and first call `before_collect` (the gauges read at scrape:
    Metrics.read_at_scrape); registering, and every name, as in its base."""

    def __init__(self, auto_describe: bool = False) -> None:
        super().__init__(auto_describe=auto_describe)
        self.before_collect: Callable[[], None] | None = None

    def collect(self) -> Iterable[Metric]:
        if self.before_collect is not None:
            self.before_collect()
        return _without_created(super().collect())

    def restricted_registry(self, names: Iterable[str]) -> _Restricted:
        return _Restricted(super().restricted_registry(names), self.before_collect)


class _Restricted:
    """A restricted view (the HTTP server's, for `?name[]=`), less the `_created` samples:
    RestrictedRegistry reads the collectors itself, not through _Registry.collect()."""

    def __init__(self, restricted: RestrictedRegistry, before_collect: Callable[[], None] | None) -> None:
        self._restricted, self._before_collect = restricted, before_collect

    def collect(self) -> Iterable[Metric]:
        if self._before_collect is not None:
            self._before_collect()
        return _without_created(self._restricted.collect())


@dataclass(frozen=True)
class Families:
    """The metric families the daemon exports. Those a snapshot (or the GPU probe, or the log's
    figures) sets are not registered until `Metrics.update` first has a value for them: the
    HTTP server serves before the core starts (metrics_scrape.py), and until then they would read 0
    (a pool of 0 blocks, no GPU), which is a value, not the absence of one."""

    registry: CollectorRegistry
    # the pool (vLLM's names where one exists)
    kv_cache_usage: Gauge  # registered at the first update
    requests_waiting: Gauge  # registered at the first update
    requests_running: Gauge  # registered at the first update
    preemptions: Counter
    num_blocks: Gauge  # registered at the first update
    blocks: Gauge  # deprecated: pool_blocks and reserved_blocks (docs/operators-guide.md, "Deprecated metrics")
    pool_blocks: Gauge
    reserved_blocks: Gauge  # registered at the first update
    group_blocks: Gauge
    group_reclaimed: Counter
    tenant_blocks: Gauge
    tenant_requests: Gauge
    prefix_queries: Counter
    prefix_hits: Counter
    prefix_query_tokens: Counter  # registered by Metrics.describe_pool (they need the block size)
    prefix_hit_tokens: Counter  # registered by Metrics.describe_pool
    policy: Gauge
    model_info: Gauge  # registered by Metrics.describe_pool
    # decisions
    decisions: Counter
    decision_latency: Histogram
    queue_time: QueueTimeHistograms  # the whole, and by tenant
    # the decision log
    log_bytes: Gauge
    log_rows: Counter  # deprecated: log_rows_written and log_rows_folded
    log_rows_written: Counter
    log_rows_folded: Counter
    log_wal_resets: Counter
    log_stalls: Counter
    log_stall_seconds: Counter
    log_unwritten: Gauge  # registered at the first update with the log's figures
    # the GPU
    gpu_present: Gauge  # registered at the first update with a GPU probe
    gpu_memory: Gauge
    pool_gpu_memory: Gauge  # registered at the first update with a GPU seen


def define_families() -> Families:
    """A new registry (no `_created` samples: _Registry) with every family defined on it."""
    r = _Registry(auto_describe=True)
    _process_families(r)
    # (Registered in this order, which is the order /metrics lists them in.)
    return Families(
        r, **_pool_families(r), **_decision_families(r), **_log_families(r), **_policy_and_gpu_families(r)
    )


def _process_families(r: CollectorRegistry) -> None:
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


def _pool_families(r: CollectorRegistry) -> dict[str, Gauge | Counter]:
    return dict(
        kv_cache_usage=Gauge(
            "kvbudget_kv_cache_usage_perc", "KV-cache usage: held blocks / pool blocks (0-1 ratio)", registry=None
        ),
        requests_waiting=Gauge("kvbudget_num_requests_waiting", "Requests waiting for admission", registry=None),
        requests_running=Gauge(
            "kvbudget_num_requests_running", "Requests admitted and holding blocks", registry=None
        ),
        preemptions=Counter(
            "kvbudget_num_preemptions", "Running requests preempted, by reason", ["reason"], registry=r
        ),
        num_blocks=Gauge("kvbudget_num_blocks", "Pool capacity in blocks (null block excluded)", registry=None),
        blocks=Gauge(
            "kvbudget_blocks",
            f"{DEPRECATED} use kvbudget_pool_blocks and kvbudget_reserved_blocks: a sum over its states "
            "counts the reserved blocks twice. Pool blocks by state: free (never cached) + evictable "
            "(cached, unreferenced) + held = capacity; reserved = promised to running requests but not yet held",
            ["state"],
            registry=r,
        ),
        pool_blocks=Gauge(
            "kvbudget_pool_blocks",
            "Pool blocks by state, summing to kvbudget_num_blocks: free (never cached), evictable "
            "(cached, unreferenced), held",
            ["state"],
            registry=r,
        ),
        reserved_blocks=Gauge(
            "kvbudget_reserved_blocks",
            "Blocks promised to running requests but not yet held (among the free and evictable ones)",
            registry=None,
        ),
        group_blocks=Gauge(
            "kvbudget_group_blocks", "Blocks per KV-cache group and state (held, reserved)",
            ["layer_type", "group", "state"], registry=r,
        ),
        group_reclaimed=Counter(
            "kvbudget_group_blocks_reclaimed", "Blocks that left a sliding window / chunk, per group",
            ["layer_type", "group"], registry=r,
        ),
        tenant_blocks=Gauge(
            "kvbudget_tenant_blocks", "Blocks per tenant and state (held, reserved)", ["tenant", "state"], registry=r
        ),
        tenant_requests=Gauge(
            "kvbudget_tenant_requests", "Requests per tenant and state (running, waiting)",
            ["tenant", "state"], registry=r,
        ),
        prefix_queries=Counter(
            "kvbudget_prefix_cache_queries", "Prompt blocks looked up in the prefix cache", registry=r
        ),
        prefix_hits=Counter("kvbudget_prefix_cache_hits", "Prompt blocks found in the prefix cache", registry=r),
        **_prefix_token_families(),
    )


def _prefix_token_families() -> dict[str, Counter]:
    # Tokens, as vLLM counts its prefix cache (new names: the block counts stay as they are).
    return dict(
        prefix_query_tokens=Counter(
            "kvbudget_prefix_cache_query_tokens", "Prompt tokens looked up in the prefix cache (whole blocks)",
            ["model_name"], registry=None,
        ),
        prefix_hit_tokens=Counter(
            "kvbudget_prefix_cache_hit_tokens", "Prompt tokens found in the prefix cache", ["model_name"],
            registry=None,
        ),
    )


def _decision_families(r: CollectorRegistry) -> dict[str, object]:
    return dict(
        decisions=Counter("kvbudget_decisions", "Decisions by kind and reason", ["kind", "reason"], registry=r),
        decision_latency=Histogram(
            "kvbudget_decision_latency_seconds",
            "Time from an engine's call to its decisions being ready (log commit included)",
            buckets=LATENCY_BUCKETS_S, registry=r,
        ),
        queue_time=QueueTimeHistograms(  # (vLLM's vllm:request_queue_time_seconds)
            "kvbudget_request_queue_time_seconds",
            "Seconds from a request's submit to its first admission, on the daemon's clock (0: admitted "
            "as it came); one rejected or aborted while waiting is not observed",
            "kvbudget_tenant_request_queue_time_seconds",
            "kvbudget_request_queue_time_seconds by tenant: each tenant the config names, the others as (other)",
            QUEUE_TIME_BUCKETS_S, registry=r,
        ),
    )


def _log_families(r: CollectorRegistry) -> dict[str, Gauge | Counter]:
    return dict(
        log_bytes=Gauge(
            "kvbudget_decision_log_bytes", "Size of the decision log's files (database, wal)", ["file"], registry=r
        ),
        log_rows=Counter(
            "kvbudget_decision_log_rows",
            f"{DEPRECATED} use kvbudget_decision_log_rows_written_total and "
            "kvbudget_decision_log_rows_folded_total: a sum over its states counts a folded row twice. "
            "Decision log rows committed, and moved into the indexed table",
            ["state"], registry=r,
        ),
        log_rows_written=Counter(
            "kvbudget_decision_log_rows_written", "Decision log rows committed", registry=r
        ),
        log_rows_folded=Counter(
            "kvbudget_decision_log_rows_folded", "Decision log rows moved into the indexed table (each one "
            "written before)", registry=r,
        ),
        log_wal_resets=Counter(
            "kvbudget_decision_log_wal_resets", "Times the WAL was past its bound and was started over", registry=r
        ),
        log_stalls=Counter(
            "kvbudget_decision_log_stalls", "Times commits waited for the log's upkeep (too many rows unindexed or owed to retention)", registry=r
        ),
        log_stall_seconds=Counter(
            "kvbudget_decision_log_stall_seconds", "Time commits waited for the log's upkeep, in all", registry=r
        ),
        log_unwritten=Gauge(
            "kvbudget_decision_log_unwritten_decisions",
            "Decisions a failed log write left (a full disk), waiting to be written first; steps are refused while > 0",
            registry=None,
        ),
    )


def _policy_and_gpu_families(r: CollectorRegistry) -> dict[str, Gauge]:
    return dict(
        policy=Gauge("kvbudget_policy", "The admission policy in force (1 for it)", ["policy"], registry=r),
        # vLLM's series carry model_name; an info metric puts it (and the layout) on any other
        # by `* on(instance) group_left(model_name)`, the old series' labels left as they are.
        model_info=Gauge(
            "kvbudget_model_info", "The model this daemon budgets for and its pool's layout (always 1)",
            ["model_name", "block_size", "tensor_parallel_size", "pipeline_parallel_size"], registry=None,
        ),
        gpu_present=Gauge("kvbudget_gpu_present", "1 when NVML sees a GPU", registry=None),
        gpu_memory=Gauge(
            "kvbudget_gpu_memory_bytes", "GPU memory by state (total, used, free), from NVML", ["state"], registry=r
        ),
        # One series per GPU the pool spans (tensor x pipeline parallel) and state; `gpu` is
        # NVML's id (its host index, as nvidia-smi and DCGM number GPUs, or the UUID given).
        pool_gpu_memory=Gauge(
            "kvbudget_pool_gpu_memory_bytes", "Memory of each GPU the pool spans by state (total, used, free), "
            "from NVML", ["gpu", "state"], registry=None,
        ),
    )
