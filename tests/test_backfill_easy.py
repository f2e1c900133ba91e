"""EASY backfill and aging that follows the workload (issue 28, point 2): a request fitting
now passes a blocked head only if it is not expected to delay the head's start; the head
is protected once it has waited 3x the recent median wait."""

from __future__ import annotations

import math
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core.aging import RecentWaits
from kvbudget.daemon.core.head_start import head_start
from kvbudget.daemon.core.records import DecisionKind, RequestSpec

from test_admission_support import SMALL_LAYOUTS, engine_step, kinds


def _run(backfill_depth: int) -> tuple[dict[str, float], list[tuple[str, str, str]]]:
    """Guaranteed, one full-attention group, B = 8, F = 64, 10 blocks; one toy engine step
    per tick for every running request. A (6 blocks, 40 tokens to decode) and B (2 blocks,
    8 to decode) run from t=0; at t=1 the head H (3 blocks) finds 2 spare. By the model, B
    ends at step 8, freeing 2: H starts at step 8 with 1 block to spare. C (2 blocks, 9
    steps) fits now, but would still hold 3 blocks then: kept back. D (1 block, 1 step)
    ends first: it passes. Bounded backfill admitted C too, and H waited for C's end."""
    ctrl = AdmissionController(
        SMALL_LAYOUTS["full"], 10,
        AdmissionConfig(max_model_len=64, max_num_batched_tokens=64, policy="guaranteed", watermark=0.0,
                        backfill_depth=backfill_depth),
    )  # fmt: skip
    goals = {"A": 48, "B": 16, "H": 24, "C": 16, "D": 8}
    admitted: dict[str, float] = {}
    submitted = [RequestSpec("A", 8, 40), RequestSpec("B", 8, 8)]
    late = [RequestSpec("H", 24, 0), RequestSpec("C", 8, 8), RequestSpec("D", 8, 0)]
    first: list[tuple[str, str, str]] = []
    for tick in range(30):
        now = float(tick)
        decisions = []
        for rid in sorted(r.request_id for r in ctrl.running_requests()):
            decisions += engine_step(ctrl, rid, goals[rid], now)
        for spec in submitted:
            out = ctrl.submit(spec, now)
            decisions += out
            if tick == 1:
                first += kinds(out)
        for d in decisions:
            if d.kind is DecisionKind.ADMIT:
                admitted.setdefault(d.request_id, now)
        ctrl.check_integrity()
        submitted = late if tick == 0 else []
    return admitted, first


def test_a_request_that_would_delay_the_blocked_head_waits_and_a_short_one_passes() -> None:
    admitted, first = _run(backfill_depth=16)
    assert first == [("queue", "budget_full", "H"), ("queue", "queue_ahead", "C"), ("admit", "fits", "D")]
    fcfs, _ = _run(backfill_depth=0)
    # H starts when it would with nothing passing it (B's end, t=9); D ran meanwhile.
    assert admitted["H"] == fcfs["H"] == 9.0
    assert admitted["D"] == 1.0 and fcfs["D"] > 1.0
    assert admitted["C"] >= admitted["H"]


def test_recent_waits_give_three_times_their_median_capped_by_the_fixed_bound() -> None:
    waits = RecentWaits(window=4)
    assert waits.bound(0.0) == math.inf  # nothing seen: only EASY guards the head
    for w in (1.0, 2.0, 9.0):
        waits.observe(w)
    assert waits.bound(0.0) == 6.0  # median 2
    assert waits.bound(5.0) == 5.0  # an operator's cap below it wins
    for w in (20.0, 20.0, 20.0):  # the workload slows down: the oldest waits leave the window
        waits.observe(w)
    assert waits.bound(0.0) == 60.0  # window 9, 20, 20, 20: median 20


def test_aging_bound_moves_with_the_waits_seen_by_the_controller() -> None:
    # Short waits seen: a head that has waited 1.2 s is past 3 x the median (0.2 s):
    # nothing new passes it, not even tried.
    def controller(wait: float) -> AdmissionController:
        ctrl = AdmissionController(
            SMALL_LAYOUTS["full"], 8,
            AdmissionConfig(max_model_len=64, max_num_batched_tokens=64, policy="guaranteed", watermark=0.0),
        )
        ctrl.submit(RequestSpec("run", 56, 0), 0.0)  # 7 of 8 blocks
        ctrl.submit(RequestSpec("w", 16, 0), 0.0)  # waits for 2
        ctrl.finish("run", wait)  # w admitted after `wait` s: the one wait seen
        ctrl.submit(RequestSpec("run2", 48, 0), wait)  # 6 + 2 held: the pool is full
        ctrl.submit(RequestSpec("big", 24, 0), wait)  # head, needs 3
        return ctrl

    quick = controller(0.2)
    assert kinds(quick.submit(RequestSpec("tiny", 1, 0), 1.2 + 0.2))[0][:2] == ("queue", "queue_ahead")
    slow = controller(10.0)
    # 3 x 10 s: a head that waited 1 s may still be passed: tiny is tried (the pool is full).
    assert kinds(slow.submit(RequestSpec("tiny", 1, 0), 11.0))[0][:2] == ("queue", "pool_full")


ends = st.lists(st.tuples(st.integers(0, 50), st.integers(0, 20), st.integers(0, 30)), max_size=12)


@settings(max_examples=300, deadline=None)
@given(ends=ends, spare=st.integers(0, 40), need=st.integers(0, 80))
def test_head_start_is_the_first_end_after_which_the_spare_covers_the_need(ends, spare, need) -> None:
    def free_at(t: int) -> int:  # the plain definition: linear growth of those still running
        growth = sum(Fraction(g, s) * t for s, _, g in ends if s > t)  # exact
        return spare + sum(f for s, f, _ in ends if s <= t) - int(growth)

    start = head_start(ends, spare, need)
    if spare >= need:
        assert (start.steps, start.extra) == (0, spare - need)
        return
    times = sorted({s for s, _, _ in ends})
    fits = [t for t in times if free_at(t) >= need]
    if fits:
        assert (start.steps, start.extra) == (fits[0], free_at(fits[0]) - need)
    else:
        assert start.extra < 0 or not times


def test_a_pass_that_tried_no_one_is_walked_again_once_the_queue_changed() -> None:
    # Guaranteed, one full-attention group, B = 8, 10 blocks. A reserves 8 (64 tokens):
    # 2 spare. H (3 blocks) waits; the next pass tries no one (H lacked blocks at this
    # spare already), and neither would an identical one. T (1 block, no output) joins
    # the queue untried (admit=False): at the same spare the pass must reach it, and it
    # ends long before H can start (A's end, 56 steps): it passes H.
    ctrl = AdmissionController(
        SMALL_LAYOUTS["full"], 10,
        AdmissionConfig(max_model_len=64, max_num_batched_tokens=64, policy="guaranteed", watermark=0.0),
    )
    assert kinds(ctrl.submit(RequestSpec("A", 8, 56), 0.0)) == [("admit", "fits", "A")]
    assert kinds(ctrl.submit(RequestSpec("H", 24, 0), 0.0)) == [("queue", "budget_full", "H")]
    assert ctrl.schedule(1.0) == [] and ctrl.schedule(2.0) == []
    assert kinds(ctrl.submit(RequestSpec("T", 8, 0), 2.0, admit=False)) == [("queue", "pool_full", "T")]
    assert kinds(ctrl.schedule(2.0)) == [("admit", "fits", "T")]
    ctrl.check_integrity()


def test_a_pass_that_tried_no_one_is_walked_again_after_a_config_reload() -> None:
    # As above, but T joins through a pass that leaves it untried behind H (backfill
    # depth 0). A deeper backfill (config reload) must let the next pass at the same
    # spare reach it.
    ctrl = AdmissionController(
        SMALL_LAYOUTS["full"], 10,
        AdmissionConfig(max_model_len=64, max_num_batched_tokens=64, policy="guaranteed", watermark=0.0,
                        backfill_depth=0),
    )
    ctrl.submit(RequestSpec("A", 8, 56), 0.0)
    ctrl.submit(RequestSpec("H", 24, 0), 0.0)
    assert kinds(ctrl.submit(RequestSpec("T", 8, 0), 0.0)) == [("queue", "queue_ahead", "T")]
    assert ctrl.schedule(1.0) == [] and ctrl.schedule(1.0) == []  # H tried, then no one
    ctrl.retune(max_queue_len=0, backfill_depth=1, max_head_wait_s=0.0, watermark=0.0, lookahead_tokens=0,
                reject_over_quota=False)  # fmt: skip
    assert kinds(ctrl.schedule(1.0)) == [("admit", "fits", "T")]
    ctrl.check_integrity()
