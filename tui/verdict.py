"""Physical vs logical: which of the pool, the budget or the GPU is holding requests back.

The on-call drill is "first free blocks, then waiting / preempt counts, last suspect the GPU".
This module turns that drill into one line from a `DashboardState`, first match wins:

- decision log cannot write: a write to the log failed (a full disk) and decisions wait
  to be written; the daemon refuses every step meanwhile, so nothing else matters yet.
- memory growing outside the pool: the GPU's used memory minus the pool rose by more than
  `OUTSIDE_GROWTH_FRACTION` of the GPU (or `OUTSIDE_GROWTH_MIN_BYTES`) inside the
  `WINDOW_S` window. The pool is allocated once, so growth there is another process or a
  leak; it outranks the rest because it ends in an out-of-memory error, not in a queue.
- not bound: no pressure (below), or pressure from a run that has since drained: nothing
  runs and nothing waits now ("idle").
- pool-bound: pressure, and the mean usage (held / capacity) of the samples under pressure
  is at least `POOL_BOUND_USAGE`, the bar `kvbudget doctor` judges by too (and reads the
  same way: kvbudget/client/pressure.py says where the two still differ); or, below it, the daemon
  says the requests that waited then waited for room in the pool more than for the budget
  (`waits_for_pool`: pool_full, watermark against budget_full, tenant_quota). Only more KV
  memory (or fewer concurrent requests) helps.
- budget-bound: pressure while that mean stays below the bar and the queue does not wait
  for the pool, and the GPU memory curve is flat: promises (reservations), quotas or the
  queue order, not memory, limit admission. A looser policy or a better output-length
  estimate helps.

Pressure is judged over trailing windows of the state's history, not from the last
snapshot: under a steady saturated load the waiting count swings between 0 and a few and
the usage around the bar from one refresh to the next, and a verdict read off one instant
flipped with them. So:

- pressure: some sample of the last `PRESSURE_WINDOW_S` had requests waiting, or the
  cumulative preemption count rose within the last `WINDOW_S` (preemptions are rarer
  events than a queue, so they are remembered longer).
- the samples under pressure: those of the last `PRESSURE_WINDOW_S` that had requests
  waiting or whose preemption count rose since the sample before; when there are none
  (the pressure is preemptions older than that), those of the `WINDOW_S` window whose
  preemption count rose. They are the moments requests were held back, and the usage then
  is what says whether the pool was full when it happened; moments without a queue would
  only dilute it.

The windows are measured on the daemon's clock, from the samples the state holds: no clock
of its own and nothing remembered between calls, so the verdict stays a pure function of
the state, as every panel is. With a single sample (just connected) both windows hold just
it, and it is judged alone. The bound can still change from one refresh to the next when
the load's mean sits right on the bar; any load that is steady on either side of it gets
one verdict that holds still. The price is a lag: a load that steps from half the pool to
all of it, with a queue throughout, reads pool-bound once most of the 10 s window is past
(8.5 s later at two samples a second); a queue that stops stops counting after 10 s,
preemptions after 30 s.

The text says the current figures (waiting now, reserved now) and, where more than one
sample was judged, the usage figure it judged on and how far back that evidence goes.
Whichever bound it is, commits that waited for the decision log's upkeep in the window (a
write stall: engines' Steps slow, whatever the pool) are said after it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean

from kvbudget.client.pressure import POOL_FULL_SHARE, waits_for_pool
from kvbudget.tui.state import DashboardState, Sample

WINDOW_S = 30.0  # growth outside the pool, preemptions and log stalls are judged over this
PRESSURE_WINDOW_S = 10.0  # a queue seen this recently still counts as pressure
POOL_BOUND_USAGE = POOL_FULL_SHARE  # the doctor's Thresholds.full_share by default
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

    recent = state.recent(PRESSURE_WINDOW_S)
    peak_waiting = max(s.waiting for s in recent)
    preempted = last.preemptions - first.preemptions
    if peak_waiting == 0 and preempted <= 0:
        why = "nothing waits, no preemptions" if snapshot.num_running else "idle"
        return Verdict(Bound.NOT_BOUND, why)
    if snapshot.num_waiting == 0 and snapshot.num_running == 0:
        # Pressure of a run that has since drained is history, not a bound: nothing is
        # held back now. (The rule preemptions always had; a queue seen in the window
        # follows it too, so a drained daemon says so at once, not 10 s later.)
        return Verdict(Bound.NOT_BOUND, "idle")

    pressure = _pressure_text(snapshot.num_waiting, peak_waiting, preempted, span_s)
    # Non-empty: a queue in `recent` or a rise of the preemption count in `window` put
    # at least one sample under pressure.
    pressed = _under_pressure(recent) or _under_pressure(window)
    usage = _judged_usage(pressed)
    judged = _judged_text(pressed, last)
    if usage >= POOL_BOUND_USAGE:
        return Verdict(Bound.POOL_BOUND, f"{pressure} with {usage:.0%} of blocks held{judged}")
    if waits_for_pool(s.waiting_by_reason for s in pressed):
        return Verdict(
            Bound.POOL_BOUND, f"{pressure} with {usage:.0%} of blocks held{judged}, waiting for free blocks"
        )
    reserved = snapshot.num_reserved_blocks / snapshot.num_blocks if snapshot.num_blocks else 0.0
    memory = "GPU memory flat" if gpu.present else "no GPU"
    return Verdict(
        Bound.BUDGET_BOUND,
        f"{pressure} with {usage:.0%} held{judged}, {reserved:.0%} reserved, {memory}",
    )


def _under_pressure(samples: Sequence[Sample]) -> tuple[Sample, ...]:
    """The samples at which requests were held back: some waited, or the cumulative
    preemption count rose since the sample before (the first has none before it here: a
    rise just outside the window is older than the window)."""
    return tuple(
        sample
        for before, sample in zip((None, *samples), samples)
        if sample.waiting > 0 or (before is not None and sample.preemptions > before.preemptions)
    )


def _judged_usage(pressed: Sequence[Sample]) -> float:
    """The mean usage of the samples under pressure.

    The mean rather than the median: a steady load whose usage swings across the bar,
    0.89 / 0.92 / 0.89 ..., has a median that is whichever value the window holds one more
    of, and that flips with every new sample; the mean of such a window moves by a
    fraction of the swing divided by the sample count and stays on one side. Usage is a
    share of the pool (0..1), so no single sample can drag the mean far: the robustness a
    median buys against outliers is not needed here.
    """
    return fmean(s.usage for s in pressed)


def _judged_text(pressed: Sequence[Sample], last: Sample) -> str:
    """What the usage figure is, once it is more than one sample's: an operator compares
    it with the pool panel's usage now, which may differ."""
    if len(pressed) < 2:
        return ""
    return f" (mean under pressure, {_seconds(last.time_s - pressed[0].time_s)})"


def _seconds(span_s: float) -> str:
    """Whole seconds, as the rest of the line; under one (the current snapshot arrives
    between two samples of the history) a tenth, rather than a "0 s" that reads as none."""
    return f"{span_s:.1f} s" if span_s < 1 else f"{span_s:.0f} s"


def _pressure_text(waiting: int, peak_waiting: int, preempted: int, span_s: float) -> str:
    parts = []
    if waiting:
        parts.append(f"{waiting:,} waiting")
    elif peak_waiting:
        parts.append(f"none waiting now, {peak_waiting:,} within {PRESSURE_WINDOW_S:.0f} s")
    if preempted > 0:
        parts.append(f"{preempted:,} preempted in {span_s:.0f} s")
    return ", ".join(parts)
