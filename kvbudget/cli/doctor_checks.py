"""`kvbudget doctor`'s checks: one pure function per question, each a `Finding`.

Each reads the sample series (doctor_samples.PoolSample, time order) and says what it
found and which knob to turn; `doctor.diagnose` runs them all and adds the verdict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kvbudget.cli.doctor_samples import (
    MiB, Finding, GpuSample, PlanView, PoolExpectation, PoolSample, Status, Thresholds,
)
from kvbudget.units import format_bytes


def check_pool_size(samples: Sequence[PoolSample], expected: PoolExpectation | None) -> Finding:
    """Is the pool the size the plan and the configuration say?"""
    last = samples[-1]
    plan = last.plan
    data: dict[str, object] = {"num_blocks": last.num_blocks}
    problems: list[str] = []
    if plan is None:
        return Finding("pool size", Status.SKIPPED, "the daemon reported no plan", data=data)
    plan_bytes = plan.num_blocks * plan.bytes_per_block
    data.update(plan_num_blocks=plan.num_blocks, bytes_per_block=plan.bytes_per_block, plan_bytes=plan_bytes)
    if last.num_blocks != plan.num_blocks:
        problems.append(f"the pool has {last.num_blocks} blocks but the plan says {plan.num_blocks}")
    if plan.memory_bytes and plan.memory_bytes < plan_bytes:
        problems.append(f"the pool's memory is {plan.memory_bytes} B, less than the plan's {plan_bytes} B")
    if last.gpu.pool_bytes and last.gpu.pool_bytes < plan_bytes:
        problems.append(f"the GPU pool occupies {last.gpu.pool_bytes} B, less than the plan's {plan_bytes} B")
    if expected is not None:
        problems += _config_problems(expected, plan, plan_bytes, data)
    if problems:
        return Finding(
            "pool size",
            Status.PROBLEM,
            "; ".join(problems),
            knob="restart the daemon with the config you meant (`kvbudget daemon --check-config`), "
            "or fix the sizing keys: num_gpu_blocks / kv_cache_memory_bytes / gpu_memory_utilization",
            data=data,
        )
    summary = (
        f"{plan.num_blocks} blocks x {format_bytes(plan.bytes_per_block)} = {format_bytes(plan_bytes)}, as planned"
    )
    if expected is not None:
        # which figures were compared: the model and its block size too, when worked out
        what = f"{expected.model}, {expected.block_size}-token blocks, " if expected.model else ""
        summary += f" and as the config implies ({what}{expected.source})"
    if plan.blocks_at_max_model_len > plan.num_blocks:
        # It serves short requests and rejects every long one: the daemon warns at start too.
        data["blocks_at_max_model_len"] = plan.blocks_at_max_model_len
        return Finding(
            "pool size", Status.WARN,
            f"{summary}; but no request of max_model_len fits: {plan.max_model_len} tokens need "
            f"{plan.blocks_at_max_model_len} blocks, the pool has {plan.num_blocks} (rejected never_fits)",
            knob="give the pool more memory (num_gpu_blocks / kv_cache_memory_bytes / gpu_memory_utilization) "
            "or lower max_model_len", data=data,
        )  # fmt: skip
    return Finding("pool size", Status.OK, summary, data=data)


def _config_problems(expected: PoolExpectation, plan: PlanView, plan_bytes: int, data: dict) -> list[str]:
    """Where the daemon differs from what --config means (or why that could not be told)."""
    if expected.unavailable:
        data["config_unavailable"] = expected.unavailable
        return [f"could not compare with the config: {expected.unavailable}"]
    data["config_source"] = expected.source
    data["config_explanation"] = expected.explanation
    problems = []
    if expected.model:
        data.update(config_model=expected.model, config_block_size=expected.block_size)
        if plan.model and expected.model != plan.model:
            problems.append(f"the config names model {expected.model}, the daemon runs {plan.model}")
        if expected.block_size != plan.block_size:
            problems.append(f"the config means {expected.block_size}-token blocks, "
                            f"the daemon runs {plan.block_size}-token blocks")
    if expected.num_blocks is not None:
        data["config_num_blocks"] = expected.num_blocks
        if expected.num_blocks != plan.num_blocks:
            problems.append(
                f"the config implies {expected.num_blocks} blocks ({expected.explanation}), "
                f"the daemon runs {plan.num_blocks}"
            )
    if expected.max_pool_bytes is not None:
        data["config_max_pool_bytes"] = expected.max_pool_bytes
        if plan_bytes > expected.max_pool_bytes:
            problems.append(
                f"the pool ({plan_bytes} B) is larger than the config allows "
                f"({expected.max_pool_bytes} B: {expected.explanation})"
            )
    return problems


def check_block_accounting(samples: Sequence[PoolSample]) -> Finding:
    """Free blocks must drop exactly as requests grow: free + held = capacity, always."""
    worst = max(samples, key=lambda s: abs(s.num_blocks - s.free - s.held))
    missing = worst.num_blocks - worst.free - worst.held
    grew = samples[-1].held - samples[0].held
    fell = samples[0].free - samples[-1].free
    data = {"held_delta": grew, "free_delta": -fell, "unaccounted_blocks": missing}
    if missing:
        return Finding(
            "block accounting",
            Status.PROBLEM,
            f"{missing} blocks are neither free nor held: the pool's books do not balance",
            knob="report this with `kvbudget log` output; restart the daemon to recover the blocks",
            data=data,
        )
    if all(s.running > 0 and s.held == 0 for s in samples):
        return Finding(
            "block accounting",
            Status.WARN,
            f"{samples[-1].running} requests run but hold no blocks: the engine reports no growth",
            knob="the engine must send Grow/Progress in each Step (docs/engine-integration.md)",
            data=data,
        )
    return Finding(
        "block accounting",
        Status.OK,
        f"free blocks track held blocks (held {grew:+d}, free {-fell:+d} over the window)",
        data=data,
    )


def check_gpu_memory(samples: Sequence[PoolSample], t: Thresholds) -> Finding:
    """Flat GPU memory: the pool is the limit. Climbing memory: something outside the pool.
    A pool over several GPUs (tensor x pipeline parallel) is judged on each: a leak on any
    one of an engine's GPUs stops the whole engine."""
    spans = max(len(s.gpus) for s in samples)
    if spans <= 1:
        return _gpu_memory_finding([s.gpu for s in samples], t)
    per_gpu = [_gpu_memory_finding([s.gpus[i] for s in samples if len(s.gpus) > i], t) for i in range(spans)]
    labels = [next((s.gpus[i].label for s in samples if len(s.gpus) > i), f"GPU {i}") for i in range(spans)]
    data = {**per_gpu[0].data, "gpus": [{"gpu": label, **f.data} for label, f in zip(labels, per_gpu)]}
    problems = [(label, f) for label, f in zip(labels, per_gpu) if f.status is Status.PROBLEM]
    if problems:
        label, worst = problems[0]
        return dataclasses.replace(worst, summary=f"{label}: {worst.summary}", data=data)
    if all(f.status is Status.SKIPPED for f in per_gpu):
        return Finding("gpu memory", Status.SKIPPED, f"no GPU readings on any of the pool's {spans} GPUs")
    each = ", ".join(
        f"{label} {f.data['rise_bytes'] / MiB:+.0f} MiB" if f.data else f"{label} no readings"  # type: ignore[operator]
        for label, f in zip(labels, per_gpu)
    )
    return Finding("gpu memory", Status.OK, f"GPU memory flat on the pool's {spans} GPUs ({each} over the window)",
                   data=data)


def _gpu_memory_finding(readings: Sequence[GpuSample], t: Thresholds) -> Finding:
    """One GPU's readings over the window, judged."""
    gpus = [g for g in readings if g.present]
    if not gpus:
        note = (readings[-1].note if readings else "") or "no GPU"
        return Finding("gpu memory", Status.SKIPPED, f"no GPU readings ({note})")
    first, last = gpus[0], gpus[-1]
    rise = last.used_bytes - first.used_bytes
    other_rise = last.other_processes_bytes - first.other_processes_bytes
    limit = max(t.memory_growth_bytes, int(first.total_bytes * t.memory_growth_share))
    data = {
        "used_bytes_first": first.used_bytes,
        "used_bytes_last": last.used_bytes,
        "rise_bytes": rise,
        "other_processes_rise_bytes": other_rise,
        "threshold_bytes": limit,
        "pool_bytes": last.pool_bytes,
    }
    if rise > limit:
        who = "other processes" if other_rise > limit // 2 else "this host's processes"
        return Finding(
            "gpu memory",
            Status.PROBLEM,
            f"GPU memory rose {rise / MiB:.0f} MiB in the window while the pool stayed "
            f"{last.pool_bytes / MiB:.0f} MiB: {who} allocate outside the pool (leak?)",
            knob="find the allocator (nvidia-smi --query-compute-apps=pid,used_memory --format=csv); "
            "leave it headroom: lower gpu_memory_utilization or kv_cache_memory_bytes",
            data=data,
        )
    return Finding(
        "gpu memory",
        Status.OK,
        f"GPU memory flat ({rise / MiB:+.0f} MiB over the window)",
        data=data,
    )


def check_preemptions(samples: Sequence[PoolSample]) -> Finding:
    """Preemptions as frequent as admissions: requests go round preempt -> readmit."""
    preempted = samples[-1].preemptions - samples[0].preemptions
    admitted = samples[-1].admits - samples[0].admits
    data = {"preemptions": preempted, "admits": admitted}
    if preempted > 0 and preempted >= admitted:
        return Finding(
            "preemptions",
            Status.WARN,
            f"{preempted} preemptions for {admitted} admissions in the window: a preempt -> "
            "readmit loop wastes the recomputed prefill",
            knob="reserve more at admission: policy guaranteed or predictive, or a larger watermark",
            data=data,
        )
    status = Status.INFO if preempted else Status.OK
    return Finding("preemptions", status, f"{preempted} preemptions, {admitted} admissions in the window", data=data)


def check_rejections(samples: Sequence[PoolSample]) -> Finding:
    first, last = samples[0].rejections_by_reason, samples[-1].rejections_by_reason
    never = last.get("never_fits", 0) - first.get("never_fits", 0)
    if never > 0:
        return Finding(
            "rejections",
            Status.WARN,
            f"{never} requests rejected in the window because their worst case exceeds the whole pool",
            knob="lower max_model_len (or clients' max new tokens), or give the pool more memory",
            data={"never_fits": never},
        )
    return Finding("rejections", Status.OK, "no request rejected for never fitting", data={"never_fits": 0})


def check_decision_log(samples: Sequence[PoolSample]) -> Finding:
    """Commits that waited for the decision log's upkeep (indexing, retention): engines'
    Steps slowed by the daemon's own log, which no pool or budget knob changes."""
    first, last = samples[0], samples[-1]
    stalls = last.log_stalls - first.log_stalls
    stalled_s = last.log_stall_s - first.log_stall_s
    window_s = last.time_s - first.time_s
    data = {"stalls": stalls, "stall_s": round(stalled_s, 3), "rows_unindexed": last.log_unindexed}
    if stalls > 0:
        share = f" ({stalled_s / window_s:.0%} of the window)" if window_s > 0 else ""
        return Finding(
            "decision log",
            Status.WARN,
            f"commits waited {stalled_s:.1f} s{share}, {stalls} times, for the decision log's upkeep: "
            "engines' Steps slow to the pace at which it indexes and purges",
            knob="fewer decisions per second on this daemon, or a faster disk for db_path; retention by "
            "size (retention_max_rows, retention_max_bytes) deletes as fast as rows come once at its bound, "
            "doubling the upkeep",
            data=data,
        )
    if len(samples) == 1 and last.log_stalls:
        return Finding(
            "decision log",
            Status.INFO,
            f"commits waited {last.log_stall_s:.1f} s, {last.log_stalls} times, for the log's upkeep since the "
            "daemon started (--samples 2 or more tells whether it still does)",
            data=data,
        )
    return Finding("decision log", Status.OK, "no commit waited for the log's upkeep", data=data)


def check_log_disk(samples: Sequence[PoolSample], t: Thresholds) -> Finding:
    """Will the disk holding the decision log fill? When it does, every commit fails and
    engines get UNAVAILABLE: the one way the log stops admission. The log grows to its
    retention bound (retention_max_bytes) and stays there; without one, until retention
    by age catches up."""
    last = samples[-1]
    free, total = last.log_disk_free_bytes, last.log_disk_total_bytes
    if last.log_unwritten:
        return Finding(
            "log disk", Status.PROBLEM,
            f"writes to the decision log fail ({last.log_write_error}): {last.log_unwritten} decisions wait to "
            "be written, and every step is refused (UNAVAILABLE) until they are",
            knob=("free space on the decision log's disk (db_path): the daemon retries each second and "
                  "goes on by itself, no restart needed"),
            data={"unwritten": last.log_unwritten, "write_error": last.log_write_error,
                  "disk_free_bytes": free, "disk_total_bytes": total})
    if total <= 0:
        return Finding("log disk", Status.SKIPPED, "the daemon does not report its decision log's disk")
    data = {"log_bytes": last.log_bytes, "max_bytes": last.log_max_bytes, "disk_free_bytes": free,
            "disk_total_bytes": total}
    knob = ("a retention_max_bytes the disk can hold (with room for the WAL, ~64 MiB), a shorter "
            "retention_days, or db_path on a bigger disk")
    bound = f"its bound {format_bytes(last.log_max_bytes)}" if last.log_max_bytes else "no size bound"
    to_grow = last.log_max_bytes - last.log_bytes if last.log_max_bytes else 0
    if last.log_max_bytes and to_grow > free:
        return Finding(
            "log disk", Status.WARN,
            f"the decision log ({format_bytes(last.log_bytes)}) may grow {format_bytes(to_grow)} more to {bound}, "
            f"but its disk has {format_bytes(free)} free: once full, commits fail and engines get UNAVAILABLE",
            knob=knob, data=data)
    if not last.log_max_bytes and free < t.log_disk_free_share * total:
        return Finding(
            "log disk", Status.WARN,
            f"the decision log ({format_bytes(last.log_bytes)}, {bound}) is on a disk {1 - free / total:.0%} full "
            f"({format_bytes(free)} free): once full, commits fail and engines get UNAVAILABLE",
            knob=knob, data=data)
    return Finding("log disk", Status.OK,
                   f"decision log {format_bytes(last.log_bytes)} of {bound}; {format_bytes(free)} free on its disk", data=data)


def requests_text(count: int) -> str:
    return f"{count} request" + ("" if count == 1 else "s")
