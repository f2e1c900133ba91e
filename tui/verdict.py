"""Physical vs logical: which of the pool, the budget or the GPU is holding requests back.

The on-call drill is "first free blocks, then waiting / preempt counts, last suspect the GPU".
This module turns that drill into one line from a `DashboardState`:

- decision log cannot write: a write to the log failed (a full disk) and decisions wait
  to be written; the daemon refuses every step meanwhile, so nothing else matters yet.
- memory growing outside the pool: the GPU's used memory minus the pool rose by more than
  `OUTSIDE_GROWTH_FRACTION` of the GPU (or `OUTSIDE_GROWTH_MIN_BYTES`) inside the window. The
  pool is allocated once, so growth there is another process or a leak; it outranks the rest
  because it ends in an out-of-memory error, not in a queue.
- pool-bound: requests wait or get preempted and at least `POOL_BOUND_USAGE` of the blocks
  are actually held. Only more KV memory (or fewer concurrent requests) helps.
- budget-bound: requests wait or get preempted while the blocks held stay below that, and the
  GPU memory curve is flat: promises (reservations), quotas or the queue order, not memory,
  limit admission. A looser policy or a better output-length estimate helps.
- not bound: nothing waits, nothing was preempted in the window.

Whichever it is, commits that waited for the decision log's upkeep in the window (a write
stall: engines' Steps slow, whatever the pool) are said after it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kvbudget.tui.state import DashboardState

WINDOW_S = 30.0
POOL_BOUND_USAGE = 0.90
OUTSIDE_GROWTH_FRACTION = 0.01
OUTSIDE_GROWTH_MIN_BYTES = 256 * 1024 * 1024


class Bound(enum.Enum):
    UNKNOWN = "waiting for the daemon"
    NOT_BOUND = "not bound"
    BUDGET_BOUND = "budget-bound"
    POOL_BOUND = "pool-bound"
    OUTSIDE_POOL = "memory growing outside the pool"
    LOG_CANNOT_WRITE = "decision log cannot write"


@dataclass(frozen=True)
class Verdict:
    bound: Bound
    why: str

    @property
    def line(self) -> str:
        return f"{self.bound.value}: {self.why}" if self.why else self.bound.value


def gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.1f} GiB"


def verdict(state: DashboardState) -> Verdict:
    found = _bound(state)
    window = state.recent(WINDOW_S)
    stalled_s = window[-1].log_stall_s - window[0].log_stall_s if window else 0.0
    if stalled_s <= 0:
        return found
    span_s = window[-1].time_s - window[0].time_s
    stall = f"commits waited {stalled_s:.1f} s in {span_s:.0f} s for the decision log"
    return Verdict(found.bound, f"{found.why}; {stall}" if found.why else stall)


def _bound(state: DashboardState) -> Verdict:
    snapshot = state.snapshot
    if snapshot is None:
        return Verdict(Bound.UNKNOWN, "")
    if snapshot.decision_log.num_unwritten_decisions:
        unwritten = snapshot.decision_log
        return Verdict(
            Bound.LOG_CANNOT_WRITE,
            f"{unwritten.num_unwritten_decisions:,} decisions wait to be written ({unwritten.write_error}); "
            "steps are refused until the log's disk has room",
        )
    window = state.recent(WINDOW_S)
    first, last = window[0], window[-1]
    span_s = last.time_s - first.time_s

    gpu = snapshot.gpu
    if gpu.present:
        growth = last.outside_pool_bytes - min(s.outside_pool_bytes for s in window)
        threshold = max(OUTSIDE_GROWTH_MIN_BYTES, OUTSIDE_GROWTH_FRACTION * gpu.total_bytes)
        if growth > threshold:
            return Verdict(
                Bound.OUTSIDE_POOL,
                f"+{gib(growth)} in {span_s:.0f} s",
            )

    preempted = last.preemptions - first.preemptions
    waiting = snapshot.num_waiting
    if waiting == 0 and (preempted <= 0 or snapshot.num_running == 0):
        # Preemptions of a run that has since drained are history, not a bound.
        why = "nothing waits, no preemptions" if snapshot.num_running else "idle"
        return Verdict(Bound.NOT_BOUND, why)

    pressure = _pressure(waiting, preempted, span_s)
    usage = last.usage
    if usage >= POOL_BOUND_USAGE:
        return Verdict(Bound.POOL_BOUND, f"{pressure} with {usage:.0%} of blocks held")
    reserved = snapshot.num_reserved_blocks / snapshot.num_blocks if snapshot.num_blocks else 0.0
    memory = "GPU memory flat" if gpu.present else "no GPU"
    return Verdict(
        Bound.BUDGET_BOUND,
        f"{pressure} with {usage:.0%} held, {reserved:.0%} reserved, {memory}",
    )


def _pressure(waiting: int, preempted: int, span_s: float) -> str:
    parts = []
    if waiting:
        parts.append(f"{waiting:,} waiting")
    if preempted > 0:
        parts.append(f"{preempted:,} preempted in {span_s:.0f} s")
    return ", ".join(parts)
