"""`kvbudget doctor`'s diagnosis: every check over a short series of daemon snapshots, and
one verdict with the knob to turn: is the pool full, the budget full, or something wrong?

Pure: `cmd_doctor` samples the daemon, tests stage series by hand, and both call
`diagnose` (the shares it judges, and why the means under pressure: docs/architecture/cli.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import NamedTuple

from kvbudget.cli.doctor_checks import (
    check_block_accounting,
    check_decision_log,
    check_gpu_memory,
    check_log_disk,
    check_pool_size,
    check_preemptions,
    check_rejections,
    requests_text,
)
from kvbudget.cli import doctor_binds as binds
from kvbudget.cli.doctor_reservations import check_reservations
from kvbudget.cli.doctor_samples import (
    Diagnosis,
    Finding,
    PoolExpectation,
    PoolSample,
    Status,
    Thresholds,
    Verdict,
)
from kvbudget.client.pressure import waits_for_pool


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
    memory, reservations, log_disk = findings[2], findings[3], findings[7]
    window = _read_window(ordered)
    findings.extend(_state_findings(ordered))
    if log_disk.status is Status.PROBLEM:
        # nothing is admitted: the cause of any queue
        outcome = _Outcome(Verdict.LOG_CANNOT_WRITE, log_disk.knob, binds="decision log")
    elif memory.status is Status.PROBLEM:
        outcome = _Outcome(Verdict.MEMORY_GROWING, memory.knob, binds="gpu memory")
    else:
        outcome = _queue_outcome(window, reservations, t)
    if outcome.queue is not None:
        findings.append(outcome.queue)
    return Diagnosis(
        verdict=outcome.verdict,
        knob=outcome.knob,
        findings=tuple(findings),
        num_samples=len(ordered),
        window_s=last.time_s - first.time_s,
        daemon_version=last.daemon_version,
        daemon_uptime_s=_uptime_s(last),
        binds=outcome.binds,
        because=outcome.because,
    )


class _Outcome(NamedTuple):
    verdict: Verdict
    knob: str
    queue: Finding | None = None  # the queue's finding, when the verdict is the queue's
    binds: str = "nothing"  # the limit that holds the queue (doctor_binds.BINDS)
    because: str = ""  # the figures that show it (the verdict line's clause)


@dataclass(frozen=True)
class _Window:
    """The series as the queue's verdict reads it."""

    last: PoolSample
    admitted: int
    preempted: int
    peak_waiting: int
    pressure: bool  # requests held back, and still running or waiting at the last sample
    stuck: bool  # a queue through the whole window, nothing admitted, not draining
    held_share: float  # mean over the samples judged
    committed_share: float
    judged: tuple[PoolSample, ...]
    pool_waits: bool  # the daemon says the queue waited for room in the pool

    def data(self) -> dict[str, object]:
        return {
            "held_share": round(self.held_share, 4),
            "committed_share": round(self.committed_share, 4),
            "judged_samples": len(self.judged),
            "waiting": self.last.waiting,
            "running": self.last.running,
            "admits_in_window": self.admitted,
            "preemptions_in_window": self.preempted,
        }


def _read_window(ordered: Sequence[PoolSample]) -> _Window:
    first, last = ordered[0], ordered[-1]
    preempted = last.preemptions - first.preemptions
    peak_waiting = max(s.waiting for s in ordered)
    # A queue anywhere in the window, or preemptions, as the dashboard reads it; but pressure
    # of a run that has since drained (nothing waits, nothing runs) holds nothing back now.
    pressure = (peak_waiting > 0 or preempted > 0) and (last.waiting > 0 or last.running > 0)
    # The samples judged: those under pressure (never none when there is pressure), else the last.
    judged = (_under_pressure(ordered) if pressure else ()) or (last,)
    admitted = last.admits - first.admits
    return _Window(
        last=last,
        admitted=admitted,
        preempted=preempted,
        peak_waiting=peak_waiting,
        pressure=pressure,
        # One sample cannot tell a queue that moves from one that does not.
        stuck=len(ordered) > 1 and all(s.waiting > 0 for s in ordered) and admitted == 0 and not last.draining,
        held_share=fmean(s.held / max(s.num_blocks, 1) for s in judged),
        committed_share=fmean((s.held + s.reserved) / max(s.num_blocks, 1) for s in judged),
        judged=judged,
        # The daemon's word on why the queue waited then: for room in the pool, or the budget
        # (kvbudget/client/pressure.py). It outranks the shares: a pool that keeps running out
        # preempts, and its mean usage dips under the bar.
        pool_waits=pressure and waits_for_pool(s.waiting_by_reason for s in judged),
    )


def _state_findings(ordered: Sequence[PoolSample]) -> list[Finding]:
    """What the series cannot judge (one sample), and a daemon that drains."""
    last = ordered[-1]
    findings = []
    if len(ordered) == 1:
        findings.append(
            Finding("trend", Status.INFO, "one sample: trends (queue, memory, preemptions) need --samples 2 or more")
        )
    if last.draining:
        findings.append(Finding(
            "draining", Status.WARN,
            f"draining: no new sessions or requests, nothing more admitted; {requests_text(last.running)} still running",
            knob="a drain cannot be undone: restart the daemon (systemctl restart kvbudget) to serve again",
        ))
    return findings


def _queue_outcome(w: _Window, reservations: Finding, t: Thresholds) -> _Outcome:
    """The verdict on the queue: a tenant's quota, stuck, the budget, the pool, or healthy."""
    at_quota = _tenants_at_quota(w.last) if w.pressure else []
    if _quota_bound(w, at_quota):
        return _quota_outcome(w, at_quota)
    if w.stuck and w.held_share < t.mostly_free_share:
        return _stuck_outcome(w, reservations)
    if w.pressure and w.held_share < t.full_share and w.committed_share >= t.full_share and not w.pool_waits:
        return _budget_outcome(w)
    if w.pressure and (w.held_share >= t.full_share or w.stuck or w.pool_waits):
        return _pool_outcome(w, t)
    moving = (
        f"{requests_text(w.last.waiting)} waiting, {w.admitted} admitted in the window"
        if w.last.waiting
        else "no queue"
    )
    return _Outcome(Verdict.HEALTHY, "", Finding("queue", Status.OK, moving, data=w.data()), because=moving)


def _quota_bound(w: _Window, at_quota: list[str]) -> bool:
    """A quota holds the queue when requests wait for it and none waits for room in the
    pool (the rest wait behind them): the tenant's budget is full, not the pool."""
    waits = w.last.waiting_by_reason
    for_room = sum(waits.get(reason, 0) for reason in ("pool_full", "budget_full", "watermark"))
    return bool(at_quota) and ((waits.get("tenant_quota", 0) > 0 and not for_room) or (w.stuck and not waits))


def _quota_outcome(w: _Window, at_quota: list[str]) -> _Outcome:
    knob = _quota_knob(at_quota)
    quota_waits = w.last.waiting_by_reason.get("tenant_quota", 0)
    summary = (
        f"{requests_text(w.last.waiting)} waiting"
        + (f", {quota_waits} of them for a tenant quota" if quota_waits else "")
        + f"; {w.held_share:.0%} of the pool held"
    )
    because = f"{binds.waiting_text(w.last)}; {binds.quota_because(w.last, at_quota)}"
    return _Outcome(Verdict.BUDGET_BOUND, knob, Finding("queue", Status.WARN, summary, knob=knob, data=w.data()),
                    "quota", because)


def _stuck_outcome(w: _Window, reservations: Finding) -> _Outcome:
    if reservations.status is Status.WARN:
        knob = reservations.knob
    else:
        knob = (
            "admission charges more than requests use (formula drift): switch policy "
            "(AdminService.SetPolicy optimistic) and report it with `kvbudget log --kind queue`"
        )
    summary = (
        f"{requests_text(w.last.waiting)} waited through the whole window with no admission while "
        f"{1 - w.held_share:.0%} of the pool is free"
    )
    because = f"{binds.waiting_text(w.last)}; {binds.stuck_because(w.last, w.held_share, w.committed_share)}"
    return _Outcome(Verdict.STUCK_QUEUE, knob, Finding("queue", Status.PROBLEM, summary, knob=knob, data=w.data()),
                    "promises", because)


def _budget_outcome(w: _Window) -> _Outcome:
    knob = (
        f"free blocks are promised to running requests ({w.last.reserved} reserved): lower max "
        "new tokens, or a policy that reserves less (predictive, or optimistic with preemption)"
    )
    summary = (
        f"{_pressure_text(w.last.waiting, w.peak_waiting, w.preempted)}; {w.held_share:.0%} of the pool held, "
        f"{w.committed_share:.0%} committed with reservations{_judged_text(w.judged)}"
    )
    because = f"{binds.waiting_text(w.last)}; {binds.promises_because(w.last, w.held_share, w.committed_share)}"
    return _Outcome(Verdict.BUDGET_BOUND, knob, Finding("queue", Status.WARN, summary, knob=knob, data=w.data()),
                    "promises", because)


def _pool_outcome(w: _Window, t: Thresholds) -> _Outcome:
    # Full, or too full for the requests at the head of the queue: room is the limit.
    more_memory = ("give it more memory (kv_cache_memory_bytes or gpu_memory_utilization, kv_dtype fp8), "
                   "lower max_model_len, or send less to this GPU")
    knob = f"the pool is really full: {more_memory}"
    promised = w.committed_share - w.held_share
    if w.held_share < t.full_share and w.committed_share >= t.full_share:
        # Free blocks ran out under promises, not holdings ("51% held", then "really full",
        # while 98% was held or promised): say which, and that promising less frees room too.
        knob = (f"the pool's free blocks are promised to running requests ({w.last.reserved} reserved): "
                f"reserve less (lower max new tokens, or a policy that reserves less), or {more_memory}")
    summary = (
        f"{_pressure_text(w.last.waiting, w.peak_waiting, w.preempted)} with {w.held_share:.0%} "
        f"of the pool held{_judged_text(w.judged)}"
        + (f" and {promised:.0%} promised ({w.committed_share:.0%} in all)"
           if promised >= 0.005 and w.held_share < t.full_share else "")  # (held past the bar: that binds)
        + (", waiting for free blocks" if w.pool_waits and w.held_share < t.full_share else "")
    )
    limit, because = "pool", binds.pool_because(w.last, w.held_share, w.committed_share, t.full_share)
    if _waits_for_watermark(w.judged):
        # Free blocks are there, but admitting would dip under the share optimistic keeps back.
        limit, because = "watermark", binds.watermark_because(w.last)
        knob = f"the watermark keeps the last free blocks back: lower [admission] watermark, or {more_memory}"
    return _Outcome(Verdict.POOL_BOUND, knob, Finding("queue", Status.WARN, summary, knob=knob, data=w.data()),
                    limit, f"{binds.waiting_text(w.last)}; {because}")


def _waits_for_watermark(judged: Sequence[PoolSample]) -> bool:
    """More waiting requests waited for the watermark than for free blocks (the daemon's word)."""
    watermark = sum(s.waiting_by_reason.get("watermark", 0) for s in judged)
    return watermark > sum(s.waiting_by_reason.get("pool_full", 0) for s in judged)


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
        return f"{requests_text(waiting)} waiting"
    if peak_waiting:
        return f"none waiting now, {peak_waiting} earlier in the window"
    return f"no queue, {preempted} preemptions in the window"


def _quota_knob(tenants: list[str]) -> str:
    return (
        f"tenant(s) {', '.join(tenants)} at quota: raise [tenants.NAME] max_share "
        "(AdminService.SetTenantQuota switches live)"
    )


def _uptime_s(sample: PoolSample) -> float | None:
    """How long the daemon had run at `sample` (its own clock, stepped back: 0); None when
    it does not say when it started."""
    if not sample.daemon_started_s:
        return None
    return max(0.0, sample.time_s - sample.daemon_started_s)
