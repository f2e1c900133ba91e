"""What `kvbudget doctor` reads and what it reports: the data of the diagnosis.

A series of daemon snapshots, each reduced to a `PoolSample` (`sample_from_snapshot`);
the pool the configuration implies (`expectation_from_config`); and the `Finding`s and
`Diagnosis` that the doctor's checks make of them, with the thresholds they use. Plain
frozen dataclasses: tests stage series by hand, `cmd_doctor` fills them from the daemon.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from kvbudget.daemon.wire import convert
from kvbudget.client.pressure import POOL_FULL_SHARE
from kvbudget.v1 import common_pb2

MiB = 1 << 20


class Verdict(str, enum.Enum):
    HEALTHY = "healthy"
    BUDGET_BOUND = "budget-bound"
    POOL_BOUND = "pool-bound"
    MEMORY_GROWING = "memory growing outside the pool"
    STUCK_QUEUE = "stuck queue (formula drift)"
    LOG_CANNOT_WRITE = "decision log cannot write"


class Status(str, enum.Enum):
    OK = "ok"
    INFO = "info"
    WARN = "warn"
    PROBLEM = "problem"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class GpuSample:
    present: bool
    total_bytes: int = 0
    used_bytes: int = 0
    pool_bytes: int = 0
    other_processes_bytes: int = 0
    note: str = ""
    label: str = ""  # which GPU: "cuda:1 (NVML 5)" (CUDA's index, NVML's id when the daemon says it)


@dataclass(frozen=True)
class PlanView:
    """The pool as the daemon sized it (the snapshot's PoolPlan)."""

    num_blocks: int
    bytes_per_block: int
    block_size: int
    max_model_len: int
    memory_bytes: int = 0  # size of the memory handle; 0 in accounting-only mode
    # What one request at max_model_len commits, in every KV-cache group (a window caps a
    # sliding group's share); 0: the plan does not say (no groups, or one not understood).
    blocks_at_max_model_len: int = 0
    model: str = ""  # the model the daemon serves (its plan's name); "": not said


@dataclass(frozen=True)
class TenantSample:
    tenant: str
    held: int
    reserved: int
    quota_blocks: int  # 0: no quota
    waiting: int


@dataclass(frozen=True)
class PoolSample:
    """One snapshot, reduced to what the checks read."""

    time_s: float
    policy: str
    num_blocks: int
    free: int  # free + evictable
    held: int
    reserved: int  # promised but not yet held
    running: int
    waiting: int
    preemptions: int
    admits: int  # cumulative ADMIT decisions
    rejections_by_reason: Mapping[str, int] = field(default_factory=dict)
    # What holds the queue: waiting requests by why their last try failed (tenant_quota, ...)
    waiting_by_reason: Mapping[str, int] = field(default_factory=dict)
    gpu: GpuSample = GpuSample(present=False)
    gpus: tuple[GpuSample, ...] = ()  # every GPU the pool spans, `gpu` first (tensor x pipeline parallel)
    plan: PlanView | None = None
    tenants: tuple[TenantSample, ...] = ()
    draining: bool = False
    # The decision log's upkeep, cumulative: times commits waited for it, and how long.
    log_stalls: int = 0
    log_stall_s: float = 0.0
    log_unindexed: int = 0  # rows committed but not yet moved into the indexed table
    log_bytes: int = 0  # the log's database file and WAL
    log_max_bytes: int = 0  # its retention bound on the database file; 0: none
    log_disk_free_bytes: int = 0  # the file system holding it (0 and 0: not reported)
    log_disk_total_bytes: int = 0
    log_unwritten: int = 0  # decisions a failed write left, waiting (steps are refused meanwhile)
    log_write_error: str = ""
    # Which daemon process answered: when it started (wall clock) and the kvbudget version
    # it runs. 0 and "": an older daemon that does not say.
    daemon_started_s: float = 0.0
    daemon_version: str = ""


@dataclass(frozen=True)
class PoolExpectation:
    """What the configuration implies for the pool (see `expectation_from_config`)."""

    source: str  # "num_gpu_blocks" | "kv_cache_memory_bytes" | "gpu_memory" | "" (unavailable)
    num_blocks: int | None = None  # exact, when the config pins it
    max_pool_bytes: int | None = None  # upper bound, when sized from GPU memory
    explanation: str = ""
    # What the config itself means, worked out from its own model (kvbudget.cli.doctor_config):
    model: str = ""  # "": not worked out (compare the pool size only)
    block_size: int = 0
    bytes_per_block: int = 0
    unavailable: str = ""  # why the config could not be compared: a problem of its own


@dataclass(frozen=True)
class Thresholds:
    # held (or committed) share, the mean under pressure, that counts as full: the dashboard's bar too
    full_share: float = POOL_FULL_SHARE
    mostly_free_share: float = 0.5  # held share under which the pool counts as mostly free
    reservation_ratio: float = 4.0  # reserved >= ratio x held: max_model_len-style reservations
    memory_growth_bytes: int = 256 * MiB  # GPU memory rise that is not noise
    memory_growth_share: float = 0.01  # ... or this share of the GPU, whichever is larger
    log_disk_free_share: float = 0.1  # the log's disk counts as nearly full under this share free


@dataclass(frozen=True)
class Finding:
    check: str
    status: Status
    summary: str
    knob: str = ""
    data: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Diagnosis:
    verdict: Verdict
    knob: str
    findings: tuple[Finding, ...]
    num_samples: int
    window_s: float
    daemon_version: str = ""  # "": the daemon does not say
    daemon_uptime_s: float | None = None  # at the last sample, on the daemon's clock; None: not said
    binds: str = "nothing"  # the limit that holds the queue back (doctor_binds.BINDS)
    because: str = ""  # the figures that show it: the verdict line's clause

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.HEALTHY and not any(
            f.status is Status.PROBLEM for f in self.findings
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "verdict": self.verdict.value,
            "ok": self.ok,
            "binds": self.binds,
            "because": self.because,
            "knob": self.knob,
            "num_samples": self.num_samples,
            "window_s": round(self.window_s, 3),
            "daemon_version": self.daemon_version,
            "daemon_uptime_s": None if self.daemon_uptime_s is None else round(self.daemon_uptime_s, 3),
            "findings": [
                {**asdict(f), "status": f.status.value, "data": dict(f.data)} for f in self.findings
            ],
        }


# --------------------------------------------------------------------------- intake


def sample_from_snapshot(msg: common_pb2.Snapshot) -> PoolSample:
    """One `kvbudget.v1.Snapshot` message, as GetSnapshot or Watch returns it."""
    by_kind = {str(k).lower(): int(v) for k, v in msg.decisions_by_kind.items()}
    return PoolSample(
        time_s=float(msg.time_unix_s),
        policy=convert.policy_from_proto(msg.policy) or "unspecified",
        num_blocks=int(msg.num_blocks),
        free=int(msg.num_free_blocks),
        held=int(msg.num_held_blocks),
        reserved=int(msg.num_reserved_blocks),
        running=int(msg.num_running),
        waiting=int(msg.num_waiting),
        preemptions=int(msg.num_preemptions),
        admits=by_kind.get("admit", by_kind.get("decision_kind_admit", 0)),
        rejections_by_reason=dict(msg.rejections_by_reason),
        waiting_by_reason={str(k): int(v) for k, v in msg.waiting_by_reason.items()},
        gpu=_gpu_sample(msg.gpu),
        gpus=tuple(_gpu_sample(g) for g in msg.gpus),
        plan=_plan_view(msg.plan) if msg.HasField("plan") else None,
        tenants=tuple(_tenant_sample(t) for t in msg.tenants),
        draining=bool(msg.draining),
        log_stalls=int(msg.decision_log.stalls),
        log_stall_s=float(msg.decision_log.stall_s),
        log_unindexed=max(0, int(msg.decision_log.rows_written) - int(msg.decision_log.rows_folded)),
        log_bytes=int(msg.decision_log.database_bytes) + int(msg.decision_log.wal_bytes),
        log_max_bytes=int(msg.decision_log.max_bytes),
        log_disk_free_bytes=int(msg.decision_log.disk_free_bytes),
        log_disk_total_bytes=int(msg.decision_log.disk_total_bytes),
        log_unwritten=int(msg.decision_log.num_unwritten_decisions),
        log_write_error=msg.decision_log.write_error,
        daemon_started_s=float(msg.started_unix_s),
        daemon_version=msg.daemon_version,
    )


def _gpu_sample(gpu: common_pb2.GpuState) -> GpuSample:
    return GpuSample(
        present=bool(gpu.present),
        total_bytes=int(gpu.total_bytes),
        used_bytes=int(gpu.used_bytes),
        pool_bytes=int(gpu.pool_bytes),
        other_processes_bytes=int(gpu.other_processes_bytes),
        note=str(gpu.note),
        label=f"cuda:{gpu.index}" + (f" (NVML {gpu.nvml_device})" if gpu.nvml_device else ""),
    )


def _plan_view(plan: common_pb2.PoolPlan) -> PlanView:
    return PlanView(
        num_blocks=int(plan.num_blocks),
        bytes_per_block=int(plan.bytes_per_block),
        block_size=int(plan.block_size_tokens),
        max_model_len=int(plan.max_model_len_tokens),
        memory_bytes=int(plan.memory.size_bytes) if plan.HasField("memory") else 0,
        blocks_at_max_model_len=_blocks_at_max_model_len(plan),
        model=plan.model,
    )


def _tenant_sample(t: common_pb2.TenantState) -> TenantSample:
    return TenantSample(
        tenant=t.tenant,
        held=int(t.blocks_held),
        reserved=int(t.blocks_reserved),
        quota_blocks=int(t.quota_blocks),
        waiting=int(t.waiting),
    )


def expectation_from_config(
    *,
    bytes_per_block: int,
    num_gpu_blocks: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    gpu_total_bytes: int | None = None,
    gpu_memory_utilization: float = 0.9,
    weights_bytes: int | None = None,
    activation_reserve_bytes: int | None = None,
) -> PoolExpectation | None:
    """The pool the configuration implies, in the sizing module's order of sources.

    From GPU memory the daemon also subtracts overhead it measures, so only an upper bound
    is implied there: total x utilization minus the weights and activation reserve given.
    """
    if bytes_per_block <= 0:
        raise ValueError(f"bytes_per_block must be > 0, got {bytes_per_block}")
    # Both sources count block 0, the null block, which is never handed out; the plan
    # counts the usable ones (as `kvbudget daemon --check-config` says: "N usable + the null block").
    if num_gpu_blocks is not None:
        return PoolExpectation(
            source="num_gpu_blocks",
            num_blocks=num_gpu_blocks - 1,
            explanation=f"num_gpu_blocks = {num_gpu_blocks}: {num_gpu_blocks - 1} usable + the null block",
        )
    if kv_cache_memory_bytes is not None:
        blocks = kv_cache_memory_bytes // bytes_per_block
        return PoolExpectation(
            source="kv_cache_memory_bytes",
            num_blocks=blocks - 1,
            explanation=f"kv_cache_memory_bytes {kv_cache_memory_bytes} // {bytes_per_block} B per block = {blocks}: "
            f"{blocks - 1} usable + the null block",
        )
    if gpu_total_bytes:
        usable = int(gpu_total_bytes * gpu_memory_utilization)
        bound = usable - (weights_bytes or 0) - (activation_reserve_bytes or 0)
        return PoolExpectation(
            source="gpu_memory",
            max_pool_bytes=max(0, bound),
            explanation=(
                f"{gpu_total_bytes} B x gpu_memory_utilization {gpu_memory_utilization} = {usable} B"
                f", minus weights {weights_bytes or 0} B and activation reserve "
                f"{activation_reserve_bytes or 0} B"
            ),
        )
    return None


def _blocks_at_max_model_len(plan: common_pb2.PoolPlan) -> int:
    """The dashboard's figure too (kvbudget.client.pool_parts), so the two say the same."""
    from kvbudget.client.pool_parts import blocks_at_max_model_len

    return blocks_at_max_model_len(plan)
