"""The dashboard's verdict over time: it holds still under a steady load and moves with a
real change.

Each test feeds the state one snapshot every 0.5 s (the dashboard's sample period) and
reads the verdict after each, as the GPU panel would on each refresh. The arithmetic behind
every expected switch is in the comment above it. Windows: a queue counts for 10 s,
preemptions for 30 s; usage is judged as the mean over the samples under pressure.
"""

from __future__ import annotations

from collections.abc import Sequence

from tui_helpers import snapshot, state_of

from kvbudget.tui.verdict import Bound, Verdict, verdict
from kvbudget.v1 import common_pb2

PERIOD_S = 0.5
START_S = 1000.0


def load(step: int, held: int, waiting: int, preemptions: int = 0, running: int = 4) -> common_pb2.Snapshot:
    """A 100-block pool at sample `step`: `held` blocks held (so usage is held / 100)."""
    return snapshot(
        time_unix_s=START_S + step * PERIOD_S,
        num_held_blocks=held,
        num_free_blocks=100 - held,
        num_evictable_blocks=0,
        num_waiting=waiting,
        num_running=running,
        num_preemptions=preemptions,
    )


def verdicts_along(snapshots: Sequence[common_pb2.Snapshot]) -> list[Verdict]:
    """The verdict after each snapshot is folded in (snapshot i: time START_S + i/2 s)."""
    return [verdict(state_of(*snapshots[: i + 1])) for i in range(len(snapshots))]


def bounds(verdicts: Sequence[Verdict]) -> list[Bound]:
    return [v.bound for v in verdicts]


def switches(verdicts: Sequence[Verdict]) -> list[tuple[int, Bound]]:
    """(step, new bound) for every step whose bound differs from the step before."""
    found = bounds(verdicts)
    return [(i, found[i]) for i in range(1, len(found)) if found[i] != found[i - 1]]


def oscillating(steps: int, first_step: int = 0) -> list[common_pb2.Snapshot]:
    """A steady saturated load as one refresh after another sees it: waiting 0/3/0/2,
    blocks held 89/92 (a request finishes, the next is admitted into its blocks), one more
    preemption every 2 s (at steps 1, 5, 9, ...: when the pool is full and requests wait)."""
    return [
        load(step, held=(89, 92)[step % 2], waiting=(0, 3, 0, 2)[step % 4], preemptions=(step + 3) // 4)
        for step in range(first_step, first_step + steps)
    ]


class TestASteadyLoadHoldsOneVerdict:
    def test_a_queue_that_comes_and_goes_with_usage_around_the_bar(self):
        # The samples under pressure are those with a queue or a new preemption: the odd
        # steps, all 92% held, so the mean is 0.92 >= 0.90: pool-bound from step 1 (the
        # first queue) on, though half the refreshes see no queue and 89% held. Step 0:
        # nothing waited yet, no preemption yet: not bound. The old rule (the last sample
        # alone) said not bound at every even step.
        found = bounds(verdicts_along(oscillating(60)))
        assert found[0] is Bound.NOT_BOUND
        assert found[1:] == [Bound.POOL_BOUND] * 59

    def test_a_queue_every_refresh_with_usage_swinging_across_the_bar(self):
        # Waiting every sample, held 89/92 alternately. Every sample is under pressure:
        # with k samples the mean is (ceil(k/2) x 0.89 + floor(k/2) x 0.92) / k, i.e. 0.905
        # for even k and 0.905 - 0.015 / k for odd k: >= 0.902 from k = 5 (2 s) on, so
        # pool-bound. (The last sample alone flipped budget/pool every refresh; so would
        # the median of an odd-sized window: whichever value it held one more of.)
        snapshots = [load(step, held=(89, 92)[step % 2], waiting=(1, 4, 2, 3)[step % 4]) for step in range(60)]
        found = bounds(verdicts_along(snapshots))
        assert found[4:] == [Bound.POOL_BOUND] * 56

    def test_a_queue_below_the_bar_holds_budget_bound(self):
        # Waiting 0/3/0/2 with 60/70 held: a queue while the pool has room is the budget's
        # doing; the samples with a queue are all at 70% -> budget-bound, however the
        # current waiting count swings.
        snapshots = [load(step, held=(60, 70)[step % 2], waiting=(0, 3, 0, 2)[step % 4]) for step in range(60)]
        found = bounds(verdicts_along(snapshots))
        assert found[1:] == [Bound.BUDGET_BOUND] * 59

    def test_the_text_says_what_was_judged(self):
        # Step 59 (t=1029.5; waiting 2, (59 + 3) // 4 = 15 preemptions so far): the 30 s
        # window holds steps 0..59, 0 -> 15 preemptions over 29.5 s ("30 s", rounded half
        # to even). Under pressure in the 10 s window (steps 39..59): the odd steps, 11
        # samples at 92%, the oldest (step 39) 10 s back.
        # Step 60 (t=1030; nothing waits now, 89% held): the queue is said as the window
        # saw it (at most 3); under pressure: odd steps 41..59, the oldest 9.5 s back ("10").
        verdicts = verdicts_along(oscillating(61))
        assert verdicts[59].line == (
            "pool-bound: 2 waiting, 15 preempted in 30 s with 92% of blocks held "
            "(mean under pressure, 10 s)"
        )
        assert verdicts[60].line == (
            "pool-bound: none waiting now, 3 within 10 s, 15 preempted in 30 s with 92% of "
            "blocks held (mean under pressure, 10 s)"
        )


class TestARealChangeMovesTheVerdict:
    def test_a_load_that_stops_is_not_bound_once_the_windows_are_past(self):
        # 30 s of the saturated load (steps 0..59: the last queue at step 59, t=1029.5; the
        # last preemption, the 15th, between steps 56 and 57), then from step 60 (t=1030) a
        # light load: 40 held, nothing waits, 4 running, no more preemptions.
        # Until t=1039.5 the queue is inside the last 10 s: pool-bound on its samples (92%).
        # From t=1040 only preemptions are left (30 s window), judged on the samples where
        # the count rose (steps 1, 5, ..., 57: 92%): still pool-bound, while usage is 40%
        # now. At step 117 (t=1058.5) the 30 s window starts at step 57, which counts 15
        # already: no rise left, not bound. One change, when both windows are past.
        light = [load(step, held=40, waiting=0, preemptions=15) for step in range(60, 130)]
        verdicts = verdicts_along(oscillating(60) + light)
        assert switches(verdicts) == [(1, Bound.POOL_BOUND), (117, Bound.NOT_BOUND)]
        # Step 100 (t=1050): the 30 s window is steps 40..100, (40 + 3) // 4 = 10 -> 15
        # preemptions; the rises in it at steps 41, 45, ..., 57, the oldest 29.5 s back.
        assert verdicts[100].line == (
            "pool-bound: 5 preempted in 30 s with 92% of blocks held (mean under pressure, 30 s)"
        )
        assert verdicts[-1].line == "not bound: nothing waits, no preemptions"

    def test_a_load_that_drains_completely_is_idle_at_once(self):
        # Nothing runs and nothing waits any more: whatever the windows saw is history.
        drained = [load(step, held=0, waiting=0, preemptions=15, running=0) for step in range(60, 64)]
        verdicts = verdicts_along(oscillating(60) + drained)
        assert bounds(verdicts)[60:] == [Bound.NOT_BOUND] * 4
        assert verdicts[60].line == "not bound: idle"

    def test_a_load_that_fills_the_pool_becomes_pool_bound_once_the_window_is_mostly_past(self):
        # 20 s at 50% held with 2 waiting (budget-bound), then from step 40 (t=1020) 97%
        # held, still 2 waiting. Every sample has a queue, so the 10 s window's 21 samples
        # are all judged: with j samples at 97% the mean is (0.5 x (21 - j) + 0.97 x j) / 21,
        # >= 0.90 from j = 18 (0.9029; j = 17 gives 0.8805). j = 18 at step 57, 8.5 s after
        # the rise; and it stays there.
        half = [load(step, held=50, waiting=2) for step in range(40)]
        full = [load(step, held=97, waiting=2) for step in range(40, 80)]
        verdicts = verdicts_along(half + full)
        assert bounds(verdicts)[:57] == [Bound.BUDGET_BOUND] * 57
        assert switches(verdicts) == [(57, Bound.POOL_BOUND)]
        assert verdicts[57].line == "pool-bound: 2 waiting with 90% of blocks held (mean under pressure, 10 s)"
        assert verdicts[-1].line == "pool-bound: 2 waiting with 97% of blocks held (mean under pressure, 10 s)"


class TestFewSamples:
    def test_one_sample_is_judged_alone(self):
        # Just connected: one snapshot, so one sample under pressure; the text has no mean.
        assert verdict(state_of(load(0, held=92, waiting=3))).line == "pool-bound: 3 waiting with 92% of blocks held"
        assert verdict(state_of(load(0, held=89, waiting=3))).line == (
            "budget-bound: 3 waiting with 89% held, 10% reserved, no GPU"
        )
        assert verdict(state_of(load(0, held=92, waiting=0))).line == "not bound: nothing waits, no preemptions"

    def test_a_queue_seen_moments_ago_still_counts(self):
        # Waiting at t=1000, none at t=1000.5: the bound holds (the old rule said not bound).
        state = state_of(load(0, held=95, waiting=3), load(1, held=95, waiting=0))
        assert verdict(state).line == "pool-bound: none waiting now, 3 within 10 s with 95% of blocks held"

    def test_a_span_under_a_second_is_said_in_tenths(self):
        # Two samples under pressure 0.3 s apart (as when the current snapshot arrives
        # between two samples of the history): mean (0.95 + 0.97) / 2 = 0.96.
        state = state_of(load(0, held=95, waiting=3), snapshot(
            time_unix_s=START_S + 0.3, num_held_blocks=97, num_free_blocks=3, num_evictable_blocks=0,
            num_waiting=4, num_running=4,
        ))
        assert verdict(state).line == "pool-bound: 4 waiting with 96% of blocks held (mean under pressure, 0.3 s)"
