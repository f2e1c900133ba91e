"""`kvbudget doctor` and the dashboard's headline give one answer to "pool full or budget full?".

Each test feeds the very same snapshots to both: the doctor as its samples (5 snapshots 1 s
apart, its default), the dashboard as the Watch updates its state folds in. Pools of 100
usable blocks, so a count of blocks is its share in percent.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from tui_helpers import snapshot, state_of

from kvbudget.cli import doctor, doctor_samples
from kvbudget.cli.doctor_samples import Thresholds, Verdict
from kvbudget.tui import verdict as dashboard
from kvbudget.tui.verdict import Bound
from kvbudget.v1 import common_pb2

SAME = {
    Verdict.POOL_BOUND: Bound.POOL_BOUND,
    Verdict.BUDGET_BOUND: Bound.BUDGET_BOUND,
    Verdict.HEALTHY: Bound.NOT_BOUND,
}


def moment(
    step: int, *, held: int, reserved: int, waiting: int, running: int = 4, preemptions: int = 0,
    waiting_by_reason: dict[str, int] | None = None,
) -> common_pb2.Snapshot:
    """The daemon at t = 1000 + step s; the queue moves (3 more admissions a second)."""
    return snapshot(
        time_unix_s=1000.0 + step,
        num_held_blocks=held,
        num_free_blocks=100 - held,
        num_evictable_blocks=0,
        num_reserved_blocks=reserved,
        num_waiting=waiting,
        num_running=running,
        num_preemptions=preemptions,
        decisions_by_kind={"admit": 100 + 3 * step},
        waiting_by_reason=waiting_by_reason or {},
    )


def both(snapshots: Sequence[common_pb2.Snapshot], thresholds: Thresholds = Thresholds()):
    diagnosis = doctor.diagnose([doctor_samples.sample_from_snapshot(s) for s in snapshots], thresholds=thresholds)
    return diagnosis, dashboard.verdict(state_of(*snapshots))


def test_a_pool_steadily_92_percent_held_with_a_queue_is_pool_bound_for_both() -> None:
    # 92 held (+ 5 reserved: 97 committed), 3 waiting at every sample. The dashboard: mean
    # held under pressure 0.92 >= 0.90. The doctor read "full" as 95 % held: 92 % held with
    # 97 % committed was budget-bound there.
    steady = [moment(step, held=92, reserved=5, waiting=3) for step in range(5)]
    diagnosis, line = both(steady)
    assert line.bound is Bound.POOL_BOUND
    assert diagnosis.verdict is Verdict.POOL_BOUND
    queue = next(f for f in diagnosis.findings if f.check == "queue")
    assert queue.summary == "3 requests waiting with 92% of the pool held (mean of 5 samples under pressure)"
    assert "more memory" in diagnosis.knob


def test_a_pool_steadily_85_percent_held_with_a_queue_is_budget_bound_for_both() -> None:
    # 85 held + 7 reserved = 92 committed, 3 waiting, the queue moving. The dashboard: 0.85
    # < 0.90, budget-bound. The doctor: held under the bar, committed (0.92) at or over it:
    # free blocks promised away. At a 95 % bar neither reached it and the doctor said healthy.
    steady = [moment(step, held=85, reserved=7, waiting=3) for step in range(5)]
    diagnosis, line = both(steady)
    assert line.bound is Bound.BUDGET_BOUND
    assert diagnosis.verdict is Verdict.BUDGET_BOUND
    assert "7 reserved" in diagnosis.knob


def test_a_queue_that_comes_and_goes_is_judged_on_its_moments_by_both() -> None:
    # A steady saturated load as the samples catch it: waiting 0/3/0/2/0, held 89/92 (a
    # request finishes, the next is admitted into its blocks). Under pressure: the samples
    # with a queue, both 92 % held, mean 0.92: pool-bound. The doctor read the last sample
    # alone: no queue there, so healthy.
    held, waiting = (89, 92, 89, 92, 89), (0, 3, 0, 2, 0)
    swinging = [moment(step, held=held[step], reserved=2, waiting=waiting[step]) for step in range(5)]
    diagnosis, line = both(swinging)
    assert line.bound is Bound.POOL_BOUND
    assert diagnosis.verdict is Verdict.POOL_BOUND
    queue = next(f for f in diagnosis.findings if f.check == "queue")
    assert queue.summary == (
        "none waiting now, 3 earlier in the window with 92% of the pool held (mean of 2 samples under pressure)"
    )
    assert (queue.data["held_share"], queue.data["judged_samples"]) == (0.92, 2)


def test_a_run_that_drained_is_not_bound_for_both() -> None:
    # A full pool with a queue and preemptions, then nothing runs and nothing waits: the
    # dashboard says idle at once; the doctor, judging the earlier moments' mean (95 %),
    # must not call the drained daemon pool-bound.
    full = [moment(step, held=95, reserved=0, waiting=4, preemptions=step) for step in range(4)]
    drained = moment(4, held=0, reserved=0, waiting=0, running=0, preemptions=3)
    diagnosis, line = both([*full, drained])
    assert line.line == "not bound: idle"
    assert diagnosis.verdict is Verdict.HEALTHY


@pytest.mark.parametrize("held", [80, 89, 90, 91, 99])
def test_both_draw_the_line_at_the_same_share(held: int) -> None:
    # Held + reserved = 100 (committed full): each side of the bar, both say the same.
    diagnosis, line = both([moment(step, held=held, reserved=100 - held, waiting=2) for step in range(5)])
    assert SAME[diagnosis.verdict] is line.bound


def test_one_bar_shared_and_the_doctors_still_overridable() -> None:
    from kvbudget.client.pressure import POOL_FULL_SHARE
    from kvbudget.tui import drawing

    assert Thresholds().full_share == dashboard.POOL_BOUND_USAGE == drawing.USAGE_CRITICAL == POOL_FULL_SHARE
    steady = [moment(step, held=92, reserved=5, waiting=3) for step in range(5)]
    diagnosis, _ = both(steady, Thresholds(full_share=0.95))  # a stricter bar, given
    assert diagnosis.verdict is Verdict.BUDGET_BOUND


def test_a_pool_that_keeps_running_out_is_pool_bound_for_both_under_the_bar() -> None:
    # Optimistic admission on a full pool, as a live replay showed it: every preemption
    # frees its victim's blocks, so the samples catch the pool at 84-89 % held (mean 0.86,
    # under the bar), nothing reserved, while the waiting requests wait for free blocks
    # (pool_full, watermark). Both read the shares alone: the dashboard said budget-bound,
    # the doctor healthy (a queue that moves, nothing committed past the bar).
    held = (84, 89, 85, 87, 85)
    waits = ({"pool_full": 3}, {"pool_full": 2, "queue_ahead": 4}, {"watermark": 3}, {"pool_full": 5}, {"pool_full": 1})
    running_out = [
        moment(step, held=held[step], reserved=0, waiting=sum(waits[step].values()), preemptions=2 * step,
               waiting_by_reason=waits[step])
        for step in range(5)
    ]
    diagnosis, line = both(running_out)
    assert line.bound is Bound.POOL_BOUND
    assert line.why.endswith("with 86% of blocks held (mean under pressure, 4 s), waiting for free blocks")
    assert diagnosis.verdict is Verdict.POOL_BOUND
    queue = next(f for f in diagnosis.findings if f.check == "queue")
    assert queue.summary == (
        "1 request waiting with 86% of the pool held (mean of 5 samples under pressure), waiting for free blocks"
    )


def test_a_queue_waiting_for_promised_blocks_stays_budget_bound_for_both() -> None:
    # The same shares, but the daemon says the queue waits for blocks promised to running
    # requests (budget_full) and 92 % is committed: the budget, not the pool.
    promised = [
        moment(step, held=86, reserved=6, waiting=3, waiting_by_reason={"budget_full": 2, "pool_full": 1})
        for step in range(5)
    ]
    diagnosis, line = both(promised)
    assert line.bound is Bound.BUDGET_BOUND
    assert diagnosis.verdict is Verdict.BUDGET_BOUND


def test_waits_for_pool_weighs_the_daemons_reasons() -> None:
    from kvbudget.client.pressure import waits_for_pool

    assert waits_for_pool([{"pool_full": 2}, {"budget_full": 1}])
    assert waits_for_pool([{"watermark": 1, "queue_ahead": 9}])  # queue_ahead says nothing
    assert not waits_for_pool([{"pool_full": 1}, {"tenant_quota": 1}])  # a tie is not "more"
    assert not waits_for_pool([{}, {}])  # an older daemon gives no reasons
    assert not waits_for_pool([])
