"""Records <-> proto messages: decisions, kinds, policies, submits, the plan, the snapshot.

The core speaks `records` (plain dataclasses, strings for kinds and policies); the wire
speaks `kvbudget.v1` (enums with an UNSPECIFIED zero). Nothing else converts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, MutableSequence, Sequence
from typing import Any

from kvbudget.daemon.core.records import Decision, DecisionKind, Reason, RequestSpec, Snapshot, new_request_spec
from kvbudget.daemon.config.sizing import kv_tokens
from kvbudget.daemon.core.spec import KVCacheLayout, LayerKind
from kvbudget.v1 import common_pb2, engine_pb2

_KIND_TO_PROTO = {kind: getattr(common_pb2, f"DECISION_KIND_{kind.name}") for kind in DecisionKind}
_KIND_FROM_PROTO = {value: kind for kind, value in _KIND_TO_PROTO.items()}
POLICY_NAMES = ("optimistic", "guaranteed", "predictive", "naive")
_POLICY_TO_PROTO = {name: getattr(common_pb2, f"POLICY_{name.upper()}") for name in POLICY_NAMES}
_POLICY_FROM_PROTO = {value: name for name, value in _POLICY_TO_PROTO.items()}
# A group's layer type, as the enum beside its name (LayerKind's values are the names).
_LAYER_TO_PROTO = {kind.value: getattr(common_pb2, f"LAYER_TYPE_{kind.value.upper()}") for kind in LayerKind}
# `Reason.X.value` is a slow descriptor; a dict lookup is not (one per decision sent).
_REASON_TEXT = {reason: reason.value for reason in Reason}


def kind_to_proto(kind: DecisionKind | str) -> int:
    return _KIND_TO_PROTO.get(DecisionKind(kind), common_pb2.DECISION_KIND_UNSPECIFIED)


def kind_from_proto(value: int) -> DecisionKind | None:
    """None for UNSPECIFIED or a value this build does not know."""
    return _KIND_FROM_PROTO.get(value)


def policy_to_proto(policy: str) -> int:
    return _POLICY_TO_PROTO.get(policy, common_pb2.POLICY_UNSPECIFIED)


def policy_from_proto(value: int) -> str | None:
    return _POLICY_FROM_PROTO.get(value)


def fill_replay_policy(replay: common_pb2.ReplayState) -> str | None:
    """A replay report's policy in both fields, from the one it sets (older replayers send the
    deprecated name, newer the enum); the refusal's message for an enum value not known here."""
    if replay.admission_policy:
        name = _POLICY_FROM_PROTO.get(replay.admission_policy)
        if name is None:
            return f"replay.admission_policy: unknown value {replay.admission_policy}"
        if not replay.policy:
            replay.policy = name
    elif replay.policy in _POLICY_TO_PROTO:
        replay.admission_policy = _POLICY_TO_PROTO[replay.policy]
    return None


def kind_name(value: int) -> str:
    """A message's kind as a reader shows it: the record's name ("admit"), or, where the
    record has none, the enum's ("unspecified") or the number of a kind newer than this build."""
    kind = _KIND_FROM_PROTO.get(value)
    return kind.value if kind is not None else _enum_text(common_pb2.DecisionKind, value, "DECISION_KIND_")


def policy_name(value: int) -> str:
    """A message's policy as a reader shows it (as `kind_name`)."""
    name = _POLICY_FROM_PROTO.get(value)
    return name if name is not None else _enum_text(common_pb2.Policy, value, "POLICY_")


def _enum_text(enum_type: Any, value: int, prefix: str) -> str:
    try:
        return enum_type.Name(value).removeprefix(prefix).lower()
    except ValueError:
        return str(value)


def decision_to_proto(d: Decision) -> common_pb2.Decision:
    return _build_decision(common_pb2.Decision, d)


def add_decisions(
    target: MutableSequence[common_pb2.Decision], decisions: Sequence[Decision], engine_id: str | None = None
) -> None:
    """Appends decisions to a message's repeated `decisions` field, built in place.

    Hot path (every decision of every Step reply): `target.add()` builds each message
    where it will live; building them apart and passing the list to the reply's
    constructor costs a copy of each, about a quarter more. With `engine_id`, only the
    decisions of that engine are added.
    """
    make = target.add  # type: ignore[attr-defined]
    if len(decisions) == 1:  # a step's own decision, as a rule
        (d,) = decisions
        if engine_id is None or d.engine_id == engine_id:
            _build_decision(make, d)
        return
    for d in decisions:
        if engine_id is None or d.engine_id == engine_id:
            _build_decision(make, d)


def _build_decision(make: Callable[[], common_pb2.Decision], d: Decision) -> common_pb2.Decision:
    """`make` is the message class or a repeated field's `add`: both make an empty message.

    Hot path: fields are set one by one, which upb does in about half the time it takes to
    read the same fields as constructor keywords, and a field at its default value (0, "")
    is left unset, which is the same message on the wire.
    """
    m = make()
    m.seq = d.seq
    m.time_unix_s = d.time_s
    m.kind = _KIND_TO_PROTO.get(d.kind) or kind_to_proto(d.kind)
    m.reason = _REASON_TEXT.get(d.reason) or Reason(d.reason).value
    m.request_id = d.request_id
    m.engine_id = d.engine_id
    if d.tenant:
        m.tenant = d.tenant
    m.policy = _POLICY_TO_PROTO.get(d.policy, common_pb2.POLICY_UNSPECIFIED)
    m.prompt_tokens = d.prompt_tokens
    if d.max_new_tokens > 0:  # a prompt past max_model_len is rejected with max_len < prompt
        m.max_new_tokens = d.max_new_tokens
    if d.num_tokens:
        m.num_tokens = d.num_tokens
    if d.num_computed:
        m.num_computed_tokens = d.num_computed
    if d.blocks_reserved:
        m.blocks_reserved.extend(d.blocks_reserved)
    if d.blocks_held:
        m.blocks_held.extend(d.blocks_held)
    if d.new_block_ids:
        new_blocks = m.new_blocks
        for i, ids in enumerate(d.new_block_ids):
            if ids:
                group = new_blocks.add()
                if i:
                    group.group_index = i
                group.block_ids.extend(ids)
    if d.freed_blocks:
        m.freed_blocks = d.freed_blocks
    if d.cached_hit_blocks:
        m.cached_hit_blocks = d.cached_hit_blocks
    m.num_free_blocks = d.num_free_blocks
    if d.num_waiting:
        m.num_waiting = d.num_waiting
    if d.num_running:
        m.num_running = d.num_running
    if d.detail:
        m.detail = d.detail
    return m


def decision_from_proto(m: common_pb2.Decision) -> Decision:
    """The inverse of `decision_to_proto` (clients and the replayer use it)."""
    num_groups = max(len(m.blocks_held), len(m.blocks_reserved), 0)
    new_ids: list[tuple[int, ...]] = [() for _ in range(num_groups)]
    for group in m.new_blocks:
        while len(new_ids) <= group.group_index:
            new_ids.append(())
        new_ids[group.group_index] = tuple(group.block_ids)
    return Decision(
        seq=m.seq,
        time_s=m.time_unix_s,
        kind=kind_from_proto(m.kind) or DecisionKind.ADMIT,
        reason=Reason(m.reason) if m.reason in Reason._value2member_map_ else Reason.NONE,
        request_id=m.request_id,
        engine_id=m.engine_id,
        tenant=m.tenant,
        policy=policy_from_proto(m.policy) or "",
        prompt_tokens=m.prompt_tokens,
        max_new_tokens=m.max_new_tokens,
        num_tokens=m.num_tokens,
        num_computed=m.num_computed_tokens,
        blocks_reserved=tuple(m.blocks_reserved),
        blocks_held=tuple(m.blocks_held),
        new_block_ids=tuple(new_ids),
        freed_blocks=m.freed_blocks,
        cached_hit_blocks=m.cached_hit_blocks,
        num_free_blocks=m.num_free_blocks,
        num_waiting=m.num_waiting,
        num_running=m.num_running,
        detail=m.detail,
    )


def submit_to_spec(submit: engine_pb2.Submit, engine_id: str, now: float) -> RequestSpec:
    # One per submit of every Step: a set max_new_tokens is almost never 0, so HasField (a
    # field lookup by name) is asked only then; most submits carry no prefix hashes.
    hashes = submit.prefix_hashes
    return new_request_spec(
        submit.request_id,
        submit.prompt_tokens,
        submit.max_new_tokens or (0 if submit.HasField("max_new_tokens") else None),
        tuple(hashes) if hashes else (),
        submit.priority,
        submit.tenant,
        engine_id,
        submit.deadline_unix_s or None,
        now,
    )


def layout_fingerprint(layout: KVCacheLayout, num_blocks: int) -> str:
    """Short, stable id of the model layout and pool size an engine must agree with."""
    digest = hashlib.sha256(repr((layout.groups, layout.block_size, num_blocks)).encode())
    name = layout.model_name or "model"
    return f"{name}:{digest.hexdigest()[:12]}"


def plan_to_proto(
    layout: KVCacheLayout,
    num_blocks: int,
    *,
    max_model_len: int,
    max_num_batched_tokens: int,
    memory: object | None = None,
) -> common_pb2.PoolPlan:
    """The pool plan engines receive; `memory` is a pool_memory.PoolMemory or None."""
    groups = []
    for i, group in enumerate(layout.groups):
        spec = group.spec
        groups.append(
            common_pb2.KVCacheGroup(
                group_index=i,
                layer_type=spec.kind.value,
                layer_kind=_LAYER_TO_PROTO[spec.kind.value],
                description=spec.describe(),
                layer_ids=group.layer_ids,
                sliding_window_tokens=getattr(spec, "sliding_window", 0),
                attention_chunk_tokens=getattr(spec, "attention_chunk_size", 0),
                token_cap=getattr(spec, "token_cap", 0),
                max_encoder_tokens=getattr(spec, "max_encoder_tokens", 0),
                state_pages_per_request=getattr(spec, "pages_per_request", 0),
            )
        )
    plan = common_pb2.PoolPlan(
        model=layout.model_name,
        block_size_tokens=layout.block_size,
        num_blocks=num_blocks,
        page_size_bytes=layout.page_size_bytes,
        layers_per_group=layout.group_size,
        bytes_per_block=layout.bytes_per_block,
        groups=groups,
        max_model_len_tokens=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
        kv_tokens=kv_tokens(num_blocks, layout),  # vLLM's "GPU KV cache size"
        model_fingerprint=layout_fingerprint(layout, num_blocks),
    )
    if memory is not None:
        plan.memory.CopyFrom(
            common_pb2.MemoryHandle(
                device=str(getattr(memory, "device", "")),
                shm_name=getattr(memory, "shm_name", None) or "",
                cuda_ipc_handle=getattr(memory, "cuda_ipc_handle", None) or b"",
                size_bytes=int(getattr(memory, "size_bytes", 0)),
                offset_bytes=int(getattr(memory, "offset_bytes", 0)),
                layout=getattr(memory, "layout", "") or "",
            )
        )
    return plan




def gpu_to_proto(gpu: object | None, pool_bytes: int = 0, own_pid: int | None = None) -> common_pb2.GpuState:
    """A gpu.GPUProbe (duck-typed: the probe module is optional at import); None: device=cpu.

    `other_processes_bytes` is what processes other than `own_pid` (the daemon, whose
    usage is the pool) hold on the GPU: memory the pool cannot count on.
    """
    if gpu is None:
        return common_pb2.GpuState(present=False, note="no GPU: device=cpu", pool_bytes=pool_bytes)
    processes = getattr(gpu, "processes", ()) or ()
    other = 0
    for proc in processes:
        used = getattr(proc, "used_bytes", None)
        pid = getattr(proc, "pid", None)
        if isinstance(proc, Mapping):
            used = proc.get("used_bytes", 0) if used is None else used
            pid = proc.get("pid") if pid is None else pid
        if own_pid is not None and pid == own_pid:
            continue
        other += int(used or 0)
    return common_pb2.GpuState(
        present=bool(getattr(gpu, "present", False)),
        name=str(getattr(gpu, "name", "") or ""),
        total_bytes=int(getattr(gpu, "total_bytes", 0) or 0),
        used_bytes=int(getattr(gpu, "used_bytes", 0) or 0),
        free_bytes=int(getattr(gpu, "free_bytes", 0) or 0),
        pool_bytes=pool_bytes,
        other_processes_bytes=other,
        note=str(getattr(gpu, "note", "") or ""),
        index=int(getattr(gpu, "index", 0) or 0),
        nvml_device=str(getattr(gpu, "nvml_device", "") or ""),
    )


def gpus_to_proto(gpu: object | None, pool_bytes: int = 0, own_pid: int | None = None) -> list[common_pb2.GpuState]:
    """Each GPU the pool spans (gpu.pool_gpus; none with device=cpu): the daemon's own
    memory, `pool_bytes`, lives on the first, the only one memory_mode owned allows."""
    if gpu is None:
        return []
    from kvbudget.daemon.config.gpu import pool_gpus

    return [gpu_to_proto(g, pool_bytes if i == 0 else 0, own_pid) for i, g in enumerate(pool_gpus(gpu))]


def snapshot_to_proto(
    s: Snapshot,
    *,
    engines: Iterable[common_pb2.EngineState] = (),
    gpu: common_pb2.GpuState | None = None,
    gpus: Iterable[common_pb2.GpuState] = (),
    replays: Iterable[common_pb2.ReplayState] = (),
    draining: bool = False,
    plan: common_pb2.PoolPlan | None = None,
    decision_log: Any = None,
    started_unix_s: float = 0.0,
    daemon_version: str = "",
) -> common_pb2.Snapshot:
    """`decision_log`: a decision_log.LogFigures (duck-typed), the log's upkeep so far.
    `started_unix_s` and `daemon_version` say which daemon process took the snapshot (0 and
    "": not told, as in a core built without a daemon around it)."""
    msg = common_pb2.Snapshot(
        time_unix_s=s.time_s,
        policy=policy_to_proto(s.policy),
        num_blocks=s.num_blocks,
        num_free_blocks=s.num_free_blocks,
        num_held_blocks=s.num_held_blocks,
        num_reserved_blocks=s.num_reserved_blocks,
        num_evictable_blocks=s.num_evictable_blocks,
        num_running=s.num_running,
        num_waiting=s.num_waiting,
        num_preemptions=s.num_preemptions,
        preemptions_by_reason=s.preemptions_by_reason,
        rejections_by_reason=s.rejections_by_reason,
        decisions_by_kind=s.decisions_by_kind,
        waiting_by_reason=s.waiting_by_reason,
        groups=_groups_to_proto(s),
        tenants=_tenants_to_proto(s),
        engines=list(engines),
        gpus=list(gpus),
        replays=list(replays),
        prefix_hit_blocks=s.prefix_hit_blocks,
        prefix_query_blocks=s.prefix_query_blocks,
        draining=draining,
        started_unix_s=started_unix_s,
        daemon_version=daemon_version,
        num_tenants=len(s.tenants) if s.num_tenants is None else s.num_tenants,
    )
    if gpu is not None:
        msg.gpu.CopyFrom(gpu)
    if plan is not None:
        msg.plan.CopyFrom(plan)
    if decision_log is not None:
        msg.decision_log.CopyFrom(_log_to_proto(decision_log))
    return msg


def _groups_to_proto(s: Snapshot) -> list[common_pb2.GroupState]:
    return [
        common_pb2.GroupState(
            layer_type=g.kind,
            layer_kind=_LAYER_TO_PROTO.get(g.kind, common_pb2.LAYER_TYPE_UNSPECIFIED),
            description=g.description,
            num_layers=g.num_layers,
            blocks_held=g.blocks_held,
            blocks_reserved=g.blocks_reserved,
            blocks_reclaimed=g.blocks_reclaimed,
        )
        for g in s.groups
    ]


def _tenants_to_proto(s: Snapshot) -> list[common_pb2.TenantState]:
    return [
        common_pb2.TenantState(
            tenant=t.tenant,
            blocks_held=t.blocks_held,
            blocks_reserved=t.blocks_reserved,
            quota_blocks=t.quota_blocks or 0,
            weight=t.weight,
            running=t.running,
            waiting=t.waiting,
        )
        for t in s.tenants
    ]


def _log_to_proto(f: Any) -> common_pb2.DecisionLogState:
    """`f`: a LogFigures of the decision log (duck-typed)."""
    return common_pb2.DecisionLogState(
        rows_written=f.rows_written, rows_folded=f.rows_folded, stalls=f.stalls,
        stall_s=f.stall_seconds, database_bytes=f.database_bytes, wal_bytes=f.wal_bytes,
        disk_free_bytes=f.disk_free_bytes, disk_total_bytes=f.disk_total_bytes, max_bytes=f.max_bytes,
        num_unwritten_decisions=f.num_unwritten, write_error=f.write_error,
        unwritten_since_unix_s=f.unwritten_since_unix_s,
    )
