"""`kvbudget doctor`'s diagnosis: pure functions over a short series of daemon snapshots.

The question an operator asks at 3 a.m. is "requests wait: is the pool full, is the budget
full, or is something wrong?". Each check below answers one part of it from what the
daemon reports (pool counts, queue, preemptions, GPU memory, the plan it sized) and says
which knob to turn. Nothing here does I/O: `cmd_doctor` samples the daemon, tests stage
series by hand, and both call `diagnose`; what they pass and get back is in
doctor_samples.py.

Shares are of the pool's usable blocks:
  held       blocks requests hold
  committed  held + reserved (promised to running requests, not yet held)
A queue with the pool physically full is pool-bound; with the pool full of promises it is
budget-bound; a queue that does not move while most blocks sit free is stuck: what
admission charges and what requests really use have drifted apart.

"Full" is the dashboard's bar and reading (kvbudget/client/pressure.py, where the differences
left are listed): the shares judged are the means over the samples under pressure (some
requests waited, or the preemption count rose since the sample before), not the last
sample's, so a steady load whose queue comes and goes gets one verdict, and a daemon with
nothing running and nothing waiting at the last sample is under no pressure.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean

from kvbudget.cli.doctor_samples import (
    MiB,
    Diagnosis,
    Finding,
    PoolExpectation,
    PoolSample,
    Status,
    Thresholds,
    Verdict,
)
from kvbudget.client.pressure import waits_for_pool
from kvbudget.units import format_bytes

# The values of the reservations check's `data["cause"]` (_reservation_cause): what sizes
# the reservations. Each, and what an operator does about it: docs/cli-reference.md.
RESERVATION_CAUSES = ("max_model_len", "max_new_tokens", "unknown")

# --------------------------------------------------------------------------- checks


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
        data["config_source"] = expected.source
        data["config_explanation"] = expected.explanation
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
        summary += f" and as the config implies ({expected.source})"
    return Finding("pool size", Status.OK, summary, data=data)


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
    """Flat GPU memory: the pool is the limit. Climbing memory: something outside the pool."""
    gpus = [s.gpu for s in samples if s.gpu.present]
    if not gpus:
        note = samples[-1].gpu.note or "no GPU"
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


def check_reservations(samples: Sequence[PoolSample], t: Thresholds) -> Finding:
    """Reservations far beyond what requests hold: every request is charged for its whole
    possible length (max_model_len or a large max_new_tokens), most of which never comes."""
    last = samples[-1]
    data: dict[str, object] = {"held": last.held, "reserved": last.reserved, "policy": last.policy}
    if last.reserved and last.reserved >= t.reservation_ratio * max(last.held, 1):
        cause, why = _reservation_cause(last)
        data["cause"] = cause
        return Finding(
            "reservations",
            Status.WARN,
            f"{last.reserved} blocks reserved for only {last.held} held "
            f"({last.reserved / max(last.held, 1):.1f}x): {why}",
            knob="lower max new tokens (or max_model_len), or use the layer-aware policy: "
            "[admission] policy = predictive or optimistic (AdminService.SetPolicy switches live)",
            data=data,
        )
    return Finding(
        "reservations",
        Status.OK,
        f"reserved {last.reserved} / held {last.held} blocks",
        data=data,
    )


def _reservation_cause(sample: PoolSample) -> tuple[str, str]:
    """What sizes the reservations, "max_model_len", "max_new_tokens" or "unknown" (it may
    be either), and the clause that says so with its figures.

    A request is promised the worst case of L = prompt + max new tokens, capped at
    max_model_len (L = max_model_len when it sends none). The snapshot gives no request's
    L, only totals: the blocks committed (held + reserved) over the n running requests are
    read against M, what a request at max_model_len commits in all the plan's groups
    (budget.request_worst_case: a window caps a sliding group's share), or, where the plan
    gives no groups, M = cdiv(max_model_len, block size), a full-attention group's share:
      n x M        every request is charged for max_model_len;
      <= n x M / 2 at most half of them can be at max_model_len: the rest, most, are
                   sized by the max new tokens they send;
      between      some at max_model_len, or all a little under it: either;
      > n x M      more than one KV-cache group (a hybrid model's window groups add
                   theirs): the totals cannot say which lengths take it: either.
    Prefix blocks shared by requests count once in "held", so sharing lowers the committed
    total: n requests at max_model_len that share a long prompt commit well under n x M
    (20 sharing 70 of 71 prompt blocks, M = 128: 1,230 committed, under 2,560 / 2). So
    "at most half" is judged on bounds sharing cannot move: a request at max_model_len is
    owed at least M - held (it holds no more than the pool's held blocks), and the n of
    them hold at most n x held, so k at max_model_len need
      k x (M - held) <= reserved  and  k x M <= reserved + n x held;
    max new tokens are named only when those let k be at most n / 2; when only the
    committed total does, they are said with that "if" and the cause is "unknown".
    Under the naive policy every request is charged max_model_len, whatever it asks for.
    """
    plan = sample.plan
    max_len = plan.max_model_len if plan is not None else 0
    if sample.policy == "naive":
        return "max_model_len", (
            "max_model_len-sized reservations: the naive policy charges every request "
            + (f"max_model_len {max_len}" if max_len else "max_model_len")
            + ", whatever its max new tokens"
        )
    either = "max_model_len-sized reservations or the clients' large max new tokens, the totals cannot tell which"
    if plan is None or not max_len or plan.block_size <= 0 or not sample.running:
        return "unknown", either
    committed, running = sample.held + sample.reserved, sample.running
    if plan.blocks_at_max_model_len:  # the plan's groups: every group's share, windows capped
        at_max_len = plan.blocks_at_max_model_len
        takes = f"max_model_len {max_len} takes {at_max_len} in all its KV-cache groups"
    else:  # a full-attention group's share only
        at_max_len = -(-max_len // plan.block_size)
        takes = f"max_model_len {max_len} takes cdiv({max_len}, {plan.block_size}) = {at_max_len}"
    figures = f"{committed} blocks committed to {_requests(running)}, {committed / running:.4g} each; {takes}"

    if committed == at_max_len * running:
        return "max_model_len", (
            f"max_model_len-sized reservations ({figures}: clients send no max new tokens, or ones that reach it)"
        )
    at_most = _most_at_max_model_len(sample, at_max_len)
    if 2 * at_most <= running:
        return "max_new_tokens", f"reservations sized by the clients' max new tokens ({figures})"
    if committed > at_max_len * running:  # (only with a full-attention group's share to go by)
        return "unknown", f"{either} ({figures} in a full-attention group: the model has more groups)"
    if 2 * committed <= at_max_len * running:  # low, but shared prefix blocks may be why
        return "unknown", (
            f"reservations sized by the clients' max new tokens if the requests share no long prompt "
            f"prefix ({figures}; prefix blocks they share count once: up to {at_most} of them may be "
            f"at max_model_len)"
        )
    return "unknown", f"{either} ({figures})"


def _most_at_max_model_len(sample: PoolSample, at_max_len: int) -> int:
    """The most running requests that can be charged for max_model_len (`at_max_len`
    blocks in a full-attention group), whatever prefix blocks they share: each is owed at
    least at_max_len - held, and all of them hold at most running x held blocks in all."""
    held, reserved, running = sample.held, sample.reserved, sample.running
    most = min(running, (reserved + running * held) // at_max_len)
    if held < at_max_len:
        most = min(most, reserved // (at_max_len - held))
    return most


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


def _requests(count: int) -> str:
    return f"{count} request" + ("" if count == 1 else "s")


def _tenants_at_quota(sample: PoolSample) -> list[str]:
    """Tenants whose quota holds their queue: requests wait for `tenant_quota` (the
    daemon says so), or, from an older daemon, the quota is used up. (A quota with room
    left still holds a request that needs more than that room: counting blocks alone
    called that formula drift.)"""
    quota_waits = sample.waiting_by_reason.get("tenant_quota", 0)
    return [
        t.tenant
        for t in sample.tenants
        if t.waiting and t.quota_blocks and (quota_waits or t.held + t.reserved >= t.quota_blocks)
    ]


def _under_pressure(samples: Sequence[PoolSample]) -> tuple[PoolSample, ...]:
    """The samples at which requests were held back, as the dashboard picks them: some
    waited, or the cumulative preemption count rose since the sample before."""
    return tuple(
        sample
        for before, sample in zip((None, *samples), samples)
        if sample.waiting > 0 or (before is not None and sample.preemptions > before.preemptions)
    )


def _judged_text(judged: Sequence[PoolSample]) -> str:
    """What the shares are, once more than one sample's."""
    if len(judged) < 2:
        return ""
    return f" (mean of {len(judged)} samples under pressure)"


def _pressure_text(waiting: int, peak_waiting: int, preempted: int) -> str:
    if waiting:
        return f"{_requests(waiting)} waiting"
    if peak_waiting:
        return f"none waiting now, {peak_waiting} earlier in the window"
    return f"no queue, {preempted} preemptions in the window"


def _quota_knob(tenants: list[str]) -> str:
    return (
        f"tenant(s) {', '.join(tenants)} at quota: raise [tenants.NAME] max_share "
        "(AdminService.SetTenantQuota switches live)"
    )


# --------------------------------------------------------------------------- verdict


def diagnose(
    samples: Sequence[PoolSample],
    expected: PoolExpectation | None = None,
    thresholds: Thresholds = Thresholds(),
) -> Diagnosis:
    """Findings for every check and one verdict with the knob to turn."""
    if not samples:
        raise ValueError("samples: at least one snapshot is needed")
    t = thresholds
    ordered = sorted(samples, key=lambda s: s.time_s)
    first, last = ordered[0], ordered[-1]
    findings = [
        check_pool_size(ordered, expected),
        check_block_accounting(ordered),
        check_gpu_memory(ordered, t),
        check_reservations(ordered, t),
        check_preemptions(ordered),
        check_rejections(ordered),
        check_decision_log(ordered),
        check_log_disk(ordered, t),
    ]
    queued_throughout = all(s.waiting > 0 for s in ordered)
    admitted = last.admits - first.admits
    preempted = last.preemptions - first.preemptions
    peak_waiting = max(s.waiting for s in ordered)
    # A queue anywhere in the window, or preemptions, as the dashboard reads it; but pressure
    # of a run that has since drained (nothing waits, nothing runs) holds nothing back now.
    pressure = (peak_waiting > 0 or preempted > 0) and (last.waiting > 0 or last.running > 0)
    # The samples judged: those under pressure (never none when there is pressure), else the last.
    judged = (_under_pressure(ordered) if pressure else ()) or (last,)
    held_share = fmean(s.held / max(s.num_blocks, 1) for s in judged)
    committed_share = fmean((s.held + s.reserved) / max(s.num_blocks, 1) for s in judged)
    held_text = _judged_text(judged)
    # The daemon's word on why the queue waited then: for room in the pool, or the budget
    # (kvbudget/client/pressure.py). It outranks the shares: a pool that keeps running out preempts,
    # and its mean usage dips under the bar.
    pool_waits = pressure and waits_for_pool(s.waiting_by_reason for s in judged)
    shares = {
        "held_share": round(held_share, 4),
        "committed_share": round(committed_share, 4),
        "judged_samples": len(judged),
        "waiting": last.waiting,
        "running": last.running,
        "admits_in_window": admitted,
        "preemptions_in_window": preempted,
    }
    memory = findings[2]
    reservations = findings[3]
    log_disk = findings[7]

    # One sample cannot tell a queue that moves from one that does not.
    stuck = len(ordered) > 1 and queued_throughout and admitted == 0 and not last.draining
    if len(ordered) == 1:
        findings.append(
            Finding("trend", Status.INFO, "one sample: trends (queue, memory, preemptions) need --samples 2 or more")
        )
    if last.draining:
        findings.append(Finding(
            "draining", Status.WARN,
            f"draining: no new sessions or requests, nothing more admitted; {_requests(last.running)} still running",
            knob="a drain cannot be undone: restart the daemon (systemctl restart kvbudget) to serve again",
        ))
    # A quota holds the queue when requests wait for it and none waits for room in the
    # pool (the rest wait behind them): the tenant's budget is full, not the pool.
    at_quota = _tenants_at_quota(last) if pressure else []
    waits = last.waiting_by_reason
    for_room = sum(waits.get(reason, 0) for reason in ("pool_full", "budget_full", "watermark"))
    quota_bound = bool(at_quota) and ((waits.get("tenant_quota", 0) > 0 and not for_room) or (stuck and not waits))
    if log_disk.status is Status.PROBLEM:
        verdict, knob = Verdict.LOG_CANNOT_WRITE, log_disk.knob  # nothing is admitted: the cause of any queue
    elif memory.status is Status.PROBLEM:
        verdict, knob = Verdict.MEMORY_GROWING, memory.knob
    elif quota_bound:
        verdict, knob = Verdict.BUDGET_BOUND, _quota_knob(at_quota)
        quota_waits = waits.get("tenant_quota", 0)
        summary = (
            f"{_requests(last.waiting)} waiting"
            + (f", {quota_waits} of them for a tenant quota" if quota_waits else "")
            + f"; {held_share:.0%} of the pool held"
        )
        findings.append(Finding("queue", Status.WARN, summary, knob=knob, data=shares))
    elif stuck and held_share < t.mostly_free_share:
        verdict = Verdict.STUCK_QUEUE
        if reservations.status is Status.WARN:
            knob = reservations.knob
        else:
            knob = (
                "admission charges more than requests use (formula drift): switch policy "
                "(AdminService.SetPolicy optimistic) and report it with `kvbudget log --kind queue`"
            )
        summary = (
            f"{_requests(last.waiting)} waited through the whole window with no admission while "
            f"{1 - held_share:.0%} of the pool is free"
        )
        findings.append(Finding("queue", Status.PROBLEM, summary, knob=knob, data=shares))
    elif pressure and held_share < t.full_share and committed_share >= t.full_share and not pool_waits:
        verdict = Verdict.BUDGET_BOUND
        knob = (
            f"free blocks are promised to running requests ({last.reserved} reserved): lower max "
            "new tokens, or a policy that reserves less (predictive, or optimistic with preemption)"
        )
        summary = (
            f"{_pressure_text(last.waiting, peak_waiting, preempted)}; {held_share:.0%} of the pool held, "
            f"{committed_share:.0%} committed with reservations{held_text}"
        )
        findings.append(Finding("queue", Status.WARN, summary, knob=knob, data=shares))
    elif pressure and (held_share >= t.full_share or stuck or pool_waits):
        # Full, or too full for the requests at the head of the queue: room is the limit.
        verdict = Verdict.POOL_BOUND
        knob = (
            "the pool is really full: give it more memory (kv_cache_memory_bytes or "
            "gpu_memory_utilization, kv_dtype fp8), lower max_model_len, or send less to this GPU"
        )
        summary = (
            f"{_pressure_text(last.waiting, peak_waiting, preempted)} with {held_share:.0%} "
            f"of the pool held{held_text}"
            + (", waiting for free blocks" if pool_waits and held_share < t.full_share else "")
        )
        findings.append(Finding("queue", Status.WARN, summary, knob=knob, data=shares))
    else:
        verdict, knob = Verdict.HEALTHY, ""
        moving = (
            f"{_requests(last.waiting)} waiting, {admitted} admitted in the window" if last.waiting else "no queue"
        )
        findings.append(Finding("queue", Status.OK, moving, data=shares))
    return Diagnosis(
        verdict=verdict,
        knob=knob,
        findings=tuple(findings),
        num_samples=len(ordered),
        window_s=last.time_s - first.time_s,
        daemon_version=last.daemon_version,
        daemon_uptime_s=_uptime_s(last),
    )


def _uptime_s(sample: PoolSample) -> float | None:
    """How long the daemon had run at `sample` (its own clock, stepped back: 0); None when
    it does not say when it started."""
    if not sample.daemon_started_s:
        return None
    return max(0.0, sample.time_s - sample.daemon_started_s)
