"""Policies: guaranteed is never denied, optimistic preempts the right victims and does not
loop, predictive learns from finished requests, naive charges max_model_len; switching."""

from __future__ import annotations

import pytest

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController, AdmissionError
from kvbudget.daemon.core.predictor import OutputLengthPredictor
from kvbudget.daemon.core.records import DecisionKind, Reason, RequestSpec
from kvbudget.daemon.core.requests import Status

from test_admission_support import SMALL_LAYOUTS, kinds

FULL = SMALL_LAYOUTS["full"]  # one group, B = 8


def make(policy: str, num_blocks: int = 10, **kw) -> AdmissionController:
    config = AdmissionConfig(
        max_model_len=64, max_num_batched_tokens=64, policy=policy, watermark=0.0, **kw
    )
    return AdmissionController(FULL, num_blocks, config)


def test_guaranteed_reserves_worst_case_and_is_never_denied():
    ctrl = make("guaranteed")
    # prompt 16 + 24 new = L 40: cdiv(40, 8) = 5 blocks each; 10 // 5 = 2 admitted.
    out = []
    for rid in "abc":
        out += ctrl.submit(RequestSpec(rid, 16, 24), 0.0)
    assert kinds(out) == [("admit", "fits", "a"), ("admit", "fits", "b"), ("queue", "budget_full", "c")]
    for n in range(17, 41):  # both decode to L, one token a step
        for rid in "ab":
            ctrl.progress(rid, n - 1, 0.0)
            assert [d.kind for d in ctrl.grow(rid, n, 0.0)] == [DecisionKind.GROW]
    ctrl.check_integrity()
    assert ctrl.snapshot(0.0).num_free_blocks == 0
    # Past L is misuse, not a denial.
    with pytest.raises(AdmissionError) as info:
        ctrl.grow("a", 41, 0.0)
    assert info.value.field == "num_tokens"
    out = ctrl.finish("a", 1.0)
    assert kinds(out) == [("release", "finished", "a"), ("admit", "fits", "c")]
    ctrl.check_integrity()


def _three_running(ctrl: AdmissionController) -> None:
    # a, b priority 0; c priority 1 (less important); 16 tokens = 2 blocks each, 6 of 10.
    for rid, prio in (("a", 0), ("b", 0), ("c", 1)):
        ctrl.submit(RequestSpec(rid, 16, 48, priority=prio), 0.0)
        ctrl.progress(rid, 16, 0.0)


def test_optimistic_preempts_lowest_priority_then_latest_and_does_not_readmit_at_once():
    ctrl = make("optimistic")
    _three_running(ctrl)
    assert [d.kind for d in ctrl.grow("a", 48, 0.0)] == [DecisionKind.GROW]  # 6 blocks: pool dry
    out = ctrl.grow("b", 17, 0.0)
    # c ranks lowest (priority 1): preempted for b, freeing 2; b takes 1 -> 1 free.
    assert kinds(out) == [("preempt", "priority", "c"), ("grow", "fits", "b")]
    assert out[0].freed_blocks == 2 and out[1].num_free_blocks == 1
    # c needs its full length back (cdiv(16, 8) = 2 > 1 spare): it waits, at the front.
    c = ctrl.request("c")
    assert c.status is Status.WAITING and c.wait_reason is Reason.POOL_FULL
    assert ctrl.snapshot(0.0).preemptions_by_reason == {"priority": 1}
    ctrl.check_integrity()


def test_optimistic_request_that_ranks_last_preempts_itself_without_a_loop():
    ctrl = make("optimistic", backfill_depth=0)
    _three_running(ctrl)
    ctrl.grow("a", 48, 0.0)
    ctrl.grow("b", 17, 0.0)  # c preempted; b holds cdiv(17, 8) = 3; 1 free
    ctrl.progress("b", 17, 0.0)
    ctrl.grow("b", 25, 0.0)  # cdiv(25, 8) = 4 blocks: the last free one
    ctrl.progress("b", 25, 0.0)
    out = ctrl.grow("b", 33, 0.0)
    # Pool dry; b is the latest arrival among a, b: it preempts itself (vLLM's answer).
    assert kinds(out) == [("preempt", "growth", "b")] and out[0].freed_blocks == 4
    # b asked for 33 tokens = 5 blocks, 4 are free: it must not come straight back (it
    # would preempt itself again at once); c (priority 1) waits behind it.
    b = ctrl.request("b")
    assert b.status is Status.WAITING and b.resume_len == 33
    for n in range(49, 65):  # a grows into the spare blocks (6 -> 8): no more preemptions
        ctrl.progress("a", n - 1, 0.0)
        assert [d.kind for d in ctrl.grow("a", n, 0.0)] == [DecisionKind.GROW]
    assert ctrl.snapshot(0.0).num_preemptions == 2
    out = ctrl.finish("a", 1.0)
    assert kinds(out) == [("release", "finished", "a"), ("admit", "fits", "b"), ("admit", "fits", "c")]
    # b returns reserving the worst case of its 33 tokens, so its recompute cannot be cut.
    assert out[1].blocks_reserved == (5,) and out[1].num_tokens == 33
    ctrl.check_integrity()


def test_guaranteed_requests_are_never_victims_after_a_switch():
    ctrl = make("guaranteed")
    ctrl.submit(RequestSpec("g", 16, 24), 0.0)  # reserves 5
    assert kinds(ctrl.set_policy("optimistic", 0.0)) == [("policy", "switch", "")]
    ctrl.submit(RequestSpec("o", 16, 48), 0.0)  # holds 2; spare 10 - 2 - 3 owed... = 3
    ctrl.progress("o", 16, 0.0)
    ctrl.grow("o", 40, 0.0)  # 5 blocks: 2 + 5 + 3 owed = 10, nothing spare
    ctrl.progress("o", 40, 0.0)
    out = ctrl.grow("o", 41, 0.0)
    # The only other request is guaranteed: o preempts itself, g keeps its promise.
    assert kinds(out) == [("preempt", "growth", "o")]
    assert ctrl.request("g").status is Status.RUNNING and ctrl.request("g").policy == "guaranteed"
    ctrl.check_integrity()


def test_naive_charges_max_model_len_and_rejects_what_never_fits():
    ctrl = make("naive", num_blocks=10)
    # naive: cdiv(max_model_len 64, 8) = 8 blocks for any request, even a 1-token one.
    [a] = ctrl.submit(RequestSpec("a", 1, 0), 0.0)
    assert a.blocks_reserved == (8,) and a.blocks_held == (1,)
    [b] = ctrl.submit(RequestSpec("b", 1, 0), 0.0)
    assert (b.kind, b.reason) == (DecisionKind.QUEUE, Reason.BUDGET_FULL)
    small = make("naive", num_blocks=7)
    [c] = small.submit(RequestSpec("c", 1, 0), 0.0)
    assert (c.kind, c.reason) == (DecisionKind.REJECT, Reason.NEVER_FITS)
    ctrl.check_integrity()
    small.check_integrity()


def test_switch_to_naive_rejects_queued_requests_that_can_no_longer_fit():
    ctrl = make("optimistic", num_blocks=7)
    ctrl.submit(RequestSpec("a", 56, 0), 0.0)  # 7 blocks: the whole pool
    [b] = ctrl.submit(RequestSpec("b", 8, 0), 0.0)
    assert b.kind is DecisionKind.QUEUE
    out = ctrl.set_policy("naive", 0.0)
    # b's naive charge cdiv(64, 8) = 8 > 7 blocks: rejected rather than left waiting forever.
    assert kinds(out) == [("policy", "switch", ""), ("reject", "never_fits", "b")]
    assert kinds(ctrl.finish("a", 1.0)) == [("release", "finished", "a")]
    ctrl.check_integrity()


def test_predictive_reserves_the_learned_quantile_and_raises_it_after_a_preemption():
    """predictive_admission "reserve" (future-peak admission: test_future_peak.py)."""
    predictor = OutputLengthPredictor(quantile=0.9, min_samples=4)
    config = AdmissionConfig(
        max_model_len=64, max_num_batched_tokens=64, policy="predictive", watermark=0.0, predictive_admission="reserve"
    )
    ctrl = AdmissionController(FULL, 20, config, predictor=predictor)
    # Cold start: no data, reserve max new tokens: 8 + 40 = 48 -> 6 blocks.
    [d] = ctrl.submit(RequestSpec("cold", 8, 40), 0.0)
    assert d.blocks_reserved == (6,)
    ctrl.abort("cold", 0.0)  # aborted requests teach nothing
    for i, out_len in enumerate((4, 8, 8, 16)):
        ctrl.submit(RequestSpec(f"w{i}", 8, 40), 0.0)
        for n in range(9, 9 + out_len):
            ctrl.progress(f"w{i}", n - 1, 0.0)
            ctrl.grow(f"w{i}", n, 0.0)
        ctrl.finish(f"w{i}", 0.0)
    # Outputs seen (num_tokens - prompt at finish): 4, 8, 8, 16.
    # p90 nearest rank: ceil(0.9 * 4) = 4th smallest = 16 -> 8 + 16 = 24 -> 3 blocks.
    assert predictor.predict("", 40) == 16
    [p] = ctrl.submit(RequestSpec("p", 8, 40), 0.0)
    assert p.blocks_reserved == (3,)
    predictor.on_preemption()  # quantile 0.9 -> 0.95
    assert predictor.quantile == 0.95
    ctrl.check_integrity()


def test_predictive_reserves_a_window_not_the_prefill_transient_in_window_groups():
    """hybrid: sliding W=16, sliding W=16, full; B = 8, F = 64. One finished request taught
    the predictor 8 output tokens, so "p" (prompt 40) is sized for n = 48 tokens.
    Full group: worst case at 48 = 48 / 8 = 6 blocks. Sliding groups: what a decoding
    request holds at 48 with the engine one block (8 tokens) ahead: slots cdiv(56, 8) = 7,
    minus (47 - 16 + 1) // 8 = 4 out of window = 3 — not the worst case at 48 (6: the
    whole prompt, which only the prefill holds). The first chunk is the whole prompt,
    cdiv(40, 8) = 5 blocks per group, so it is charged max(held, base) = (5, 5, 6).
    Once a decoding request was seen growing 32 tokens ahead, the window base of the next
    one is cdiv(48 + 32, 8) - 4 = 6 (capped by the worst case at 48, 6)."""
    hybrid = SMALL_LAYOUTS["hybrid"]
    predictor = OutputLengthPredictor(quantile=0.9, min_samples=1)
    predictor.observe("", 8)
    config = AdmissionConfig(
        max_model_len=128, max_num_batched_tokens=64, policy="predictive", watermark=0.0, predictive_admission="reserve"
    )
    ctrl = AdmissionController(hybrid, 200, config, predictor=predictor)
    [d] = ctrl.submit(RequestSpec("p", 40, 40), 0.0)
    assert d.kind is DecisionKind.ADMIT and d.blocks_held == (5, 5, 5)
    assert ctrl.request("p").base == [3, 3, 6] and d.blocks_reserved == (5, 5, 6)
    ctrl.progress("p", 40, 0.0)  # prompt computed: the windows keep (40 - 16 + 1) // 8 = 3 out
    ctrl.grow("p", 41 + 31, 0.0)  # decoding, 32 tokens ahead of the 40 computed
    [d2] = ctrl.submit(RequestSpec("q", 40, 40), 0.0)
    assert ctrl.request("q").base == [6, 6, 6]
    ctrl.check_integrity()
