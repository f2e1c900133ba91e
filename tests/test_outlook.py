"""The routing answer (core/outlook.py) on a pool worked by hand: what a request of a shape
needs, what waits ahead of it, whether it is admitted now, about when, and that asking
changes nothing."""

from __future__ import annotations

import pytest

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController, AdmissionError
from kvbudget.daemon.core.outlook import Shape, outlook
from kvbudget.daemon.core.records import RequestSpec

from test_admission_support import SMALL_LAYOUTS, kinds

# One full-attention group, B = 8, 10 blocks, guaranteed (base = worst case at L), F = 16.
# a (20 + 12: L 32, 4 blocks) and b (30 + 10: L 40, 5 blocks) run, each holding its first
# chunk (16 tokens: 2 blocks): free 10 - 4 = 6, owed 2 + 3, spare 6 - 5 = 1.
# c (16 + 8: L 24, 3 blocks) waits: 3 > spare 1 but <= free 6, budget_full.


def busy_pool(**config) -> AdmissionController:
    ctrl = AdmissionController(
        SMALL_LAYOUTS["full"], 10,
        AdmissionConfig(max_model_len=64, max_num_batched_tokens=16, watermark=0.0, policy="guaranteed", **config),
    )  # fmt: skip
    assert kinds(ctrl.submit(RequestSpec("a", 20, 12), 0.0)) == [("admit", "fits", "a")]
    assert kinds(ctrl.submit(RequestSpec("b", 30, 10), 0.0)) == [("admit", "fits", "b")]
    assert kinds(ctrl.submit(RequestSpec("c", 16, 8), 0.0)) == [("queue", "budget_full", "c")]
    return ctrl


def test_a_shape_that_needs_more_than_is_spare_waits_behind_the_queue():
    answer = outlook(busy_pool(), Shape(8, 8), 1.0)  # L 16: 2 blocks > spare 1
    assert (answer.admit_now, answer.reason, answer.final) == (False, "budget_full", False)
    assert answer.blocks_needed == (2,) and answer.blocks_needed_total == 2
    assert (answer.blocks_free, answer.blocks_spare, answer.blocks_reclaimable) == (6, 1, 0)
    assert (answer.requests_ahead, answer.blocks_ahead) == (1, 3)  # c
    # It lacks 2 + 3 - 1 = 4 blocks: a gives back its 4 when it finishes, at its
    # expected length 32 (no samples: max tokens), 32 - 16 = 16 decode steps from now.
    assert (answer.wait_steps, answer.wait_s) == (16, pytest.approx(0.32))
    assert outlook(busy_pool(), Shape(8, 8), 1.0, step_s=0.05).wait_s == pytest.approx(0.8)


def test_a_shape_that_fits_the_spare_is_backfilled_past_the_waiting_head():
    ctrl = busy_pool()
    answer = outlook(ctrl, Shape(1, 7), 1.0)  # L 8: 1 block
    assert (answer.admit_now, answer.reason, answer.requests_ahead, answer.wait_steps) == (True, "fits", 1, 0)
    # ... and a submit of that shape is indeed admitted; with no backfill it would wait.
    assert kinds(ctrl.submit(RequestSpec("d", 1, 7), 1.0))[0] == ("admit", "fits", "d")
    assert outlook(busy_pool(backfill_depth=0), Shape(1, 7), 1.0).reason == "queue_ahead"


def test_a_shape_that_fits_but_would_delay_the_protected_head_waits():
    # Guaranteed, 10 blocks: a (8 + 8: L 16, 2 blocks) and b (8 + 40: L 48, 6) run, spare 2;
    # c (8 + 24: L 32, 4) waits at the head. With no samples each runs to its maximum: a
    # ends after 1 prefill step + 8 decode steps = 9, and its 2 blocks make the 4 c needs,
    # 0 beyond (b's growth rate, 1 block in 41 steps, takes none by then): c starts at 9.
    ctrl = AdmissionController(
        SMALL_LAYOUTS["full"], 10, AdmissionConfig(max_model_len=64, max_num_batched_tokens=16, policy="guaranteed"),
    )  # fmt: skip
    for rid, prompt, new in (("a", 8, 8), ("b", 8, 40), ("c", 8, 24)):
        ctrl.submit(RequestSpec(rid, prompt, new), 0.0)
    # 1 + 15 (L 16: 2 blocks) fits the spare 2 but runs 1 + 15 = 16 steps, and at step 9
    # holds 9 tokens + one block ahead = 3 blocks > 0: it would delay c.
    long = outlook(ctrl, Shape(1, 15), 1.0)
    assert (long.admit_now, long.reason, long.blocks_needed_total, long.blocks_spare) == (False, "queue_ahead", 2, 2)
    # 8 + 8 (also 2 blocks) ends in 9 steps, as c starts: backfilled.
    short = outlook(ctrl, Shape(8, 8), 1.0)
    assert (short.admit_now, short.reason) == (True, "fits")
    assert kinds(ctrl.submit(RequestSpec("x", 1, 15), 1.0)) == [("queue", "queue_ahead", "x")]
    assert kinds(ctrl.submit(RequestSpec("y", 8, 8), 1.0))[0] == ("admit", "fits", "y")


def test_a_shape_that_fits_now_but_not_the_predicted_peak_waits_budget_full():
    def pool(peak: bool) -> AdmissionController:
        ctrl = AdmissionController(SMALL_LAYOUTS["full"], 10, AdmissionConfig(
            max_model_len=64, max_num_batched_tokens=16, watermark=0.0, admit_on="first_chunk", optimistic_peak=peak,
        ))  # fmt: skip
        ctrl.submit(RequestSpec("a", 32, 24), 0.0)  # holds its first chunk: 2 blocks, spare 8
        return ctrl

    # 16 + 24 takes 2 blocks now. With no samples both run to their maximum, 24 decode
    # steps: a at 56 tokens (7 blocks) and it at 40 (5), 12 blocks, 10 more than the 2 held
    # today: more than the 8 spare, so the peak gate holds it back.
    answer = outlook(pool(True), Shape(16, 24), 1.0)
    assert (answer.admit_now, answer.reason, answer.final, answer.blocks_spare) == (False, "budget_full", False, 8)
    assert kinds(pool(True).submit(RequestSpec("x", 16, 24), 1.0)) == [("queue", "budget_full", "x")]
    assert (outlook(pool(False), Shape(16, 24), 1.0).admit_now, outlook(pool(False), Shape(16, 24), 1.0).reason) == (
        True, "fits",
    )  # fmt: skip


def test_priority_puts_it_ahead_of_the_queue_and_a_new_tenant_is_not_created():
    ctrl = busy_pool()
    answer = outlook(ctrl, Shape(8, 8, tenant="new", priority=-1), 1.0)
    # Ahead of c: it lacks only 2 - 1 = 1 block, which a's finish gives in 16 steps.
    assert (answer.requests_ahead, answer.blocks_ahead, answer.wait_steps) == (0, 0, 16)
    assert "new" not in {t.tenant for t in ctrl.snapshot(1.0).tenants}


def test_final_answers_name_the_rejection():
    ctrl = busy_pool()
    too_long = outlook(ctrl, Shape(100, 7), 1.0)
    assert (too_long.reason, too_long.final, too_long.wait_steps) == ("prompt_too_long", True, -1)
    big = outlook(AdmissionController(SMALL_LAYOUTS["full"], 3, AdmissionConfig(max_model_len=64)), Shape(30, 10), 0.0)
    assert (big.reason, big.final, big.detail) == ("never_fits", True, "worst case 5 > pool 3")
    # 8 blocks: more than a's and b's 9 give back can cover with c's 3 ahead: unknown.
    assert (outlook(ctrl, Shape(60, 4), 1.0).reason, outlook(ctrl, Shape(60, 4), 1.0).wait_steps) == ("pool_full", -1)
    ctrl.close_admissions(2.0)
    assert outlook(ctrl, Shape(1, 1), 2.0).reason == "draining"


def test_tenant_at_its_quota_waits_for_its_own_requests():
    ctrl = AdmissionController(
        SMALL_LAYOUTS["full"], 10, AdmissionConfig(max_model_len=64, max_num_batched_tokens=16, policy="guaranteed"),
    )  # fmt: skip
    ctrl.set_tenant_quota("t", 0.5)  # 5 blocks
    ctrl.submit(RequestSpec("a", 20, 12, tenant="t"), 0.0)  # charged 4
    answer = outlook(ctrl, Shape(8, 8, tenant="t"), 1.0)  # 4 + 2 > 5
    assert (answer.reason, answer.final, answer.wait_steps) == ("tenant_quota", False, 16)


def test_asking_changes_nothing():
    ctrl = busy_pool()
    before = ctrl.snapshot(1.0)
    for shape in (Shape(8, 8), Shape(1, 7), Shape(60, 4), Shape(8, 8, tenant="x", priority=-3, prefix_hashes=(1, 2))):
        outlook(ctrl, shape, 1.0)
    assert ctrl.snapshot(1.0) == before
    assert [r.request_id for r in ctrl.waiting_requests()] == ["c"]
    ctrl.check_integrity()
    # The next decision is numbered as if nobody had asked.
    assert ctrl.submit(RequestSpec("d", 1, 7), 1.0)[0].seq == 4


@pytest.mark.parametrize(
    ("shape", "step_s", "field"),
    [(Shape(0), 0.02, "prompt_tokens"), (Shape(4, -1), 0.02, "max_new_tokens"), (Shape(4), -1.0, "step_s")],
)
def test_bad_shape_names_the_field(shape, step_s, field):
    with pytest.raises(AdmissionError) as info:
        outlook(busy_pool(), shape, 0.0, step_s)
    assert info.value.field == field


def test_prefix_hits_held_by_a_running_request_are_not_asked_of_the_pool():
    ctrl = AdmissionController(
        SMALL_LAYOUTS["full"], 10,
        AdmissionConfig(max_model_len=64, max_num_batched_tokens=32, watermark=0.0, policy="guaranteed"),
    )  # fmt: skip
    # a (20 + 12: 4 blocks) publishes its 2 full prompt blocks; c (8 + 24: 4) leaves 2 spare.
    ctrl.submit(RequestSpec("a", 20, 12, prefix_hashes=(11, 12)), 0.0)
    ctrl.progress("a", 20, 0.0)
    ctrl.submit(RequestSpec("c", 8, 24), 0.0)
    hit = outlook(ctrl, Shape(20, 12, prefix_hashes=(11, 12)), 1.0)
    miss = outlook(ctrl, Shape(20, 12), 1.0)
    assert (hit.blocks_needed, hit.blocks_needed_total, hit.admit_now, hit.reason) == ((4,), 2, True, "prefix_hit")
    assert (miss.blocks_needed_total, miss.admit_now, miss.reason, miss.blocks_spare) == (4, False, "budget_full", 2)
    assert kinds(ctrl.submit(RequestSpec("b", 20, 12, prefix_hashes=(11, 12)), 1.0)) == [("admit", "prefix_hit", "b")]
